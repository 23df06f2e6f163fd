"""The Twisted client against the real server over 127.0.0.1 sockets."""

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from nsq_client.twisted_client import Consumer, connect
from nsq_wire.errors import NSQError
from tests.helpers import InProcessNSQD


class ClientTests(unittest.TestCase):
    timeout = 20

    def setUp(self) -> None:
        self.server = InProcessNSQD(msg_timeout=60.0).start()
        self.addCleanup(self.server.stop)
        self.port = self.server.tcp_port

    @defer.inlineCallbacks
    def producer(self):
        conn = yield connect(reactor, "127.0.0.1", self.port)
        self.addCleanup(conn.close)
        return conn

    @defer.inlineCallbacks
    def consume(self, n: int, channel: str = "c", handler=None, **kw):
        got: list = []
        done: defer.Deferred = defer.Deferred()

        def handle(msg):
            got.append(msg)
            if handler is not None:
                result = handler(msg)
            else:
                result = None
            if len(got) == n and not done.called:
                done.callback(got)
            return result

        consumer = yield Consumer.connect(reactor, "127.0.0.1", self.port, "t", channel, handle, **kw)
        self.addCleanup(consumer.close)
        return consumer, done

    @defer.inlineCallbacks
    def test_identify_response(self):
        conn = yield self.producer()
        self.assertEqual(conn.identify_response["max_rdy_count"], 2500)
        self.assertEqual(conn.identify_response["version"], "1.3.0")

    @defer.inlineCallbacks
    def test_pub_mpub_dpub_consume(self):
        _, done = yield self.consume(4, max_in_flight=10)
        p = yield self.producer()
        yield p.pub("t", b"one")
        yield p.mpub("t", [b"two", b"three"])
        yield p.dpub("t", 50, b"four")
        self.server.nsqd.opts.queue_scan_interval = 0.01
        got = yield done
        self.assertEqual(sorted(m.body for m in got), [b"four", b"one", b"three", b"two"])

    @defer.inlineCallbacks
    def test_error_response(self):
        p = yield self.producer()
        with self.assertRaises(NSQError) as cm:
            yield p.pub("bad!", b"x")
        self.assertEqual(cm.exception.code, "E_BAD_TOPIC")

    @defer.inlineCallbacks
    def test_requeue_then_finish(self):
        attempts = []

        def handler(msg):
            attempts.append(msg.attempts)
            if msg.attempts == 1:
                raise ValueError("try again")

        _, done = yield self.consume(2, handler=handler)
        p = yield self.producer()
        yield p.pub("t", b"x")
        yield done
        self.assertEqual(attempts, [1, 2])
        self.flushLoggedErrors(ValueError)

    @defer.inlineCallbacks
    def test_msg_timeout_redelivers(self):
        def handler(msg):
            msg.auto_respond = False  # never answer: let it time out

        _, done = yield self.consume(2, handler=handler, msg_timeout=1000)
        p = yield self.producer()
        yield p.pub("t", b"slow")
        got = yield done
        self.assertEqual([m.attempts for m in got], [1, 2])
        self.assertEqual(self.server.nsqd.topics["t"].channels["c"].timeout_count, 1)

    @defer.inlineCallbacks
    def test_touch_keeps_it(self):
        finished: defer.Deferred = defer.Deferred()

        def handler(msg):
            msg.auto_respond = False
            call = task.LoopingCall(msg.touch)
            call.start(0.4, now=False)

            def finish():
                call.stop()
                msg.finish()
                # a PUB on the same connection answers after the FIN is handled
                msg.conn.pub("sync", b"x").chainDeferred(finished)

            reactor.callLater(1.5, finish)

        yield self.consume(1, handler=handler, msg_timeout=1000)
        p = yield self.producer()
        yield p.pub("t", b"long job")
        yield finished
        ch = self.server.nsqd.topics["t"].channels["c"]
        self.assertEqual((ch.timeout_count, len(ch.in_flight), ch.message_count), (0, 0, 1))

    @defer.inlineCallbacks
    def test_consumers_and_channels(self):
        _, a_done = yield self.consume(50, channel="a", max_in_flight=100)
        b_got: list = []
        b_done: defer.Deferred = defer.Deferred()

        def on_b(msg):
            b_got.append(msg)
            if len(b_got) == 50:
                b_done.callback(None)

        for _ in range(2):
            c = yield Consumer.connect(reactor, "127.0.0.1", self.port, "t", "b", on_b, max_in_flight=100)
            self.addCleanup(c.close)
        p = yield self.producer()
        yield p.mpub("t", [b"%d" % i for i in range(50)])
        got = yield a_done
        yield b_done
        self.assertEqual(len({m.body for m in got}), 50)
        self.assertEqual(len({m.body for m in b_got}), 50)
        by_conn = {id(m.conn) for m in b_got}
        self.assertEqual(len(by_conn), 2, "both consumers of channel b got messages")

    @defer.inlineCallbacks
    def wait_settled(self, channel: str = "c"):
        """The channel once nsqd has seen every consumer go."""
        ch = self.server.nsqd.topics["t"].channels[channel]
        for _ in range(200):
            if not ch.clients:
                return ch
            yield task.deferLater(reactor, 0.01, lambda: None)
        self.fail("the consumer's connection is still open on nsqd")

    @defer.inlineCallbacks
    def test_close_waits_for_a_running_handler_and_its_fin(self):
        release: defer.Deferred = defer.Deferred()
        running: defer.Deferred = defer.Deferred()

        def handler(msg):
            running.callback(None)
            return release

        consumer, _ = yield self.consume(1, handler=handler)
        p = yield self.producer()
        yield p.pub("t", b"slow")
        yield running
        closing = consumer.close()
        yield task.deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(closing.called, "close() waits for the handler")
        release.callback(None)
        yield closing
        ch = yield self.wait_settled()
        self.assertEqual((ch.message_count, ch.requeue_count, len(ch.in_flight), ch.depth()), (1, 0, 0, 0))

    @defer.inlineCallbacks
    def test_close_from_inside_the_handler_still_fins_that_message(self):
        closed: defer.Deferred = defer.Deferred()
        consumers: list = []

        def handler(msg):
            consumers[0].close().chainDeferred(closed)  # e.g. a Deferred the handler fires resumes main()

        consumer, _ = yield self.consume(1, handler=handler)
        consumers.append(consumer)
        p = yield self.producer()
        yield p.pub("t", b"last")
        yield closed
        ch = yield self.wait_settled()
        self.assertEqual((ch.message_count, ch.requeue_count, len(ch.in_flight), ch.depth()), (1, 0, 0, 0))
