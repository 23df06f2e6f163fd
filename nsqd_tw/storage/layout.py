"""The files of one disk queue as go-diskqueue lays them out, and their recovery.

For a queue named ``name`` (``topic`` or ``topic:channel``) in the data path:

- ``name.diskqueue.000000.dat``, ``...000001.dat``: records, each a 4-byte
  big-endian size then that many bytes (an encoded message); a new file
  whenever the next record would pass --max-bytes-per-file;
- ``name.diskqueue.meta.dat``: ``depth\\nreadFileNum,readPos\\nwriteFileNum,writePos\\n``;
- ``name.diskqueue.deferred.dat`` (beyond Go, which ignores it): see
  :mod:`nsqd_tw.storage.deferred`.

Recovery beyond Go: records written after the last metadata sync (a crash) are
salvaged and counted again, and corrupt bytes are skipped to the next good
record (kept aside in ``<file>.bad.<offset>``) instead of discarding the rest of
the file.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from nsq_wire.message import ID_OFFSET, MSG_ID_LENGTH, TIMESTAMP
from nsqd_tw.storage.files import read_regular
from nsqd_tw.storage.records import RECORD_SIZE, framed

_META_RE = re.compile(rb"^(-?\d+)\n(-?\d+),(-?\d+)\n(-?\d+),(-?\d+)\n?")
_ID_RE = re.compile(rb"[0-9a-f]{16}")
_DATA_INFIX = ".diskqueue."
# a topic's retained log (beyond Go): see nsqd_tw.storage.retained
RETAINED_SEGMENT = re.compile(r"(.+)\.retained\.(\d{6,})")
# where a record's message ID starts (after the record's 4-byte size)
_ID_OFFSET = 4 + ID_OFFSET
MIN_TS = 1_300_000_000 * 10**9  # 2011, before Go's ID epoch: no record is older

Write = tuple[int, int, bytes, int]


class Meta(NamedTuple):
    """What the metadata file holds: the depth, the read and the write positions."""

    depth: int
    read_file: int
    read_pos: int
    write_file: int
    write_pos: int

    def text(self) -> bytes:
        return b"%d\n%d,%d\n%d,%d\n" % self


@dataclass(frozen=True, slots=True)
class FramedRecords:
    """Records as a data file holds them (each after its 4-byte size), with their
    count and the sizes of the smallest and the largest: what a disk queue needs
    to take them in one write, with nothing done per record (a replication
    standby's publishes)."""

    count: int
    smallest: int
    largest: int
    data: bytes

    @classmethod
    def of(cls, records: Sequence[bytes]) -> FramedRecords:
        """``records``, at least one."""
        sizes = list(map(len, records))
        return cls(len(records), min(sizes), max(sizes), framed(records))

    def records(self) -> list[bytes]:
        """The records one by one; ValueError if ``data`` is not ``count``
        records within ``smallest`` and ``largest`` bytes."""
        data, unpack, out = self.data, RECORD_SIZE.unpack_from, []
        pos, end, lo, hi = 0, len(self.data), self.smallest, self.largest
        while pos < end:
            if end - pos < 4:
                raise ValueError("framed records: a size cut short")
            (size,) = unpack(data, pos)
            pos += 4
            if not lo <= size <= hi or pos + size > end:
                raise ValueError(f"framed records: a record of {size} bytes where {lo} to {hi} were said")
            out.append(data[pos : pos + size])
            pos += size
        if len(out) != self.count:
            raise ValueError(f"framed records: {len(out)} records where {self.count} were said")
        return out


def plan_writes(records: Sequence[bytes], file_num: int, pos: int, limit: int) -> list[Write]:
    """Frame records written from (file_num, pos) into (file, offset, bytes, count)
    writes, a new file whenever the next record would pass ``limit``."""
    if not records:
        return []
    data = framed(records)
    if pos + len(data) <= limit or (pos == 0 and len(records) == 1):
        return [(file_num, pos, data, len(records))]  # the whole batch in this file
    pack = RECORD_SIZE.pack
    chunks: list[Write] = []
    parts: list[bytes] = []
    start = pos
    for record in records:
        total = 4 + len(record)
        if pos > 0 and pos + total > limit:
            if parts:
                chunks.append((file_num, start, b"".join(parts), len(parts) // 2))
                parts = []
            file_num, pos = file_num + 1, 0
            start = 0
        parts.append(pack(len(record)))
        parts.append(record)
        pos += total
    if parts:
        chunks.append((file_num, start, b"".join(parts), len(parts) // 2))
    return chunks


def list_data_files(path: str) -> dict[str, list[int]]:
    """The numbered data files in ``path``, by queue name, in order."""
    return list_files(path)[0]


def list_files(path: str) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The numbered data files in ``path``, by queue name, and the retained
    segments, by topic, each in order."""
    found: dict[str, list[int]] = {}
    retained: dict[str, list[int]] = {}
    try:
        entries = os.scandir(path or ".")
    except OSError:
        return found, retained
    with entries:
        for entry in entries:
            fn = entry.name
            if not fn.endswith(".dat"):
                continue
            stem = fn[:-4]
            at = stem.rfind(_DATA_INFIX)
            if at < 0:
                m = RETAINED_SEGMENT.fullmatch(stem)
                if m is not None:
                    retained.setdefault(m.group(1), []).append(int(m.group(2)))
                continue
            num = stem[at + len(_DATA_INFIX) :]
            if num.isascii() and num.isdigit():
                found.setdefault(stem[:at], []).append(int(num))
    for nums in (*found.values(), *retained.values()):
        nums.sort()
    return found, retained


class DataDirectory:
    """The data files in the data path, listed once for every queue in it.

    Listing the directory once per queue made opening N queues cost N listings
    of ~N files. One listing, taken when the first queue opens, stays true:
    under the data-path lock only this process adds files, each queue only its
    own, and each queue takes its entry when it opens (a file it later fails to
    remove is given back with :meth:`kept`).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._files: dict[str, list[int]] | None = None
        self._retained: dict[str, list[int]] = {}

    def _list(self) -> dict[str, list[int]]:
        if self._files is None:
            self._files, self._retained = list_files(self.path)
        return self._files

    def take(self, name: str) -> list[int]:
        """The numbers of queue ``name``'s data files, in order; forgotten here."""
        return self._list().pop(name, [])

    def take_retained(self, topic: str) -> list[int]:
        """The numbers of topic ``topic``'s retained segments, in order; forgotten here."""
        self._list()
        return self._retained.pop(topic, [])

    def retained_left(self) -> dict[str, list[int]]:
        """The retained segments no topic took (of topics without retention now)."""
        self._list()
        return dict(self._retained)

    def kept(self, name: str, nums: list[int]) -> None:
        """Files of ``name`` still on disk after its queue went (a remove failed)."""
        if self._files is not None and nums:
            self._files[name] = sorted(set(self._files.get(name, [])) | set(nums))


class QueueFiles:
    """The files of one queue: their names, the metadata at start-up, and the
    recovery that needs only the files (positions are passed in and returned)."""

    def __init__(
        self,
        data_path: str,
        name: str,
        min_msg_size: int,
        max_msg_size: int,
        log: Any,
        directory: DataDirectory | None = None,
    ) -> None:
        self.data_path = data_path
        self.name = name
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size
        self.log = log
        self.directory = directory if directory is not None else DataDirectory(data_path)
        # data files behind the read position (left by a crash, or a failed remove)
        self.orphans: list[int] = []
        self.meta_file = os.path.join(data_path, f"{name}.diskqueue.meta.dat")
        self.deferred_file = os.path.join(data_path, f"{name}.diskqueue.deferred.dat")
        # the metadata file's content as last read or written, None if not known
        self.meta_on_disk: bytes | None = None

    def data_file(self, num: int) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.{num:06d}.dat")

    def existing(self) -> list[int]:
        """The numbers of the data files on disk when the queue opens, in order
        (asked once: the queue knows its files from then on)."""
        return self.directory.take(self.name)

    def remove(self, path: str) -> bool:
        """Remove a file of this queue; False (logged) if it is still there."""
        if path == self.meta_file:
            self.meta_on_disk = None
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.log.error("DISKQUEUE({name}) failed to Remove({fn}) - {err}", name=self.name, fn=path, err=e)
            return False
        return True

    # -- start-up ------------------------------------------------------------------

    def _read_meta(self) -> bytes | None:
        try:
            return read_regular(self.meta_file)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.log.error("DISKQUEUE({name}) failed to retrieveMetaData - {err}", name=self.name, err=e)
            return None

    def recover(self) -> tuple[Meta, bool]:
        """The metadata, corrected after an unclean stop, and whether the stop was.

        Records past the write position (written after the last sync) start a new
        write file, never written over; with no metadata at all (lost, or never
        synced) reading starts at the oldest file. Depth is then to be recounted.
        """
        raw = self.meta_on_disk = self._read_meta()
        meta = Meta(0, 0, 0, 0, 0)
        if raw is not None:
            m = _META_RE.match(raw)
            if m is None:
                self.log.error(
                    "DISKQUEUE({name}) failed to retrieveMetaData - unexpected metadata {raw!r}",
                    name=self.name,
                    raw=raw[:100],
                )
            else:
                meta = Meta(*(int(x) for x in m.groups()))
        depth, read_file, read_pos, write_file, write_pos = meta
        unclean = False
        try:
            size = os.stat(self.data_file(write_file)).st_size
        except FileNotFoundError:
            size = 0
        if write_pos < size:
            self.log.warn(
                "DISKQUEUE({name}) {fn} metadata writePos {pos} < file size of {size}, skipping to new file",
                name=self.name,
                fn=self.data_file(write_file),
                pos=write_pos,
                size=size,
            )
            write_file += 1
            write_pos = 0
            unclean = True
        existing = self.existing()
        # files written after the last sync: past the write file, or the new one
        # skipped to above (never written over)
        if existing and (existing[-1] > write_file or (unclean and existing[-1] == write_file)):
            write_file = existing[-1] + 1
            write_pos = 0
            unclean = True
        if raw is None and existing and existing[0] > read_file:
            read_file, read_pos = existing[0], 0
            unclean = True
        self.orphans = [num for num in existing if num < read_file]
        return Meta(depth, read_file, read_pos, write_file, write_pos), unclean

    def count_records(self, read_file: int, read_pos: int, write_file: int, write_pos: int) -> int:
        """The records between the two positions, by walking their headers."""
        count = 0
        num, pos = read_file, read_pos
        while num <= write_file:
            try:
                fd = os.open(self.data_file(num), os.O_RDONLY)
            except FileNotFoundError:
                num, pos = num + 1, 0
                continue
            try:
                end = write_pos if num == write_file else os.fstat(fd).st_size
                while pos + 4 <= end:
                    head = os.pread(fd, 4, pos)
                    if len(head) < 4:
                        break
                    (size,) = RECORD_SIZE.unpack(head)
                    if size < self.min_msg_size or size > self.max_msg_size or pos + 4 + size > end:
                        break
                    count += 1
                    pos += 4 + size
            finally:
                os.close(fd)
            num, pos = num + 1, 0
        return count

    def count_bytes(self, read_file: int, read_pos: int, write_file: int, write_pos: int) -> int:
        """The bytes between the two positions, across files."""
        total = 0
        for num in range(read_file, write_file + 1):
            if num == write_file:
                end = write_pos
            else:
                try:
                    end = os.stat(self.data_file(num)).st_size
                except FileNotFoundError:
                    continue
            total += max(0, end - (read_pos if num == read_file else 0))
        return total

    # -- corruption ------------------------------------------------------------------

    def resync(self, fd: int, num: int, pos: int, end: int) -> tuple[int | None, str]:
        """Corrupt bytes at ``pos`` of data file ``num`` (``fd``, readable to ``end``):
        the offset of the next plausible record (None: none before ``end``), and
        where the bad bytes up to it were kept aside (or why they were not)."""
        resume = find_record(fd, pos + 1, end, self.min_msg_size, self.max_msg_size)
        kept = keep_bad(fd, f"{self.data_file(num)}.bad.{pos}", pos, end if resume is None else resume)
        return resume, kept


# -- damaged records: what a disk queue and a retained log both step over -----------


def find_record(fd: int, start: int, end: int, min_size: int, max_size: int) -> int | None:
    """The first offset in [start, end) of file ``fd`` where a plausible record
    begins (:func:`plausible`, and so is the record after it, unless it ends at
    ``end``); None if there is none."""
    window = 1 << 20
    pos = start
    now_ns = time.time_ns() + 86_400 * 10**9
    while pos < end:
        buf = os.pread(fd, min(window + 64, end - pos), pos)
        if not buf:
            return None
        for m in _ID_RE.finditer(buf):
            cand = pos + m.start() - _ID_OFFSET
            if cand < start:
                continue
            size = plausible(fd, cand, end, min_size, max_size, now_ns)
            if size is not None:
                nxt = cand + 4 + size
                if nxt == end or plausible(fd, nxt, end, min_size, max_size, now_ns) is not None:
                    return cand
        pos += window
    return None


def plausible(fd: int, at: int, end: int, min_size: int, max_size: int, now_ns: int) -> int | None:
    """The size of the record at ``at`` if it looks like one (a size in bounds that
    ends by ``end``, a timestamp from 2011 to ``now_ns``, a 16-hex-digit ID), else None."""
    head = os.pread(fd, _ID_OFFSET + MSG_ID_LENGTH, at)
    if len(head) < _ID_OFFSET + MSG_ID_LENGTH:
        return None
    (size,) = RECORD_SIZE.unpack_from(head)
    if size < min_size or size > max_size or at + 4 + size > end:
        return None
    (ts,) = TIMESTAMP.unpack_from(head, 4)
    if MIN_TS <= ts <= now_ns and _ID_RE.fullmatch(head[_ID_OFFSET:]) is not None:
        return int(size)
    return None


def keep_bad(fd: int, path: str, pos: int, end: int) -> str:
    """Copy the bytes from ``pos`` to ``end`` of file ``fd`` to ``path`` (an
    operator's evidence); ``path``, or why they were not kept."""
    try:
        chunk = os.pread(fd, end - pos, pos)
        with open(path, "wb") as f:
            f.write(chunk)
    except OSError as e:
        return f"(not kept: {e})"
    return path
