"""Every route of the HTTP API and its error paths, in memory with StubTreq."""

from __future__ import annotations

import json
import struct
import sys

from treq.testing import StubTreq
from twisted.internet import defer
from twisted.trial import unittest

from nsq_service.listen import Bound
from nsq_service.web import QueryError, parse_query
from nsqd_tw.http.api import NSQDHTTPAPI
from tests.helpers import FakeClient, make_nsqd
from tests.nsqd_tw.test_channel import FakeConsumer

NSQ_HEADER = ["nsq; version=1.0"]


class HTTPTestCase(unittest.TestCase):
    opts: dict = {}

    def setUp(self) -> None:
        self.nsqd = make_nsqd(**self.opts)
        self.bound = Bound(tcp=("127.0.0.1", 4150), http=("127.0.0.1", 4151))
        self.api = NSQDHTTPAPI(self.nsqd, self.bound)
        self.treq = StubTreq(self.api.resource())

    @defer.inlineCallbacks
    def call(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        resp = yield self.treq.request(method, "http://nsqd" + path, data=body, headers=headers, allow_redirects=False)
        content = yield resp.content()
        return resp, content

    @defer.inlineCallbacks
    def assertError(self, method: str, path: str, code: int, message: str, body: bytes = b""):
        resp, content = yield self.call(method, path, body)
        self.assertEqual((resp.code, content), (code, json.dumps({"message": message}, separators=(",", ":")).encode()))
        self.assertEqual(resp.headers.getRawHeaders("content-type"), ["application/json; charset=utf-8"])
        self.assertEqual(resp.headers.getRawHeaders("x-nsq-content-type"), NSQ_HEADER)

    @defer.inlineCallbacks
    def assertEmpty(self, method: str, path: str):
        resp, content = yield self.call(method, path)
        self.assertEqual((resp.code, content), (200, b""))
        self.assertIsNone(resp.headers.getRawHeaders("content-type"))
        self.assertEqual(resp.headers.getRawHeaders("x-nsq-content-type"), NSQ_HEADER)


class QueryTests(unittest.TestCase):
    def test_go_parse_query(self) -> None:
        self.assertEqual(
            parse_query(b"topic=a&topic=b&x=%41+b&flag"), {"topic": ["a", "b"], "x": ["A b"], "flag": [""]}
        )
        self.assertRaises(QueryError, parse_query, b"topic=%zz")
        self.assertRaises(QueryError, parse_query, b"topic=a;b=c")


class RoutingTests(HTTPTestCase):
    @defer.inlineCallbacks
    def test_ping(self):
        resp, content = yield self.call("GET", "/ping")
        self.assertEqual((resp.code, content), (200, b"OK"))
        self.assertEqual(resp.headers.getRawHeaders("content-type"), ["text/plain; charset=utf-8"])
        self.assertIsNone(resp.headers.getRawHeaders("x-nsq-content-type"))
        self.assertIsNone(resp.headers.getRawHeaders("server"))

    @defer.inlineCallbacks
    def test_host_header_that_is_not_utf8(self):
        """Go's answer, as nsqlookupd's (Klein answered 400 Non-UTF-8 encoding in URL and logged a traceback)."""
        for path in ("/ping", "/%ff"):
            resp, content = yield self.call("GET", path, headers={b"Host": [b"\xff"]})
            self.assertEqual((resp.code, resp.phrase), (400, b"Bad Request: malformed Host header"))
            self.assertEqual(content, b"400 Bad Request: malformed Host header")

    @defer.inlineCallbacks
    def test_ping_unhealthy(self):
        self.nsqd.set_health(OSError("disk full"))
        resp, content = yield self.call("GET", "/ping")
        self.assertEqual((resp.code, content), (500, b"NOK - disk full"))

    @defer.inlineCallbacks
    def test_not_found(self):
        yield self.assertError("GET", "/nope", 404, "NOT_FOUND")

    @defer.inlineCallbacks
    def test_method_not_allowed(self):
        resp, _ = yield self.call("POST", "/ping")
        self.assertEqual(resp.headers.getRawHeaders("allow"), ["GET, OPTIONS"])
        yield self.assertError("POST", "/ping", 405, "METHOD_NOT_ALLOWED")
        resp, _ = yield self.call("HEAD", "/stats")
        self.assertEqual(resp.code, 405)
        yield self.assertError("GET", "/pub?topic=t", 405, "METHOD_NOT_ALLOWED")

    @defer.inlineCallbacks
    def test_options(self):
        resp, content = yield self.call("OPTIONS", "/config/log_level")
        self.assertEqual((resp.code, content), (200, b""))
        self.assertEqual(resp.headers.getRawHeaders("allow"), ["GET, PUT, OPTIONS"])

    @defer.inlineCallbacks
    def test_redirects(self):
        resp, content = yield self.call("GET", "/ping/")
        self.assertEqual((resp.code, resp.headers.getRawHeaders("location")), (301, ["/ping"]))
        self.assertEqual(content, b'<a href="/ping">Moved Permanently</a>.\n\n')
        resp, _ = yield self.call("POST", "/TOPIC/CREATE?topic=x")
        self.assertEqual((resp.code, resp.headers.getRawHeaders("location")), (307, ["/topic/create?topic=x"]))
        # httprouter's CleanPath (Klein's werkzeug answered 308 to an absolute URL)
        for path, target in (("//ping", "/ping"), ("/debug/./pprof", "/debug/pprof/"), ("/x/../stats", "/stats")):
            resp, _ = yield self.call("GET", path)
            self.assertEqual((resp.code, resp.headers.getRawHeaders("location")), (301, [target]), path)

    @defer.inlineCallbacks
    def test_info(self):
        _resp, content = yield self.call("GET", "/info")
        data = json.loads(content)
        self.assertEqual(
            list(data),
            [
                "version",
                "broadcast_address",
                "hostname",
                "http_port",
                "tcp_port",
                "start_time",
                "max_heartbeat_interval",
                "max_output_buffer_size",
                "max_output_buffer_timeout",
                "max_deflate_level",
            ],
        )
        self.assertEqual((data["tcp_port"], data["http_port"], data["version"]), (4150, 4151, "1.3.0"))
        self.assertEqual((data["max_heartbeat_interval"], data["max_output_buffer_timeout"]), (60 * 10**9, 30 * 10**9))


class PublishTests(HTTPTestCase):
    @defer.inlineCallbacks
    def test_pub(self):
        c = FakeConsumer(1, rdy=10)
        self.nsqd.get_topic("t").get_channel("c").add_client(c)
        resp, content = yield self.call("POST", "/pub?topic=t", b"hello")
        self.assertEqual((resp.code, content), (200, b"OK"))
        self.assertEqual(resp.headers.getRawHeaders("x-nsq-content-type"), NSQ_HEADER)
        self.assertEqual([m.body for m in c.got], [b"hello"])

    @defer.inlineCallbacks
    def test_pub_errors(self):
        yield self.assertError("POST", "/pub?topic=t", 400, "MSG_EMPTY")
        yield self.assertError("POST", "/pub", 400, "MISSING_ARG_TOPIC", b"x")
        yield self.assertError("POST", "/pub?topic=bad!", 400, "INVALID_TOPIC", b"x")
        yield self.assertError("POST", "/pub?topic=t&defer=abc", 400, "INVALID_DEFER", b"x")
        yield self.assertError("POST", "/pub?topic=t&defer=-1", 400, "INVALID_DEFER", b"x")
        yield self.assertError("POST", "/pub?topic=t&defer=3600001", 400, "INVALID_DEFER", b"x")
        yield self.assertError("POST", "/pub?topic=t", 413, "MSG_TOO_BIG", b"x" * (1024 * 1024 + 1))
        yield self.assertError("POST", "/pub?topic=%zz", 400, "INVALID_REQUEST", b"x")

    @defer.inlineCallbacks
    def test_pub_defer(self):
        ch = self.nsqd.get_topic("t").get_channel("c")
        resp, _ = yield self.call("POST", "/pub?topic=t&defer=1500", b"later")
        self.assertEqual(resp.code, 200)
        self.assertEqual(len(ch.deferred), 1)

    @defer.inlineCallbacks
    def test_mpub_text(self):
        ch = self.nsqd.get_topic("t").get_channel("c")
        resp, content = yield self.call("POST", "/mpub?topic=t", b"one\n\ntwo\nthree")
        self.assertEqual((resp.code, content), (200, b"OK"))
        self.assertEqual([m.body for m in ch.queued()], [b"one", b"two", b"three"])

    @defer.inlineCallbacks
    def test_mpub_binary(self):
        ch = self.nsqd.get_topic("t").get_channel("c")
        body = struct.pack(">I", 2) + struct.pack(">I", 3) + b"abc" + struct.pack(">I", 1) + b"d"
        resp, _ = yield self.call("POST", "/mpub?topic=t&binary=true", body)
        self.assertEqual(resp.code, 200)
        self.assertEqual([m.body for m in ch.queued()], [b"abc", b"d"])

    @defer.inlineCallbacks
    def test_mpub_errors(self):
        yield self.assertError("POST", "/mpub", 400, "MISSING_ARG_TOPIC", b"x")
        yield self.assertError("POST", "/mpub?topic=t", 413, "MSG_TOO_BIG", b"x" * (1024 * 1024 + 1))
        yield self.assertError("POST", "/mpub?topic=t&binary=1", 413, "BAD_BODY", struct.pack(">I", 0))
        yield self.assertError("POST", "/mpub?topic=t&binary=1", 413, "BAD_MESSAGE", struct.pack(">II", 1, 0))
        yield self.assertError("POST", "/mpub?topic=t&binary=1", 413, "BAD_MESSAGE", struct.pack(">II", 1, 5) + b"ab")

    @defer.inlineCallbacks
    def test_mpub_body_too_big(self):
        self.nsqd.opts.max_body_size = 10
        yield self.assertError("POST", "/mpub?topic=t", 413, "BODY_TOO_BIG", b"x" * 11)


class TopicChannelTests(HTTPTestCase):
    @defer.inlineCallbacks
    def test_topic_lifecycle(self):
        yield self.assertEmpty("POST", "/topic/create?topic=t")
        self.assertIn("t", self.nsqd.topics)
        yield self.assertEmpty("POST", "/topic/pause?topic=t")
        self.assertTrue(self.nsqd.topics["t"].paused)
        yield self.assertEmpty("POST", "/topic/unpause?topic=t")
        self.assertFalse(self.nsqd.topics["t"].paused)
        self.nsqd.publish("t", [b"x", b"y"])
        yield self.assertEmpty("POST", "/topic/empty?topic=t")
        self.assertEqual(self.nsqd.topics["t"].depth(), 0)
        yield self.assertEmpty("POST", "/topic/delete?topic=t")
        self.assertNotIn("t", self.nsqd.topics)

    @defer.inlineCallbacks
    def test_topic_errors(self):
        for route in ("create", "delete", "empty", "pause", "unpause"):
            yield self.assertError("POST", f"/topic/{route}", 400, "MISSING_ARG_TOPIC")
        yield self.assertError("POST", "/topic/create?topic=bad!", 400, "INVALID_TOPIC")
        yield self.assertError("POST", "/topic/empty?topic=bad!", 400, "INVALID_TOPIC")
        for route in ("delete", "empty", "pause", "unpause"):
            yield self.assertError("POST", f"/topic/{route}?topic=nope", 404, "TOPIC_NOT_FOUND")

    @defer.inlineCallbacks
    def test_channel_lifecycle(self):
        self.nsqd.get_topic("t")
        yield self.assertEmpty("POST", "/channel/create?topic=t&channel=c")
        ch = self.nsqd.topics["t"].channels["c"]
        yield self.assertEmpty("POST", "/channel/pause?topic=t&channel=c")
        self.assertTrue(ch.paused)
        yield self.assertEmpty("POST", "/channel/unpause?topic=t&channel=c")
        self.assertFalse(ch.paused)
        self.nsqd.publish("t", [b"x"])
        yield self.assertEmpty("POST", "/channel/empty?topic=t&channel=c")
        self.assertEqual(ch.depth(), 0)
        yield self.assertEmpty("POST", "/channel/delete?topic=t&channel=c")
        self.assertNotIn("c", self.nsqd.topics["t"].channels)

    @defer.inlineCallbacks
    def test_channel_errors(self):
        self.nsqd.get_topic("t")
        for route in ("create", "delete", "empty", "pause", "unpause"):
            yield self.assertError("POST", f"/channel/{route}?channel=c", 400, "MISSING_ARG_TOPIC")
            yield self.assertError("POST", f"/channel/{route}?topic=bad!", 400, "INVALID_ARG_TOPIC")
            yield self.assertError("POST", f"/channel/{route}?topic=t", 400, "MISSING_ARG_CHANNEL")
            yield self.assertError("POST", f"/channel/{route}?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL")
            yield self.assertError("POST", f"/channel/{route}?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND")
        for route in ("delete", "empty", "pause", "unpause"):
            yield self.assertError("POST", f"/channel/{route}?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND")


class ConfigTests(HTTPTestCase):
    @defer.inlineCallbacks
    def test_get(self):
        for opt, body in [
            ("log_level", b"2"),
            ("nsqlookupd_tcp_addresses", b"[]"),
            ("msg_timeout", b"60000000000"),
            ("tls_min_version", b"769"),
            ("tls_required", b"0"),
            ("id", b"1"),
            ("mem_queue_size", b"10000"),
            ("statsd_prefix", b'"nsq.%s"'),
            ("deflate", b"true"),
        ]:
            resp, content = yield self.call("GET", f"/config/{opt}")
            self.assertEqual((resp.code, content), (200, body), opt)
            self.assertEqual(resp.headers.getRawHeaders("content-type"), ["application/json; charset=utf-8"])
        yield self.assertError("GET", "/config/nope", 400, "INVALID_OPTION")
        yield self.assertError("GET", "/config/queue_scan_interval", 400, "INVALID_OPTION")

    @defer.inlineCallbacks
    def test_put(self):
        changed = []
        self.nsqd.observe_options(changed.append)
        resp, content = yield self.call("PUT", "/config/nsqlookupd_tcp_addresses", b'["127.0.0.1:4160"]')
        self.assertEqual((resp.code, content), (200, b'["127.0.0.1:4160"]'))
        self.assertEqual(self.nsqd.opts.lookupd_tcp_addresses, ["127.0.0.1:4160"])
        resp, content = yield self.call("PUT", "/config/log_level", b"debug")
        self.assertEqual((resp.code, content), (200, b"1"))
        self.assertEqual(changed, ["lookupd_tcp_addresses", "log_level"])
        yield self.call("PUT", "/config/log_level", b"info")

    @defer.inlineCallbacks
    def test_put_errors(self):
        yield self.assertError("PUT", "/config/log_level", 413, "INVALID_VALUE")
        yield self.assertError("PUT", "/config/log_level", 400, "INVALID_VALUE", b"loud")
        yield self.assertError("PUT", "/config/nsqlookupd_tcp_addresses", 400, "INVALID_VALUE", b"{nope")
        yield self.assertError("PUT", "/config/nsqlookupd_tcp_addresses", 400, "INVALID_VALUE", b"[1]")
        yield self.assertError("PUT", "/config/msg_timeout", 400, "INVALID_OPTION", b"1")

    @defer.inlineCallbacks
    def test_put_lookupd_addresses_all_or_nothing(self):
        changed = []
        self.nsqd.observe_options(changed.append)
        self.nsqd.opts.lookupd_tcp_addresses = ["127.0.0.1:4160"]
        for bad in (
            ["junk", "127.0.0.1:4161"],
            ["127.0.0.1:4161", "127.0.0.1"],
            ["::1:4161"],
            ["127.0.0.1:"],
            ["127.0.0.1:http"],
            ["127.0.0.1:65536"],
            ["[::1:4161"],
            [""],
        ):
            yield self.assertError(
                "PUT", "/config/nsqlookupd_tcp_addresses", 400, "INVALID_VALUE", json.dumps(bad).encode()
            )
            self.assertEqual(self.nsqd.opts.lookupd_tcp_addresses, ["127.0.0.1:4160"], bad)
        self.assertEqual(changed, [])
        good = ["[::1]:4161", "localhost:4162", ":4163", "127.0.0.1:4160"]
        resp, content = yield self.call("PUT", "/config/nsqlookupd_tcp_addresses", json.dumps(good).encode())
        self.assertEqual((resp.code, json.loads(content)), (200, good))
        self.assertEqual(changed, ["lookupd_tcp_addresses"])


class StatsTests(HTTPTestCase):
    opts = {"e2e_processing_latency_percentiles": [0.99, 0.5]}

    @defer.inlineCallbacks
    def test_json_shape(self):
        consumer = FakeClient(self.nsqd)
        consumer.identify(client_id="cons", hostname="h2", user_agent="ua/2")
        consumer.sub("t1", "c1", rdy=5)
        producer = FakeClient(self.nsqd)
        producer.identify(client_id="prod", hostname="h1", user_agent="ua/1")
        producer.pub("t1", b"hello")
        producer.pub("t2", b"hello")
        (msg,) = consumer.messages()
        self.nsqd.reactor.advance(0.25)
        consumer.fin(msg.id)
        _resp, content = yield self.call("GET", "/stats?format=json")
        data = json.loads(content)
        self.assertEqual(list(data), ["version", "health", "start_time", "topics", "memory", "producers"])
        t1, t2 = data["topics"]
        self.assertEqual(
            list(t1),
            [
                "topic_name",
                "channels",
                "depth",
                "backend_depth",
                "message_count",
                "message_bytes",
                "paused",
                "e2e_processing_latency",
                # beyond Go, after Go's keys
                "memory_bytes",
                "backend_bytes",
                "oldest_message_age_ms",
                "fin_latency",
                "expired_count",
                "dropped_count",
            ],
        )
        self.assertEqual((t1["memory_bytes"], t1["backend_bytes"]), (0, 0))
        c1 = t1["channels"][0]
        self.assertEqual(
            list(c1)[-8:],
            [
                "e2e_processing_latency",
                "memory_bytes",
                "backend_bytes",
                "oldest_message_age_ms",
                "fin_latency",
                "dead_letter_count",
                "expired_count",
                "dropped_count",
            ],
        )
        self.assertEqual(c1["channel_name"], "c1")
        self.assertEqual((c1["message_count"], c1["client_count"]), (1, 1))
        e2e = c1["e2e_processing_latency"]
        self.assertEqual(e2e["count"], 1)
        self.assertEqual([p["quantile"] for p in e2e["percentiles"]], [0.99, 0.5])
        self.assertLess(abs(e2e["percentiles"][0]["value"] - 0.25e9), 0.25e9 * 0.02)  # DDSketch: 1% accurate
        self.assertEqual(t2["channels"], [])
        self.assertEqual(t2["e2e_processing_latency"], {"count": 0, "percentiles": None})
        client = c1["clients"][0]
        self.assertEqual((client["client_id"], client["state"], client["finish_count"]), ("cons", 3, 1))
        self.assertNotIn("pub_counts", client)
        (prod,) = data["producers"]
        self.assertEqual(prod["pub_counts"], [{"topic": "t1", "count": 1}])  # one topic, as Go reports
        self.assertEqual(next(iter(data["memory"])), "heap_objects")

    @defer.inlineCallbacks
    def test_filters(self):
        self.nsqd.get_topic("t1").get_channel("c1")
        self.nsqd.get_topic("t2")
        _, content = yield self.call("GET", "/stats?format=json&include_clients=false&include_mem=false&topic=t1")
        data = json.loads(content)
        self.assertNotIn("memory", data)
        self.assertEqual(data["producers"], None)
        self.assertEqual([t["topic_name"] for t in data["topics"]], ["t1"])
        self.assertIsNone(data["topics"][0]["channels"][0]["clients"])
        _, content = yield self.call("GET", "/stats?format=json&topic=nope")
        self.assertIsNone(json.loads(content)["topics"])
        _, content = yield self.call("GET", "/stats?format=json&topic=t1&channel=nope")
        self.assertEqual(json.loads(content)["topics"], [])

    @defer.inlineCallbacks
    def test_text(self):
        self.nsqd.get_topic("t1").get_channel("c1").pause()
        resp, content = yield self.call("GET", "/stats?include_mem=false")
        text = content.decode()
        self.assertEqual(resp.headers.getRawHeaders("content-type"), ["text/plain; charset=utf-8"])
        self.assertRegex(
            text, r"^nsqd v1\.3\.0 \(built w/python3\.\d+\.\d+\)\nstart_time \S+\nuptime \S+\n\nHealth: OK\n"
        )
        self.assertIn(
            "\nTopics:\n   [t1             ] depth: 0     be-depth: 0     msgs: 0        e2e%: 0.0ns, 0.0ns\n", text
        )
        self.assertIn("   *P [c1                       ] depth: 0     be-depth: 0     inflt: 0    def: 0    ", text)
        self.assertTrue(text.endswith("\nProducers: None\n"))


class TLSRequiredTests(HTTPTestCase):
    @defer.inlineCallbacks
    def test_http_refused_when_tls_required(self):
        from nsqd_tw.options import TLS_REQUIRED

        self.nsqd.opts.tls_required = TLS_REQUIRED
        self.bound.https = ("127.0.0.1", 4152)
        resp, content = yield self.call("GET", "/ping")
        self.assertEqual((resp.code, content), (403, b'{"message": "TLS_REQUIRED", "https_port": 4152}'))


class DebugTests(HTTPTestCase):
    @defer.inlineCallbacks
    def test_endpoints(self):
        for path, needle in [
            ("/debug/pprof/", b"goroutine"),
            ("/debug/pprof/goroutine?debug=2", b"thread "),
            ("/debug/pprof/heap", b"gc-tracked objects"),
            ("/debug/pprof/threadcreate", b"threadcreate profile"),
            ("/debug/pprof/symbol", b"num_symbols: 0"),
        ]:
            resp, content = yield self.call("GET", path)
            self.assertEqual(resp.code, 200, path)
            self.assertIn(needle, content, path)
        resp, _ = yield self.call("POST", "/debug/freememory")
        self.assertEqual(resp.code, 200)
        resp, content = yield self.call("PUT", "/debug/setblockrate?rate=x")
        self.assertEqual(resp.code, 400)

    @defer.inlineCallbacks
    def test_profile_for_n_seconds(self):
        d = self.call("GET", "/debug/pprof/profile?seconds=2")
        self.nsqd.reactor.advance(1)
        busy, _busy_content = yield self.call("GET", "/debug/pprof/profile?seconds=1")
        self.assertEqual(busy.code, 500)
        self.assertNoResult(d)
        self.nsqd.reactor.advance(1.1)
        self.treq.flush()
        resp, content = yield d
        self.assertEqual(resp.code, 200)
        self.assertIn(b"function calls", content)

    @defer.inlineCallbacks
    def test_profile_seconds_read_as_go_does(self):
        # Go: a base-10 int64, else (or if <= 0) 30 s; the profiler always stops
        for raw in ("nan", "inf", "1e300", "-5", "0", "1.5", "abc", ""):
            d = self.call("GET", f"/debug/pprof/profile?seconds={raw}")
            self.nsqd.reactor.advance(29.9)
            self.assertNoResult(d)
            self.nsqd.reactor.advance(0.2)
            self.treq.flush()
            resp, content = yield d
            self.assertEqual(resp.code, 200, raw)
            self.assertIn(b"function calls", content)
            self.assertFalse(self.api.profiling)
            self.assertIsNone(sys.getprofile())

    @defer.inlineCallbacks
    def test_profile_seconds_overflowing_go_duration_end_at_once(self):
        # seconds * time.Second wraps around in Go: a duration <= 0 does not wait
        d = self.call("GET", "/debug/pprof/profile?seconds=9223372037")
        self.nsqd.reactor.advance(0)
        self.treq.flush()
        resp, _ = yield d
        self.assertEqual(resp.code, 200)
        self.assertIsNone(sys.getprofile())
