"""nsqd's lookup loop against nsqlookupd over loopback."""

from __future__ import annotations

import json
import struct

import treq
from twisted.internet import defer, protocol, reactor
from twisted.internet.task import deferLater
from twisted.trial import unittest

from lookupd_tw.options import NSQLookupdOptions
from lookupd_tw.tap import makeService as make_lookupd
from tests.helpers import InProcessNSQD

GO_IDENTIFY = b'{"broadcast_address":"127.0.0.1","hostname":"vm","http_port":24171,"tcp_port":24170,"version":"1.3.0"}'


class RecordingLookupd(protocol.Protocol):
    """A stand-in nsqlookupd that records what nsqd sends and answers as Go's does."""

    def connectionMade(self) -> None:
        self.buf = b""
        self.factory.sessions.append(self)
        self.commands: list[bytes] = []
        self.identify_body = b""

    def dataReceived(self, data: bytes) -> None:
        self.buf += data
        if self.buf[:4] == b"  V1":
            self.buf = self.buf[4:]
        while b"\n" in self.buf:
            line, rest = self.buf.split(b"\n", 1)
            if line == b"IDENTIFY":
                if len(rest) < 4:
                    return
                (n,) = struct.unpack(">i", rest[:4])
                if len(rest) < 4 + n:
                    return
                self.identify_body, self.buf = rest[4 : 4 + n], rest[4 + n :]
                answer = GO_IDENTIFY
            else:
                self.buf = rest
                answer = b"OK"
            self.commands.append(line)
            self.transport.write(struct.pack(">i", len(answer)) + answer)
            waiting = self.factory.waiting
            while waiting and waiting[0][0] <= len(self.commands):
                waiting.pop(0)[1].callback(self)

    def wait_for(self, n: int) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        if len(self.commands) >= n:
            d.callback(self)
        else:
            self.factory.waiting.append((n, d))
        return d


class LookupTests(unittest.TestCase):
    timeout = 30

    def fake_lookupd(self):
        factory = protocol.Factory.forProtocol(RecordingLookupd)
        factory.sessions = []
        factory.waiting = []
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return factory, port.getHost().port

    @defer.inlineCallbacks
    def connected(self, factory, n: int = 1):
        while not factory.sessions:
            yield deferLater(reactor, 0.01, lambda: None)
        session = factory.sessions[-1]
        yield session.wait_for(n)
        return session

    def nsqd(self, *lookupds: int, **kw) -> InProcessNSQD:
        server = InProcessNSQD(
            lookupd_tcp_addresses=[f"127.0.0.1:{p}" for p in lookupds], broadcast_address="127.0.0.1", **kw
        ).start()
        self.addCleanup(server.stop)
        return server

    @defer.inlineCallbacks
    def post(self, server: InProcessNSQD, path: str):
        resp = yield treq.post(f"http://127.0.0.1:{server.http_port}{path}", b"", persistent=False)
        yield resp.content()
        return resp.code

    @defer.inlineCallbacks
    def test_same_commands_as_go_nsqd(self):
        factory, port = self.fake_lookupd()
        server = self.nsqd(port)
        session = yield self.connected(factory)
        body = json.loads(session.identify_body)
        self.assertEqual(list(body), ["broadcast_address", "hostname", "http_port", "tcp_port", "version"])
        self.assertEqual(
            (body["broadcast_address"], body["tcp_port"], body["http_port"], body["version"]),
            ("127.0.0.1", server.tcp_port, server.http_port, "1.3.0"),
        )
        # the calls made to Go nsqd when its session was recorded
        for path in (
            "/topic/create?topic=gt",
            "/channel/create?topic=gt&channel=gc",
            "/channel/create?topic=gt&channel=ge%23ephemeral",
            "/channel/delete?topic=gt&channel=gc",
            "/topic/delete?topic=gt",
        ):
            yield self.post(server, path)
        yield session.wait_for(7)
        self.assertEqual(
            session.commands,
            [
                b"IDENTIFY",
                b"REGISTER gt",
                b"REGISTER gt gc",
                b"REGISTER gt ge#ephemeral",
                b"UNREGISTER gt gc",
                b"UNREGISTER gt",
                b"UNREGISTER gt ge#ephemeral",
            ],
        )

    @defer.inlineCallbacks
    def test_reconnect_registers_everything_again(self):
        factory, port = self.fake_lookupd()
        server = self.nsqd(port)
        first = yield self.connected(factory)
        yield self.post(server, "/topic/create?topic=a")
        yield self.post(server, "/channel/create?topic=a&channel=c")
        yield self.post(server, "/topic/create?topic=b")
        yield first.wait_for(4)
        first.transport.loseConnection()
        while len(factory.sessions) < 2:
            yield deferLater(reactor, 0.05, lambda: None)
        second = yield self.connected(factory, 3)
        self.assertEqual(second.commands, [b"IDENTIFY", b"REGISTER a c", b"REGISTER b"])

    @defer.inlineCallbacks
    def test_peers_change_live(self):
        factory, port = self.fake_lookupd()
        server = self.nsqd()
        resp = yield treq.put(
            f"http://127.0.0.1:{server.http_port}/config/nsqlookupd_tcp_addresses",
            json.dumps([f"127.0.0.1:{port}"]).encode(),
            persistent=False,
        )
        self.assertEqual((yield resp.content()), json.dumps([f"127.0.0.1:{port}"]).replace(" ", "").encode())
        session = yield self.connected(factory)
        self.assertEqual(session.commands, [b"IDENTIFY"])
        yield treq.put(f"http://127.0.0.1:{server.http_port}/config/nsqlookupd_tcp_addresses", b"[]", persistent=False)
        while session.transport.connected:
            yield deferLater(reactor, 0.02, lambda: None)

    @defer.inlineCallbacks
    def put_lookupds(self, server: InProcessNSQD, addresses: list[str]):
        resp = yield treq.put(
            f"http://127.0.0.1:{server.http_port}/config/nsqlookupd_tcp_addresses",
            json.dumps(addresses).encode(),
            persistent=False,
        )
        content = yield resp.content()
        return resp.code, content

    @defer.inlineCallbacks
    def test_junk_address_refuses_the_whole_value(self):
        factory, port = self.fake_lookupd()
        server = self.nsqd()
        code, content = yield self.put_lookupds(server, ["junk", f"127.0.0.1:{port}"])
        self.assertEqual((code, content), (400, b'{"message":"INVALID_VALUE"}'))
        self.assertEqual(server.nsqd.opts.lookupd_tcp_addresses, [])
        # a repeated address is one peer, as in Go
        code, _ = yield self.put_lookupds(server, [f"127.0.0.1:{port}", f"127.0.0.1:{port}"])
        self.assertEqual(code, 200)
        session = yield self.connected(factory)
        self.assertEqual(session.commands, [b"IDENTIFY"])
        self.assertEqual(len(factory.sessions), 1)

    @defer.inlineCallbacks
    def test_channels_are_created_from_lookupd_before_messages_flow(self):
        lookupd = make_lookupd(
            NSQLookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", broadcast_address="127.0.0.1"),
            reactor,
        )
        lookupd.privilegedStartService()
        lookupd.startService()
        self.addCleanup(lookupd.stopService)
        tcp, http = lookupd.lookupd.tcp_address[1], lookupd.lookupd.http_address[1]
        resp = yield treq.post(
            f"http://127.0.0.1:{http}/channel/create?topic=pre&channel=archive", b"", persistent=False
        )
        yield resp.content()
        yield treq.post(
            f"http://127.0.0.1:{http}/channel/create?topic=pre&channel=tail%23ephemeral", b"", persistent=False
        ).addCallback(lambda r: r.content())
        server = self.nsqd(tcp)
        while not lookupd.lookupd.db.find_producers("client", "", ""):
            yield deferLater(reactor, 0.02, lambda: None)
        resp = yield treq.post(f"http://127.0.0.1:{server.http_port}/pub?topic=pre", b"early", persistent=False)
        self.assertEqual((yield resp.content()), b"OK")
        topic = server.nsqd.topics["pre"]
        while not topic.started:
            yield deferLater(reactor, 0.02, lambda: None)
        self.assertEqual(list(topic.channels), ["archive"], "ephemeral channels are not pre-created")
        self.assertEqual(topic.channels["archive"].depth(), 1)


class PeerInfoLogTests(unittest.TestCase):
    def test_logged_as_go_prints_the_struct(self):
        from nsqd_tw.lookup import go_peer_info

        info = {
            "broadcast_address": "10.0.0.2",
            "hostname": "h",
            "http_port": 4161,
            "tcp_port": 4160,
            "version": "1.3.0",
        }
        self.assertEqual(go_peer_info(info), "{TCPPort:4160 HTTPPort:4161 Version:1.3.0 BroadcastAddress:10.0.0.2}")
        self.assertEqual(go_peer_info({}), "{TCPPort:0 HTTPPort:0 Version: BroadcastAddress:}")
