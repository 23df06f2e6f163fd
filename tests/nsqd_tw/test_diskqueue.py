"""The disk queue: go-diskqueue's files, rotation, metadata, faults, durable mode, deferred times."""

from __future__ import annotations

import os
import re
import shutil
import struct

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial import unittest

from nsqd_tw.core.message import Message
from nsqd_tw.storage import deferred, records
from nsqd_tw.storage.backend import CutRecord
from nsqd_tw.storage.diskqueue import DiskQueue
from nsqd_tw.storage.errors import DiskQueueError
from nsqd_tw.storage.layout import FramedRecords
from nsqd_tw.storage.syncer import Syncer

MIN, MAX = 26, 26 + 1024


class ListLog:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def _add(self, fmt: str, **kw) -> None:
        self.lines.append(fmt.format(**kw))

    info = warn = error = debug = _add


def record(i: int, size: int = 10) -> bytes:
    """An encoded message whose body is the number i, padded to size."""
    body = (b"%d" % i).ljust(size, b".")
    return Message(b"%016x" % (0x1000 + i), body, 1_700_000_000_000_000_000 + i).encode()


def number(data: bytes) -> int:
    return int(Message.decode(data).body.rstrip(b"."))


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = self.mktemp()
        os.makedirs(self.dir)
        self.clock = Clock()
        self.syncs: list[int] = []
        self.syncer = Syncer(self.clock, self.run_inline)
        self.log = ListLog()

    def run_inline(self, fn):
        self.syncs.append(1)
        return defer.maybeDeferred(fn)

    def queue(self, name: str = "t", max_bytes: int = 1 << 20, acked: bool = False, sync_every: int = 2500, **kw):
        return DiskQueue(name, self.dir, max_bytes, MIN, MAX, sync_every, self.syncer, self.log, acked=acked, **kw)

    def drain(self, q: DiskQueue) -> list[int]:
        out = []
        while (data := q.get()) is not None:
            out.append(number(data))
        return out

    def files(self) -> list[str]:
        return sorted(os.listdir(self.dir))


class FormatTests(Base):
    def test_put_get_and_file_names(self) -> None:
        q = self.queue("topic:channel")
        q.put_many([record(i) for i in range(3)])
        q.put(record(3))
        self.assertEqual(q.depth(), 4)
        self.assertEqual(self.files(), ["topic:channel.diskqueue.000000.dat"])
        self.assertEqual(self.drain(q), [0, 1, 2, 3])
        self.assertEqual(q.depth(), 0)

    def test_record_framing(self) -> None:
        q = self.queue()
        q.put(record(7))
        with open(q.files.data_file(0), "rb") as f:
            data = f.read()
        self.assertEqual(data, struct.pack(">i", len(record(7))) + record(7))

    def test_meta_file_format(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(5)])
        q.get()
        q.close()
        size = 4 + len(record(0))
        with open(q.files.meta_file, "rb") as f:
            self.assertEqual(f.read(), b"4\n0,%d\n0,%d\n" % (size, 5 * size))

    def test_meta_round_trip(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(5)])
        q.get()
        q.get()
        q.close()
        again = self.queue()
        self.assertEqual(again.depth(), 3)
        again.put(record(5))
        self.assertEqual(self.drain(again), [2, 3, 4, 5])

    def test_an_idle_queue_stops_without_rewriting_its_metadata(self) -> None:
        """A stop rewrote (and fsynced) every queue's metadata, changed or not:
        12,001 fsyncs for 4,000 idle topics, longer than a service manager waits
        on a busy disk. Metadata read clean and unchanged is left as it is."""
        q = self.queue()
        q.put_many([record(i) for i in range(3)])
        q.get()
        q.close()
        before = os.stat(q.files.meta_file).st_ino
        again = self.queue()
        again.close()
        self.assertEqual(os.stat(again.files.meta_file).st_ino, before, "unchanged: not rewritten")
        third = self.queue()
        self.assertEqual(number(third.get()), 1)
        third.close()
        self.assertNotEqual(os.stat(third.files.meta_file).st_ino, before, "changed: rewritten")
        with open(third.files.meta_file, "rb") as f:
            size = 4 + len(record(0))
            self.assertEqual(f.read(), b"1\n0,%d\n0,%d\n" % (2 * size, 3 * size))

    def test_rotation_and_removal_of_read_files(self) -> None:
        size = 4 + len(record(0))
        q = self.queue(max_bytes=3 * size)
        q.put_many([record(i) for i in range(7)])  # 3 + 3 + 1 records
        self.assertEqual(len([f for f in self.files() if f.endswith(".dat") and "meta" not in f]), 3)
        self.assertEqual([number(q.get()) for _ in range(4)], [0, 1, 2, 3])
        self.assertFalse(os.path.exists(q.files.data_file(0)), "a fully read file is removed")
        self.assertEqual(q.read_file_num, 1)
        self.assertEqual(self.drain(q), [4, 5, 6])

    def test_rotates_before_the_limit(self) -> None:
        # go-diskqueue rolls when the next record would cross max-bytes-per-file
        size = 4 + len(record(0))
        q = self.queue(max_bytes=2 * size + 5)
        q.put_many([record(i) for i in range(3)])
        self.assertEqual(os.path.getsize(q.files.data_file(0)), 2 * size)
        self.assertEqual(os.path.getsize(q.files.data_file(1)), size)

    def test_message_size_limits(self) -> None:
        q = self.queue()
        e = self.assertRaises(DiskQueueError, q.put, b"x" * 25)
        self.assertEqual(str(e), "invalid message write size (25) minMsgSize=26 maxMsgSize=1050")
        self.assertRaises(DiskQueueError, q.put, b"x" * (MAX + 1))
        self.assertEqual(q.depth(), 0)

    def test_empty_and_delete(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(3)])
        q.empty()
        self.assertEqual((q.depth(), q.get()), (0, None))
        q.put(record(9))
        self.assertEqual(self.drain(q), [9])
        q.delete()
        self.assertEqual(self.files(), [])


class FramedTests(Base):
    def test_framed_records_are_one_write_read_back_as_any(self) -> None:
        q = self.queue()
        q.put(record(0))
        batch = FramedRecords.of([record(i) for i in range(1, 4)])
        self.assertTrue(q.takes_framed(batch))
        writes: list[int] = []
        self.patch(records.os, "pwrite", lambda fd, data, offset: writes.append(len(data)) or _pwrite(fd, data, offset))
        mark = q.put_framed(batch)
        self.assertEqual(writes, [len(batch.data)])
        self.assertEqual((q.depth(), q.queued_bytes), (4, 4 * (4 + len(record(0)))))
        q.close()
        again = self.queue()
        self.assertEqual(self.drain(again), [0, 1, 2, 3])
        self.assertIsNotNone(mark)

    def test_what_does_not_fit_the_file_or_the_sizes_is_not_taken(self) -> None:
        size = 4 + len(record(0))
        q = self.queue(max_bytes=3 * size)
        q.put(record(0))
        self.assertTrue(q.takes_framed(FramedRecords.of([record(1), record(2)])))  # exactly the file
        self.assertFalse(q.takes_framed(FramedRecords.of([record(i) for i in range(1, 4)])))  # a new file
        self.assertFalse(q.takes_framed(FramedRecords.of([record(1, size=MAX)])))  # past --max-msg-size
        self.assertRaises(DiskQueueError, q.put_framed, FramedRecords.of([record(i) for i in range(1, 4)]))
        self.assertEqual(q.depth(), 1)

    def test_a_failed_write_leaves_no_trace_and_unput_takes_it_back(self) -> None:
        q = self.queue()
        q.put(record(0))
        self.patch(records.os, "pwrite", lambda fd, data, offset: (_ for _ in ()).throw(OSError(28, "No space")))
        self.assertRaises(OSError, q.put_framed, FramedRecords.of([record(1), record(2)]))
        self.assertEqual(q.depth(), 1)
        self.patch(records.os, "pwrite", _pwrite)
        q.unput(q.put_framed(FramedRecords.of([record(3)])))
        q.put(record(4))
        self.assertEqual(self.drain(q), [0, 4])


class GoCompatibilityTests(Base):
    def go_read(self, name: str) -> list[int]:
        """Read a queue the way go-diskqueue does: Fscanf the metadata, then
        records from (readFileNum, readPos) to (writeFileNum, writePos), a
        complete file ending at its size."""
        with open(os.path.join(self.dir, f"{name}.diskqueue.meta.dat"), "rb") as f:
            m = re.fullmatch(rb"(\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n", f.read())
        assert m is not None
        depth, rf, rp, wf, wp = map(int, m.groups())
        out = []
        while (rf, rp) < (wf, wp):
            with open(os.path.join(self.dir, f"{name}.diskqueue.{rf:06d}.dat"), "rb") as f:
                data = f.read()
            end = wp if rf == wf else len(data)
            while rp < end:
                (size,) = struct.unpack_from(">i", data, rp)
                out.append(number(data[rp + 4 : rp + 4 + size]))
                rp += 4 + size
            if rf < wf:
                rf, rp = rf + 1, 0
        self.assertEqual(depth, len(out))
        return out

    def test_go_reads_what_we_wrote(self) -> None:
        size = 4 + len(record(0))
        q = self.queue("t:c", max_bytes=4 * size)
        q.put_many([record(i) for i in range(10)])
        q.get()
        q.get()
        q.close()
        self.assertEqual(self.go_read("t:c"), list(range(2, 10)))

    def test_we_read_what_go_wrote(self) -> None:
        # a fixture laid out by the format description: two files, the read
        # position inside the first, the write position at the end of the second
        recs = [struct.pack(">i", len(record(i))) + record(i) for i in range(6)]
        with open(os.path.join(self.dir, "go.diskqueue.000003.dat"), "wb") as f:
            f.write(b"".join(recs[:4]))
        with open(os.path.join(self.dir, "go.diskqueue.000004.dat"), "wb") as f:
            f.write(b"".join(recs[4:]))
        read_pos = len(recs[0])
        write_pos = len(recs[4]) + len(recs[5])
        with open(os.path.join(self.dir, "go.diskqueue.meta.dat"), "w") as f:
            f.write(f"5\n3,{read_pos}\n4,{write_pos}\n")
        q = self.queue("go")
        self.assertEqual(q.depth(), 5)
        self.assertEqual(self.drain(q), [1, 2, 3, 4, 5])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "go.diskqueue.000003.dat")))


class FaultTests(Base):
    def test_failed_write_raises_and_leaves_no_trace(self) -> None:
        q = self.queue()
        q.put(record(0))

        def full(fd, data, offset):
            _pwrite(fd, bytes(data)[:5], offset)  # a partial write, then the error
            raise OSError(28, "No space left on device")

        self.patch(records.os, "pwrite", full)
        e = self.assertRaises(OSError, q.put_many, [record(1), record(2)])
        self.assertEqual(e.errno, 28)
        self.assertEqual(q.depth(), 1)
        self.patch(records.os, "pwrite", _pwrite)
        q.put(record(3))
        self.assertEqual(self.drain(q), [0, 3])

    def fail_after(self, good: int):
        """Make pwrite write ``good`` bytes more (torn mid-record), then fail as a full disk."""
        left = [good]

        def full(fd, data, offset):
            data = bytes(data)
            if len(data) <= left[0]:
                left[0] -= len(data)
                return _pwrite(fd, data, offset)
            if left[0]:
                _pwrite(fd, data[: left[0]], offset)
                left[0] = 0
            raise OSError(28, "No space left on device")

        self.patch(records.os, "pwrite", full)

    def after_a_crash(self, q: DiskQueue) -> list[int]:
        """What nsqd would read if it were killed now and restarted: a copy of the
        files (as the page cache holds them) opened by a new queue."""
        copy = self.mktemp()
        shutil.copytree(self.dir, copy)
        again = DiskQueue(
            q.name, copy, q.max_bytes_per_file, MIN, MAX, 2500, Syncer(self.clock, self.run_inline), ListLog()
        )
        return self.drain(again)

    def test_a_failed_batch_leaves_nothing_a_restart_could_read(self) -> None:
        """A batch refused half-written is taken out of the file, so a crash and restart
        (which salvages records past the synced metadata) cannot deliver any of it."""
        q = self.queue()
        q.put(record(0))
        q.sync_now()
        q.put(record(1))  # acknowledged, not synced yet
        size = os.path.getsize(q.files.data_file(0))
        self.fail_after(len(record(2)) + 4 + 10)  # record 2 whole, record 3 torn
        self.assertRaises(OSError, q.put_many, [record(2), record(3), record(4)])
        self.assertEqual(os.path.getsize(q.files.data_file(0)), size)
        self.assertEqual(q.depth(), 2)
        self.patch(records.os, "pwrite", _pwrite)
        self.assertEqual(self.after_a_crash(q), [0, 1])
        q.put(record(5))
        self.assertEqual(self.drain(q), [0, 1, 5])

    def test_a_failed_batch_across_files_is_taken_back_whole(self) -> None:
        size = 4 + len(record(0))
        q = self.queue(max_bytes=3 * size)
        q.put_many([record(0), record(1)])
        self.fail_after(2 * size)  # file 0 fills with 2 and 3; file 1 fails
        self.assertRaises(OSError, q.put_many, [record(i) for i in range(2, 7)])
        self.assertEqual(os.path.getsize(q.files.data_file(0)), 2 * size)
        self.assertFalse(os.path.exists(q.files.data_file(1)))
        self.assertEqual((q.write_file_num, q.write_pos, q.depth()), (0, 2 * size, 2))
        self.patch(records.os, "pwrite", _pwrite)
        self.assertEqual(self.after_a_crash(q), [0, 1])
        q.put_many([record(7), record(8)])
        self.assertEqual(self.drain(q), [0, 1, 7, 8])

    def test_unput_takes_back_the_last_batch(self) -> None:
        q = self.queue(max_bytes=3 * (4 + len(record(0))))
        q.put(record(0))
        mark = q.put_many([record(i) for i in range(1, 6)])
        q.unput(mark)
        self.assertEqual(q.depth(), 1)
        self.assertFalse(os.path.exists(q.files.data_file(1)))
        self.assertEqual(self.after_a_crash(q), [0])
        q.put(record(9))
        self.assertEqual(self.drain(q), [0, 9])


_pwrite = os.pwrite


class AckedTests(Base):
    def test_unfinished_records_are_read_again_after_a_crash(self) -> None:
        q = self.queue(acked=True)
        q.put_many([record(i) for i in range(4)])
        items = [q.read() for _ in range(4)]
        q.done(items[0][1])
        q.done(items[2][1])  # 1 is still in flight
        self.assertEqual(q.meta_text().split(b"\n")[1], b"0,%d" % (4 + len(record(0))))
        q.sync_now()  # what a sync persists; then the process dies
        again = self.queue(acked=True)
        self.assertEqual(self.drain(again), [1, 2, 3])

    def test_done_removes_files_behind_the_cursor(self) -> None:
        size = 4 + len(record(0))
        q = self.queue(max_bytes=2 * size, acked=True)
        q.put_many([record(i) for i in range(6)])
        items = [q.read() for _ in range(3)]
        self.assertTrue(os.path.exists(q.files.data_file(0)), "file 0 holds unfinished records")
        for _, ref in items:
            q.done(ref)
        self.assertFalse(os.path.exists(q.files.data_file(0)))
        self.assertTrue(os.path.exists(q.files.data_file(1)))


class TombstoneTests(Base):
    """Records dropped (a bound, the TTL) while an older one is still owned stay
    dropped across a crash: the persisted read position cannot pass them yet."""

    def msg_id(self, i: int) -> bytes:
        return b"%016x" % (0x1000 + i)

    def test_a_dropped_record_is_not_read_again_after_a_crash(self) -> None:
        q = self.queue(acked=True)
        q.put_many([record(i) for i in range(5)])
        items = [q.read() for _ in range(4)]  # 0 stays in flight
        q.drop(items[1][1], self.msg_id(1))
        q.drop(items[2][1], self.msg_id(2))
        q.done(items[3][1])  # finished: at least once, it may come back
        q.sync_now()
        again = self.queue(acked=True)
        self.assertEqual(again.depth(), 3, "0, 3 and 4: the dropped ones are not counted")
        self.assertEqual(self.drain(again), [0, 3, 4])
        self.assertEqual(again.depth(), 0)

    def test_tombstones_go_once_the_read_position_passes_them(self) -> None:
        q = self.queue(acked=True)
        q.put_many([record(i) for i in range(3)])
        items = [q.read() for _ in range(3)]
        q.drop(items[1][1], self.msg_id(1))
        self.assertEqual(list(q.deferred.dropped), [self.msg_id(1)])
        q.drop(items[0][1], self.msg_id(0))  # the oldest: the position moves at once, no tombstone
        self.assertEqual(q.deferred.dropped, {})
        q.done(items[2][1])
        q.sync_now()
        self.assertFalse(os.path.exists(q.files.deferred_file))
        self.assertEqual(self.drain(self.queue(acked=True)), [])

    def test_a_tombstone_behind_the_persisted_position_is_forgotten(self) -> None:
        q = self.queue(acked=True)
        q.put_many([record(i) for i in range(3)])
        items = [q.read() for _ in range(2)]
        q.drop(items[1][1], self.msg_id(1))
        q.done(items[0][1])  # the position passes 1; the file still lists its tombstone
        with open(q.files.meta_file, "wb") as f:
            f.write(q.meta_text())  # what a sync persisted before a crash
        with open(q.files.deferred_file, "rb") as f:
            self.assertIn(b" drop ", f.read())
        again = self.queue(acked=True)
        self.assertEqual((again.depth(), again.deferred.dropped), (1, {}))
        self.assertEqual(self.drain(again), [2])


class DeferredTimesTests(Base):
    def test_deferred_time_survives_close(self) -> None:
        q = self.queue()
        q.put(record(1))
        msg_id = Message.decode(record(1)).id
        q.set_deferred(msg_id, 1_800_000_000_000_000_000)
        q.close()
        again = self.queue()
        self.assertEqual(again.take_deferred(msg_id), 1_800_000_000_000_000_000)
        self.assertIsNone(again.take_deferred(msg_id))
        again.close()
        self.assertFalse(os.path.exists(again.files.deferred_file), "an empty sidecar is removed")

    def deferred_lines(self, q: DiskQueue) -> int:
        try:
            with open(q.files.deferred_file, "rb") as f:
                return len(f.read().splitlines())
        except FileNotFoundError:
            return 0

    def test_the_file_is_trimmed_while_running(self) -> None:
        """Durable mode: 10,000 DPUBs read and done left 10,000 stale lines (370 KB)
        until a clean stop; now the file keeps within twice what it must hold plus
        COMPACT_SLACK lines."""
        q = self.queue(acked=True)
        for i in range(10_000):
            q.put(record(i))
            q.set_deferred(Message.decode(record(i)).id, 1_800_000_000_000_000_000 + i)
            data, ref = q.read()
            self.assertEqual(q.take_deferred(Message.decode(data).id), 1_800_000_000_000_000_000 + i)
            q.done(ref)
        self.assertLessEqual(self.deferred_lines(q), deferred.COMPACT_SLACK + 1)

    def test_a_time_read_but_not_done_survives_a_crash(self) -> None:
        q = self.queue(acked=True)
        ids = [Message.decode(record(i)).id for i in range(3000)]
        for i, msg_id in enumerate(ids):
            q.put(record(i))
            q.set_deferred(msg_id, 1_800_000_000_000_000_000 + i)
        items = [q.read() for _ in range(3000)]
        for _, ref in items[1:]:  # the first is still in flight: its time must stay
            q.done(ref)
        # then the process dies: nothing is synced
        self.assertLess(self.deferred_lines(q), 2 * deferred.COMPACT_SLACK)
        again = self.queue(acked=True)
        data, _ = again.read()
        self.assertEqual(Message.decode(data).id, ids[0])
        self.assertEqual(again.take_deferred(ids[0]), 1_800_000_000_000_000_000)


class PeekTests(Base):
    """peek() and head_timestamp(): the next records, read without being taken."""

    def test_peek_leaves_the_read_position(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(5)])
        self.assertEqual([number(r) for r in q.peek(3)], [0, 1, 2])
        self.assertEqual([number(r) for r in q.peek(10)], [0, 1, 2, 3, 4])
        self.assertEqual((q.depth(), q.read_file_num, q.read_pos), (5, 0, 0))
        self.assertEqual(number(q.get()), 0)
        self.assertEqual([number(r) for r in q.peek(2)], [1, 2])
        self.assertEqual(self.drain(q), [1, 2, 3, 4])
        self.assertEqual(q.peek(10), [])

    def test_peek_crosses_files(self) -> None:
        size = 4 + len(record(0))
        q = self.queue(max_bytes=2 * size)
        q.put_many([record(i) for i in range(7)])  # files of 2, 2, 2, 1
        self.assertEqual([number(q.get()) for _ in range(2)], [0, 1])  # the reader is at the end of file 0
        self.assertEqual([number(r) for r in q.peek(4)], [2, 3, 4, 5])
        self.assertEqual(self.drain(q), [2, 3, 4, 5, 6])

    def test_peek_in_acknowledged_mode_starts_after_what_was_read(self) -> None:
        q = self.queue(acked=True)
        q.put_many([record(i) for i in range(4)])
        q.read()  # in flight: not done, no longer queued
        self.assertEqual([number(r) for r in q.peek(10)], [1, 2, 3])
        self.assertEqual(q.depth(), 3)

    def test_peek_stops_at_what_is_not_a_record(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(3)])
        with open(q.files.data_file(0), "r+b") as f:
            f.seek(2 * (4 + len(record(0))))
            f.write(b"\xff\xff\xff\xff")  # the third record's size
        self.assertEqual([number(r) for r in q.peek(10)], [0, 1])

    def test_peek_within_a_byte_bound(self) -> None:
        q = self.queue()
        q.put_many([record(i, size=100) for i in range(10)])  # records of 126 bytes
        self.assertEqual([number(r) for r in q.peek(10, max_bytes=126 * 3)], [0, 1, 2])
        self.assertEqual([number(r) for r in q.peek(10, max_bytes=126 * 4 - 1)], [0, 1, 2])
        self.assertEqual([number(r) for r in q.peek(2, max_bytes=10_000)], [0, 1])
        self.assertEqual(len(q.peek(100, max_bytes=10_000)), 10)
        self.assertNotIsInstance(q.peek(10, max_bytes=126)[0], CutRecord)

    def test_a_first_record_over_the_bound_is_read_only_as_far_as_the_bound(self) -> None:
        big = Message(b"%016x" % 1, b"b" * (8 << 20), 1_700_000_000_000_000_000).encode()
        q = DiskQueue("t", self.dir, 64 << 20, MIN, 16 << 20, 2500, self.syncer, self.log)
        q.put_many([big, record(1)])
        sizes: list[int] = []
        pread = os.pread

        def counted(fd: int, n: int, offset: int) -> bytes:
            sizes.append(n)
            return pread(fd, n, offset)

        self.patch(os, "pread", counted)
        (cut,) = q.peek(10, max_bytes=3000)
        self.assertIsInstance(cut, CutRecord)
        self.assertEqual((bytes(cut), cut.size), (big[:3000], len(big)))
        self.assertLessEqual(sum(sizes), records.READ_CHUNK + 3000, "not the whole 8 MiB record")
        self.assertEqual(q.peek(10, max_bytes=0), [b""], "a bound of nothing: the first record, cut to nothing")
        self.assertEqual((q.depth(), q.read_pos), (2, 0))
        self.assertEqual(q.get(), big)

    def test_head_timestamp(self) -> None:
        q = self.queue()
        self.assertIsNone(q.head_timestamp())
        q.put_many([record(i) for i in range(3)])
        self.assertEqual(q.head_timestamp(), 1_700_000_000_000_000_000)
        q.get()
        self.assertEqual(q.head_timestamp(), 1_700_000_000_000_000_001)
        self.drain(q)
        self.assertIsNone(q.head_timestamp())

    def test_head_timestamp_is_read_again_only_when_the_head_moves(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(3)])
        q.get()
        q.close()
        q = self.queue()  # nothing read through this queue's own reader yet
        reads: list[int] = []
        pread = os.pread
        self.patch(records.os, "pread", lambda fd, n, pos: reads.append(n) or pread(fd, n, pos))
        for _ in range(3):
            self.assertEqual(q.head_timestamp(), 1_700_000_000_000_000_001)
        self.assertEqual(len(reads), 1, "one small read, then the cached time")
        self.assertLessEqual(reads[0], 12)
        q.put(record(7))
        self.assertEqual(q.head_timestamp(), 1_700_000_000_000_000_001)
        self.assertEqual(len(reads), 1, "a write does not move the head")
        q.get()
        del reads[:]
        self.assertEqual(q.head_timestamp(), 1_700_000_000_000_000_002)
        self.assertEqual(reads, [], "the reader's buffer holds the new head")

    def test_head_timestamp_after_a_batch_is_taken_back(self) -> None:
        q = self.queue()
        mark = q.put_many([record(5)])
        self.assertEqual(q.head_timestamp(), 1_700_000_000_000_000_005)
        q.unput(mark)
        self.assertIsNone(q.head_timestamp())
        q.put(record(6))  # written where the taken-back one was
        self.assertEqual(q.head_timestamp(), 1_700_000_000_000_000_006)


class ReadManyTests(Base):
    """read_many: what read() gives one by one, the buffered records in one pass."""

    def test_the_same_records_as_read(self) -> None:
        size = 4 + len(record(0))
        q = self.queue(max_bytes=7 * size)
        q.put_many([record(i) for i in range(30)])  # 5 files
        got = []
        while batch := q.read_many(4):
            self.assertLessEqual(len(batch), 4)
            got += [number(data) for data, ref in batch]
        self.assertEqual(got, list(range(30)))
        self.assertEqual((q.depth(), q.queued_bytes), (0, 0))
        # read files removed as read() removes them: the one still written to stays
        self.assertEqual([f for f in self.files() if "meta" not in f], ["t.diskqueue.000004.dat"])
        q.put(record(30))
        self.assertEqual([number(d) for d, _ in q.read_many(10)], [30])

    def test_stops_at_what_was_written(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(3)])
        self.assertEqual([number(d) for d, _ in q.read_many(2)], [0, 1])
        q.put_many([record(i) for i in range(3, 6)])
        self.assertEqual([number(d) for d, _ in q.read_many(100)], [2, 3, 4, 5])
        self.assertEqual(q.read_many(100), [])

    def test_a_corrupt_record_is_skipped_as_read_skips_it(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(6)])
        size = 4 + len(record(0))
        with open(q.files.data_file(0), "r+b") as f:
            f.seek(2 * size)
            f.write(struct.pack(">i", 5))  # record 2's size: below the minimum
        got = [number(d) for d, _ in q.read_many(100)]
        self.assertNotIn(2, got)
        self.assertEqual(got[:2], [0, 1])
        self.assertTrue(any("corrupt data" in line for line in self.log.lines))

    def test_durable_mode_gives_refs(self) -> None:
        q = self.queue(acked=True)
        q.put_many([record(i) for i in range(5)])
        batch = q.read_many(5)
        self.assertEqual([number(d) for d, _ in batch], [0, 1, 2, 3, 4])
        self.assertTrue(all(ref is not None for _, ref in batch))
        for _, ref in batch:
            q.done(ref)
        self.assertEqual(q.queued_bytes, 0)

    def test_read_views_gives_large_buffered_records_as_views(self) -> None:
        from nsqd_tw.storage.diskqueue_read import VIEW_FROM

        q = self.queue()
        small, large = record(0), record(1, VIEW_FROM)
        q.put_many([small, large, small, large, large])
        batch = q.read_views(5)
        self.assertEqual([bytes(d) for d, _ in batch], [small, large, small, large, large])
        # the first comes from read(), one record at a time; the rest from the buffer
        self.assertEqual([type(d) for d, _ in batch], [bytes, memoryview, bytes, memoryview, memoryview])
        got = [Message.decode(d) for d, _ in batch]
        self.assertEqual([(type(m.id), type(m.body)) for m in got], [(bytes, bytes)] * 5)
        self.assertEqual([m.encode() for m in got], [small, large, small, large, large])
        self.assertEqual((q.depth(), q.queued_bytes), (0, 0))

    def test_read_many_copies_every_record(self) -> None:
        from nsqd_tw.storage.diskqueue_read import VIEW_FROM

        q = self.queue()
        q.put_many([record(i, VIEW_FROM) for i in range(4)])
        self.assertEqual([type(d) for d, _ in q.read_many(4)], [bytes] * 4)

    def test_counts_for_the_sync(self) -> None:
        q = self.queue(sync_every=10)
        q.put_many([record(i) for i in range(25)])
        syncs = len(self.syncs)
        q.read_many(25)
        self.clock.advance(0)
        self.assertGreater(len(self.syncs), syncs)  # 25 reads passed sync_every
