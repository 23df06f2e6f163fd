"""The Twisted client against nsqd: in memory (twisted.test.iosim), and once over 127.0.0.1."""

from typing import Any

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from nsq_client.twisted_client import Consumer, LookupdConsumer, connect
from nsq_wire.errors import NSQError
from nsqd_tw.tcp.protocol import V2Factory
from tests.helpers import InProcessNSQD, MemoryNetwork, make_nsqd


class ClientTests(unittest.TestCase):
    def setUp(self) -> None:
        self.net = MemoryNetwork()
        self.reactor = self.net.reactor
        self.nsqd = make_nsqd(clock=self.reactor, msg_timeout=60.0)
        self.factory = V2Factory(self.nsqd)
        scan = task.LoopingCall(self.nsqd.queue_scan)  # as the tap's TimerService
        scan.clock = self.reactor
        scan.start(self.nsqd.opts.queue_scan_interval, now=False)
        self.addCleanup(scan.stop)

    def result(self, d: defer.Deferred) -> Any:
        self.net.settle()
        return self.successResultOf(d)

    def producer(self) -> Any:
        return self.result(connect(self.reactor, "127.0.0.1", 4150, endpoint=self.net.endpoint(self.factory)))

    def consume(self, channel: str = "c", handler=None, **kw) -> tuple[Consumer, list]:
        got: list = []

        def handle(msg):
            got.append(msg)
            return handler(msg) if handler is not None else None

        endpoint = self.net.endpoint(self.factory)
        consumer = self.result(Consumer.connect(self.reactor, "", 0, "t", channel, handle, endpoint=endpoint, **kw))
        return consumer, got

    def test_identify_response(self):
        conn = self.producer()
        self.assertEqual(conn.identify_response["max_rdy_count"], 2500)
        self.assertEqual(conn.identify_response["version"], "1.3.0")

    def test_pub_mpub_dpub_consume(self):
        _, got = self.consume(max_in_flight=10)
        p = self.producer()
        for d in (p.pub("t", b"one"), p.mpub("t", [b"two", b"three"]), p.dpub("t", 50, b"four")):
            self.assertEqual(self.result(d), b"OK")
        self.net.advance(0.2)
        self.assertEqual(sorted(m.body for m in got), [b"four", b"one", b"three", b"two"])

    def test_error_response(self):
        p = self.producer()
        d = p.pub("bad!", b"x")
        self.net.settle()
        self.assertEqual(self.failureResultOf(d, NSQError).value.code, "E_BAD_TOPIC")

    def test_requeue_then_finish(self):
        attempts = []

        def handler(msg):
            attempts.append(msg.attempts)
            if msg.attempts == 1:
                raise ValueError("try again")

        self.consume(handler=handler)
        self.result(self.producer().pub("t", b"x"))
        self.net.settle()
        self.assertEqual(attempts, [1, 2])
        self.flushLoggedErrors(ValueError)

    def test_msg_timeout_redelivers(self):
        def handler(msg):
            msg.auto_respond = False  # never answer: let it time out

        _, got = self.consume(handler=handler, msg_timeout=1000)
        self.result(self.producer().pub("t", b"slow"))
        self.net.advance(1.5, step=0.1)
        self.assertEqual([m.attempts for m in got], [1, 2])
        self.assertEqual(self.nsqd.topics["t"].channels["c"].timeout_count, 1)

    def test_touch_keeps_it(self):
        def handler(msg):
            msg.auto_respond = False
            call = task.LoopingCall(msg.touch)
            call.clock = self.reactor
            call.start(0.4, now=False)

            def finish():
                call.stop()
                msg.finish()

            self.reactor.callLater(1.5, finish)

        self.consume(handler=handler, msg_timeout=1000)
        self.result(self.producer().pub("t", b"long job"))
        self.net.advance(2.0, step=0.1)
        ch = self.nsqd.topics["t"].channels["c"]
        self.assertEqual((ch.timeout_count, len(ch.in_flight), ch.message_count), (0, 0, 1))

    def test_consumers_and_channels(self):
        _, a_got = self.consume(channel="a", max_in_flight=100)
        b_got: list = []
        for _ in range(2):
            endpoint = self.net.endpoint(self.factory)
            self.result(Consumer.connect(self.reactor, "", 0, "t", "b", b_got.append, 100, endpoint=endpoint))
        self.result(self.producer().mpub("t", [b"%d" % i for i in range(50)]))
        self.net.settle()
        self.assertEqual(len({m.body for m in a_got}), 50)
        self.assertEqual(len({m.body for m in b_got}), 50)
        self.assertEqual(len({id(m.conn) for m in b_got}), 2, "both consumers of channel b got messages")

    def test_close_waits_for_a_running_handler_and_its_fin(self):
        release: defer.Deferred = defer.Deferred()
        consumer, got = self.consume(handler=lambda msg: release)
        self.result(self.producer().pub("t", b"slow"))
        self.assertEqual(len(got), 1)
        closing = consumer.close()
        self.net.advance(0.1)
        self.assertNoResult(closing)  # close() waits for the handler
        release.callback(None)
        self.result(closing)
        ch = self.nsqd.topics["t"].channels["c"]
        self.assertEqual(ch.clients, {})
        self.assertEqual((ch.message_count, ch.requeue_count, len(ch.in_flight), ch.depth()), (1, 0, 0, 0))

    def test_close_from_inside_the_handler_still_fins_that_message(self):
        closed: list = []
        consumers: list = []

        def handler(msg):
            consumers[0].close().addCallback(closed.append)  # e.g. a Deferred the handler fires resumes main()

        consumer, _ = self.consume(handler=handler)
        consumers.append(consumer)
        self.result(self.producer().pub("t", b"last"))
        self.net.settle()
        self.assertEqual(closed, [None])
        ch = self.nsqd.topics["t"].channels["c"]
        self.assertEqual(ch.clients, {})
        self.assertEqual((ch.message_count, ch.requeue_count, len(ch.in_flight), ch.depth()), (1, 0, 0, 0))


class LookupdConsumerTests(unittest.TestCase):
    def test_subscribes_to_the_nodes_lookupd_lists(self):
        from treq.testing import StubTreq
        from twisted.web.resource import Resource

        net = MemoryNetwork()
        nsqd = make_nsqd(clock=net.reactor)
        asked: list = []

        class Lookup(Resource):
            isLeaf = True

            def render_GET(self, request):
                asked.append((request.uri, request.getHeader(b"accept")))
                return b'{"channels":[],"producers":[{"broadcast_address":"::1","tcp_port":4150}]}'

        nodes: list = []

        def endpoint_factory(host: str, port: int) -> Any:
            nodes.append((host, port))
            return net.endpoint(V2Factory(nsqd))

        got: list = []
        consumer = LookupdConsumer(
            net.reactor,
            ["lookupd:4161"],
            "a b",
            "c",
            got.append,
            http_client=StubTreq(Lookup()),
            endpoint_factory=endpoint_factory,
        )
        consumer.start()
        net.settle()
        self.assertEqual(asked, [(b"/lookup?topic=a%20b", b"application/vnd.nsq; version=1.0")])
        self.assertEqual((nodes, list(consumer.consumers)), ([("::1", 4150)], [("::1", 4150)]))
        net.advance(60.0, step=10.0)  # the next poll: still the one connection
        self.assertEqual((len(asked), nodes), (2, [("::1", 4150)]))
        d = consumer.stop()
        net.settle()
        self.successResultOf(d)


class RealSocketTests(unittest.TestCase):
    """The client over 127.0.0.1 once: HostnameEndpoint, the reactor's TCP."""

    timeout = 20

    @defer.inlineCallbacks
    def test_publish_and_consume(self):
        server = InProcessNSQD(msg_timeout=60.0).start()
        self.addCleanup(server.stop)
        done: defer.Deferred = defer.Deferred()
        consumer = yield Consumer.connect(reactor, "127.0.0.1", server.tcp_port, "t", "c", done.callback)
        self.addCleanup(consumer.close)
        producer = yield connect(reactor, "127.0.0.1", server.tcp_port)
        self.addCleanup(producer.close)
        self.assertEqual((yield producer.pub("t", b"one")), b"OK")
        msg = yield done
        self.assertEqual((msg.body, msg.attempts), (b"one", 1))
