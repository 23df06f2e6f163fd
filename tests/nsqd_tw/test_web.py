"""The HTTP channel under abuse, in memory: bounded bodies, Go's answers to bad
framing, header/body deadlines that a dripping client cannot extend."""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import weakref
from typing import Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial import unittest

from nsq_service import http_channel
from nsq_service.listen import Bound
from nsqd_tw.http.api import make_site
from tests.helpers import make_nsqd

GO_400 = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"
)


class Conn:
    """One HTTP connection to a site, over a StringTransport."""

    _port = 40000

    def __init__(self, site: Any) -> None:
        Conn._port += 1
        peer = IPv4Address("TCP", "127.0.0.1", Conn._port)
        self.proto = site.buildProtocol(peer)
        self.transport = StringTransport(peerAddress=peer, hostAddress=IPv4Address("TCP", "127.0.0.1", 4151))
        self.proto.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.proto.dataReceived(data)

    def take(self) -> bytes:
        out = self.transport.value()
        self.transport.clear()
        return out

    @property
    def closed(self) -> bool:
        return bool(self.transport.disconnecting)

    def lose(self) -> None:
        from twisted.internet import error
        from twisted.python.failure import Failure

        self.proto.connectionLost(Failure(error.ConnectionDone()))

    def shut(self) -> None:
        """The client shuts its side down (``shutdown(SHUT_WR)``): what twisted's TCP
        transport does when a read finds the end of the stream."""
        half = IHalfCloseableProtocol(self.proto, None)
        if half is None:
            self.lose()
        else:
            half.readConnectionLost()


def response(raw: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    code = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower()] = v.strip()
    return code, headers, body


class SiteTestCase(unittest.TestCase):
    opts: dict[str, Any] = {}

    def setUp(self) -> None:
        self.nsqd = make_nsqd(**self.opts)
        self.clock = self.nsqd.reactor
        self.site = make_site(self.nsqd, Bound(tcp=("127.0.0.1", 4150), http=("127.0.0.1", 4151)))
        # a body over twisted's 100 KB threshold must never reach a temporary file
        self.patch(tempfile, "TemporaryFile", self.no_temporary_file)

    def no_temporary_file(self, *a: Any, **kw: Any) -> Any:
        raise AssertionError("a request body was spooled to a temporary file")

    def conn(self) -> Conn:
        return Conn(self.site)

    def depth(self, topic: str) -> int:
        t = self.nsqd.topics.get(topic)
        return 0 if t is None else t.depth()


class BodyLimitTests(SiteTestCase):
    opts = {"max_msg_size": 1000, "max_body_size": 5000}

    def test_content_length_over_the_limit_is_refused_at_once(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 314572800\r\n\r\n")
        code, headers, body = response(c.take())
        self.assertEqual((code, body), (413, b'{"message":"MSG_TOO_BIG"}'))
        self.assertEqual(headers[b"connection"], b"close")
        # what follows is not read into memory; the socket is not read any more
        self.assertEqual(c.transport.producerState, "paused")
        c.send(b"x" * 100_000)
        self.assertEqual(c.take(), b"")
        self.assertEqual(self.depth("t"), 0)

    def test_no_100_continue_for_a_refused_body(self):
        c = self.conn()
        c.send(b"POST /mpub?topic=t HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5001\r\n\r\n")
        out = c.take()
        self.assertTrue(out.startswith(b"HTTP/1.1 413 "), out)
        self.assertEqual(response(out)[2], b'{"message":"BODY_TOO_BIG"}')

    def test_100_continue_for_an_accepted_body(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        self.assertEqual(c.take(), b"HTTP/1.1 100 Continue\r\n\r\n")
        c.send(b"hello")
        self.assertEqual(response(c.take())[::2], (200, b"OK"))

    def test_chunked_body_read_up_to_the_limit_only(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        c.send(b"190\r\n" + b"x" * 400 + b"\r\n")
        c.send(b"190\r\n" + b"x" * 400 + b"\r\n")
        self.assertEqual(c.take(), b"")
        # 1200 bytes > --max-msg-size: answered without waiting for the last chunk
        c.send(b"190\r\n" + b"x" * 400 + b"\r\n")
        code, headers, body = response(c.take())
        self.assertEqual((code, body), (413, b'{"message":"MSG_TOO_BIG"}'))
        self.assertEqual(headers[b"connection"], b"close")
        c.send(b"190\r\n" + b"x" * 400 + b"\r\n0\r\n\r\n")
        self.assertEqual(c.take(), b"")

    def test_chunked_mpub_over_the_body_limit(self):
        c = self.conn()
        c.send(b"POST /mpub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        line = b"m" * 99 + b"\n"
        for _ in range(60):
            c.send(b"%x\r\n%s\r\n" % (len(line), line))
        self.assertEqual(response(c.take())[::2], (413, b'{"message":"BODY_TOO_BIG"}'))
        self.assertEqual(self.depth("t"), 0)

    def test_chunked_body_within_the_limit(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        c.send(b"5\r\nhello\r\n0\r\n\r\n")
        self.assertEqual(response(c.take())[::2], (200, b"OK"))
        self.assertEqual(self.depth("t"), 1)

    def test_body_of_exactly_the_limit_is_published(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000)
        self.assertEqual(response(c.take())[::2], (200, b"OK"))
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n" + b"x" * 1001)
        self.assertEqual(response(c.take())[::2], (413, b'{"message":"MSG_TOO_BIG"}'))


class LargeBodyTests(SiteTestCase):
    def test_large_bodies_stay_in_memory(self):
        c = self.conn()
        body = b"y" * 500_000
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 65536):
            c.send(body[i : i + 65536])
        self.assertEqual(response(c.take())[::2], (200, b"OK"))
        self.assertEqual(self.depth("t"), 1)

    def test_routes_without_a_body_do_not_keep_one(self):
        c = self.conn()
        c.send(b"POST /topic/create?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
        code, headers, _ = response(c.take())
        self.assertEqual(code, 200)
        self.assertNotIn(b"connection", headers)
        # keep-alive goes on
        c.send(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(response(c.take())[::2], (200, b"OK"))
        # a big one is not read: answered at once, then the connection closes
        c.send(b"POST /topic/create?topic=u HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\n")
        code, headers, _ = response(c.take())
        self.assertEqual((code, headers[b"connection"]), (200, b"close"))
        self.assertIn("u", self.nsqd.topics)

    def test_lingering_close_after_a_refusal(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 314572800\r\n\r\n")
        self.assertEqual(response(c.take())[0], 413)
        # the client gets time to read the answer before unread data resets the connection
        self.assertFalse(c.closed)
        self.clock.advance(http_channel.LINGER)
        self.assertTrue(c.closed)


class BadFramingTests(SiteTestCase):
    def assertGo400(self, request: bytes) -> None:
        c = self.conn()
        c.send(request)
        self.assertEqual(c.take(), GO_400)
        self.assertTrue(c.closed)

    def test_content_length_too_big_for_int64(self):
        self.assertGo400(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\nabc")
        self.assertGo400(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 9223372036854775808\r\n\r\n")

    def test_content_length_not_a_number(self):
        self.assertGo400(b'POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: " 3"\r\n\r\nabc')
        self.assertGo400(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc")
        self.assertGo400(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\nabc")
        self.assertGo400(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\nabc")

    def test_content_length_with_spaces_is_trimmed_as_go_does(self):
        # textproto trims a value's spaces and tabs, parseContentLength TrimString's it again
        for value in (b"  3 ", b"   3  ", b"\t3\t", b" \t 3"):
            c = self.conn()
            c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length:" + value + b"\r\n\r\nabc")
            self.assertEqual(response(c.take())[::2], (200, b"OK"), value)
            self.assertFalse(c.closed)
        self.assertEqual(self.depth("t"), 4)
        # the same value twice, spaced differently, is one value to Go
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length:  3 \r\n\r\nabc")
        self.assertEqual(response(c.take())[::2], (200, b"OK"))

    def test_content_length_forms_go_refuses(self):
        # strconv.ParseUint(v, 10, 63) after the trim: no sign, no base prefix, no inner space
        for value in (b"3 3", b"0x3", b"3_0", b"\x0b3", b"3\x0c"):
            self.assertGo400(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: " + value + b"\r\n\r\nabc")
        self.assertEqual(self.depth("t"), 0)

    def test_other_bad_requests_get_go_text(self):
        self.assertGo400(b"GET /ping HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n")
        self.assertGo400(b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc")

    def test_bad_requests_are_logged(self):
        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        self.assertGo400(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n")
        texts = [e.get("reason", "") for e in events if e.get("log_namespace") == "nsq_service.web"]
        self.assertTrue(any("Content-Length" in t for t in texts), events)

    def test_raw_non_utf8_in_the_query(self):
        # Go serves these: the raw bytes are the query's, as %-escaped ones would be
        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        c = self.conn()
        c.send(b"POST /pub?topic=\xff\xfe HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        code, headers, body = response(c.take())
        self.assertEqual((code, body), (400, b'{"message":"INVALID_TOPIC"}'))
        self.assertEqual(headers[b"x-nsq-content-type"], b"nsq; version=1.0")
        c.send(b"GET /stats?format=json&topic=\xc3\xa9\xff HTTP/1.1\r\nHost: x\r\n\r\n")
        code, _, body = response(c.take())
        self.assertEqual((code, json.loads(body)["topics"]), (200, None))  # Go's nil slice
        c.send(b"GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(response(c.take())[::2], (404, b'{"message":"NOT_FOUND"}'))
        self.assertFalse(c.closed)
        targets = [e.get("target") for e in events if e.get("log_namespace") == "nsq_service.web"]
        self.assertIn("/pub?topic=%FF%FE", targets)  # logged, as %-escapes
        self.assertIn("/stats?format=json&topic=%C3%A9%FF", targets)

    def test_control_bytes_in_the_target(self):
        self.assertGo400(b"GET /ping?a=\x7f HTTP/1.1\r\nHost: x\r\n\r\n")

    def test_unsupported_transfer_encoding(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n")
        self.assertEqual(
            c.take(),
            b"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Connection: close\r\n\r\nUnsupported transfer encoding",
        )


GO_500 = b'{"message":"INTERNAL_ERROR"}'


class CutShortTests(SiteTestCase):
    """A client that shuts its side down (``shutdown(SHUT_WR)``) before its request
    is whole. Go's handler reads the end of the stream: ``io.ReadAll`` of a body
    cut short fails (doPUB, doMPUB, doConfig: ``500 INTERNAL_ERROR``); after the
    answer Go's server finds the end and closes."""

    def cut(self, request: bytes) -> tuple[int, dict[bytes, bytes], bytes, Conn]:
        c = self.conn()
        c.send(request)
        self.assertEqual(c.take(), b"", "nothing is answered before the end")
        c.shut()
        code, headers, body = response(c.take())
        self.assertTrue(c.closed, "closed after the answer")
        return code, headers, body, c

    def test_content_length_body_cut_short(self):
        code, headers, body, _ = self.cut(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        self.assertEqual((code, body), (500, GO_500))
        self.assertEqual(headers[b"content-type"], b"application/json; charset=utf-8")
        self.assertEqual(headers[b"x-nsq-content-type"], b"nsq; version=1.0")
        # Go's handler read to the end of the declared body: nothing left to discard, no Connection header
        self.assertNotIn(b"connection", headers)
        self.assertEqual(self.depth("t"), 0)

    def test_chunked_body_cut_short(self):
        request = b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nabc"
        code, headers, body, _ = self.cut(request)
        self.assertEqual((code, body), (500, GO_500))
        # the chunked reader's error stays: Go's discard after the handler fails, so it says close
        self.assertEqual(headers[b"connection"], b"close")
        self.assertEqual(self.depth("t"), 0)

    def test_mpub_and_config_bodies_cut_short(self):
        for target in (b"/mpub?topic=t", b"/config/log_level"):
            method = b"PUT" if target.startswith(b"/config") else b"POST"
            request = method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\nab\ncd"
            code, _, body, _ = self.cut(request)
            self.assertEqual((code, body), (500, GO_500), target)
        self.assertEqual(self.depth("t"), 0)
        self.assertEqual(self.nsqd.opts.log_level, "info")

    def test_binary_mpub_cut_short_is_a_short_body(self):
        # readMPUB reads what it needs: the end inside a message is E_BAD_MESSAGE (413)
        data = (1).to_bytes(4, "big") + (10).to_bytes(4, "big") + b"abc"
        request = b"POST /mpub?topic=t&binary=true HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + data
        code, headers, body, _ = self.cut(request)
        self.assertEqual((code, body), (413, b'{"message":"BAD_MESSAGE"}'))
        self.assertNotIn(b"connection", headers)
        self.assertEqual(self.depth("t"), 0)
        # the one message its count announces arrived whole: published, as readMPUB does
        data = (1).to_bytes(4, "big") + (3).to_bytes(4, "big") + b"abc"
        request = b"POST /mpub?topic=t&binary=true HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + data
        code, headers, body, _ = self.cut(request)
        self.assertEqual((code, body, headers[b"connection"]), (200, b"OK", b"close"))
        self.assertEqual(self.depth("t"), 1)

    def test_a_route_that_reads_no_body_answers_as_usual(self):
        # doCreateTopic parses the query alone (getTopicFromQuery) and never reads the
        # body; the discard after it fails: Connection: close
        request = b"POST /topic/create?topic=u HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"
        code, headers, body, _ = self.cut(request)
        self.assertEqual((code, body, headers[b"connection"]), (200, b"", b"close"))
        self.assertIn("u", self.nsqd.topics)

    def test_routes_that_read_the_body_with_their_query_get_400(self):
        # Go's http_api.NewReqParams reads the whole body after the query: INVALID_REQUEST
        self.nsqd.get_topic("t")
        targets = (
            b"POST /channel/create?topic=t&channel=c",
            b"POST /topic/empty?topic=t",
            b"POST /topic/pause?topic=t",
            b"POST /topic/delete?topic=t",
            b"GET /stats?format=json",
        )
        for target in targets:
            code, headers, body, _ = self.cut(target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
            self.assertEqual((code, body), (400, b'{"message":"INVALID_REQUEST"}'), target)
            self.assertNotIn(b"connection", headers)
        request = b"POST /topic/delete?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nabc"
        code, headers, body, _ = self.cut(request)
        self.assertEqual((code, body, headers[b"connection"]), (400, b'{"message":"INVALID_REQUEST"}', b"close"))
        topic = self.nsqd.topics["t"]
        self.assertEqual((list(topic.channels), topic.paused), ([], False), "nothing done")

    def test_a_whole_request_then_the_end(self):
        c = self.conn()
        pub = b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        c.send(pub + b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\n")  # the last one cut short
        c.shut()
        out = c.take()
        self.assertEqual(out.count(b"HTTP/1.1 200 OK\r\n"), 2, out)
        self.assertTrue(out.endswith(GO_400), out)
        self.assertTrue(c.closed)
        self.assertEqual(self.depth("t"), 1)

    def test_the_end_between_requests_closes_in_silence(self):
        c = self.conn()
        c.send(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(response(c.take())[::2], (200, b"OK"))
        c.shut()
        self.assertEqual(c.take(), b"")
        self.assertTrue(c.closed)
        c = self.conn()
        c.send(b"\r\n")
        c.shut()
        self.assertEqual(c.take(), b"")
        self.assertTrue(c.closed)

    def test_request_line_or_headers_cut_short_get_400(self):
        # readRequest turns the end after the first line into ErrUnexpectedEOF: Go answers 400
        for partial in (b"GET /pi", b"GET /ping HTTP/1.1\r\nHost: x\r\n", b"POST /pub?topic=t HTTP/1.1\r\nContent-Le"):
            c = self.conn()
            c.send(partial)
            c.shut()
            self.assertEqual(c.take(), GO_400, partial)
            self.assertTrue(c.closed)
        self.assertEqual(self.depth("t"), 0)

    def test_an_answer_on_its_way_is_written_before_the_close(self):
        # a durable publish is answered once fsynced: the end arrives before that
        synced: defer.Deferred = defer.Deferred()
        publish = self.nsqd.publish
        self.patch(self.nsqd, "publish", lambda *a: (publish(*a), synced)[1])
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        c.shut()
        self.assertEqual(c.take(), b"")
        self.assertFalse(c.closed)
        synced.callback(None)
        code, headers, body = response(c.take())
        self.assertEqual((code, body), (200, b"OK"))
        self.assertNotIn(b"connection", headers)
        self.assertTrue(c.closed)

    def test_a_refused_body_then_the_end(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 314572800\r\n\r\nabc")
        self.assertEqual(response(c.take())[::2], (413, b'{"message":"MSG_TOO_BIG"}'))
        c.shut()
        self.assertEqual(c.take(), b"")
        self.clock.advance(http_channel.LINGER)
        self.assertTrue(c.closed)


GO_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n431 Request Header Fields Too Large"
)


class GoEdgeTests(SiteTestCase):
    """Requests Go answers that twisted, left alone, closed in silence, refused,
    or left waiting for a deadline."""

    def answer(self, request: bytes) -> tuple[int, bytes]:
        c = self.conn()
        c.send(request)
        code, _, body = response(c.take())
        return code, body

    def test_a_long_request_line(self):
        query = "&".join(f"p{i}=v" for i in range(2_500)).encode()  # 20 KB: twisted closed at 16 KB
        self.assertEqual(self.answer(b"GET /ping?" + query + b" HTTP/1.1\r\nHost: x\r\n\r\n"), (200, b"OK"))

    def test_past_go_header_bytes_431(self):
        c = self.conn()
        c.send(b"GET /ping?" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 1000 + b"\r\n")
        self.assertEqual(c.take(), GO_431)
        self.assertEqual(c.transport.producerState, "paused", "nothing more is read")
        c = self.conn()
        c.send(b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"v" * ((1 << 20) + 5000) + b"\r\n\r\n")
        self.assertEqual(c.take(), GO_431)

    def test_many_headers(self):
        headers = b"".join(b"X-H%d: v\r\n" % i for i in range(600))  # twisted refused more than 500
        self.assertEqual(self.answer(b"GET /ping HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"), (200, b"OK"))
        c = self.conn()
        c.send(b"GET /ping HTTP/1.1\r\n" + b"X: v\r\n" * 10_001 + b"\r\n")
        self.assertEqual(c.take(), GO_431)

    def test_bare_lf_line_endings(self):
        self.assertEqual(self.answer(b"GET /ping HTTP/1.1\nHost: x\n\n"), (200, b"OK"))
        self.assertEqual(self.answer(b"POST /pub?topic=t HTTP/1.1\nHost: x\nContent-Length: 3\n\nabc"), (200, b"OK"))
        self.assertEqual(self.depth("t"), 1)

    def test_the_same_content_length_twice(self):
        request = b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"
        self.assertEqual(self.answer(request), (200, b"OK"))
        self.assertEqual(self.depth("t"), 1)

    def test_absolute_form_target(self):
        request = b"POST http://example.com:4151/pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        self.assertEqual(self.answer(request), (200, b"OK"))
        self.assertEqual(self.answer(b"GET HTTPS://example.com HTTP/1.1\r\nHost: x\r\n\r\n")[0], 404)
        self.assertEqual(self.answer(b"GET http://h?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")[0], 404)
        self.assertEqual(self.depth("t"), 1)

    def test_a_chunk_size_go_refuses_is_refused_at_once(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\nabc" % (1 << 80))
        self.assertEqual(c.take(), GO_400)
        self.assertTrue(c.closed)
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        self.assertEqual(response(c.take())[::2], (200, b"OK"))


class DeadlineTests(SiteTestCase):
    def test_values(self):
        # documented in docs/http-api.md and docs/operator-guide.md
        self.assertEqual((self.site.header_timeout, self.site.body_timeout, self.site.idle_timeout), (10, 60, 120))

    def test_dripping_headers_do_not_extend_the_deadline(self):
        c = self.conn()
        c.send(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Drip: ")
        for _ in range(self.site.header_timeout - 1):
            self.clock.advance(1)
            c.send(b"a")
        self.assertFalse(c.closed)
        self.clock.advance(1)
        self.assertTrue(c.closed)
        self.assertEqual(c.take(), b"")  # as Go: no answer to a request never finished

    def test_silent_connection_closed_at_the_header_deadline(self):
        c = self.conn()
        self.clock.advance(self.site.header_timeout - 0.1)
        self.assertFalse(c.closed)
        self.clock.advance(0.1)
        self.assertTrue(c.closed)

    def test_dripping_body_gets_408(self):
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n")
        for _ in range(self.site.body_timeout - 1):
            self.clock.advance(1)
            c.send(b"a")
        self.assertFalse(c.closed)
        self.assertEqual(c.take(), b"")
        self.clock.advance(1)
        self.assertEqual(
            c.take(),
            b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Connection: close\r\n\r\n408 Request Timeout",
        )
        self.clock.advance(http_channel.LINGER)
        self.assertTrue(c.closed)
        self.assertEqual(self.depth("t"), 0)

    def test_keep_alive_idle_then_next_request(self):
        c = self.conn()
        c.send(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(response(c.take())[::2], (200, b"OK"))
        # the header deadline of the next request starts with its first byte
        self.clock.advance(self.site.idle_timeout - 1)
        self.assertFalse(c.closed)
        c.send(b"GET /pi")
        self.clock.advance(self.site.header_timeout - 1)
        c.send(b"ng HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(response(c.take())[::2], (200, b"OK"))
        self.clock.advance(self.site.idle_timeout)
        self.assertTrue(c.closed)

    def test_a_long_request_is_not_cut(self):
        c = self.conn()
        c.send(b"GET /debug/pprof/profile?seconds=200 HTTP/1.1\r\nHost: x\r\n\r\n")
        self.clock.advance(199)
        self.assertFalse(c.closed)
        self.clock.advance(1)
        self.assertEqual(response(c.take())[0], 200)
        self.assertFalse(c.closed)

    def test_pipelined_requests(self):
        c = self.conn()
        c.send(
            b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\nPOST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
        )
        out = c.take()
        self.assertEqual(out.count(b"HTTP/1.1 200 OK"), 2)
        self.assertEqual(self.depth("t"), 1)

    def test_timeouts_are_logged_rate_limited(self):
        events: list[dict] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        conns = [self.conn() for _ in range(50)]
        self.clock.advance(self.site.header_timeout)
        self.assertTrue(all(c.closed for c in conns))
        self.clock.advance(60)
        lines = [e["text"] for e in events if e.get("log_namespace") == "nsq_service.web" and "text" in e]
        self.assertLessEqual(len(lines), 2, lines)
        self.assertIn("no complete request headers within 10s", lines[0])
        self.assertIn("49", lines[-1])
        self.assertTrue(all(e["log_level"] == LogLevel.info for e in events if e.get("text") in lines))


class ProfileTests(SiteTestCase):
    def test_client_gone_mid_profile_turns_the_profiler_off(self):
        c = self.conn()
        c.send(b"GET /debug/pprof/profile?seconds=1000 HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIsNotNone(sys.getprofile())
        c.lose()
        self.assertIsNone(sys.getprofile())
        # and the next profile runs
        c = self.conn()
        c.send(b"GET /debug/pprof/profile?seconds=2 HTTP/1.1\r\nHost: x\r\n\r\n")
        self.clock.advance(2)
        self.assertEqual(response(c.take())[0], 200)
        self.assertIsNone(sys.getprofile())

    def test_busy_profiler_answers_as_go(self):
        first = self.conn()
        first.send(b"GET /debug/pprof/profile?seconds=5 HTTP/1.1\r\nHost: x\r\n\r\n")
        c = self.conn()
        c.send(b"GET /debug/pprof/profile HTTP/1.1\r\nHost: x\r\n\r\n")
        code, headers, body = response(c.take())
        self.assertEqual((code, body), (500, b"Could not enable CPU profiling: cpu profiling already in use\n"))
        self.assertEqual(headers[b"x-go-pprof"], b"1")
        self.clock.advance(5)
        self.assertEqual(response(first.take())[0], 200)
        self.assertIsNone(sys.getprofile())


class LifetimeTests(SiteTestCase):
    def test_an_answered_request_lets_its_connection_go(self):
        """Klein keeps each request in a self-referencing closure until a GC
        collection; once answered, the request no longer holds its connection,
        headers or body, so all of that is freed at once."""
        gc.disable()
        self.addCleanup(gc.enable)
        c = self.conn()
        c.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello")
        self.assertEqual(response(c.take())[0], 200)
        c.lose()
        gone = [weakref.ref(c.proto), weakref.ref(c.transport)]
        del c
        self.assertEqual([ref() for ref in gone], [None, None])
        self.assertEqual(self.depth("t"), 1)
