"""A topic's retained log (beyond Go): every message published to it, kept for a time or a size.

Its files (segments, their indexes, the horizon) and how they are read at start
are :mod:`nsqd_tw.storage.retained_segments`'s; reading from a position,
:mod:`nsqd_tw.storage.retained_reader`'s.

A damaged record is stepped over by every reader, and a missing segment found at
start (see :mod:`nsqd_tw.storage.faults`).

A whole segment is deleted once its last append is older than the retention
(:meth:`RetainedLog.expire`), while the log is larger than its byte bound
(:meth:`RetainedLog.trim`), or, oldest first, when ``--max-disk-bytes`` needs
room (:meth:`RetainedLog.evict`). Its bytes count in the disk budget. Writes are
``pwrite`` before :meth:`RetainedLog.append` returns; fsync is the
:class:`~nsqd_tw.storage.syncer.Syncer`'s (so a durable publish's group commit
covers its retained copy).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from nsq_wire.message import MESSAGE_HEADER_LENGTH, TIMESTAMP
from nsqd_tw.storage.budget import DiskBudget
from nsqd_tw.storage.faults import Faults, Gap
from nsqd_tw.storage.files import write_atomic
from nsqd_tw.storage.layout import framed
from nsqd_tw.storage.retained_reader import RetainedReader
from nsqd_tw.storage.retained_segments import (
    SPARSE_BYTES,
    MetaFiles,
    Position,
    Segment,
    SegmentFiles,
    new_uid,
    records_from,
)
from nsqd_tw.storage.syncer import Syncer

_unpack_ts = TIMESTAMP.unpack_from


class SinceTooOld(Exception):
    """A rewind from before the horizon: messages published since then may be gone."""

    def __init__(self, horizon_ns: int) -> None:
        super().__init__(horizon_ns)
        self.horizon_ns = horizon_ns


class Mark(NamedTuple):
    """The active segment's state before an append, to take the append back."""

    segment: Segment
    messages: int
    size: int
    first_ts: int
    max_ts: int
    appended_ns: int
    sparse: int


class RetainedLog(SegmentFiles):
    """The retained log of one topic: append, age out, trim, evict, locate, read."""

    def __init__(
        self,
        topic: str,
        data_path: str,
        syncer: Syncer,
        log: Any,
        now_ns: int,
        existing: Sequence[int] = (),
        *,
        max_msg_size: int,
        sync_every: int = 2500,
        budget: DiskBudget | None = None,
        segment_bytes: int = 100 * 1024 * 1024,
        roll_ns: int = 0,
        known: Sequence[Segment] = (),
    ) -> None:
        """``existing``: the numbers of the segments on disk (the data path's listing);
        ``known``: those of them described already (the log closed a moment ago)."""
        self.topic = topic
        self.data_path = data_path
        self.syncer = syncer
        self.log = log
        self.budget = budget
        self.segment_bytes = segment_bytes
        self.roll_ns = roll_ns
        self.min_size = MESSAGE_HEADER_LENGTH
        self.max_size = max_msg_size + MESSAGE_HEADER_LENGTH
        # what the Syncer reads
        self.count = 0
        self.sync_every = sync_every
        self.exiting = False
        self.deleted = False
        self.files = MetaFiles(self._path("meta.dat"), log)

        self.segments: list[Segment] = []
        self.messages = 0
        self.bytes = 0
        self._active: Segment | None = None  # the segment written to (the last one)
        self.next_num = 0  # segment numbers only grow (a rewind's position names one)
        self._fd: int | None = None
        self.on_delete: Callable[[Segment, str], None] | None = None
        # the last publish written: where, and its records (a channel's spill queue
        # keeps what its memory can't hold as a run of the log: see storage/spill.py)
        self.last_append: tuple[Position, Sequence[bytes]] | None = None
        self.holders: dict[Any, None] = {}  # spill queues with runs in this log
        # beyond Go's beyond: a replication standby's log is a copy of its primary's
        # (storage/mirror.py): it writes only what the primary wrote, where it wrote
        # it (``mirror_at``: segment, offset and uid of the next append), and deletes
        # only what the primary deleted
        self.mirror = False
        self.mirror_at: tuple[int, int, str] | None = None
        self.faults = Faults(topic, log, self.data_file, self.min_size, self.max_size)
        self.horizon_ns = 0
        self._load(existing, now_ns, {seg.num: seg for seg in known})
        self._add_bytes(self.bytes)
        syncer.register(self)

    def __repr__(self) -> str:
        return f"<RetainedLog {self.topic}>"

    @property
    def earliest_ts(self) -> int | None:
        """The timestamp of the oldest message retained (None: none)."""
        for seg in self.segments:
            if seg.count:
                return seg.first_ts
        return None

    # -- writing -------------------------------------------------------------------------

    def append(self, records: Sequence[bytes], now_ns: int) -> Mark | None:
        """Write the records of one publish; they are in the file (page cache)
        when this returns. All or nothing: a failed write is cut off again and
        raised. Returns a mark for :meth:`take_back` (None: a mirror not told
        where, which keeps nothing: see ``mirror``)."""
        if self.exiting:
            raise OSError(errno.ESHUTDOWN, "retained log closed")
        data = framed(records)
        size = len(data)
        place = None
        if self.mirror:
            place, self.mirror_at = self.mirror_at, None
            if place is None:
                return None  # not written where the primary is: its log did not take it
        if self.budget is not None:
            self.budget.check(size)  # may evict retained segments, this log's active one too
        seg = self._active
        if self.mirror:
            assert place is not None
            if seg is None or self._fd is None or seg.num != place[0]:
                seg = self._roll(now_ns, place[0], place[2])
        elif (
            seg is None
            or self._fd is None
            or (seg.size and seg.size + size > self.segment_bytes)
            or (self.roll_ns and seg.count and now_ns - seg.created_ns >= self.roll_ns)
        ):
            seg = self._roll(now_ns)
        fd = self._fd
        assert fd is not None
        mark = Mark(seg, seg.count, seg.size, seg.first_ts, seg.max_ts, seg.appended_ns, len(seg.sparse))
        offset = seg.size
        try:
            view = memoryview(data)
            at = offset
            while view:
                n = os.pwrite(fd, view, at)
                if n <= 0:
                    raise OSError(errno.EIO, "short write")
                view = view[n:]
                at += n
        except BaseException:
            self._truncate(fd, offset)
            raise
        (first,) = _unpack_ts(records[0])
        (last,) = _unpack_ts(records[-1])
        if not seg.count:
            seg.first_ts = first
        if offset >= len(seg.sparse) * SPARSE_BYTES:
            seg.sparse.append((offset, seg.count, first))
        seg.max_ts = max(seg.max_ts, first, last)
        seg.count += len(records)
        seg.size += size
        seg.appended_ns = now_ns
        self.last_append = (Position(seg.num, offset, mark.messages), records)
        self.messages += len(records)
        self.bytes += size
        self._add_bytes(size)
        self.count += len(records)
        self.syncer.wrote(self, len(records))
        return mark

    def take_back(self, mark: Mark | None) -> None:
        """Take back the append that returned ``mark`` (the publish failed elsewhere)."""
        if mark is None:
            return
        seg = mark.segment
        self.last_append = None
        if seg is not self._active or self._fd is None:
            return  # evicted meanwhile: nothing of it is left
        n, size = seg.count - mark.messages, seg.size - mark.size
        self._truncate(self._fd, mark.size)
        seg.count, seg.size, seg.first_ts, seg.max_ts, seg.appended_ns = mark[1:6]
        del seg.sparse[mark.sparse :]
        self.messages -= n
        self.bytes -= size
        self._add_bytes(-size)
        self.syncer.request(self)

    def _truncate(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError as e:
            self.log.error("RETAINED({topic}): failed to take back a write - {err}", topic=self.topic, err=e)

    def _roll(self, now_ns: int, num: int | None = None, uid: str = "") -> Segment:
        """Seal the active segment (its index goes with the next sync) and start the
        next (a mirror: the primary's ``num`` and ``uid``). A segment a kill left
        without an index is given a new identity at the start (so a standby's copy
        of it is sent again whole: storage/mirror.py)."""
        self._seal()
        if num is None:
            num = self.next_num
        seg = Segment(num, created_ns=now_ns, appended_ns=now_ns, uid=uid or new_uid())
        self._fd = os.open(self.data_file(num), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        # a number is used once its file is there (a gap is a missing file)
        self.next_num = max(self.next_num, num + 1)
        self.segments.append(seg)
        self._active = seg
        self.syncer.persist(self.files.meta_file, self._meta_text)
        return seg

    def seal_active(self) -> None:
        """Seal the segment being written: the next append starts another (a new
        link's snapshot, a standby promoted: each segment has one writer)."""
        if self._active is not None:
            self._seal()

    @property
    def active_uid(self) -> str:
        """The identity of the segment being written ("" if none)."""
        return self._active.uid if self._active is not None else ""

    def _seal(self) -> None:
        seg, fd = self._active, self._fd
        self._active = self._fd = None
        if fd is not None:
            self.syncer.retire_fd(fd)  # fsynced and closed by the next sync, then the index written
        if seg is not None:
            self.syncer.persist(self.index_file(seg.num), seg.index_text)

    def _add_bytes(self, n: int) -> None:
        if self.budget is not None:
            self.budget.used += n

    # -- deleting ------------------------------------------------------------------------

    def _delete_first(self, why: str) -> Segment:
        seg = self.segments[0]
        for holder in list(self.holders):
            holder.before_delete(seg)  # the runs in it are copied to their disk queues first
        self.segments.pop(0)
        if self.last_append is not None and self.last_append[0].segment == seg.num:
            self.last_append = None
        if seg is self._active:
            fd, self._fd, self._active = self._fd, None, None
            if fd is not None:
                os.close(fd)
        self.files.remove(self.data_file(seg.num))
        self._remove_index(seg.num)
        self.messages -= seg.count
        self.bytes -= seg.size
        self._add_bytes(-seg.size)
        if seg.count:
            self.horizon_ns = max(self.horizon_ns, seg.max_ts + 1)
        # a gap after it is at the head now: the horizon goes past it
        first_left = self.segments[0].num if self.segments else self.next_num
        self.horizon_ns = max(self.horizon_ns, self.faults.forget(seg.num, first_left))
        self.syncer.persist(self.files.meta_file, self._meta_text)
        if self.on_delete is not None:
            self.on_delete(seg, why)
        return seg

    def expire(self, before_ns: int) -> list[Segment]:
        """Delete the segments last written to before ``before_ns``, oldest first."""
        gone = []
        while self.segments and self.segments[0].appended_ns < before_ns:
            gone.append(self._delete_first("retention"))
        return gone

    def trim(self, max_bytes: int) -> list[Segment]:
        """Delete the oldest segments while the log holds more than ``max_bytes``
        (not the one being written)."""
        gone = []
        while self.bytes > max_bytes and self.segments and self.segments[0] is not self._active:
            gone.append(self._delete_first("retention_bytes"))
        return gone

    def evict(self) -> int:
        """Delete the oldest segment (the one being written too) for the disk
        budget; the bytes freed (0: nothing left)."""
        if not self.segments:
            return 0
        return self._delete_first("--max-disk-bytes").size

    def oldest_appended(self) -> int | None:
        return self.segments[0].appended_ns if self.segments else None

    # -- reading -------------------------------------------------------------------------

    def end(self) -> Position:
        """Where the next publish will be written (the end of what a rewind reads)."""
        if not self.segments:
            return Position(0, 0, 0)
        seg = self.segments[-1]
        return Position(seg.num, seg.size, seg.count)

    def start(self) -> Position:
        if not self.segments:
            return self.end()
        return Position(self.segments[0].num, 0, 0)

    def locate(self, since_ns: int | None) -> Position:
        """Where the first message published at or after ``since_ns`` is (None:
        the oldest retained). Raises :class:`SinceTooOld` before the horizon,
        :class:`~nsqd_tw.storage.faults.RetainedGap` inside a gap."""
        if since_ns is None:
            return self.start()
        if since_ns < self.horizon_ns:
            raise SinceTooOld(self.horizon_ns)
        self.faults.check(since_ns)
        for seg in self.segments:
            if seg.count and seg.max_ts >= since_ns:
                return self._locate_in(seg, since_ns)
        return self.end()

    def _locate_in(self, seg: Segment, since_ns: int) -> Position:
        offset, ordinal = 0, 0
        for entry_offset, entry_ordinal, ts in seg.sparse:
            if ts >= since_ns:
                break
            offset, ordinal = entry_offset, entry_ordinal
        try:
            fd = os.open(self.data_file(seg.num), os.O_RDONLY)
        except OSError:
            return Position(seg.num, 0, 0)
        try:
            for at, at_ordinal, data in self._walk(fd, seg, offset, ordinal):
                if _unpack_ts(data)[0] >= since_ns:
                    return Position(seg.num, at, at_ordinal)
        finally:
            os.close(fd)
        nxt = [s for s in self.segments if s.num > seg.num]
        return Position(nxt[0].num, 0, 0) if nxt else self.end()

    def _walk(self, fd: int, seg: Segment, offset: int, ordinal: int) -> Iterator[tuple[int, int, bytes]]:
        """(offset, ordinal, record) of the records of ``seg`` (``fd`` open on it)
        from ``offset`` (whose ordinal is ``ordinal``) on, damage stepped over."""
        at: int | None = offset
        while at is not None and at < seg.size:
            for record_at, data in records_from(fd, at, seg.size, self.min_size, self.max_size):
                yield record_at, ordinal, data
                at = record_at + 4 + len(data)
                ordinal += 1
            if at < seg.size:
                at, ordinal = self.faults.skip(fd, seg, at, ordinal)

    def renumbered(self, pos: Position) -> Position:
        """``pos`` (saved before a restart) with the ordinal its offset has now:
        a segment scanned at start without its index numbers the records after
        damage it stepped over anew."""
        seg = self.segment(pos.segment)
        if seg is None or not self.faults.damaged_before(seg.num, pos.offset):
            return pos
        if pos.offset >= seg.size:
            return Position(seg.num, pos.offset, seg.count)
        offset, ordinal = 0, 0
        for entry_offset, entry_ordinal, _ in seg.sparse:
            if entry_offset > pos.offset:
                break
            offset, ordinal = entry_offset, entry_ordinal
        try:
            fd = os.open(self.data_file(seg.num), os.O_RDONLY)
        except OSError:
            return pos
        try:
            for at, at_ordinal, _ in self._walk(fd, seg, offset, ordinal):
                if at >= pos.offset:
                    return Position(seg.num, pos.offset, at_ordinal) if at == pos.offset else pos
        finally:
            os.close(fd)
        return pos

    def gaps_between(self, start: Position, end: Position) -> list[Gap]:
        """The segments missing (found at start) that a read from ``start`` to ``end`` crosses."""
        return self.faults.between(start.segment, end.segment)

    def count_between(self, start: Position, end: Position) -> int:
        """The messages from ``start`` up to ``end`` still retained."""
        n = 0
        for seg in self.segments:
            if seg.num < start.segment or seg.num > end.segment:
                continue
            top = end.ordinal if seg.num == end.segment else seg.count
            bottom = start.ordinal if seg.num == start.segment else 0
            n += max(0, top - bottom)
        return n

    def bytes_between(self, start: Position, end: Position) -> int:
        """The bytes of the records from ``start`` up to ``end`` still retained."""
        n = 0
        for seg in self.segments:
            if start.segment <= seg.num <= end.segment:
                top = end.offset if seg.num == end.segment else seg.size
                bottom = start.offset if seg.num == start.segment else 0
                n += max(0, top - bottom)
        return n

    def first_from(self, num: int, end: Position) -> Position:
        """The start of the first segment still retained numbered ``num`` or
        later (``end`` if none is, before it)."""
        for seg in self.segments:
            if seg.num >= num:
                return min(Position(seg.num, 0, 0), end)
        return end

    def reader(self, start: Position, end: Position, label: str = "a reader") -> RetainedReader:
        return RetainedReader(self, start, end, label)

    # -- sync and shutdown ---------------------------------------------------------------

    def sync_snapshot(self) -> tuple[list[int], str | None, bytes]:
        """What a sync needs: the active segment's fd (dup'd); no metadata file."""
        self.count = 0
        return ([os.dup(self._fd)] if self._fd is not None else []), None, b""

    def close(self) -> None:
        """fsync, write the active segment's index (a clean start reads no segment)."""
        if self.exiting:
            return
        self.exiting = True
        self.last_append = None
        try:
            if self._fd is not None:
                os.fsync(self._fd)
            if self._active is not None:
                write_atomic(self.index_file(self._active.num), self._active.index_text())
        finally:
            if self._fd is not None:
                os.close(self._fd)
            self._fd = self._active = None
            self.syncer.unregister(self)

    def delete(self) -> None:
        """Remove every file of the log (retention turned off, the topic deleted)."""
        for holder in list(self.holders):
            holder.release_log()  # every run copied to its disk queue
        self.exiting = True
        self.deleted = True
        self.last_append = None
        if self._fd is not None:
            os.close(self._fd)
        self._fd = self._active = None
        for seg in self.segments:
            self.files.remove(self.data_file(seg.num))
            self._remove_index(seg.num)
        self._add_bytes(-self.bytes)
        self.segments.clear()
        self.faults.clear()
        self.messages = self.bytes = 0
        self.syncer.forget(self.files.meta_file)
        self.files.remove(self.files.meta_file)
        self.syncer.unregister(self)

    def _remove_index(self, num: int) -> None:
        path = self.index_file(num)
        self.syncer.forget(path)  # not written after its segment is gone
        self.files.remove(path)
