from twisted.trial import unittest

from nsqd_tw.core.message import Message
from nsqd_tw.core.topic import TopicError
from tests.helpers import make_nsqd
from tests.nsqd_tw.test_channel import FakeConsumer


class TopicTests(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd(mem_queue_size=10)
        self.clock = self.nsqd.reactor
        self.topic = self.nsqd.get_topic("t")

    def msgs(self, n: int) -> list[Message]:
        return [Message(self.nsqd.guid.new_id(), b"%d" % i, self.nsqd.now_ns()) for i in range(n)]

    def test_every_channel_gets_a_copy(self) -> None:
        a = self.topic.get_channel("a")
        b = self.topic.get_channel("b")
        self.topic.put_messages(self.msgs(3))
        self.assertEqual((a.depth(), b.depth()), (3, 3))
        self.assertEqual([m.id for m in a.queued()], [m.id for m in b.queued()])
        self.assertIs(a.memory[0], b.memory[0], "one record in memory, shared by the channels")
        first_a, _ = a._next()
        first_b, _ = b._next()
        assert first_a is not None and first_b is not None
        self.assertIsNot(first_a, first_b, "each channel delivers its own message")
        self.assertEqual((first_a.id, first_a.body), (first_b.id, first_b.body))
        self.assertEqual((self.topic.message_count, self.topic.message_bytes), (3, 3))

    def test_held_until_the_first_channel(self) -> None:
        self.topic.put_messages(self.msgs(25))
        self.assertEqual(self.topic.depth(), 25)
        ch = self.topic.get_channel("c")
        self.clock.advance(0)
        self.assertEqual((self.topic.depth(), ch.depth()), (0, 25))

    def test_backlog_is_pumped_in_batches(self) -> None:
        self.nsqd.opts.mem_queue_size = 100_000
        topic = self.nsqd.get_topic("big")
        topic.put_messages(self.msgs(2000))
        ch = topic.get_channel("c")
        topic._pump()
        self.assertEqual(ch.depth(), 512)
        # new messages wait behind the backlog
        (last,) = self.msgs(1)
        topic.put_messages([last])
        self.clock.advance(0)
        self.assertEqual(ch.depth(), 2001)
        self.assertEqual(ch.queued()[-1].id, last.id)

    def test_pause_holds_messages(self) -> None:
        ch = self.topic.get_channel("c")
        self.topic.pause()
        self.topic.put_messages(self.msgs(2))
        self.clock.advance(0)
        self.assertEqual((self.topic.depth(), ch.depth()), (2, 0))
        self.topic.unpause()
        self.clock.advance(0)
        self.assertEqual((self.topic.depth(), ch.depth()), (0, 2))

    def test_deferred_messages(self) -> None:
        ch = self.topic.get_channel("c")
        c = FakeConsumer(1, rdy=5)
        ch.add_client(c)
        (m,) = self.msgs(1)
        m.deferred = 3.0
        self.topic.put_message(m)
        self.assertEqual((len(ch.deferred), c.got), (1, []))
        self.clock.advance(3)
        ch.process_queues(self.nsqd.now())
        self.assertEqual([x.id for x in c.got], [m.id])

    def test_delete_channel(self) -> None:
        ch = self.topic.get_channel("c")
        self.topic.delete_existing_channel("c")
        self.assertTrue(ch.exiting)
        e = self.assertRaises(TopicError, self.topic.delete_existing_channel, "c")
        self.assertEqual(str(e), "channel does not exist")

    def test_put_after_delete(self) -> None:
        self.nsqd.delete_existing_topic("t")
        e = self.assertRaises(TopicError, self.topic.put_messages, self.msgs(1))
        self.assertEqual(str(e), "exiting")

    def test_ephemeral_topic_deleted_with_last_channel(self) -> None:
        topic = self.nsqd.get_topic("e#ephemeral")
        topic.get_channel("c")
        topic.delete_existing_channel("c")
        self.assertNotIn("e#ephemeral", self.nsqd.topics)

    def test_ephemeral_topic_drops_overflow(self) -> None:
        topic = self.nsqd.get_topic("e#ephemeral")
        topic.put_messages(self.msgs(15))
        self.assertEqual(topic.depth(), 10)

    def test_a_batch_kept_fills_memory_and_overflows_to_the_backend(self) -> None:
        self.topic.put_messages(self.msgs(4))
        self.topic.put_messages(self.msgs(9))  # no channel: kept, 6 in memory and 3 on the backend
        self.assertEqual((len(self.topic.memory), self.topic.backend.depth()), (10, 3))
        self.assertEqual(self.topic.memory_bytes, 10)

    def test_a_batch_that_fails_on_the_backend_leaves_nothing_kept(self) -> None:
        self.topic.put_messages(self.msgs(4))

        def full(records: object) -> object:
            raise OSError("no space left on device")

        self.patch(self.topic.backend, "put_many", full)
        self.assertRaises(OSError, self.topic.put_messages, self.msgs(9))
        self.assertEqual((len(self.topic.memory), self.topic.memory_bytes, self.topic.depth()), (4, 4, 4))

    def test_close_flushes_memory_to_backend(self) -> None:
        self.topic.put_messages(self.msgs(4))
        backend = self.topic.backend
        self.topic.close()
        self.assertEqual(backend.depth(), 4)


class CopyTests(unittest.TestCase):
    def test_second_channel_sees_first_attempt(self) -> None:
        nsqd = make_nsqd()
        topic = nsqd.get_topic("t")
        consumers = []
        for name in ("a", "b"):
            c = FakeConsumer(len(consumers) + 1, rdy=5)
            topic.get_channel(name).add_client(c)
            consumers.append(c)
        topic.put_messages([Message(nsqd.guid.new_id(), b"x", nsqd.now_ns())])
        self.assertEqual([c.got[0].attempts for c in consumers], [1, 1])
