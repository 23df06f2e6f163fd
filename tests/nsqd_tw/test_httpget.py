"""nsq_service.httpget: the GET nsqd asks the lookupds for a new topic's channels with."""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import defer, protocol, reactor
from twisted.internet.error import ConnectionRefusedError
from twisted.trial import unittest

from nsq_service.httpget import HTTPGetError, QuickHTTPClient, parse_response


class ParseTests(unittest.TestCase):
    def test_content_length_bounds_the_body(self) -> None:
        r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\n{}junk")
        self.assertEqual((r.code, r.phrase, r.body, r.headers[b"x-a"]), (200, b"OK", b"{}", b"b"))
        self.assertEqual(self.successResultOf(r.content()), b"{}")

    def test_without_a_length_the_body_is_all_up_to_the_close(self) -> None:
        r = parse_response(b'HTTP/1.0 404 Not Found\r\n\r\n{"message":"x"}')
        self.assertEqual((r.code, r.phrase, r.body), (404, b"Not Found", b'{"message":"x"}'))

    def test_what_is_not_a_whole_response(self) -> None:
        for data, text in (
            (b"", "EOF"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", "malformed HTTP response"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", "unexpected EOF"),
            (b"SSH-2.0-OpenSSH\r\n\r\n", "malformed HTTP response b'SSH-2.0-OpenSSH'"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "bad Content-Length b'x'"),
        ):
            with self.assertRaises(HTTPGetError) as caught:
                parse_response(data)
            self.assertEqual(str(caught.exception), text)


class Answer(protocol.Protocol):
    """An HTTP server's side: records the request, answers the factory's bytes and closes."""

    def dataReceived(self, data: bytes) -> None:
        self.factory.requests.append(data)
        if self.factory.answer is not None:
            self.transport.write(self.factory.answer)
            self.transport.loseConnection()


def server(answer: bytes | None) -> protocol.Factory:
    factory = protocol.Factory.forProtocol(Answer)
    factory.requests = []
    factory.answer = answer
    return factory


class ClientTests(unittest.TestCase):
    """Over 127.0.0.1."""

    def listen(self, factory: protocol.Factory) -> int:
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return int(port.getHost().port)

    @defer.inlineCallbacks
    def test_one_request_one_answer(self) -> Any:
        factory = server(b'HTTP/1.1 200 OK\r\nContent-Length: 16\r\nConnection: close\r\n\r\n{"channels":[]}\n')
        port = self.listen(factory)
        client = QuickHTTPClient(reactor, 2.0)
        url = f"http://127.0.0.1:{port}/channels?topic=t"
        resp = yield client.get(url, headers={b"Accept": [b"application/vnd.nsq; version=1.0"]}, timeout=5)
        self.assertEqual((resp.code, (yield resp.content())), (200, b'{"channels":[]}\n'))
        self.assertEqual(
            factory.requests,
            [
                f"GET /channels?topic=t HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n"
                f"Accept: application/vnd.nsq; version=1.0\r\n\r\n".encode()
            ],
        )

    @defer.inlineCallbacks
    def test_a_refused_connection_fails(self) -> Any:
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with self.assertRaises(ConnectionRefusedError):
            yield QuickHTTPClient(reactor, 2.0).get(f"http://127.0.0.1:{port}/x", timeout=5)

    @defer.inlineCallbacks
    def test_a_cancelled_get_hangs_up(self) -> Any:
        factory = server(None)
        port = self.listen(factory)
        d = QuickHTTPClient(reactor, 2.0).get(f"http://127.0.0.1:{port}/x", timeout=5)
        d.cancel()
        with self.assertRaises(defer.CancelledError):
            yield d

    @defer.inlineCallbacks
    def test_no_answer_in_time_fails_and_hangs_up(self) -> Any:
        factory = server(None)  # reads the request, never answers
        port = self.listen(factory)
        client = QuickHTTPClient(reactor, 2.0)
        with self.assertRaises(HTTPGetError) as caught:
            yield client.get(f"http://127.0.0.1:{port}/slow", timeout=0.05)
        self.assertEqual(str(caught.exception), f"Get http://127.0.0.1:{port}/slow: no answer within 0.05s")

    def test_only_plain_http(self) -> None:
        f = self.failureResultOf(QuickHTTPClient(reactor, 2.0).get("https://127.0.0.1:4161/x"), HTTPGetError)
        self.assertEqual(str(f.value), "unsupported URL https://127.0.0.1:4161/x")


class NameTests(unittest.TestCase):
    @defer.inlineCallbacks
    def test_a_host_name_is_resolved(self) -> Any:
        """A name goes through HostnameEndpoint (both families, as Go dials)."""
        factory = server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        resp = yield QuickHTTPClient(reactor, 2.0).get(f"http://localhost:{port.getHost().port}/ping", timeout=5)
        self.assertEqual((resp.code, resp.body), (200, b"OK"))
        self.assertIn(b"Host: localhost:", factory.requests[0])
