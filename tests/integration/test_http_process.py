"""The HTTP API of a real nsqd process: HTTPS, non-HTTP clients, statsd, Prometheus, peek."""

from __future__ import annotations

import base64
import json
import os
import socket

import treq
from treq.client import HTTPClient
from twisted.internet import defer, protocol, reactor, ssl
from twisted.internet.task import deferLater
from twisted.trial import unittest
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool

from nsq_client.twisted_client import Consumer
from tests.certs import make_certs
from tests.integration.procs import ServerProcess

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")


class HTTPProcessTestCase(unittest.TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)

    def start(self, *args: str, wait_for: tuple[str, ...] = ("TCP", "HTTP")) -> ServerProcess:
        proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.dir, *args).start(wait_for)
        self.addCleanup(proc.kill)
        return proc


class PlainHTTPTests(HTTPProcessTestCase):
    def test_non_http_bytes_get_400_at_once(self) -> None:
        proc = self.start()
        host, port = proc.addresses["HTTP"].rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"  V2")
        data = s.recv(1000)
        s.close()
        self.assertTrue(data.startswith(b"HTTP/1.1 400 Bad Request\r\n"), data)
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b"\r\n\r\nOK", s.recv(1000))
        s.close()

    @defer.inlineCallbacks
    def test_pub_over_http_then_consume_over_tcp(self):
        proc = self.start()
        http = proc.addresses["HTTP"]
        resp = yield treq.post(f"http://{http}/pub?topic=web", b"from curl", persistent=False)
        self.assertEqual((resp.code, (yield resp.content())), (200, b"OK"))
        resp = yield treq.post(f"http://{http}/mpub?topic=web", b"two\nthree", persistent=False)
        self.assertEqual(resp.code, 200)
        got: list[bytes] = []
        done: defer.Deferred = defer.Deferred()

        def handle(msg):
            got.append(msg.body)
            if len(got) == 3:
                done.callback(None)

        c = yield Consumer.connect(reactor, "127.0.0.1", proc.port(), "web", "c", handle, max_in_flight=10)
        yield done
        yield c.close()
        self.assertEqual(sorted(got), [b"from curl", b"three", b"two"])
        resp = yield treq.get(f"http://{http}/metrics", persistent=False)
        text = (yield resp.content()).decode()
        self.assertIn('nsq_topic_messages_total{topic="web"} 3.0', text)


@defer.inlineCallbacks
def get_json(url: str):
    resp = yield treq.get(url, persistent=False)
    content = yield resp.content()
    assert resp.code == 200, (url, resp.code, content)
    return json.loads(content)


@defer.inlineCallbacks
def eventually(check, timeout: float = 30.0):
    """Poll ``check()`` (a Deferred) until what it fires with is true; return that."""
    deadline = reactor.seconds() + timeout
    while True:
        found = yield check()
        if found:
            return found
        if reactor.seconds() >= deadline:
            raise AssertionError("condition not met in time")
        yield deferLater(reactor, 0.05, lambda: None)


class InspectProcessTests(HTTPProcessTestCase):
    """Beyond Go: peek, the oldest message's age and the delivery-to-FIN latency."""

    @defer.inlineCallbacks
    def test_peek_a_disk_backed_channel_then_consume_what_it_showed(self):
        proc = self.start("--mem-queue-size", "2", "--e2e-processing-latency-percentile", "0.99,0.5")
        http = f"http://{proc.addresses['HTTP']}"
        for path in ("/topic/create?topic=orders", "/channel/create?topic=orders&channel=billing"):
            resp = yield treq.post(f"{http}{path}", persistent=False)
            self.assertEqual(resp.code, 200)
            yield resp.content()
        bodies = [b"order %d" % i for i in range(6)]
        resp = yield treq.post(f"{http}/mpub?topic=orders", b"\n".join(bodies), persistent=False)
        self.assertEqual((yield resp.content()), b"OK")

        peek = yield get_json(f"{http}/channel/peek?topic=orders&channel=billing&n=1000")
        peeked = [(m["id"], base64.b64decode(m["body"])) for m in peek["messages"]]
        self.assertEqual(sorted(body for _, body in peeked), bodies)

        def billing():
            d = get_json(f"{http}/stats?format=json&topic=orders&channel=billing")
            return d.addCallback(lambda s: s["topics"][0]["channels"][0])

        channel = yield eventually(lambda: billing().addCallback(lambda c: c["oldest_message_age_ms"] > 0 and c))
        self.assertEqual((channel["depth"], channel["backend_depth"]), (6, 4), "peeking took nothing")
        self.assertEqual(
            channel["fin_latency"],
            {"count": 0, "percentiles": [{"quantile": 0.99, "value": 0.0}, {"quantile": 0.5, "value": 0.0}]},
        )

        metrics = yield self.metrics(http)
        self.assertGreater(metrics['nsq_channel_oldest_message_age_seconds{channel="billing",topic="orders"}'], 0)

        got = []
        all_in: defer.Deferred = defer.Deferred()

        def handle(msg):
            got.append((msg.id.decode(), msg.body))
            if len(got) == len(bodies):
                all_in.callback(None)

        consumer = yield Consumer.connect(reactor, "127.0.0.1", proc.port(), "orders", "billing", handle, 10)
        yield all_in
        yield consumer.close()
        self.assertEqual(got, peeked, "the consumer got what peek showed, in that order")

        channel = yield eventually(lambda: billing().addCallback(lambda c: c["fin_latency"]["count"] == 6 and c))
        self.assertEqual((channel["depth"], channel["oldest_message_age_ms"]), (0, 0))
        self.assertGreater(channel["fin_latency"]["percentiles"][0]["value"], 0)
        metrics = yield self.metrics(http)
        self.assertEqual(metrics['nsq_channel_oldest_message_age_seconds{channel="billing",topic="orders"}'], 0)
        self.assertGreater(
            metrics['nsq_channel_fin_latency_seconds{channel="billing",quantile="0.99",topic="orders"}'], 0
        )

    @defer.inlineCallbacks
    def metrics(self, http: str):
        """/metrics as {name and labels: value}."""
        resp = yield treq.get(f"{http}/metrics", persistent=False)
        text = (yield resp.content()).decode()
        lines = [line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")]
        return {key: float(value) for key, value in lines}

    @defer.inlineCallbacks
    def test_a_topic_without_channels(self):
        proc = self.start("--mem-queue-size", "1")
        http = f"http://{proc.addresses['HTTP']}"
        resp = yield treq.post(f"{http}/mpub?topic=dead", b"a\nb\nc", persistent=False)
        yield resp.content()
        peek = yield get_json(f"{http}/topic/peek?topic=dead&n=2")
        self.assertEqual(sorted(base64.b64decode(m["body"]) for m in peek["messages"]), [b"a", b"b"])

        def dead():
            d = get_json(f"{http}/stats?format=json&topic=dead")
            return d.addCallback(lambda s: s["topics"][0])

        topic = yield eventually(lambda: dead().addCallback(lambda t: t["oldest_message_age_ms"] > 0 and t))
        self.assertEqual((topic["depth"], topic["backend_depth"]), (3, 2))
        resp = yield treq.get(f"{http}/topic/peek?topic=dead&n=1001", persistent=False)
        self.assertEqual((resp.code, (yield resp.content())), (400, b'{"message":"INVALID_N"}'))


def exchange(address: str, request: bytes, timeout: float = 10.0) -> bytes:
    """Send a raw request and read until nsqd closes or a whole answer is in."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
            head, sep, body = out.partition(b"\r\n\r\n")
            length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
            if sep and length and len(body) >= int(length[0].split(b":")[1]):
                return out


class GoEdgeProcessTests(HTTPProcessTestCase):
    def test_requests_go_answers_are_answered(self) -> None:
        """Before: closed in silence (a request line over 16 KB), 400 (over 500
        headers, the same Content-Length twice), waiting for the 10 s header
        deadline (bare LF) or the 60 s body deadline (a chunk size of 2^80), 404 (an
        absolute-form target). Go answers each at once."""
        proc = self.start()
        http = proc.addresses["HTTP"]
        query = "&".join(f"p{i}=v" for i in range(10_000)).encode()
        ok = [
            b"GET /ping?" + query + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(600)) + b"\r\n",
            b"GET /ping HTTP/1.1\nHost: x\n\n",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            b"POST http://example.com/pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
        ]
        for request in ok:
            answer = exchange(http, request)
            self.assertTrue(answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nOK"), answer[:200])
        answer = exchange(http, b"GET /ping?" + b"a" * (2 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200])
        chunked = b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\nabc" % (1 << 80)
        self.assertTrue(exchange(http, chunked, timeout=5).startswith(b"HTTP/1.1 400 Bad Request\r\n"))
        self.assertEqual(proc.stop(), 0)


def until_closed(address: str, request: bytes, timeout: float = 10.0) -> bytes:
    """Send a raw request, shut the write side (``shutdown(SHUT_WR)``: the end of
    the request's bytes) and read until the server closes; a server that leaves
    the connection open fails (socket.timeout)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def head_and_body(answer: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    return status, {k.lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines)}, body


GO_500 = b'{"message":"INTERNAL_ERROR"}'


class CutShortProcessTests(HTTPProcessTestCase):
    """Issue 34 (6): a spaced Content-Length is served, and a body whose client shut
    its side down before the body was whole gets Go's 500 and a close."""

    def test_nsqd(self) -> None:
        proc = self.start()
        http = proc.addresses["HTTP"]
        answer = exchange(http, b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length:  3 \r\n\r\nabc")
        self.assertTrue(answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nOK"), answer)
        cut = {
            "chunked": b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nabc",
            "length": b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc",
        }
        for kind, request in cut.items():
            status, headers, body = head_and_body(until_closed(http, request))
            self.assertEqual((status, body), (b"HTTP/1.1 500 Internal Server Error", GO_500), kind)
            self.assertEqual(headers[b"content-type"], b"application/json; charset=utf-8")
            self.assertEqual(headers[b"x-nsq-content-type"], b"nsq; version=1.0")
            self.assertEqual(headers.get(b"connection"), b"close" if kind == "chunked" else None, kind)
        self.assertTrue(exchange(http, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n").endswith(b"\r\n\r\nOK"))
        stats = json.loads(
            head_and_body(exchange(http, b"GET /stats?format=json&topic=t HTTP/1.1\r\nHost: x\r\n\r\n"))[2]
        )
        self.assertEqual(stats["topics"][0]["depth"], 1, "the spaced one only")
        self.assertEqual(proc.stop(), 0)

    def test_nsqlookupd(self) -> None:
        proc = ServerProcess("nsqlookupd", *LOOPBACK).start(("TCP", "HTTP"))
        self.addCleanup(proc.kill)
        http = proc.addresses["HTTP"]
        spaced = b"POST /topic/create?topic=a HTTP/1.1\r\nHost: x\r\nContent-Length:  3 \r\n\r\nabc"
        self.assertTrue(exchange(http, spaced).startswith(b"HTTP/1.1 200 OK\r\n"))
        # Go's doCreateTopic reads the body after the query (http_api.NewReqParams)
        cut = b"POST /topic/create?topic=b HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"
        status, headers, body = head_and_body(until_closed(http, cut))
        self.assertEqual((status, body), (b"HTTP/1.1 400 Bad Request", b'{"message":"INVALID_REQUEST"}'))
        self.assertNotIn(b"connection", headers)
        # /topics reads no body: answered, and Connection: close (Go's discard after it fails)
        cut = b"GET /topics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nabc"
        status, headers, _ = head_and_body(until_closed(http, cut))
        self.assertEqual((status, headers[b"connection"]), (b"HTTP/1.1 200 OK", b"close"))
        # beyond Go: PUT /config reads its body as Go's routes do
        cut = b"PUT /config/log_level HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nwarn"
        status, _, body = head_and_body(until_closed(http, cut))
        self.assertEqual((status, body), (b"HTTP/1.1 500 Internal Server Error", GO_500))
        topics = head_and_body(exchange(http, b"GET /topics HTTP/1.1\r\nHost: x\r\n\r\n"))[2]
        self.assertEqual(json.loads(topics)["topics"], ["a"])
        level = head_and_body(exchange(http, b"GET /config/log_level HTTP/1.1\r\nHost: x\r\n\r\n"))[2]
        self.assertEqual(level, b"2", "still info: the cut PUT changed nothing")
        self.assertEqual(proc.stop(), 0)


class HTTPSTests(HTTPProcessTestCase):
    @defer.inlineCallbacks
    def test_https(self):
        certs = make_certs(os.path.join(self.dir, "certs"))
        proc = self.start(
            "--tls-cert",
            certs.cert,
            "--tls-key",
            certs.key,
            "--https-address",
            "127.0.0.1:0",
            wait_for=("TCP", "HTTP", "HTTPS"),
        )
        with open(certs.ca, "rb") as f:
            trust = ssl.Certificate.loadPEM(f.read())
        pool = HTTPConnectionPool(reactor, persistent=False)
        client = HTTPClient(Agent(reactor, BrowserLikePolicyForHTTPS(trustRoot=trust), pool=pool))
        https = proc.addresses["HTTPS"]
        resp = yield client.get(f"https://{https}/ping")
        self.assertEqual((resp.code, (yield resp.content())), (200, b"OK"))
        resp = yield client.get(f"https://{https}/info")
        self.assertEqual(resp.code, 200)

    @defer.inlineCallbacks
    def test_tls_required_refuses_plain_http(self):
        certs = make_certs(os.path.join(self.dir, "certs"))
        proc = self.start(
            "--tls-cert",
            certs.cert,
            "--tls-key",
            certs.key,
            "--https-address",
            "127.0.0.1:0",
            "--tls-required",
            wait_for=("TCP", "HTTP", "HTTPS"),
        )
        https_port = proc.port("HTTPS")
        resp = yield treq.get(f"http://{proc.addresses['HTTP']}/ping", persistent=False)
        body = yield resp.content()
        self.assertEqual((resp.code, body), (403, b'{"message": "TLS_REQUIRED", "https_port": %d}' % https_port))


class StatsdReceiver(protocol.DatagramProtocol):
    def __init__(self) -> None:
        self.packets: list[bytes] = []
        self.waiting: defer.Deferred | None = None

    def datagramReceived(self, data: bytes, addr) -> None:  # type: ignore[no-untyped-def]
        self.packets.append(data)
        seen = b"".join(self.packets)
        if self.waiting is not None and b"topic.s.channel.c.depth:1|g" in seen and b"mem.gc_runs" in seen:
            d, self.waiting = self.waiting, None
            d.callback(None)


class StatsdTests(HTTPProcessTestCase):
    @defer.inlineCallbacks
    def test_statsd_receives_go_metric_names(self):
        receiver = StatsdReceiver()
        port = reactor.listenUDP(0, receiver, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        receiver.waiting = defer.Deferred()
        proc = self.start(
            "--statsd-address",
            f"127.0.0.1:{port.getHost().port}",
            "--statsd-interval",
            "1s",
            "--statsd-prefix",
            "nsq.%s",
            "--broadcast-address",
            "testhost",
        )
        http = proc.addresses["HTTP"]
        for path in ("/topic/create?topic=s", "/channel/create?topic=s&channel=c", "/pub?topic=s"):
            resp = yield treq.post(f"http://{http}{path}", b"x", persistent=False)
            yield resp.content()
        yield receiver.waiting
        text = b"".join(receiver.packets).decode()
        prefix = f"nsq.testhost_{proc.port('HTTP')}."
        self.assertIn(f"{prefix}topic.s.message_count:1|c\n", text)
        self.assertIn(f"{prefix}topic.s.channel.c.depth:1|g\n", text)
        self.assertIn(f"{prefix}mem.heap_objects:", text)
        self.assertTrue(all(len(p) <= 508 for p in receiver.packets))
