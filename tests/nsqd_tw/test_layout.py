"""A disk queue's files after an unclean stop: salvage, recount, corruption skipped and kept aside."""

from __future__ import annotations

import os
import struct
from dataclasses import replace

from twisted.trial import unittest

from nsqd_tw.storage.layout import DataDirectory, FramedRecords, QueueFiles, plan_writes
from nsqd_tw.storage.records import _framed, framed
from tests.nsqd_tw.test_diskqueue import Base, number, record


class PlanWritesTests(unittest.TestCase):
    def test_a_new_file_when_the_next_record_would_pass_the_limit(self) -> None:
        a, b = b"a" * 30, b"b" * 30
        chunks = plan_writes([a, b, a], 0, 0, 70)
        self.assertEqual([(f, off, n) for f, off, _, n in chunks], [(0, 0, 2), (1, 0, 1)])
        self.assertEqual(chunks[0][2], struct.pack(">i", 30) + a + struct.pack(">i", 30) + b)
        self.assertEqual([(f, off, n) for f, off, _, n in plan_writes([a], 3, 40, 70)], [(4, 0, 1)])

    def test_a_batch_that_fits_is_one_write_and_one_byte_more_splits_it(self) -> None:
        a = b"a" * 30
        fits = plan_writes([a, a], 2, 6, 74)  # 6 + 2 * 34 = 74: exactly the limit
        self.assertEqual([(f, off, n) for f, off, _, n in fits], [(2, 6, 2)])
        self.assertEqual(fits[0][2], (struct.pack(">i", 30) + a) * 2)
        over = plan_writes([a, a], 2, 7, 74)
        self.assertEqual([(f, off, n) for f, off, _, n in over], [(2, 7, 1), (3, 0, 1)])
        self.assertEqual(plan_writes([], 2, 7, 74), [])

    def test_a_record_larger_than_a_file_starts_one_of_its_own(self) -> None:
        big = b"x" * 100
        self.assertEqual([(f, off, n) for f, off, _, n in plan_writes([big], 0, 0, 50)], [(0, 0, 1)])
        self.assertEqual([(f, off, n) for f, off, _, n in plan_writes([big], 0, 10, 50)], [(1, 0, 1)])


class FramedTests(unittest.TestCase):
    def test_each_record_after_its_size(self) -> None:
        records = [bytes(range(i % 256)) * (1 + i) for i in range(300)] + [b""]
        want = b"".join(struct.pack(">i", len(r)) + r for r in records)
        self.assertEqual(framed(records), want)
        self.assertEqual(_framed(records), want)
        self.assertEqual(framed([]), b"")
        # other shapes take the pure path: the same bytes, or the same error
        self.assertEqual(framed(tuple(records)), want)
        self.assertEqual(framed([b"ab", bytearray(b"cd")]), struct.pack(">i", 2) + b"ab" + struct.pack(">i", 2) + b"cd")
        self.assertRaises(TypeError, framed, [b"ab", 5])


class RecoveryTests(Base):
    def test_stale_metadata_skips_to_a_new_file_and_salvages(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(3)])
        q.close()
        # writes after the last metadata sync (a crash): the file is longer than writePos
        with open(q.files.data_file(0), "ab") as f:
            f.write(struct.pack(">i", len(record(3))) + record(3))
        again = self.queue()
        self.assertEqual(again.write_file_num, 1)
        self.assertEqual(again.depth(), 4)
        again.put(record(4))
        self.assertEqual(self.drain(again), [0, 1, 2, 3, 4])

    def test_stale_metadata_with_whole_files_written_after_it(self) -> None:
        """Files 0 and 1 written after the last sync (metadata: 0,0): both are
        salvaged, and the next write goes to file 2, not over file 1."""
        q = self.queue(max_bytes=100)
        q.sync_now()  # the metadata as it was before any write
        with open(q.files.meta_file, "rb") as f:
            stale = f.read()
        q.put_many([record(i) for i in range(5)])  # files 0, 1 and 2
        q.close()
        os.remove(q.files.data_file(2))
        with open(q.files.meta_file, "wb") as f:
            f.write(stale)
        again = self.queue(max_bytes=100)
        self.assertEqual((again.write_file_num, again.depth()), (2, 4))
        again.put(record(9))
        self.assertEqual(self.drain(again), [0, 1, 2, 3, 9])

    def test_garbled_size_skips_to_next_good_record(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(6)])
        size = 4 + len(record(0))
        with open(q.files.data_file(0), "r+b") as f:
            f.seek(2 * size)
            f.write(b"\xff\xff\xff\xff")  # record 2's size field
        self.assertEqual(self.drain(q), [0, 1, 3, 4, 5])
        bad = [f for f in self.files() if ".bad." in f]
        self.assertEqual(bad, [f"t.diskqueue.000000.dat.bad.{2 * size}"])
        self.assertEqual(os.path.getsize(os.path.join(self.dir, bad[0])), size)
        (line,) = [x for x in self.log.lines if "corrupt data" in x]
        self.assertIn(f"at offset {2 * size} (invalid message read size (-1)): skipped {size} bytes", line)
        self.assertIn("depth corrected from 4 to 3", line)
        self.assertEqual(q.depth(), 0)

    def test_flipped_bytes_in_the_middle_of_a_record_header(self) -> None:
        q = self.queue()
        q.put_many([record(i, size=50) for i in range(5)])
        size = 4 + len(record(0, size=50))
        with open(q.files.data_file(0), "r+b") as f:
            f.seek(size + 1)
            f.write(b"\x7f")  # record 1 now claims a huge size
        self.assertEqual(self.drain(q), [0, 2, 3, 4])

    def test_torn_last_record_of_a_complete_file(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(3)])
        q.close()
        size = 4 + len(record(0))
        with open(q.files.data_file(0), "ab") as f:
            f.write((struct.pack(">i", len(record(3))) + record(3))[: size // 2])  # crash mid-write
        again = self.queue()
        again.put(record(4))
        self.assertEqual(self.drain(again), [0, 1, 2, 4])
        self.assertTrue(any("runs past the end of the file" in x for x in self.log.lines), self.log.lines)

    def test_missing_metadata_salvages_the_files(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(3)])
        q.close()
        os.remove(q.files.meta_file)
        again = self.queue()
        self.assertEqual(self.drain(again), [0, 1, 2])

    def test_garbled_metadata_is_logged_and_the_files_read_from_the_start(self) -> None:
        q = self.queue()
        q.put_many([record(i) for i in range(3)])
        q.close()
        with open(q.files.meta_file, "wb") as f:
            f.write(b"garbage\n")
        again = self.queue()
        self.assertTrue(any("unexpected metadata b'garbage\\n'" in x for x in self.log.lines), self.log.lines)
        self.assertEqual(again.depth(), 3)
        self.assertEqual([number(again.get()) for _ in range(3)], [0, 1, 2])


class ExistingFilesTests(unittest.TestCase):
    def test_only_this_queues_numbered_data_files(self) -> None:
        d = self.mktemp()
        os.makedirs(d)
        names = [
            "t[1]*.diskqueue.000002.dat",
            "t[1]*.diskqueue.000000.dat",
            "t[1]*.diskqueue.meta.dat",
            "t[1]*.diskqueue.00000².dat",
            "t[1]*:ch.diskqueue.000005.dat",
            "t[1]*.diskqueue.000001.diskqueue.000007.dat",
            "t[1].diskqueue.000009.dat",
        ]
        for fn in names:
            open(os.path.join(d, fn), "wb").close()
        self.assertEqual(QueueFiles(d, "t[1]*", 0, 100, None).existing(), [0, 2])
        self.assertEqual(QueueFiles(d, "t[1]*:ch", 0, 100, None).existing(), [5])
        self.assertEqual(QueueFiles(os.path.join(d, "gone"), "t", 0, 100, None).existing(), [])


class DataDirectoryTests(Base):
    def test_queues_of_one_data_path_list_it_once(self) -> None:
        """Opening N queues listed the directory N times: minutes for 10,000 topics."""
        for i in range(50):
            q = self.queue(f"t{i}")
            q.put(record(i))
            q.close()
        listed = []
        scandir = os.scandir
        self.patch(os, "scandir", lambda path: listed.append(path) or scandir(path))
        directory = DataDirectory(self.dir)
        queues = [self.queue(f"t{i}", directory=directory) for i in range(50)]
        self.assertEqual(listed, [self.dir])
        self.assertEqual([number(q.get()) for q in queues], list(range(50)))

    def test_a_deleted_queue_takes_its_left_over_files_along(self) -> None:
        """Data files behind the read position (a crash between reading a file and
        removing it) are found at open and removed with the queue."""
        q = self.queue(max_bytes=100)
        q.put_many([record(i) for i in range(5)])
        with open(q.files.data_file(0), "rb") as f:
            stale = f.read()
        self.assertEqual(self.drain(q), [0, 1, 2, 3, 4])
        q.close()
        with open(q.files.data_file(0), "wb") as f:
            f.write(stale)  # the read moved past file 0, which is still there
        again = self.queue(max_bytes=100)
        self.assertEqual(again.files.orphans, [0])
        again.delete()
        self.assertEqual([f for f in self.files() if f.startswith("t.")], [])

    def test_a_file_that_could_not_be_removed_is_seen_by_the_next_queue_of_that_name(self) -> None:
        directory = DataDirectory(self.dir)
        q = self.queue(max_bytes=100, directory=directory)
        q.put_many([record(i) for i in range(5)])
        remove = os.remove
        kept = q.files.data_file(1)

        def failing(path: str) -> None:
            if path == kept:
                raise PermissionError(13, "Permission denied")
            remove(path)

        self.patch(os, "remove", failing)
        q.delete()
        self.assertEqual(directory.take("t"), [1])


class FramedRecordsTests(unittest.TestCase):
    def test_records_framed_as_a_data_file_holds_them_and_back(self) -> None:
        records = [b"a" * 30, b"bb" * 20, b"c" * 26]
        batch = FramedRecords.of(records)
        self.assertEqual((batch.count, batch.smallest, batch.largest), (3, 26, 40))
        self.assertEqual(batch.data, b"".join(struct.pack(">i", len(r)) + r for r in records))
        self.assertEqual(batch.records(), records)

    def test_what_does_not_match_its_description_is_refused(self) -> None:
        good = FramedRecords.of([b"a" * 30, b"b" * 30])
        for bad, why in (
            (replace(good, count=3), "2 records where 3 were said"),
            (replace(good, largest=29), "a record of 30 bytes where 30 to 29 were said"),
            (replace(good, data=good.data[:-1]), "a record of 30 bytes"),
            (replace(good, data=good.data + b"\x00\x00"), "a size cut short"),
        ):
            with self.assertRaises(ValueError) as e:
                bad.records()
            self.assertIn(why, str(e.exception))
