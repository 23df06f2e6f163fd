from twisted.trial import unittest

from nsqd_tw.core.channel import ChannelError
from nsqd_tw.core.message import Message
from nsqd_tw.options import NSQDOptions
from nsqd_tw.tcp.client import ClientV2
from tests.helpers import make_nsqd


class _Recording:
    """A connection and output for a ClientV2 that keep what it is sent."""

    transport = None

    def __init__(self) -> None:
        self.got: list[Message] = []
        self.writes = 0
        self.closed = False

    def message(self, frames: bytes) -> None:
        self.writes += 1
        while frames:
            size = int.from_bytes(frames[:4], "big")
            self.got.append(Message.decode(frames[8 : 4 + size]))
            frames = frames[4 + size :]

    def close(self) -> None:
        self.closed = True

    shutdown = close


class FakeConsumer(ClientV2):
    """A real ClientV2 (its counters are the real ones) whose messages are kept."""

    def __init__(self, cid: int, rdy: int = 0, msg_timeout: float = 60.0) -> None:
        recording = _Recording()
        super().__init__(recording, NSQDOptions(node_id=1), None, 0.0, None)  # type: ignore[arg-type]
        self.output = recording  # type: ignore[assignment]
        self.id = cid
        self.ready_count = rdy
        self.msg_timeout = msg_timeout

    @property
    def got(self) -> list[Message]:
        return self.conn.got  # type: ignore[attr-defined, no-any-return]

    @property
    def closed(self) -> bool:
        return self.conn.closed  # type: ignore[attr-defined, no-any-return]


def new_msg(nsqd, body: bytes = b"x") -> Message:
    return Message(nsqd.guid.new_id(), body, nsqd.now_ns())


class ChannelTests(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd(mem_queue_size=10)
        self.clock = self.nsqd.reactor
        self.channel = self.nsqd.get_topic("t").get_channel("c")

    def put(self, n: int) -> list[Message]:
        msgs = [new_msg(self.nsqd, b"%d" % i) for i in range(n)]
        self.channel.put_messages(msgs)
        return msgs

    def test_queued_until_a_consumer_is_ready(self) -> None:
        self.put(3)
        c = FakeConsumer(1)
        self.channel.add_client(c)
        self.channel.kick()
        self.assertEqual(c.got, [])
        c.ready_count = 2
        self.channel.kick()
        self.assertEqual([m.body for m in c.got], [b"0", b"1"])
        self.assertEqual(self.channel.depth(), 1)
        self.assertEqual(len(self.channel.in_flight), 2)
        self.assertEqual(c.got[0].attempts, 1)

    def test_spread_round_robin(self) -> None:
        a, b = FakeConsumer(1, rdy=10), FakeConsumer(2, rdy=10)
        self.channel.add_client(a)
        self.channel.add_client(b)
        self.put(6)
        self.assertEqual((len(a.got), len(b.got)), (3, 3))

    def test_a_burst_is_one_buffer(self) -> None:
        c = FakeConsumer(1, rdy=100)
        self.channel.add_client(c)
        self.channel.stage([m.encode() for m in (new_msg(self.nsqd) for _ in range(8))])
        self.channel.kick()
        self.assertEqual((len(c.got), c.conn.writes), (8, 1))  # type: ignore[attr-defined]
        self.assertEqual([m.attempts for m in c.got], [1] * 8)
        self.assertEqual(len(self.channel.in_flight), 8)

    def test_a_burst_stops_at_a_mebibyte_and_a_backed_up_consumer_gets_no_more(self) -> None:
        nsqd = make_nsqd(mem_queue_size=100)
        channel = nsqd.get_topic("t").get_channel("c")
        c = FakeConsumer(1, rdy=100)
        channel.add_client(c)
        channel.stage([m.encode() for m in (new_msg(nsqd, b"x" * 100_000) for _ in range(30))])
        got = c.conn.message  # type: ignore[attr-defined]

        def backs_up(frames: bytes) -> None:
            got(frames)
            c.blocked = True  # the transport paused its producer: more than it can take unsent

        c.output.message = backs_up  # type: ignore[union-attr, method-assign]
        channel.kick()
        self.assertEqual((c.conn.writes, len(c.got)), (1, 10))  # type: ignore[attr-defined]
        c.blocked = False  # drained
        channel.kick()
        self.assertEqual((c.conn.writes, len(c.got)), (2, 20))  # type: ignore[attr-defined]

    def test_bursts_share_what_is_queued(self) -> None:
        consumers = [FakeConsumer(1, rdy=1), FakeConsumer(2, rdy=100), FakeConsumer(3, rdy=100)]
        for c in consumers:
            self.channel.add_client(c)
        self.channel.stage([m.encode() for m in (new_msg(self.nsqd) for _ in range(9))])
        self.channel.kick()
        # a fair share is 3 each; the first has room for 1, the rest goes to the others
        self.assertEqual([len(c.got) for c in consumers], [1, 4, 4])
        self.assertEqual(sum(c.in_flight_count for c in consumers), 9)

    def test_finish_messages_reports_refusals_in_order(self) -> None:
        a, b = FakeConsumer(1, rdy=10), FakeConsumer(2, rdy=10)
        self.channel.add_client(a)
        self.channel.add_client(b)
        self.put(4)
        ids = [m.id for m in a.got] + [b.got[0].id, b"0123456789abcdef"]
        finished, refused = self.channel.finish_messages(1, ids)
        self.assertEqual(finished, 2)
        self.assertEqual(
            [(i, str(e)) for i, e in refused],
            [(b.got[0].id, "client does not own message"), (b"0123456789abcdef", "ID not in flight")],
        )
        self.assertEqual((self.channel.finish_count, len(self.channel.in_flight)), (2, 2))

    def test_overflow_goes_to_backend_and_comes_back(self) -> None:
        msgs = self.put(25)
        self.assertEqual(len(self.channel.memory), 10)
        self.assertEqual(self.channel.backend.depth(), 15)
        c = FakeConsumer(1, rdy=100)
        self.channel.add_client(c)
        self.channel.kick()
        self.assertEqual(sorted(m.id for m in c.got), sorted(m.id for m in msgs))

    def test_a_batch_that_overflows_and_fails_on_the_backend_leaves_nothing_queued(self) -> None:
        self.put(4)
        before = (list(self.channel.memory), self.channel.memory_bytes)

        def full(records: object) -> object:
            raise OSError("no space left on device")

        self.patch(self.channel.backend, "put_many", full)
        msgs = [new_msg(self.nsqd, b"body %d" % i) for i in range(9)]  # 6 fit in memory, 3 do not
        self.assertRaises(OSError, self.channel.stage, [m.encode() for m in msgs])
        self.assertEqual((list(self.channel.memory), self.channel.memory_bytes), before)
        self.assertEqual(self.channel.depth(), 4)

    def test_a_batch_fills_memory_by_count_and_bytes(self) -> None:
        self.put(4)
        take_back = self.channel.stage([new_msg(self.nsqd, b"body %d" % i).encode() for i in range(9)])
        self.assertEqual((len(self.channel.memory), self.channel.backend.depth()), (10, 3))
        self.assertEqual(self.channel.memory_bytes, 4 * 1 + 6 * 6)  # bodies "0".."3", then "body 0".."body 5"
        take_back()
        self.assertEqual((len(self.channel.memory), self.channel.memory_bytes, self.channel.depth()), (4, 4, 4))

    def test_a_burst_takes_memory_and_backend_in_turns(self) -> None:
        msgs = self.put(25)  # 10 in memory, 15 on disk
        c = FakeConsumer(1, rdy=14)
        self.channel.add_client(c)
        self.channel.kick()
        first = [m.id for m in c.got]
        self.assertEqual(len(first), 14)
        on_disk = {m.id for m in msgs[10:]}
        self.assertEqual([i in on_disk for i in first], [True, False] * 7)  # as _next alternates
        c.ready_count = 100
        self.channel.kick()
        self.assertEqual(sorted(m.id for m in c.got), sorted(m.id for m in msgs))
        self.assertEqual((self.channel.depth(), self.channel.memory_bytes), (0, 0))

    def test_finish_requires_owner(self) -> None:
        a, b = FakeConsumer(1, rdy=1), FakeConsumer(2, rdy=1)
        self.channel.add_client(a)
        self.channel.add_client(b)
        (m,) = self.put(1)
        owner, other = (a, b) if a.got else (b, a)
        e = self.assertRaises(ChannelError, self.channel.finish_message, other.id, m.id)
        self.assertEqual(str(e), "client does not own message")
        self.channel.finish_message(owner.id, m.id)
        e = self.assertRaises(ChannelError, self.channel.finish_message, owner.id, m.id)
        self.assertEqual(str(e), "ID not in flight")

    def test_timeout_requeues(self) -> None:
        c = FakeConsumer(1, rdy=1, msg_timeout=5)
        self.channel.add_client(c)
        self.put(1)
        self.clock.advance(4.9)
        self.assertFalse(self.channel.process_queues(self.nsqd.now()))
        self.clock.advance(0.2)
        self.assertTrue(self.channel.process_queues(self.nsqd.now()))
        self.assertEqual(self.channel.timeout_count, 1)
        self.assertEqual(len(c.got), 2)
        self.assertEqual(c.got[1].attempts, 2)

    def test_touch_extends_but_not_past_max(self) -> None:
        self.nsqd.opts.max_msg_timeout = 8
        c = FakeConsumer(1, rdy=1, msg_timeout=5)
        self.channel.add_client(c)
        (m,) = self.put(1)
        self.clock.advance(4)
        self.channel.touch_message(1, m.id, 5)
        self.clock.advance(4)  # t=8: the max (delivery + 8) is reached
        self.assertTrue(self.channel.process_queues(self.nsqd.now()))

    def test_requeue_with_delay(self) -> None:
        c = FakeConsumer(1, rdy=1)
        self.channel.add_client(c)
        (m,) = self.put(1)
        self.channel.requeue_message(1, m.id, 2.0)
        c.in_flight_count -= 1
        self.assertEqual(len(self.channel.deferred), 1)
        self.clock.advance(1.9)
        self.channel.process_queues(self.nsqd.now())
        self.assertEqual(len(c.got), 1)
        self.clock.advance(0.2)
        self.channel.process_queues(self.nsqd.now())
        self.assertEqual(len(c.got), 2)
        self.assertEqual(self.channel.requeue_count, 1)

    def test_disconnect_requeues_in_flight_at_once(self) -> None:
        a = FakeConsumer(1, rdy=5)
        self.channel.add_client(a)
        msgs = self.put(3)
        b = FakeConsumer(2, rdy=5)
        self.channel.add_client(b)
        self.channel.remove_client(1)
        self.assertEqual(sorted(m.id for m in b.got), sorted(m.id for m in msgs))
        self.assertEqual(len(self.channel.in_flight), 3)

    def test_pause(self) -> None:
        c = FakeConsumer(1, rdy=5)
        self.channel.add_client(c)
        self.channel.pause()
        self.put(2)
        self.assertEqual(c.got, [])
        self.channel.unpause()
        self.assertEqual(len(c.got), 2)

    def test_max_channel_consumers(self) -> None:
        self.nsqd.opts.max_channel_consumers = 1
        self.channel.add_client(FakeConsumer(1))
        e = self.assertRaises(ChannelError, self.channel.add_client, FakeConsumer(2))
        self.assertEqual(str(e), "consumers for t:c exceeds limit of 1")

    def test_empty(self) -> None:
        c = FakeConsumer(1, rdy=2)
        self.channel.add_client(c)
        self.put(15)
        self.channel.empty()
        self.assertEqual((self.channel.depth(), len(self.channel.in_flight), c.in_flight_count), (0, 0, 0))

    def test_sample_rate_drops_the_rest(self) -> None:
        c = FakeConsumer(1, rdy=1000)
        c.sample_rate = 50
        self.channel.add_client(c)
        for _ in range(20):
            self.put(10)
        self.assertTrue(50 < len(c.got) < 150, len(c.got))
        self.assertEqual(self.channel.depth(), 0)

    def test_close_flushes_everything_to_backend(self) -> None:
        c = FakeConsumer(1, rdy=2)
        self.channel.add_client(c)
        self.put(5)
        m = c.got[0]
        self.channel.requeue_message(1, m.id, 60)
        backend = self.channel.backend
        self.channel.close()
        self.assertTrue(c.closed)
        self.assertEqual(backend.depth(), 5)


class EphemeralChannelTests(unittest.TestCase):
    def test_deleted_with_last_client(self) -> None:
        nsqd = make_nsqd()
        topic = nsqd.get_topic("t")
        ch = topic.get_channel("c#ephemeral")
        ch.add_client(FakeConsumer(1))
        ch.remove_client(1)
        self.assertNotIn("c#ephemeral", topic.channels)
        self.assertTrue(ch.exiting)

    def test_zero_memory_still_feeds_a_waiting_consumer(self) -> None:
        nsqd = make_nsqd(mem_queue_size=0)
        ch = nsqd.get_topic("t").get_channel("c#ephemeral")
        c = FakeConsumer(1, rdy=1)
        ch.add_client(c)
        ch.put_messages([new_msg(nsqd), new_msg(nsqd)])
        self.assertEqual(len(c.got), 1)
        self.assertEqual(ch.depth(), 0)
