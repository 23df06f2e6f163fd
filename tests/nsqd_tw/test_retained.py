"""The retained log's files: segments, indexes, the horizon; age-out, trim, eviction, recovery, reading."""

from __future__ import annotations

import os

from twisted.logger import Logger, formatEvent, globalLogPublisher
from twisted.trial import unittest

from nsq_wire.gofmt import rfc3339_nano
from nsq_wire.message import records
from nsqd_tw.storage.budget import DiskBudget
from nsqd_tw.storage.errors import DiskBudgetFull
from nsqd_tw.storage.faults import Gap, RetainedGap
from nsqd_tw.storage.layout import DataDirectory
from nsqd_tw.storage.retained import RetainedLog, SinceTooOld
from nsqd_tw.storage.retained_segments import SPARSE_BYTES, Position
from nsqd_tw.storage.syncer import Syncer
from tests.helpers import START_TIME, run_inline
from tests.nsqd_tw.test_diskqueue import ListLog
from tests.nsqd_tw.test_rewind import RetentionTestCase

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
            self.assertEqual(
                f.read(), b"%d\n6\n3\n" % (T0 + 2 * SECOND + 1), "the horizon, the next segment, the first segment"
            )
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


def record_offsets(path: str) -> list[int]:
    """The offset of each record of a segment, by its size prefixes (before any damage)."""
    with open(path, "rb") as f:
        data = f.read()
    out, at = [], 0
    while at + 4 <= len(data):
        out.append(at)
        at += 4 + int.from_bytes(data[at : at + 4], "big")
    return out


def flip(path: str, offset: int, n: int = 4) -> None:
    """Every bit of ``n`` bytes at ``offset`` (by default a record's size prefix)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


class DamageTests(RetainedTestCase):
    """A damaged record costs that record: every reader steps over it to the next good one."""

    def setUp(self) -> None:
        super().setUp()
        self.log = ListLog()

    def thousand(self, log: RetainedLog) -> list[bytes]:
        """1,000 records of 1,030 bytes, 10 to a publish a second: index entries at records 0, 260, 510, 770."""
        sent = []
        for k in range(100):
            sent += self.publish(log, 10, T0 + k * SECOND, start=10 * k, size=1000)
        self.assertEqual([e[1] for e in log.segments[0].sparse], [0, 260, 510, 770])
        return sent

    def damaged_lines(self) -> list[str]:
        return [x for x in self.log.lines if "damaged record" in x]

    def bad_files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.dir) if ".bad." in f)

    def test_a_reader_steps_over_a_damaged_record_to_the_next_good_one(self) -> None:
        log = self.open()
        sent = self.thousand(log)
        at = record_offsets(log.data_file(0))[500]
        flip(log.data_file(0), at)
        reader = log.reader(log.locate(None), log.end())
        got = reader.read(600, 1 << 30)
        self.assertEqual(got, sent[:500] + sent[501:601])
        self.assertTrue(reader.lost, "its caller recounts")
        self.assertEqual(log.count_between(reader.position, log.end()), 399, "the ordinals stay exact")
        got += reader.read(1000, 1 << 30)
        self.assertEqual((got, reader.position), (sent[:500] + sent[501:], log.end()))
        self.assertEqual(self.read_all(log, log.locate(None)), sent[:500] + sent[501:], "another reader too")
        (line,) = self.damaged_lines()
        self.assertIn(
            f"damaged record in {log.data_file(0)} at offset {at}: 1030 bytes skipped to the next good record at "
            f"offset {at + 1030}, kept in {log.data_file(0)}.bad.{at}",
            line,
        )
        self.assertEqual(self.bad_files(), [f"t.retained.000000.dat.bad.{at}"])
        self.assertEqual(os.path.getsize(os.path.join(self.dir, self.bad_files()[0])), 1030)
        self.assertEqual(log.faults.damaged, 1)

    def test_a_rewind_locates_its_start_past_damage(self) -> None:
        log = self.open()
        sent = self.thousand(log)
        flip(log.data_file(0), record_offsets(log.data_file(0))[500])
        start = log.locate(T0 + 50 * SECOND)  # records 500-509: the first one damaged
        self.assertEqual(start.ordinal, 501)
        self.assertEqual(self.read_all(log, start), sent[501:])
        start = log.locate(T0 + 50 * SECOND + 1)  # read from the entry at record 260, over the damage
        self.assertEqual((start.ordinal, log.count_between(start, log.end())), (510, 490))
        self.assertEqual(len(self.damaged_lines()), 1)

    def test_nothing_like_a_record_before_the_next_index_entry_resumes_there(self) -> None:
        log = self.open()
        sent = self.thousand(log)
        offsets = record_offsets(log.data_file(0))
        with open(log.data_file(0), "r+b") as f:
            f.seek(offsets[500])
            f.write(b"\0" * (offsets[510] - offsets[500]))  # to the index entry at record 510
        reader = log.reader(log.locate(None), log.end())
        self.assertEqual(reader.read(510, 1 << 30), sent[:500] + sent[510:520])
        self.assertEqual(reader.position.ordinal, 520)
        (line,) = self.damaged_lines()
        self.assertIn(f"{10 * 1030} bytes skipped to the next good record at offset {offsets[510]}", line)

    def test_logged_and_kept_once_however_often_it_is_read(self) -> None:
        log = self.open()
        sent = self.thousand(log)
        flip(log.data_file(0), record_offsets(log.data_file(0))[500])
        reader = log.reader(log.locate(None), log.end())
        for _ in range(3):
            self.assertEqual(len(reader.peek(1000)), 999)
        for _ in range(2):
            self.assertEqual(len(self.read_all(log, log.locate(T0 + 10 * SECOND))), 899)
        self.assertEqual(reader.read(2000, 1 << 30), sent[:500] + sent[501:])
        self.assertEqual((len(self.damaged_lines()), len(self.bad_files()), log.faults.damaged), (1, 1, 1))

    def test_without_its_index_start_up_steps_over_damage_and_cuts_only_a_torn_tail(self) -> None:
        log = self.open()
        sent = self.thousand(log)
        log.close()
        size = os.path.getsize(log.data_file(0))
        offsets = record_offsets(log.data_file(0))
        flip(log.data_file(0), offsets[300])
        os.remove(log.index_file(0))
        with open(log.data_file(0), "ab") as f:
            f.write(b"\x00\x00\x04\x06torn")  # a record cut short by a kill
        again = self.open(T0 + 1000 * SECOND)
        self.assertEqual((again.messages, os.path.getsize(again.data_file(0))), (999, size), "the torn tail cut")
        self.assertEqual(self.read_all(again, again.locate(None)), sent[:300] + sent[301:])
        self.assertEqual(self.read_all(again, again.locate(T0 + 40 * SECOND)), sent[400:])
        self.assertEqual(len(self.damaged_lines()), 1, "found by the scan, not again by the readers")
        self.assertEqual(again.faults.damaged, 1)
        self.assertTrue(any("bytes after the last whole record" in x for x in self.log.lines))
        # a position saved before: the records after the damage are numbered anew
        self.assertEqual(again.renumbered(Position(0, offsets[600], 600)), Position(0, offsets[600], 599))
        self.assertEqual(again.renumbered(Position(0, offsets[200], 200)), Position(0, offsets[200], 200))
        self.reactor.run()
        again.close()
        third = self.open(T0 + 2000 * SECOND)
        self.assertEqual((third.messages, third.faults.damaged), (999, 0), "the index the scan wrote")
        self.assertEqual(self.read_all(third, third.locate(None)), sent[:300] + sent[301:])

    def test_damage_is_forgotten_with_its_segment(self) -> None:
        log = self.open(segment_bytes=200)
        for k in range(4):
            self.publish(log, 4, T0 + k * SECOND, start=4 * k)  # 4 x 40 bytes: a segment each
        flip(log.data_file(0), 40)
        self.assertEqual(len(self.read_all(log, log.locate(None))), 15)
        self.assertEqual(log.faults.damaged, 1)
        log.expire(T0 + 1)
        self.assertEqual(log.faults.damaged, 0)


class GapTests(RetainedTestCase):
    """A segment missing from the data path is found at start, logged, and never skipped in silence."""

    def setUp(self) -> None:
        super().setUp()
        self.log = ListLog()

    def six(self) -> list[bytes]:
        """Segments 0 to 5, 2 messages each, published at T0, T0 + 1 s, ...; stopped cleanly."""
        log = self.open(segment_bytes=100)
        sent = []
        for k in range(6):
            sent += self.publish(log, 2, T0 + k * SECOND, start=2 * k)
        log.close()
        self.reactor.run()
        return sent

    def remove(self, *nums: int) -> None:
        for num in nums:
            for ext in ("dat", "idx"):
                os.remove(os.path.join(self.dir, f"t.retained.{num:06d}.{ext}"))

    def warnings(self) -> list[str]:
        return [x for x in self.log.lines if "missing" in x]

    def test_a_missing_segment_in_the_middle_is_a_gap(self) -> None:
        sent = self.six()
        self.remove(2)
        log = self.open(T0 + 10 * SECOND)
        gap = Gap(2, 2, T0 + SECOND, T0 + 3 * SECOND, False)
        self.assertEqual((log.faults.gaps, log.faults.missing, log.messages), ([gap], 1, 10))
        (line,) = self.warnings()
        self.assertEqual(
            line,
            f"RETAINED(t): {log.data_file(2)} missing: messages published from {rfc3339_nano(T0 + SECOND)} to "
            f"{rfc3339_nano(T0 + 3 * SECOND)} are not in the retained log; a rewind from a time in between is "
            "refused (RETAINED_GAP), one from before it skips them",
        )
        for since in (T0 + SECOND + 1, T0 + 2 * SECOND, T0 + 3 * SECOND - 1):
            with self.assertRaises(RetainedGap) as cm:
                log.locate(since)
            self.assertEqual(cm.exception.gap, gap)
        self.assertEqual(log.locate(T0 + 3 * SECOND), Position(3, 0, 0), "from the oldest after it")
        start = log.locate(T0 + SECOND)
        self.assertEqual(log.gaps_between(start, log.end()), [gap], "from before it: crossed")
        self.assertEqual(log.gaps_between(log.locate(T0 + 3 * SECOND), log.end()), [])
        reader = log.reader(start, log.end(), "CHANNEL(t:c) rewind")
        self.assertEqual(reader.read(100, 1 << 20), sent[2:4] + sent[6:])
        self.assertTrue(reader.lost)
        (line,) = [x for x in self.log.lines if "skipped" in x]
        self.assertEqual(
            line,
            "RETAINED(t): CHANNEL(t:c) rewind skipped segment 2: missing from the data path: messages published "
            f"from {rfc3339_nano(T0 + SECOND)} to {rfc3339_nano(T0 + 3 * SECOND)} are not in the retained log",
        )
        log.expire(T0 + SECOND + 1)  # segments 0 and 1: the gap is at the head now
        self.assertEqual((log.horizon_ns, log.faults.gaps), (T0 + 3 * SECOND, []))
        with self.assertRaises(SinceTooOld):
            log.locate(T0 + 2 * SECOND)

    def test_a_missing_head_moves_the_horizon(self) -> None:
        self.six()
        self.remove(0, 1)
        log = self.open(T0 + 10 * SECOND)
        self.assertEqual((log.horizon_ns, log.messages, log.faults.missing), (T0 + 2 * SECOND, 8, 0))
        (line,) = self.warnings()
        self.assertEqual(
            line,
            f"RETAINED(t): {log.data_file(0)} to {log.data_file(1)} (2 segments) missing from the head of the "
            f"retained log: messages published from {rfc3339_nano(T0)} to {rfc3339_nano(T0 + 2 * SECOND)} are "
            f"not in it; available_since moved to {rfc3339_nano(T0 + 2 * SECOND)}",
        )
        with self.assertRaises(SinceTooOld) as cm:
            log.locate(T0 + SECOND)
        self.assertEqual(cm.exception.horizon_ns, T0 + 2 * SECOND)
        self.reactor.run()
        with open(log.files.meta_file, "rb") as f:
            self.assertEqual(f.read(), b"%d\n6\n2\n" % (T0 + 2 * SECOND), "the horizon moved is kept")

    def test_a_missing_last_segment_is_a_gap_up_to_the_start(self) -> None:
        self.six()
        self.remove(5)
        log = self.open(T0 + 10 * SECOND)
        self.assertEqual(log.faults.gaps, [Gap(5, 5, T0 + 4 * SECOND, T0 + 10 * SECOND, False)])
        with self.assertRaises(RetainedGap):
            log.locate(T0 + 5 * SECOND)
        self.publish(log, 1, T0 + 11 * SECOND, start=99)
        self.assertEqual([s.num for s in log.segments], [0, 1, 2, 3, 4, 6])
        self.assertEqual(log.locate(T0 + 10 * SECOND), Position(6, 0, 0))

    def test_a_meta_file_without_the_first_segment_finds_gaps_in_the_middle_only(self) -> None:
        self.six()
        with open(os.path.join(self.dir, "t.retained.meta.dat"), "wb") as f:
            f.write(b"%d\n6\n" % T0)  # as written before issue 36
        self.remove(0, 3)
        log = self.open(T0 + 10 * SECOND)
        self.assertEqual(log.faults.gaps, [Gap(3, 3, T0 + 2 * SECOND, T0 + 4 * SECOND, False)])
        self.assertEqual(log.horizon_ns, T0, "a missing head cannot be told")
        self.reactor.run()
        with open(log.files.meta_file, "rb") as f:
            self.assertEqual(f.read(), b"%d\n6\n1\n" % T0, "written with the first segment from now on")

    def test_a_reader_from_a_missing_segment_warns_once(self) -> None:
        sent = self.six()
        self.remove(2, 3)
        log = self.open(T0 + 10 * SECOND)
        reader = log.reader(Position(2, 40, 1), log.end(), "CHANNEL(t:c) rewind")  # saved in nsqd.dat
        self.assertEqual(log.count_between(reader.position, log.end()), 4)
        for _ in range(3):
            self.assertEqual(reader.peek(10), sent[8:])
        self.assertEqual(reader.read(10, 1 << 20), sent[8:])
        (line,) = [x for x in self.log.lines if "skipped" in x]
        self.assertIn("CHANNEL(t:c) rewind skipped segments 2 to 3: missing from the data path", line)

    def test_the_first_segment_is_kept_in_the_meta_file_as_segments_come_and_go(self) -> None:
        log = self.open(segment_bytes=100)
        for k in range(3):
            self.publish(log, 2, T0 + k * SECOND, start=2 * k)
        self.reactor.run()
        with open(log.files.meta_file, "rb") as f:
            self.assertEqual(f.read(), b"%d\n3\n0\n" % T0, "written when a segment starts")
        log.expire(T0 + 100 * SECOND)
        self.reactor.run()
        with open(log.files.meta_file, "rb") as f:
            self.assertEqual(f.read(), b"%d\n3\n3\n" % (T0 + 2 * SECOND + 1), "none left: the next one")
        log.close()
        again = self.open(T0 + 200 * SECOND)
        self.assertEqual((again.faults.gaps, self.warnings()), ([], []), "deleted, not missing")


class InNSQDTests(RetentionTestCase):
    """What a damaged record or a missing segment costs a channel: its backlog kept in the
    log, a rewind resumed after a restart."""

    def setUp(self) -> None:
        super().setUp()
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def lines(self, *parts: str) -> list[str]:
        texts = [formatEvent(e) for e in self.events]
        return [t for t in texts if all(p in t for p in parts)]

    def test_a_backlog_kept_in_the_log_loses_only_a_damaged_record(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=10)
        channel = n.get_topic("t").get_channel("c")
        for at in range(0, 500, 10):
            n.publish("t", [b"m%d" % i for i in range(at, at + 10)])
        self.settle(n)
        log = n.topics["t"].retained
        assert log is not None
        self.assertEqual(channel.backend.depth(), 490, "a run of the log")
        flip(log.data_file(0), record_offsets(log.data_file(0))[200])
        bodies = self.drain(n, channel, self.consumer(channel))
        self.assertEqual(sorted(bodies), sorted(b"m%d" % i for i in range(500) if i != 200))
        self.assertEqual((channel.depth(), channel.backend.depth(), channel.backend.queued_bytes), (0, 0, 0))
        self.assertEqual(len(self.lines("damaged record")), 1)

    def test_a_rewind_resumed_in_a_missing_segment_says_what_it_skips(self) -> None:
        n = self.start(retention=3600.0, max_bytes_per_file=100_000)  # 2,000 messages a segment
        first = n.now_ns()
        self.publish(n, "t", 12_000, batch=1000)
        log = n.topics["t"].retained
        assert log is not None
        self.assertEqual([s.count for s in log.segments], [2000] * 6)
        channel = n.topics["t"].get_channel("c")
        n.reactor.advance(0)
        n.retention.start_rewind(channel, first + SECOND)  # no room: it stays at its start in segment 0
        self.stop(n)
        for ext in ("dat", "idx"):
            os.remove(os.path.join(self.dir, f"t.retained.000000.{ext}"))
        n = self.start(retention=3600.0, max_bytes_per_file=100_000)
        self.assertEqual(len(self.lines("t.retained.000000.dat missing from the head of the retained log")), 1)
        self.assertEqual(len(self.lines("rewinding since", "missing from the retained log, skipped: segment 0")), 1)
        channel = n.topics["t"].channels["c"]
        bodies = self.drain(n, channel, self.consumer(channel))
        self.assertEqual(len(bodies), 12_000 + 10_000, "what was queued, and the rewind from segment 1 on")
        self.assertEqual(len(self.lines("CHANNEL(t:c) rewind skipped segment 0: missing from the data path")), 1)
