"""What an operator watches (beyond Go): the oldest queued message's age, the
delivery-to-FIN latency, and peeking at a queue without consuming it."""

from __future__ import annotations

import base64
import json
import os

from treq.testing import StubTreq
from twisted.internet import defer
from twisted.trial import unittest

from nsq_wire import gojson
from nsqd_tw.core.message import Message
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.core.peek import CutMessage
from nsqd_tw.http.api import NSQDHTTPAPI
from nsqd_tw.http.inspect import PEEK_BYTES, PEEK_RECORD_BYTES, message_json, peek_json
from nsqd_tw.http.metrics import make_registry, render
from nsqd_tw.http.stats import get_stats, print_stats
from nsqd_tw.http.statsd import metric_lines
from nsqd_tw.storage.backend import DummyBackendQueue, MemoryBackendQueue
from tests.helpers import FakeClient, make_nsqd
from tests.nsqd_tw.test_channel import FakeConsumer


def bodies(msgs: list) -> list[bytes]:
    return [m.body for m in msgs]


class OldestMessageAgeTests(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd(mem_queue_size=2)
        self.clock = self.nsqd.reactor
        self.topic = self.nsqd.get_topic("t")
        self.channel = self.topic.get_channel("c")

    def test_zero_when_empty(self) -> None:
        self.assertEqual((self.channel.oldest_message_age_ms(), self.topic.oldest_message_age_ms()), (0, 0))

    def test_from_memory_and_backend(self) -> None:
        self.nsqd.publish("t", [b"m0", b"m1"])  # memory
        self.clock.advance(10)
        self.nsqd.publish("t", [b"d0", b"d1", b"d2", b"d3"])  # memory is full: the backend
        self.clock.advance(10)
        self.assertEqual((len(self.channel.memory), self.channel.backend.depth()), (2, 4))
        self.assertEqual(self.channel.oldest_message_age_ms(), 20_000)
        c = FakeConsumer(1, rdy=4)
        self.channel.add_client(c)
        self.channel.kick()
        self.assertEqual(sorted(bodies(c.got)), [b"d0", b"d1", b"m0", b"m1"])
        self.assertEqual(len(self.channel.memory), 0)
        self.assertEqual(self.channel.oldest_message_age_ms(), 10_000, "the backend's head, once memory is empty")

    def test_in_flight_and_deferred_are_not_queued(self) -> None:
        c = FakeConsumer(1, rdy=1)
        self.channel.add_client(c)
        self.nsqd.publish("t", [b"a"])
        self.nsqd.publish("t", [b"later"], delay=60)
        self.clock.advance(5)
        self.assertEqual(self.channel.oldest_message_age_ms(), 0)

    def test_a_requeued_message_keeps_its_publish_time(self) -> None:
        c = FakeConsumer(1, rdy=1)
        self.channel.add_client(c)
        self.nsqd.publish("t", [b"a"])
        self.clock.advance(3)
        self.channel.requeue_message(1, c.got[0].id, 0)
        self.assertEqual(self.channel.oldest_message_age_ms(), 3000)

    def test_a_topics_own_backlog(self) -> None:
        self.nsqd.publish("held", [b"a", b"b", b"c"])
        self.clock.advance(1.5)
        self.assertEqual(self.nsqd.topics["held"].oldest_message_age_ms(), 1500)
        self.assertEqual(self.topic.oldest_message_age_ms(), 0, "a topic with a channel hands everything on")

    def test_in_stats_after_gos_keys(self) -> None:
        self.nsqd.publish("t", [b"a"])
        self.clock.advance(2)
        (t,) = get_stats(self.nsqd)["topics"]
        for keys in (list(t), list(t["channels"][0])):
            at = keys.index("backend_bytes")
            self.assertEqual(keys[at : at + 3], ["backend_bytes", "oldest_message_age_ms", "fin_latency"])
        self.assertEqual((t["oldest_message_age_ms"], t["channels"][0]["oldest_message_age_ms"]), (0, 2000))

    def test_not_in_the_text_format(self) -> None:
        self.nsqd.publish("t", [b"a"])
        text = print_stats(get_stats(self.nsqd), None, "OK", 0.0, self.nsqd.now(), "nsqd v1.3.0")
        self.assertNotIn("oldest", text)
        self.assertNotIn("fin", text)


class FinLatencyTests(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd(e2e_processing_latency_percentiles=[0.99, 0.5])
        self.clock = self.nsqd.reactor

    def test_from_delivery_to_fin(self) -> None:
        self.nsqd.publish("t", [b"a"])
        channel = self.nsqd.topics["t"].get_channel("c")
        self.clock.advance(0)
        self.clock.advance(1.0)  # waiting: counts in the end-to-end latency only
        c = FakeConsumer(1, rdy=1)
        channel.add_client(c)
        channel.kick()
        self.clock.advance(0.25)
        channel.finish_message(1, c.got[0].id)
        now = self.nsqd.now()
        e2e = channel.e2e.result(now)["percentiles"][0]["value"]
        assert channel.fin_latency is not None
        fin = channel.fin_latency.result(now)
        self.assertEqual(fin["count"], 1)
        self.assertLess(abs(fin["percentiles"][0]["value"] - 0.25e9), 0.25e9 * 0.02)  # DDSketch: 1%
        self.assertLess(abs(e2e - 1.25e9), 1.25e9 * 0.02)

    def test_a_redelivery_counts_from_its_own_delivery(self) -> None:
        channel = self.nsqd.get_topic("t").get_channel("c")
        c = FakeConsumer(1, rdy=1, msg_timeout=5)
        channel.add_client(c)
        self.nsqd.publish("t", [b"a"])
        self.clock.advance(5.1)
        channel.process_queues(self.nsqd.now())  # timed out: sent again
        self.clock.advance(0.5)
        channel.finish_message(1, c.got[1].id)
        assert channel.fin_latency is not None
        value = channel.fin_latency.result(self.nsqd.now())["percentiles"][0]["value"]
        self.assertLess(abs(value - 0.5e9), 0.5e9 * 0.02)

    def test_in_stats_statsd_and_prometheus(self) -> None:
        consumer = FakeClient(self.nsqd)
        consumer.sub("t", "c", rdy=1)
        FakeClient(self.nsqd).pub("t", b"x")
        (msg,) = consumer.messages()
        self.clock.advance(0.1)
        consumer.fin(msg.id)
        (t,) = get_stats(self.nsqd)["topics"]
        for fin in (t["fin_latency"], t["channels"][0]["fin_latency"]):
            self.assertEqual(fin["count"], 1)
            self.assertEqual([p["quantile"] for p in fin["percentiles"]], [0.99, 0.5])
        lines = b"".join(metric_lines(self.nsqd, {}, None)[0]).decode()
        self.assertRegex(lines, r"\.topic\.t\.fin_latency_99:1\d{8}\|g\n")
        self.assertRegex(lines, r"\.topic\.t\.channel\.c\.fin_latency_50:1\d{8}\|g\n")
        text = render(make_registry(self.nsqd)).decode()
        self.assertRegex(text, r'nsq_channel_fin_latency_seconds\{channel="c",quantile="0.99",topic="t"\} 0\.1\d*')
        self.assertIn('nsq_channel_oldest_message_age_seconds{channel="c",topic="t"} 0.0', text)
        self.assertIn('nsq_topic_oldest_message_age_seconds{topic="t"} 0.0', text)

    def test_off_without_the_percentiles(self) -> None:
        nsqd = make_nsqd()
        channel = nsqd.get_topic("t").get_channel("c")
        self.assertIsNone(channel.fin_latency)
        (t,) = get_stats(nsqd)["topics"]
        self.assertEqual(t["channels"][0]["fin_latency"], {"count": 0, "percentiles": None})
        self.assertNotIn(b"fin_latency", b"".join(metric_lines(nsqd, {}, None)[0]))


class PeekTests(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd(mem_queue_size=2)
        self.channel = self.nsqd.get_topic("t").get_channel("c")

    def test_in_delivery_order_without_consuming(self) -> None:
        self.nsqd.publish("t", [b"%d" % i for i in range(5)])  # memory 0 1, backend 2 3 4
        peeked = self.channel.peek(10)
        self.assertEqual(bodies(self.channel.peek(3)), bodies(peeked[:3]))
        self.assertEqual(self.channel.depth(), 5)
        c = FakeConsumer(1, rdy=10)
        self.channel.add_client(c)
        self.channel.kick()
        self.assertEqual([(m.id, m.body, m.timestamp) for m in c.got], [(m.id, m.body, m.timestamp) for m in peeked])
        self.assertEqual(sorted(bodies(peeked)), [b"0", b"1", b"2", b"3", b"4"])

    def test_the_turn_of_memory_and_backend_is_kept(self) -> None:
        self.nsqd.publish("t", [b"%d" % i for i in range(5)])
        c = FakeConsumer(1, rdy=1)
        self.channel.add_client(c)
        self.channel.kick()
        peeked = self.channel.peek(10)
        self.channel.finish_message(1, c.got[0].id)
        c.in_flight_count = 0
        c.ready_count = 10
        self.channel.kick()
        self.assertEqual(bodies(c.got[1:]), bodies(peeked))

    def test_a_requeued_message_shows_its_attempts(self) -> None:
        c = FakeConsumer(1, rdy=1)
        self.channel.add_client(c)
        self.nsqd.publish("t", [b"a"])
        self.channel.requeue_message(1, c.got[0].id, 0)
        (m,) = self.channel.peek(10)
        self.assertEqual((m.body, m.attempts), (b"a", 1))

    def test_a_topics_backlog(self) -> None:
        self.nsqd.publish("held", [b"a", b"b", b"c"])
        self.assertEqual(sorted(bodies(self.nsqd.topics["held"].peek(10))), [b"a", b"b", b"c"])
        self.assertEqual(self.nsqd.topics["held"].depth(), 3)


class OldBackend(MemoryBackendQueue):
    """An embedder's backend written before peek's byte bound."""

    def peek(self, n: int) -> list[bytes]:  # type: ignore[override]
        return list(self._records)[:n]


class BoundedPeekTests(unittest.TestCase):
    """peek(n, max_bytes): in order, as many as fit; the first cut if even it does not."""

    RECORD = 26 + 100  # a record of a 100-byte body

    def setUp(self) -> None:
        self.nsqd = make_nsqd(mem_queue_size=2)
        self.channel = self.nsqd.get_topic("t").get_channel("c")

    def publish(self, *sizes: int) -> None:
        self.nsqd.publish("t", [(b"%d:" % i).ljust(size, b".") for i, size in enumerate(sizes)])

    def names(self, msgs: list) -> list[bytes]:
        return [m.body.partition(b":")[0] for m in msgs]

    def test_memory_and_dummy_backends(self) -> None:
        q = MemoryBackendQueue("q")
        for size in (10, 20, 30):
            q.put(b"x" * size)
        self.assertEqual(q.peek(3, max_bytes=30), [b"x" * 10, b"x" * 20])
        self.assertEqual(q.peek(3, max_bytes=59), [b"x" * 10, b"x" * 20])
        self.assertEqual(q.peek(1, max_bytes=1000), [b"x" * 10])
        (cut,) = q.peek(3, max_bytes=4)
        self.assertEqual((bytes(cut), cut.size), (b"xxxx", 10))
        self.assertEqual(q.depth(), 3)
        self.assertEqual(DummyBackendQueue("d").peek(3, max_bytes=4), [])

    def test_in_delivery_order_as_many_as_fit(self) -> None:
        self.publish(*[100] * 6)  # memory 0 1, backend 2-5: order 2 0 3 1 4 5
        self.assertEqual(self.names(self.channel.peek(10)), [b"2", b"0", b"3", b"1", b"4", b"5"])
        self.assertEqual(self.names(self.channel.peek(10, 3 * self.RECORD)), [b"2", b"0", b"3"])
        self.assertEqual(self.names(self.channel.peek(10, 4 * self.RECORD - 1)), [b"2", b"0", b"3"])
        self.assertEqual(self.names(self.channel.peek(2, 10 * self.RECORD)), [b"2", b"0"])
        self.assertFalse(any(isinstance(m, CutMessage) for m in self.channel.peek(10, 3 * self.RECORD)))

    def test_a_first_message_too_big_is_cut(self) -> None:
        self.publish(1000, 100, 100)  # memory 0 1, backend 2
        self.channel._take_backend = True  # memory's turn: 0 first
        (m,) = self.channel.peek(10, 226)
        self.assertIsInstance(m, CutMessage)
        self.assertEqual((m.body, m.body_bytes), (b"0:".ljust(200, b"."), 1000))
        self.channel._take_backend = False  # the backend's turn: 2, then 0, which does not fit
        self.assertEqual(self.names(self.channel.peek(10, 1025)), [b"2"])

    def test_a_first_message_from_the_backend_is_cut_there(self) -> None:
        self.publish(100, 100, 5000)
        (m,) = self.channel.peek(10, 1026)
        self.assertIsInstance(m, CutMessage)
        self.assertEqual((self.names([m]), len(m.body), m.body_bytes), ([b"2"], 1000, 5000))
        (m,) = self.channel.peek(10, 1)  # a bound under a record's header: the header still
        self.assertEqual((m.body, m.body_bytes, m.timestamp), (b"", 5000, self.channel.peek(1)[0].timestamp))

    def test_a_message_back_in_memory_is_cut_too(self) -> None:
        c = FakeConsumer(1, rdy=1)
        self.channel.add_client(c)
        self.publish(1000)
        self.channel.requeue_message(1, c.got[0].id, 0)
        (m,) = self.channel.peek(10, 126)
        self.assertEqual((len(m.body), m.body_bytes, m.attempts), (100, 1000, 1))
        self.assertEqual(self.channel.peek(10)[0].body, b"0:".ljust(1000, b"."), "nothing queued changed")

    def test_nothing_after_a_backend_record_that_does_not_fit(self) -> None:
        """The backend's next record is over the bound: memory's after it are not shown
        in its place (they come after it)."""
        self.publish(100, 100, 100, 1000, 100)  # memory 0 1, backend 2 3 4: order 2 0 3 1 4
        self.assertEqual(self.names(self.channel.peek(10, 3 * self.RECORD)), [b"2", b"0"])

    def test_a_backend_written_before_the_bound(self) -> None:
        n = make_nsqd(mem_queue_size=2, backend_factory=lambda name, ephemeral: OldBackend(name))
        ch = n.get_topic("t").get_channel("c")
        n.publish("t", [b"%d" % i for i in range(6)])
        self.assertEqual(bodies(ch.peek(10, 26 * 3 + 3)), [b"2", b"0", b"3"])
        (m,) = ch.peek(10, 26)
        self.assertEqual((m.body, m.body_bytes), (b"", 1))


class DiskTests(unittest.TestCase):
    """With disk queues: peek and the oldest age read the disk queue's head."""

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)

    def start(self, **kw) -> NSQD:
        n = make_nsqd(backend_factory=None, data_path=self.dir, **kw)
        n.privilegedStartService()
        n.startService()
        self.addCleanup(lambda: n.running and n.stopService())
        return n

    def test_peek_spills_to_disk(self) -> None:
        n = self.start(mem_queue_size=2)
        ch = n.get_topic("t").get_channel("c")
        n.publish("t", [b"%d" % i for i in range(6)])
        self.assertEqual((len(ch.memory), ch.backend.depth()), (2, 4))
        peeked = ch.peek(10)
        self.assertEqual(sorted(bodies(peeked)), [b"%d" % i for i in range(6)])
        self.assertEqual((ch.depth(), ch.backend.depth()), (6, 4))
        c = FakeConsumer(1, rdy=10)
        ch.add_client(c)
        ch.kick()
        self.assertEqual([(m.id, m.body) for m in c.got], [(m.id, m.body) for m in peeked])

    def test_oldest_age_from_the_disk_head_after_memory_empties(self) -> None:
        n = self.start(mem_queue_size=2)
        ch = n.get_topic("t").get_channel("c")
        n.publish("t", [b"m0", b"m1"])
        n.reactor.advance(7)
        n.publish("t", [b"d0", b"d1", b"d2"])
        n.reactor.advance(3)
        self.assertEqual(ch.oldest_message_age_ms(), 10_000)
        c = FakeConsumer(1, rdy=4)  # memory and disk take turns: m0 m1 d0 d1
        ch.add_client(c)
        ch.kick()
        self.assertEqual((len(ch.memory), ch.backend.depth()), (0, 1))
        self.assertEqual(ch.oldest_message_age_ms(), 3000)

    def test_durable_mode(self) -> None:
        n = self.start(mem_queue_size=0, sync_every=1)
        ch = n.get_topic("t").get_channel("c")
        n.publish("t", [b"a", b"b", b"c"])
        n.reactor.advance(0)
        c = FakeConsumer(1, rdy=1)
        ch.add_client(c)
        ch.kick()
        self.assertEqual(bodies(c.got), [b"a"])
        n.reactor.advance(4)
        self.assertEqual(bodies(ch.peek(10)), [b"b", b"c"], "what is in flight is not queued")
        self.assertEqual(ch.oldest_message_age_ms(), 4000)
        self.assertEqual(ch.depth(), 2)


class PeekRouteTests(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd(mem_queue_size=2)
        self.treq = StubTreq(NSQDHTTPAPI(self.nsqd).resource())

    @defer.inlineCallbacks
    def get(self, path: str):
        resp = yield self.treq.get("http://nsqd" + path)
        content = yield resp.content()
        return resp.code, content

    @defer.inlineCallbacks
    def test_channel_peek(self):
        self.nsqd.get_topic("t").get_channel("c")
        self.nsqd.publish("t", [b"one", b"\x00\xff", b"three"])
        code, content = yield self.get("/channel/peek?topic=t&channel=c&n=2")
        self.assertEqual(code, 200)
        data = json.loads(content)
        self.assertEqual(list(data), ["messages"])
        self.assertEqual(len(data["messages"]), 2)
        expected = self.nsqd.topics["t"].channels["c"].peek(2)
        for got, m in zip(data["messages"], expected, strict=True):
            self.assertEqual(list(got), ["id", "timestamp", "attempts", "body"])
            self.assertEqual(
                (got["id"], got["timestamp"], got["attempts"], base64.b64decode(got["body"])),
                (m.id.decode(), m.timestamp, 0, m.body),
            )
        _, content = yield self.get("/channel/peek?topic=t&channel=c")
        self.assertEqual(len(json.loads(content)["messages"]), 3, "n is 10 by default")
        self.assertEqual(self.nsqd.topics["t"].channels["c"].depth(), 3)

    @defer.inlineCallbacks
    def test_topic_peek(self):
        self.nsqd.publish("dead", [b"x"])
        code, content = yield self.get("/topic/peek?topic=dead&n=1000")
        self.assertEqual(code, 200)
        self.assertEqual([base64.b64decode(m["body"]) for m in json.loads(content)["messages"]], [b"x"])
        self.nsqd.get_topic("empty")
        _, content = yield self.get("/topic/peek?topic=empty")
        self.assertEqual(content, b'{"messages":[]}')

    @defer.inlineCallbacks
    def test_errors(self):
        self.nsqd.get_topic("t").get_channel("c")
        for path, code, message in [
            ("/channel/peek?channel=c", 400, "MISSING_ARG_TOPIC"),
            ("/channel/peek?topic=t", 400, "MISSING_ARG_CHANNEL"),
            ("/channel/peek?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
            ("/channel/peek?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
            ("/channel/peek?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND"),
            ("/channel/peek?topic=t&channel=c&n=1001", 400, "INVALID_N"),
            ("/channel/peek?topic=t&channel=c&n=0", 400, "INVALID_N"),
            ("/channel/peek?topic=t&channel=c&n=ten", 400, "INVALID_N"),
            ("/topic/peek", 400, "MISSING_ARG_TOPIC"),
            ("/topic/peek?topic=bad!", 400, "INVALID_TOPIC"),
            ("/topic/peek?topic=nope", 404, "TOPIC_NOT_FOUND"),
            ("/topic/peek?topic=t&n=-1", 400, "INVALID_N"),
        ]:
            got = yield self.get(path)
            self.assertEqual(got, (code, json.dumps({"message": message}).replace(" ", "").encode()), path)
        resp = yield self.treq.post("http://nsqd/channel/peek?topic=t&channel=c")
        self.assertEqual(resp.code, 405)


class DeliveryOrderTests(unittest.TestCase):
    """Bursts deliver in the order peek shows: memory and disk in the turns _next
    takes, whichever source's turn comes next and whatever a burst's size."""

    def start(self, mem_queue_size: int) -> NSQD:
        data = os.path.abspath(self.mktemp())
        os.makedirs(data)
        n = make_nsqd(backend_factory=None, data_path=data, mem_queue_size=mem_queue_size)
        n.privilegedStartService()
        n.startService()
        self.addCleanup(lambda: n.running and n.stopService())
        return n

    def deliver(self, n: NSQD, rdy: int, more: list[bytes] | None = None) -> tuple[list[bytes], list[bytes]]:
        """Consume everything with one consumer of RDY ``rdy``, FINing each burst;
        ``more`` is published after the first burst. Each burst is checked against
        the peek just before it; the whole delivered order and the first peek."""
        ch = n.topics["t"].channels["c"]
        first = bodies(ch.peek(1000))
        c = FakeConsumer(1, rdy=rdy)
        ch.add_client(c)
        delivered: list[bytes] = []
        while ch.depth():
            expected = bodies(ch.peek(1000))
            ch.kick()
            burst = bodies(c.got[len(delivered) :])
            self.assertTrue(burst, "something is delivered")
            self.assertEqual(burst, expected[: len(burst)], f"a burst of {len(burst)} in peek's order")
            self.assertEqual(bodies(ch.peek(1000)), expected[len(burst) :], "what is left, in the same order")
            for m in c.got[len(delivered) :]:
                ch.finish_message(1, m.id)
            delivered += burst
            if more:  # while the consumer is full: queued, not delivered
                c.in_flight_count = rdy
                n.publish("t", more)
                more = None
            c.in_flight_count = 0
        ch.remove_client(1)
        return delivered, first

    def test_every_turn_and_burst_size(self) -> None:
        for take_backend in (False, True):
            for in_memory, on_disk in [(0, 5), (4, 0), (3, 3), (2, 7), (7, 2), (5, 6)]:
                for rdy in (1, 2, 3, 4, 2500):
                    n = self.start(max(in_memory, 1) if on_disk or in_memory else 1)
                    ch = n.get_topic("t").get_channel("c")
                    if not in_memory:
                        ch._mem_size = 0
                    n.publish("t", [b"%d" % i for i in range(in_memory + on_disk)])
                    self.assertEqual((len(ch.memory), ch.backend.depth()), (in_memory, on_disk))
                    ch._take_backend = take_backend
                    delivered, peeked = self.deliver(n, rdy)
                    case = (take_backend, in_memory, on_disk, rdy)
                    self.assertEqual(delivered, peeked, case)
                    self.assertEqual(sorted(delivered), sorted(b"%d" % i for i in range(in_memory + on_disk)), case)
                    n.stopService()

    def test_memory_refilled_behind_the_disk(self) -> None:
        """Memory empties first, then takes what is published next, while the disk
        still holds older messages: the issue's peek [2, 203, 3, 204, ...]."""
        for rdy in (1, 2, 3, 2500):
            n = self.start(4)
            n.get_topic("t").get_channel("c")
            n.publish("t", [b"%d" % i for i in range(20)])  # 0-3 in memory, 4-19 on disk
            more = [b"%d" % i for i in range(100, 104)]
            delivered, _ = self.deliver(n, rdy, more=more)
            self.assertEqual(sorted(delivered), sorted([b"%d" % i for i in range(20)] + more))
            n.stopService()


class PeekAnswerTests(unittest.TestCase):
    """The answer: Go's JSON of the four keys as before, at most PEEK_BYTES."""

    def setUp(self) -> None:
        self.nsqd = make_nsqd(mem_queue_size=2)
        self.nsqd.get_topic("t").get_channel("c")
        self.treq = StubTreq(NSQDHTTPAPI(self.nsqd).resource())

    @defer.inlineCallbacks
    def peek(self, query: str = "n=1000"):
        resp = yield self.treq.get("http://nsqd/channel/peek?topic=t&channel=c&" + query)
        self.assertEqual(resp.code, 200)
        self.assertEqual(resp.headers.getRawHeaders(b"content-type"), [b"application/json; charset=utf-8"])
        content = yield resp.content()
        return content

    def test_small_answers_as_before(self) -> None:
        msgs = [Message(b"0123456789abcdef", b"<body & \x00 \xff>", 1_700_000_000_000_000_001, 3)]
        msgs.append(Message(b"fedcba9876543210", b"", 5, 0))
        origins = {b"fedcba9876543210": {"topic": "a<b", "channel": "c", "attempts": 2}}
        before = gojson.dumps(
            {
                "messages": [
                    {
                        "id": m.id.decode(),
                        "timestamp": m.timestamp,
                        "attempts": m.attempts,
                        "body": base64.b64encode(m.body).decode(),
                        **({"dead_letter": origins[m.id]} if m.id in origins else {}),
                    }
                    for m in msgs
                ]
            }
        )
        self.assertEqual(peek_json(msgs, origins.get), before)
        self.assertEqual(peek_json([], origins.get), b'{"messages":[]}')

    @defer.inlineCallbacks
    def test_as_many_as_fit_in_the_bound(self):
        self.nsqd.publish("t", [b"%d" % i * (1 << 20) for i in range(10)])
        content = yield self.peek()
        self.assertLessEqual(len(content), PEEK_BYTES)
        data = json.loads(content)
        self.assertEqual(list(data), ["messages", "truncated"])
        self.assertIs(data["truncated"], True)
        self.assertEqual(len(data["messages"]), 2, "a third would pass 4 MiB of base64")
        for m in data["messages"]:
            self.assertEqual(list(m), ["id", "timestamp", "attempts", "body"])
            self.assertEqual(len(base64.b64decode(m["body"])), 1 << 20)
        content = yield self.peek("n=2")
        self.assertEqual(list(json.loads(content)), ["messages"], "n=2: nothing left out")

    @defer.inlineCallbacks
    def test_a_message_too_big_for_the_answer_is_cut(self):
        for size in (5 << 20, PEEK_RECORD_BYTES - 26):  # cut by the queue's read, then by the answer
            self.nsqd.topics["t"].channels["c"].empty()
            body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
            self.nsqd.publish("t", [body, b"small"])
            content = yield self.peek()
            self.assertLessEqual(len(content), PEEK_BYTES)
            self.assertGreater(len(content), PEEK_BYTES - 4, "as much of the body as fits")
            data = json.loads(content)
            self.assertEqual(list(data), ["messages", "truncated"])
            (m,) = data["messages"]
            self.assertEqual(list(m), ["id", "timestamp", "attempts", "body", "body_bytes", "truncated"])
            self.assertEqual((m["body_bytes"], m["truncated"]), (size, True))
            cut = base64.b64decode(m["body"])
            self.assertEqual(cut, body[: len(cut)])

    def test_a_cut_dead_letter_keeps_its_origin_first(self) -> None:
        msg = Message(b"0123456789abcdef", b"x" * (5 << 20), 1, 1)
        data = json.loads(peek_json([msg], lambda msg_id: {"topic": "t", "channel": "c"}))
        (m,) = data["messages"]
        self.assertEqual(list(m), ["id", "timestamp", "attempts", "body", "dead_letter", "body_bytes", "truncated"])
        self.assertEqual(message_json(msg)[:40], b'{"id":"0123456789abcdef","timestamp":1,"')
