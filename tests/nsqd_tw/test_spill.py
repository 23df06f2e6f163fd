"""A retained topic's channel keeps what its memory can't hold as runs of the retained log (storage/spill.py)."""

from __future__ import annotations

import os

from nsqd_tw.core.message import Message
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.storage.backend import CutRecord
from nsqd_tw.storage.diskqueue import DiskQueue
from nsqd_tw.storage.spill import SpillQueue
from tests.nsqd_tw.test_rewind import RetentionTestCase

SECOND = 1_000_000_000


class SpillTests(RetentionTestCase):
    def queue_files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.dir) if ".diskqueue." in f and not f.endswith("meta.dat"))

    def spill_files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.dir) if f.endswith(".spill.dat"))

    def bodies(self, start: int, stop: int) -> list[bytes]:
        return [b"m%d" % i for i in range(start, stop)]

    def fill(self, n: NSQD, count: int, start: int = 0) -> None:
        """``count`` messages past a memory queue of 10, 10 to a publish."""
        for at in range(start, start + count, 10):
            n.publish("t", self.bodies(at, min(at + 10, start + count)))
        self.settle(n)

    def test_a_backlog_is_written_once(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.get_topic("t").get_channel("c")
        self.assertIsInstance(channel.backend, SpillQueue)
        self.fill(n, 500)
        self.assertEqual(channel.depth(), 500)
        self.assertEqual(self.queue_files(), [], "no second copy in a disk queue")
        self.assertEqual(channel.backend.depth(), 490)
        log = n.topics["t"].retained
        assert log is not None
        self.assertEqual(channel.backend.queued_bytes, sum(4 + 26 + len(b) for b in self.bodies(10, 500)))
        self.assertEqual(n.disk_budget.used, log.bytes, "counted once in the disk budget")
        c = self.consumer(channel)
        self.assertEqual(sorted(self.drain(n, channel, c)), sorted(self.bodies(0, 500)))
        self.assertEqual(channel.depth(), 0)

    def test_once_spilling_every_publish_joins_the_run(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.get_topic("t").get_channel("c")
        self.fill(n, 30)
        c = self.consumer(channel, rdy=5)  # memory now has room, the run is still there
        for m in list(c.got):
            channel.finish_message(c.id, m.id)
        self.fill(n, 30, start=30)
        backend = channel.backend
        assert isinstance(backend, SpillQueue)
        self.assertEqual(len(backend.runs), 1, "one run: publishes joined it rather than memory")
        self.assertEqual(backend.depth() + len(channel.memory) + len(channel.in_flight), 55)

    def test_off_by_default_and_in_durable_mode(self) -> None:
        n = self.start(mem_queue_size=10)
        self.assertIsInstance(n.get_topic("t").get_channel("c").backend, DiskQueue)
        self.fill(n, 50)
        self.assertEqual(self.spill_files(), [])
        self.stop(n)
        n = self.start(retention=3600.0, mem_queue_size=0, sync_every=1)
        self.assertIsInstance(n.get_topic("d").get_channel("c").backend, DiskQueue)

    def test_a_message_back_from_a_consumer_goes_to_the_disk_queue(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.get_topic("t").get_channel("c")
        c = self.consumer(channel, rdy=1)
        self.fill(n, 100)
        first = c.got[0]
        channel.requeue_message(c.id, first.id, 0)
        self.finished[c.id] = 1  # drain() below: not that one again
        self.assertEqual(channel.depth(), 100)
        self.assertEqual(channel.backend.inner.depth(), 1, "the message back is in the disk queue")
        c.ready_count = 100
        channel.kick()
        got = self.drain(n, channel, c)
        self.assertEqual(sorted(got), sorted(self.bodies(0, 100)))

    def test_a_clean_restart_keeps_the_runs(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.get_topic("t").get_channel("c")
        self.fill(n, 300)
        c = self.consumer(channel, rdy=50)
        for m in list(c.got):
            channel.finish_message(c.id, m.id)
        channel.remove_client(c.id)
        self.stop(n)
        self.assertEqual(self.spill_files(), ["t:c.spill.dat"])
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.topics["t"].channels["c"]
        self.assertEqual(channel.depth(), 250)
        c = self.consumer(channel)
        self.assertEqual(sorted(self.drain(n, channel, c)), sorted(self.bodies(50, 300)))

    def test_after_a_kill_everything_owed_comes_at_least_once(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.get_topic("t").get_channel("c")
        self.fill(n, 200)
        n.reactor.advance(3)  # a sync writes where the runs are
        self.settle(n)
        self.fill(n, 200, start=200)  # after the last sync
        self.crash(n)
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.topics["t"].channels["c"]
        c = self.consumer(channel)
        got = self.drain(n, channel, c)
        self.assertTrue(set(self.bodies(10, 400)) <= set(got), "all that was past memory comes again")

    def test_segments_aging_out_are_copied_to_the_disk_queue(self) -> None:
        n = self.start(retention=10.0, mem_queue_size=10)
        channel = n.get_topic("t").get_channel("c")
        for i in range(10):
            self.fill(n, 20, start=20 * i)
            n.reactor.advance(1)
        n.reactor.advance(30)
        n.queue_scan()
        self.settle(n)
        log = n.topics["t"].retained
        assert log is not None
        self.assertEqual(log.messages, 0)
        self.assertEqual(channel.depth(), 200)
        self.assertNotEqual(self.queue_files(), [])
        c = self.consumer(channel)
        self.assertEqual(sorted(self.drain(n, channel, c)), sorted(self.bodies(0, 200)))

    def test_retention_turned_off_copies_the_runs(self) -> None:
        n = self.start(mem_queue_size=10)
        topic = n.get_topic("t")
        topic.update_settings({"retention": 60.0})
        channel = topic.get_channel("c")
        self.assertIsInstance(channel.backend, SpillQueue)
        self.fill(n, 100)
        topic.update_settings({"retention": None})
        self.assertIsNone(topic.retained)
        self.assertIsInstance(channel.backend, DiskQueue)
        self.assertEqual(channel.depth(), 100)
        self.settle(n)
        self.assertEqual(self.spill_files(), [])
        c = self.consumer(channel)
        self.assertEqual(sorted(self.drain(n, channel, c)), sorted(self.bodies(0, 100)))

    def test_empty_and_delete(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        topic = n.get_topic("t")
        channel = topic.get_channel("c")
        other = topic.get_channel("d")
        self.fill(n, 100)
        channel.empty()
        self.assertEqual((channel.depth(), other.depth()), (0, 100))
        topic.delete_existing_channel("d")
        self.settle(n)
        self.assertNotIn("t:d.spill.dat", self.spill_files())

    def test_peek_and_snapshot_see_the_runs(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.get_topic("t").get_channel("c")
        self.fill(n, 100)
        backend = channel.backend
        self.assertEqual([r[26:] for r in backend.peek(5)], self.bodies(10, 15))
        snap = backend.snapshot()
        records = []
        while not snap.done:
            records += [r for _, r in snap.take()]
        self.assertEqual([r[26:] for r in records], self.bodies(10, 100))
        self.assertIsNotNone(backend.head_timestamp())

    def test_peek_within_a_byte_bound(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.get_topic("t").get_channel("c")
        self.fill(n, 100)  # m0-m9 in memory, the rest in a run
        backend = channel.backend
        assert isinstance(backend, SpillQueue)
        size = 26 + len(b"m10")
        self.assertEqual([r[26:] for r in backend.peek(50, max_bytes=3 * size)], self.bodies(10, 13))
        self.assertEqual([r[26:] for r in backend.peek(50, max_bytes=4 * size - 1)], self.bodies(10, 13))
        (cut,) = backend.peek(50, max_bytes=size - 1)
        self.assertIsInstance(cut, CutRecord)
        self.assertEqual((cut[26:], cut.size), (b"m1", size))
        # the disk queue's records come first: one that does not fit ends the peek there
        c = self.consumer(channel, rdy=1)
        self.assertEqual(c.got[0].body, b"m10")
        channel.requeue_message(c.id, c.got[0].id, 0)  # to the disk queue
        self.assertEqual(backend.inner.depth(), 1)
        self.assertEqual([r[26:] for r in backend.peek(50, max_bytes=2 * size)], [b"m10", b"m11"])
        self.assertEqual([r[26:] for r in backend.peek(50, max_bytes=2 * size - 1)], [b"m10"])
        (cut,) = backend.peek(50, max_bytes=size - 1)
        self.assertEqual((cut[26:], cut.size), (b"m1", size))
        self.assertEqual(backend.depth(), 90)
        backend.inner.put(Message(b"%016x" % 999, b"x" * 100, 0).encode())  # after it, one that does not fit
        self.assertEqual([r[26:] for r in backend.peek(50, max_bytes=3 * size)], [b"m10"], "nothing after it")

    def test_started_without_retention_the_runs_go_to_the_disk_queue(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        n.get_topic("t").get_channel("c")
        self.fill(n, 100)
        self.stop(n)
        n = self.start(mem_queue_size=10)
        channel = n.topics["t"].channels["c"]
        self.assertIsInstance(channel.backend, DiskQueue)
        self.assertEqual(channel.depth(), 100)
        self.assertEqual(self.spill_files(), [])
        self.assertNotEqual(self.retained_files(), [], "the segments stay (set retention to use them)")
        c = self.consumer(channel)
        self.assertEqual(sorted(self.drain(n, channel, c)), sorted(self.bodies(0, 100)))

    def test_a_publish_failing_in_another_channel_is_taken_back_from_the_run(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        topic = n.get_topic("t")
        channel = topic.get_channel("a")
        other = topic.get_channel("b")
        self.fill(n, 50)
        log = topic.retained
        assert log is not None
        backend = channel.backend
        assert isinstance(backend, SpillQueue)
        before = (channel.depth(), backend.spilled_bytes, len(backend.runs), log.messages, log.bytes)

        def full(*args: object, **kw: object) -> None:
            raise OSError(28, "No space left on device")

        self.patch(other, "stage", full)
        with self.assertRaises(OSError):
            n.publish("t", [b"x1", b"x2"])
        self.assertEqual((channel.depth(), backend.spilled_bytes, len(backend.runs), log.messages, log.bytes), before)
        self.patch(other, "stage", type(other).stage.__get__(other))
        n.publish("t", [b"x3"])
        self.assertEqual(channel.depth(), 51)
        c = self.consumer(channel)
        self.assertEqual(sorted(self.drain(n, channel, c)), sorted([*self.bodies(0, 50), b"x3"]))
