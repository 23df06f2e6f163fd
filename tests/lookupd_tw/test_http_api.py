"""nsqlookupd's HTTP API in memory, with the bodies Go nsqlookupd 1.3 answers."""

from __future__ import annotations

import json

from treq.testing import StubTreq
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from lookupd_tw.http_api import LookupdHTTPAPI
from lookupd_tw.nsqlookupd import NSQLookupd
from lookupd_tw.options import NSQLookupdOptions
from lookupd_tw.registration_db import PeerInfo, Producer, Registration


class LookupdHTTPTests(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_800_000_000)
        self.lookupd = NSQLookupd(NSQLookupdOptions(inactive_producer_timeout=300, tombstone_lifetime=45), self.clock)
        self.treq = StubTreq(LookupdHTTPAPI(self.lookupd).resource())
        self.peer = self.register("127.0.0.1:36924", ("t", "c"), ("t", ""))

    def register(self, peer_id: str, *keys: tuple[str, str]) -> PeerInfo:
        info = PeerInfo(
            id=peer_id,
            remote_address=peer_id,
            hostname="h",
            broadcast_address="127.0.0.1",
            tcp_port=4150,
            http_port=4151,
            version="1.3.0",
            last_update=self.clock.seconds(),
        )
        db = self.lookupd.db
        db.add_producer(Registration("client", "", ""), Producer(info))
        for topic, channel in keys:
            if channel:
                db.add_producer(Registration("channel", topic, channel), Producer(info))
            db.add_producer(Registration("topic", topic, ""), Producer(info))
        return info

    @defer.inlineCallbacks
    def get(self, method: str, path: str):
        resp = yield self.treq.request(method, "http://lookupd" + path, allow_redirects=False)
        content = yield resp.content()
        return resp.code, content

    @defer.inlineCallbacks
    def test_go_bodies(self):
        producer = (
            '{"remote_address":"127.0.0.1:36924","hostname":"h","broadcast_address":"127.0.0.1",'
            '"tcp_port":4150,"http_port":4151,"version":"1.3.0"'
        )
        for method, path, code, body in [
            ("GET", "/ping", 200, "OK"),
            ("GET", "/info", 200, '{"version":"1.3.0"}'),
            ("GET", "/lookup?topic=t", 200, '{"channels":["c"],"producers":[' + producer + "}]}"),
            ("GET", "/lookup?topic=nope", 404, '{"message":"TOPIC_NOT_FOUND"}'),
            ("GET", "/lookup", 400, '{"message":"MISSING_ARG_TOPIC"}'),
            ("GET", "/topics", 200, '{"topics":["t"]}'),
            ("GET", "/channels?topic=t", 200, '{"channels":["c"]}'),
            ("GET", "/channels", 400, '{"message":"MISSING_ARG_TOPIC"}'),
            ("GET", "/nodes", 200, '{"producers":[' + producer + ',"tombstones":[false],"topics":["t"]}]}'),
            ("POST", "/topic/create?topic=bad!", 400, '{"message":"INVALID_ARG_TOPIC"}'),
            ("POST", "/topic/create?topic=new", 200, ""),
            ("POST", "/channel/create?topic=new&channel=nc", 200, ""),
            ("POST", "/channel/delete?topic=new&channel=zz", 404, '{"message":"CHANNEL_NOT_FOUND"}'),
            ("POST", "/channel/create?topic=new&channel=bad!", 400, '{"message":"INVALID_ARG_CHANNEL"}'),
            ("POST", "/channel/create?topic=new", 400, '{"message":"MISSING_ARG_CHANNEL"}'),
            ("POST", "/topic/tombstone?topic=t", 400, '{"message":"MISSING_ARG_NODE"}'),
            ("POST", "/topic/delete", 400, '{"message":"MISSING_ARG_TOPIC"}'),
            ("POST", "/lookup?topic=t", 405, '{"message":"METHOD_NOT_ALLOWED"}'),
            ("GET", "/nope", 404, '{"message":"NOT_FOUND"}'),
        ]:
            got = yield self.get(method, path)
            self.assertEqual(got, (code, body.encode()), f"{method} {path}")

    @defer.inlineCallbacks
    def test_urls_that_are_not_utf8(self):
        """Go answers them; Klein answered 400 and logged a traceback."""
        for method, path in [("GET", "/%ff"), ("GET", "/ping/%ff"), ("POST", "/%ff/x"), ("GET", "/config/%ff")]:
            got = yield self.get(method, path)
            self.assertEqual(got, (404, b'{"message":"NOT_FOUND"}'), f"{method} {path}")
        resp = yield self.treq.get("http://lookupd/ping", headers={b"Host": [b"\xff"]})
        self.assertEqual(resp.code, 400)
        self.assertEqual(resp.phrase, b"Bad Request: malformed Host header")
        self.assertEqual((yield resp.content()), b"400 Bad Request: malformed Host header")

    @defer.inlineCallbacks
    def test_create_and_delete(self):
        yield self.get("POST", "/channel/create?topic=new&channel=nc")
        _, topics = yield self.get("GET", "/topics")
        self.assertEqual(json.loads(topics)["topics"], ["t", "new"])
        _, channels = yield self.get("GET", "/channels?topic=new")
        self.assertEqual(json.loads(channels)["channels"], ["nc"])
        yield self.get("POST", "/topic/delete?topic=new")
        _, topics = yield self.get("GET", "/topics")
        self.assertEqual(json.loads(topics)["topics"], ["t"])

    @defer.inlineCallbacks
    def test_tombstone(self):
        code, _ = yield self.get("POST", "/topic/tombstone?topic=t&node=127.0.0.1:4151")
        self.assertEqual(code, 200)
        _, body = yield self.get("GET", "/lookup?topic=t")
        self.assertEqual(json.loads(body)["producers"], [])
        _, body = yield self.get("GET", "/nodes")
        self.assertEqual(json.loads(body)["producers"][0]["tombstones"], [True])
        self.clock.advance(46)
        self.peer.last_update = self.clock.seconds()
        _, body = yield self.get("GET", "/lookup?topic=t")
        self.assertEqual(len(json.loads(body)["producers"]), 1, "the tombstone lifetime is over")

    @defer.inlineCallbacks
    def test_inactive_producers_are_dropped(self):
        self.clock.advance(301)
        _, body = yield self.get("GET", "/lookup?topic=t")
        self.assertEqual(json.loads(body)["producers"], [])
        _, body = yield self.get("GET", "/nodes")
        self.assertEqual(json.loads(body)["producers"], [])

    @defer.inlineCallbacks
    def test_debug(self):
        _, body = yield self.get("GET", "/debug")
        data = json.loads(body)
        self.assertEqual(sorted(data), ["channel:t:c", "client::", "topic:t:"])
        entry = data["topic:t:"][0]
        self.assertEqual(
            list(entry),
            [
                "broadcast_address",
                "hostname",
                "http_port",
                "id",
                "last_update",
                "tcp_port",
                "tombstoned",
                "tombstoned_at",
                "version",
            ],
        )
        self.assertEqual(entry["tombstoned_at"], -6795364578871345152)

    @defer.inlineCallbacks
    def test_config(self):
        self.assertEqual((yield self.get("GET", "/config/inactive_producer_timeout")), (200, b"300000000000"))
        self.assertEqual((yield self.get("GET", "/config/nope")), (400, b'{"message":"INVALID_OPTION"}'))
        resp = yield self.treq.put("http://lookupd/config/log_level", data=b"warn")
        self.assertEqual((resp.code, (yield resp.content())), (200, b"3"))
        yield self.treq.put("http://lookupd/config/log_level", data=b"info")


class LookupdSiteTests(unittest.TestCase):
    """The channel's bounds hold for nsqlookupd's site too."""

    def setUp(self) -> None:
        from lookupd_tw.http_api import make_site

        self.clock = Clock()
        self.lookupd = NSQLookupd(NSQLookupdOptions(), self.clock)
        self.site = make_site(self.lookupd)

    def test_body_over_the_config_limit_answered_at_once(self):
        from tests.nsqd_tw.test_web import Conn, response

        c = Conn(self.site)
        c.send(b"PUT /config/log_level HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\n")
        code, headers, body = response(c.take())
        self.assertEqual((code, body, headers[b"connection"]), (413, b'{"message":"INVALID_VALUE"}', b"close"))

    def test_header_deadline(self):
        from tests.nsqd_tw.test_web import Conn

        c = Conn(self.site)
        for _ in range(9):
            self.clock.advance(1)
            c.send(b"G")
        self.assertFalse(c.closed)
        self.clock.advance(1)
        self.assertTrue(c.closed)

    def test_a_body_cut_short(self):
        """A client that shuts its side down before its body is whole: a route that
        reads its query with http_api.NewReqParams reads the body too (400
        INVALID_REQUEST), /topics reads none (200, then close); PUT /config reads it
        (500)."""
        from tests.nsqd_tw.test_web import Conn, response

        targets = (b"POST /topic/create?topic=b", b"POST /channel/create?topic=b&channel=c", b"GET /lookup?topic=b")
        for target in targets:
            c = Conn(self.site)
            c.send(target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
            c.shut()
            code, headers, body = response(c.take())
            self.assertEqual((code, body), (400, b'{"message":"INVALID_REQUEST"}'), target)
            self.assertNotIn(b"connection", headers)
            self.assertTrue(c.closed)
        self.assertEqual(self.lookupd.db.find_registrations("topic", "b", ""), [])
        c = Conn(self.site)
        c.send(b"GET /topics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        c.shut()
        code, headers, _ = response(c.take())
        self.assertEqual((code, headers[b"connection"]), (200, b"close"))
        self.assertTrue(c.closed)
        c = Conn(self.site)
        c.send(b"PUT /config/log_level HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nwarn")
        c.shut()
        code, _, body = response(c.take())
        self.assertEqual((code, body), (500, b'{"message":"INTERNAL_ERROR"}'))
        self.assertTrue(c.closed)
