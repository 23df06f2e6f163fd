"""The retained log's files: segments, indexes, the horizon; age-out, trim, eviction, recovery, reading."""

from __future__ import annotations

import os

from twisted.logger import Logger
from twisted.trial import unittest

from nsq_wire.message import records
from nsqd_tw.storage.budget import DiskBudget
from nsqd_tw.storage.errors import DiskBudgetFull
from nsqd_tw.storage.layout import DataDirectory
from nsqd_tw.storage.retained import SPARSE_BYTES, Position, RetainedLog, SinceTooOld
from nsqd_tw.storage.syncer import Syncer
from tests.helpers import START_TIME, run_inline

T0 = int(START_TIME * 1e9)
SECOND = 1_000_000_000


class Clockless:
    """The Syncer's reactor: what it schedules runs when the test says (:meth:`run`)."""

    def __init__(self) -> None:
        self.calls: list = []

    def callLater(self, delay: float, fn, *args):
        self.calls.append((fn, args))
        return _Call()

    def run(self) -> None:
        while self.calls:
            fn, args = self.calls.pop(0)
            fn(*args)


class _Call:
    def active(self) -> bool:
        return False

    def cancel(self) -> None:
        pass


class RetainedTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.reactor = Clockless()
        self.syncer = Syncer(self.reactor, run_inline)
        self.log = Logger(namespace="test_retained")

    def open(self, now_ns: int = T0, **kw) -> RetainedLog:
        kw.setdefault("max_msg_size", 1024)
        existing = DataDirectory(self.dir).take_retained("t")
        return RetainedLog("t", self.dir, self.syncer, self.log, now_ns, existing, **kw)

    def publish(self, log: RetainedLog, n: int, ts: int, start: int = 0, size: int = 10) -> list[bytes]:
        """``n`` messages published together at ``ts`` (IDs ``start``...)."""
        ids = [b"%016d" % i for i in range(start, start + n)]
        recs = records(ids, [b"x" * size] * n, ts)
        log.append(recs, ts)
        return recs

    def files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.dir) if ".retained." in f)

    def read_all(self, log: RetainedLog, start: Position) -> list[bytes]:
        reader = log.reader(start, log.end())
        out: list[bytes] = []
        while not reader.done:
            out += reader.read(7, 1 << 20)
        reader.close()
        return out


class AppendAndLocateTests(RetainedTestCase):
    def test_rewind_from_a_time_reads_from_there_in_publish_order(self) -> None:
        log = self.open()
        sent = []
        for k in range(10):
            sent += self.publish(log, 3, T0 + k * SECOND, start=3 * k)
        self.assertEqual((log.messages, log.earliest_ts), (30, T0))
        start = log.locate(T0 + 4 * SECOND)
        self.assertEqual(self.read_all(log, start), sent[12:])
        self.assertEqual(log.count_between(start, log.end()), 18)
        self.assertEqual(self.read_all(log, log.locate(None)), sent)
        self.assertEqual(self.read_all(log, log.locate(T0 + 4 * SECOND + 1)), sent[15:], "from the next publish")
        self.assertEqual(log.locate(T0 + 100 * SECOND), log.end(), "after the last: nothing")

    def test_files_are_framed_as_disk_queue_records(self) -> None:
        log = self.open()
        recs = self.publish(log, 2, T0)
        with open(log.data_file(0), "rb") as f:
            data = f.read()
        self.assertEqual(data, b"".join(len(r).to_bytes(4, "big") + r for r in recs))
        self.assertEqual(self.files(), ["t.retained.000000.dat", "t.retained.meta.dat"][:1])

    def test_segments_roll_by_size_and_index_with_the_next_sync(self) -> None:
        log = self.open(segment_bytes=500)
        for k in range(10):
            self.publish(log, 3, T0 + k, start=3 * k)  # 3 x 40 bytes a publish
        self.assertEqual([s.count for s in log.segments], [12, 12, 6])
        self.reactor.run()
        self.assertEqual(
            self.files(),
            [
                "t.retained.000000.dat",
                "t.retained.000000.idx",
                "t.retained.000001.dat",
                "t.retained.000001.idx",
                "t.retained.000002.dat",
                "t.retained.meta.dat",
            ],
        )
        start = log.locate(T0 + 5)
        self.assertEqual(start, Position(1, 120, 3))
        self.assertEqual(log.count_between(start, log.end()), 15)

    def test_segments_roll_by_age(self) -> None:
        log = self.open(roll_ns=10 * SECOND)
        for k in range(5):
            self.publish(log, 1, T0 + k * 4 * SECOND, start=k)
        self.assertEqual([s.count for s in log.segments], [3, 2])

    def test_the_sparse_index_finds_a_start_deep_in_a_segment(self) -> None:
        log = self.open()
        for k in range(400):  # 400 x 10 x 1026 bytes: 16 entries
            self.publish(log, 10, T0 + k * SECOND, start=10 * k, size=1000)
        seg = log.segments[0]
        self.assertGreater(len(seg.sparse), 10)
        self.assertEqual(len(seg.sparse), -(-seg.size // SPARSE_BYTES))
        self.assertTrue(all(k * SPARSE_BYTES <= e[0] < k * SPARSE_BYTES + 10_260 for k, e in enumerate(seg.sparse)))
        start = log.locate(T0 + 317 * SECOND)
        self.assertEqual(start.ordinal, 3170)
        self.assertEqual(len(self.read_all(log, start)), 830)

    def test_take_back(self) -> None:
        log = self.open()
        self.publish(log, 2, T0)
        mark = log.append(records([b"%016d" % 9], [b"y"], T0 + 1), T0 + 1)
        log.take_back(mark)
        self.assertEqual((log.messages, log.bytes, os.path.getsize(log.data_file(0))), (2, 80, 80))


class RestartTests(RetainedTestCase):
    def test_a_clean_restart_reads_indexes_and_writes_a_new_segment(self) -> None:
        log = self.open()
        sent = self.publish(log, 5, T0)
        log.close()
        self.assertIn("t.retained.000000.idx", self.files())
        again = self.open(T0 + SECOND)
        self.assertEqual((again.messages, again.horizon_ns, again.earliest_ts), (5, T0, T0))
        sent += self.publish(again, 1, T0 + SECOND, start=5)
        self.assertEqual([s.num for s in again.segments], [0, 1])
        self.assertEqual(self.read_all(again, again.locate(None)), sent)

    def test_after_a_kill_segments_without_index_are_scanned_and_torn_bytes_cut(self) -> None:
        log = self.open()
        sent = self.publish(log, 4, T0)
        self.reactor.run()  # the horizon written; the segment has no index yet
        with open(log.data_file(0), "ab") as f:
            f.write(b"\x00\x00\x01\x00torn")  # a record cut short by the kill
        again = self.open(T0 + SECOND)
        self.assertEqual((again.messages, again.bytes), (4, 160))
        self.assertEqual(os.path.getsize(again.data_file(0)), 160)
        self.assertEqual(self.read_all(again, again.locate(T0)), sent)
        self.reactor.run()
        self.assertIn("t.retained.000000.idx", self.files())


class DeletionTests(RetainedTestCase):
    def test_age_out_deletes_whole_segments_and_moves_the_horizon(self) -> None:
        log = self.open(segment_bytes=100)
        for k in range(6):
            self.publish(log, 2, T0 + k * SECOND, start=2 * k)  # a segment each
        gone = log.expire(T0 + 3 * SECOND)
        self.assertEqual([s.num for s in gone], [0, 1, 2])
        self.assertEqual((log.messages, log.horizon_ns), (6, T0 + 2 * SECOND + 1))
        self.reactor.run()
        self.assertFalse(os.path.exists(log.data_file(0)))
        self.assertFalse(os.path.exists(log.index_file(2)))
        with open(log.files.meta_file, "rb") as f:
            self.assertEqual(f.read(), b"%d\n6\n" % (T0 + 2 * SECOND + 1), "the horizon, the next segment")
        with self.assertRaises(SinceTooOld) as cm:
            log.locate(T0 + 2 * SECOND)
        self.assertEqual(cm.exception.horizon_ns, T0 + 2 * SECOND + 1)
        self.assertEqual(log.locate(T0 + 2 * SECOND + 1), Position(3, 0, 0))
        log.expire(T0 + 100 * SECOND)
        self.assertEqual((log.messages, log.bytes, log.segments), (0, 0, []), "the segment written to as well")
        self.assertEqual(log.locate(T0 + 5 * SECOND + 1), log.end())

    def test_trim_keeps_the_log_under_its_byte_bound(self) -> None:
        log = self.open(segment_bytes=100)
        for k in range(6):
            self.publish(log, 2, T0 + k, start=2 * k)  # 80 bytes a segment
        log.trim(250)
        self.assertEqual((len(log.segments), log.bytes), (3, 240))

    def test_the_disk_budget_evicts_retained_segments_first(self) -> None:
        budget = DiskBudget(400)
        logs: list[RetainedLog] = []

        def reclaim(need: int) -> None:
            freed = 0
            while freed < need and logs[0].segments:
                freed += logs[0].evict()

        budget.reclaim = reclaim
        log = self.open(segment_bytes=100, budget=budget)
        logs.append(log)
        for k in range(6):
            self.publish(log, 2, T0 + k, start=2 * k)
        self.assertLessEqual(budget.used, 400)
        self.assertEqual((budget.used, [s.num for s in log.segments]), (400, [1, 2, 3, 4, 5]))
        budget.used += 250  # a disk queue's backlog
        self.publish(log, 2, T0 + 10, start=99)
        self.assertEqual([s.num for s in log.segments], [6], "all of it went, the one written to too")
        budget.used += 100
        with self.assertRaises(DiskBudgetFull):
            self.publish(log, 2, T0 + 11, start=200)
        self.assertEqual(log.messages, 0)

    def test_a_reader_skips_what_was_deleted_before_it_got_there(self) -> None:
        log = self.open(segment_bytes=100)
        sent = []
        for k in range(4):
            sent += self.publish(log, 2, T0 + k, start=2 * k)
        reader = log.reader(log.locate(None), log.end())
        self.assertEqual(reader.read(1, 1 << 20), sent[:1])
        log.expire(T0 + 3)  # segments 0 (being read: its file stays open), 1 and 2
        out = reader.read(10, 1 << 20)
        self.assertEqual(out, [sent[1], *sent[6:]])
        self.assertTrue(reader.lost)
        self.assertTrue(reader.done)

    def test_delete_removes_every_file(self) -> None:
        log = self.open(segment_bytes=100)
        for k in range(3):
            self.publish(log, 2, T0 + k, start=2 * k)
        self.reactor.run()
        log.delete()
        self.reactor.run()
        self.assertEqual(self.files(), [])
