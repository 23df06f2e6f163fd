"""nsqd's lookup loop: in memory against a recording nsqlookupd, and once against the real one over 127.0.0.1."""

from __future__ import annotations

import json
import struct
from typing import Any

import treq
from treq.testing import StubTreq
from twisted.internet import defer, protocol, reactor
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.task import deferLater
from twisted.trial import unittest
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from lookupd_tw.options import NSQLookupdOptions
from lookupd_tw.tap import makeService as make_lookupd
from nsq_wire.frames import FRAME_TYPE_RESPONSE
from nsqd_tw.core.message import Message
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.lookup import LookupService
from tests.helpers import FakeClient, InProcessNSQD, MemoryNetwork, make_nsqd

OK = (FRAME_TYPE_RESPONSE, b"OK")

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
    """nsqd's lookup peers in memory: the endpoints LookupService takes connect
    to RecordingLookupds through twisted.test.iosim."""

    def setUp(self) -> None:
        self.net = MemoryNetwork()
        self.lookupds: dict[int, protocol.Factory] = {}
        self.channels: dict[str, list[str]] = {}  # what the lookupds' /channels answers
        self.asked: list[bytes] = []
        self.hold = False  # /channels answers only at release()
        self.held: list[Any] = []

    def fake_lookupd(self, port: int = 4160) -> protocol.Factory:
        factory = protocol.Factory.forProtocol(RecordingLookupd)
        factory.sessions = []
        factory.waiting = []
        self.lookupds[port] = factory
        return factory

    def endpoint(self, host: str, port: int) -> IStreamClientEndpoint:
        return self.net.endpoint(self.lookupds.get(port))  # none there: refused

    def nsqd(self, *lookupds: int, **kw) -> NSQD:
        nsqd = make_nsqd(
            clock=self.net.reactor,
            lookupd_tcp_addresses=[f"127.0.0.1:{p}" for p in lookupds],
            broadcast_address="127.0.0.1",
            broadcast_tcp_port=4150,
            broadcast_http_port=4151,
            **kw,
        )
        test = self

        class Channels(Resource):
            isLeaf = True

            def render_GET(self, request: Any) -> Any:
                test.asked.append(request.uri)
                if test.hold:
                    test.held.append(request)
                    return NOT_DONE_YET
                return test.answer(request)

        self.stub = StubTreq(Channels())
        self.lookup = LookupService(nsqd, self.endpoint, self.stub)
        self.lookup.startService()
        self.addCleanup(self.stop)
        self.net.settle()
        return nsqd

    def answer(self, request: Any) -> bytes:
        topic = request.args[b"topic"][0].decode()
        return json.dumps({"channels": self.channels.get(topic, [])}).encode()

    def release(self) -> None:
        """The lookupds answer the /channels queries held so far."""
        held, self.held = self.held, []
        for request in held:
            request.write(self.answer(request))
            request.finish()
        self.stub.flush()

    def stop(self) -> None:
        d = self.lookup.stopService()
        self.net.settle()  # the connections close
        self.successResultOf(d)

    def test_same_commands_as_go_nsqd(self):
        factory = self.fake_lookupd()
        nsqd = self.nsqd(4160)
        (session,) = factory.sessions
        body = json.loads(session.identify_body)
        self.assertEqual(list(body), ["broadcast_address", "hostname", "http_port", "tcp_port", "version"])
        self.assertEqual(
            (body["broadcast_address"], body["tcp_port"], body["http_port"], body["version"]),
            ("127.0.0.1", 4150, 4151, "1.3.0"),
        )
        # what the HTTP API's /topic/create, /channel/create... (the calls made
        # to Go nsqd when its session was recorded) do
        topic = nsqd.get_topic("gt")
        topic.get_channel("gc")
        topic.get_channel("ge#ephemeral")
        topic.delete_existing_channel("gc")
        nsqd.delete_existing_topic("gt")
        self.net.settle()
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

    def test_pings_every_15_seconds(self):
        factory = self.fake_lookupd()
        self.nsqd(4160)
        self.net.advance(31, step=1.0)
        self.assertEqual(factory.sessions[0].commands, [b"IDENTIFY", b"PING", b"PING"])

    def test_reconnect_registers_everything_again(self):
        factory = self.fake_lookupd()
        nsqd = self.nsqd(4160)
        nsqd.get_topic("a").get_channel("c")
        nsqd.get_topic("b")
        self.net.settle()
        first = factory.sessions[0]
        self.assertEqual(len(first.commands), 4)
        first.transport.loseConnection()
        self.net.advance(2.0)  # the retry after the backoff (0.2 s and up to 1 s of jitter)
        self.assertEqual(len(factory.sessions), 2)
        self.assertEqual(factory.sessions[1].commands, [b"IDENTIFY", b"REGISTER a c", b"REGISTER b"])

    def test_peers_change_live(self):
        factory = self.fake_lookupd()
        nsqd = self.nsqd()
        self.assertEqual(factory.sessions, [])
        # what PUT /config/nsqlookupd_tcp_addresses does once the value is valid
        nsqd.opts.lookupd_tcp_addresses = ["127.0.0.1:4160"]
        nsqd.options_changed("lookupd_tcp_addresses")
        self.net.settle()
        (session,) = factory.sessions
        self.assertEqual(session.commands, [b"IDENTIFY"])
        nsqd.opts.lookupd_tcp_addresses = []
        nsqd.options_changed("lookupd_tcp_addresses")
        self.net.settle()
        self.assertTrue(session.transport.disconnected)

    def test_a_repeated_address_is_one_peer(self):
        factory = self.fake_lookupd()
        self.nsqd(4160, 4160)  # as in Go
        self.assertEqual(len(self.lookup.peers), 1)
        self.assertEqual([s.commands for s in factory.sessions], [[b"IDENTIFY"]])

    def test_channels_are_created_from_lookupd(self):
        self.fake_lookupd()
        self.channels["pre"] = ["archive", "tail#ephemeral"]
        nsqd = self.nsqd(4160)
        topic = nsqd.get_topic("pre")
        self.net.settle()
        self.assertEqual(self.asked, [b"/channels?topic=pre"])
        self.assertTrue(topic.started)
        self.assertEqual(list(topic.channels), ["archive"], "ephemeral channels are not pre-created")

    def test_the_publish_that_creates_a_topic_is_answered_once_its_channels_exist(self):
        """As Go's GetTopic returns only then: a client that publishes, then
        subscribes, finds the topic flowing. Its RDY has its message at once, with
        the lookupd's answers to the channel's REGISTER not even read yet."""
        factory = self.fake_lookupd()
        self.channels["t"] = ["archive"]
        nsqd = self.nsqd(4160)
        self.hold = True
        producer = FakeClient(nsqd)
        producer.command(b"PUB", "t", body=b"early")
        self.net.settle()
        self.assertEqual(self.asked, [b"/channels?topic=t"])
        self.assertEqual(producer.frames(), [], "not answered while the lookupd is asked")
        self.release()
        self.assertEqual(producer.frames(), [OK])
        topic = nsqd.topics["t"]
        self.assertTrue(topic.started)
        self.assertEqual(list(topic.channels), ["archive"])
        self.assertEqual(topic.channels["archive"].depth(), 1)
        self.net.settle()
        # another topic, on which the consumer will be the first
        self.channels["u"] = []
        producer.command(b"PUB", "u", body=b"early")
        self.net.settle()
        self.assertEqual(producer.frames(), [])
        self.release()
        self.assertEqual(producer.frames(), [OK])

        consumer = FakeClient(nsqd)
        consumer.command(b"SUB", "u", "c")
        self.assertEqual(consumer.frames(), [OK])
        producer.command(b"PUB", "u", body=b"later")  # the topic exists: answered at once
        self.assertEqual(producer.frames(), [OK])
        consumer.command(b"RDY", "2")
        self.assertEqual([m.body for m in consumer.messages()], [b"early", b"later"])
        self.net.settle()
        self.assertEqual(factory.sessions[0].commands[-2:], [b"REGISTER u", b"REGISTER u c"])

    def test_the_sub_that_creates_a_topic_reads_on_once_its_channels_exist(self):
        self.fake_lookupd()
        nsqd = self.nsqd(4160)
        self.hold = True
        consumer = FakeClient(nsqd)
        consumer.send(b"SUB t c\nRDY 1\n")  # as clients do, RDY right behind SUB
        self.net.settle()
        self.assertEqual(consumer.frames(), [])
        producer = FakeClient(nsqd)
        producer.command(b"PUB", "t", body=b"meanwhile")  # not the creator: answered, held by the topic
        self.assertEqual(producer.frames(), [OK])
        self.release()
        frames = consumer.frames()
        self.assertEqual(frames[0], OK)
        self.assertEqual([Message.decode(data).body for _, data in frames[1:]], [b"meanwhile"])


class LookupdIntegrationTests(unittest.TestCase):
    """nsqd and nsqlookupd over 127.0.0.1 once: HostnameEndpoint and treq on the reactor's network."""

    timeout = 30

    def nsqd(self, *lookupds: int, **kw) -> InProcessNSQD:
        server = InProcessNSQD(
            lookupd_tcp_addresses=[f"127.0.0.1:{p}" for p in lookupds], broadcast_address="127.0.0.1", **kw
        ).start()
        self.addCleanup(server.stop)
        return server

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


class AddressEndpointTests(unittest.TestCase):
    """The endpoint to a lookupd at an IP address (no twisted.internet.endpoints)."""

    @defer.inlineCallbacks
    def test_connects_and_hands_everything_to_the_protocol(self):
        from nsqd_tw.lookup import AddressEndpoint

        class Echo(protocol.Protocol):
            def dataReceived(self, data: bytes) -> None:
                self.transport.write(data.upper())
                self.transport.loseConnection()

        port = reactor.listenTCP(0, protocol.Factory.forProtocol(Echo), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        lost: defer.Deferred = defer.Deferred()

        class Client(protocol.Protocol):
            def connectionMade(self) -> None:
                self.got = b""
                self.transport.write(b"v1")

            def dataReceived(self, data: bytes) -> None:
                self.got += data

            def connectionLost(self, reason: Any = None) -> None:
                lost.callback(self.got)

        endpoint = AddressEndpoint(reactor, "127.0.0.1", port.getHost().port, timeout=5)
        proto = yield endpoint.connect(protocol.Factory.forProtocol(Client))
        self.assertIsInstance(proto, Client)
        self.assertEqual((yield lost), b"V1")

    @defer.inlineCallbacks
    def test_a_refused_connection_fails_and_a_cancelled_one_stops(self):
        import socket

        from twisted.internet.error import ConnectionRefusedError

        from nsqd_tw.lookup import AddressEndpoint

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        with self.assertRaises(ConnectionRefusedError):
            yield AddressEndpoint(reactor, "127.0.0.1", free, timeout=5).connect(protocol.Factory())
        d = AddressEndpoint(reactor, "127.0.0.1", free, timeout=5).connect(protocol.Factory())
        d.cancel()
        with self.assertRaises(defer.CancelledError):
            yield d


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
