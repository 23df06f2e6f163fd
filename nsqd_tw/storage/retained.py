"""A topic's retained log (beyond Go): every message published to it, kept for a time or a size.

For topic ``T`` in the data path (names Go nsqd never opens, and that no disk
queue's name can take):

- ``T.retained.000000.dat``, ``...000001.dat``: *segments*, the records of the
  messages in publish order, framed as the disk queues frame them (a 4-byte
  big-endian size, then the encoded message); one write per publish. A new
  segment starts when the next publish would pass the segment size, or when the
  segment is older than the roll age; at each start of nsqd the next publish
  starts a new one.
- ``T.retained.000000.idx``: a sealed segment's summary (messages, bytes, first
  and greatest timestamp, last append time) and its sparse index, one entry per
  :data:`SPARSE_BYTES` (the offset, ordinal and timestamp of the record there),
  so that a rewind finds its start by reading at most one entry's span. Written
  with the next sync once a segment is sealed; a segment without one (after a
  kill) is scanned at start, and whatever follows its last good record is cut.
- ``T.retained.meta.dat``: the *horizon*, in ns: every message published since
  then is in the log (the time the log was made, moved on when a segment is
  deleted); the next segment's number; the first segment's (a third field,
  written since issue 36: with it a missing head segment is found).

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
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nsq_wire.message import MESSAGE_HEADER_LENGTH, TIMESTAMP
from nsqd_tw.storage.backend import CutRecord
from nsqd_tw.storage.budget import DiskBudget
from nsqd_tw.storage.faults import Faults, Gap
from nsqd_tw.storage.files import read_regular, write_atomic
from nsqd_tw.storage.layout import MIN_TS, RECORD_SIZE, framed
from nsqd_tw.storage.records import READ_CHUNK, RecordReader
from nsqd_tw.storage.syncer import Syncer

SPARSE_BYTES = 256 * 1024  # bytes of records between two entries of a segment's index
INFIX = ".retained."
_SEGMENT_RE = re.compile(r"(.+)\.retained\.(\d{6,})\.dat")
UID_BYTES = 8
_UID_RE = re.compile(r"[0-9a-f]{16}")


_unpack_size = RECORD_SIZE.unpack_from
_unpack_ts = TIMESTAMP.unpack_from


def segment_of(filename: str) -> tuple[str, int] | None:
    """(topic, segment number) of a retained segment's file name, else None."""
    m = _SEGMENT_RE.fullmatch(filename)
    return (m.group(1), int(m.group(2))) if m else None


class Position(NamedTuple):
    """A place in the log: a segment, a byte offset in it, the ordinal of the record there."""

    segment: int
    offset: int
    ordinal: int


class SinceTooOld(Exception):
    """A rewind from before the horizon: messages published since then may be gone."""

    def __init__(self, horizon_ns: int) -> None:
        super().__init__(horizon_ns)
        self.horizon_ns = horizon_ns


@dataclass
class Segment:
    num: int
    count: int = 0
    size: int = 0  # bytes of whole records
    first_ts: int = 0
    max_ts: int = 0  # the greatest timestamp (of the first and last record of each write)
    appended_ns: int = 0  # when it was last written to (what ages it out)
    created_ns: int = 0  # when it was first written to (what rolls it)
    sparse: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, ordinal, timestamp)
    # who wrote it: random, made when it is started; a replication standby's copy
    # of it has the same (storage/mirror.py), which is how the two are matched
    uid: str = ""

    def index_text(self) -> bytes:
        head = b"v1 %d %d %d %d %d" % (self.count, self.size, self.first_ts, self.max_ts, self.appended_ns)
        if self.uid:
            head += b" " + self.uid.encode()  # an extra field: an older reader takes the first five
        return head + b"\n" + b"".join(b"%d %d %d\n" % entry for entry in self.sparse)


def new_uid() -> str:
    return os.urandom(UID_BYTES).hex()


def index_uid(head: bytes) -> str:
    """The segment identity in an index's first line, else ""."""
    fields = head.split(b"\n", 1)[0].split()
    uid = fields[6].decode("ascii", "replace") if len(fields) > 6 else ""
    return uid if _UID_RE.fullmatch(uid) else ""


class Mark(NamedTuple):
    """The active segment's state before an append, to take the append back."""

    segment: Segment
    messages: int
    size: int
    first_ts: int
    max_ts: int
    appended_ns: int
    sparse: int


class MetaFiles:
    """What the Syncer asks of a queue's files: its metadata file, and removal
    (errors logged as ``<label>: failed to remove ...``)."""

    def __init__(self, meta_file: str, log: Any, label: str = "RETAINED") -> None:
        self.meta_file = meta_file
        self._log = log
        self._label = label

    def remove(self, path: str) -> bool:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self._log.error("{label}: failed to remove {fn} - {err}", label=self._label, fn=path, err=e)
            return False
        return True


class RetainedLog:
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

    def _path(self, suffix: str) -> str:
        return os.path.join(self.data_path, f"{self.topic}{INFIX}{suffix}")

    def data_file(self, num: int) -> str:
        return self._path(f"{num:06d}.dat")

    def index_file(self, num: int) -> str:
        return self._path(f"{num:06d}.idx")

    @property
    def earliest_ts(self) -> int | None:
        """The timestamp of the oldest message retained (None: none)."""
        for seg in self.segments:
            if seg.count:
                return seg.first_ts
        return None

    # -- start-up --------------------------------------------------------------------

    def _load(self, existing: Sequence[int], now_ns: int, known: dict[int, Segment]) -> None:
        for num in sorted(existing):
            seg = known.get(num) or self._load_index(num) or self._scan(num)
            if seg is not None:
                self._identify(seg)
                self.segments.append(seg)
                self.messages += seg.count
                self.bytes += seg.size
        self.next_num = max(existing, default=-1) + 1
        raw = b""
        first = claimed_next = None  # a meta file of before issue 36 has neither
        try:
            raw = read_regular(self.files.meta_file)
            fields = [int(x) for x in raw.split()]
            horizon = fields[0]
            self.next_num = max(self.next_num, fields[1] if len(fields) > 1 else 0)
            if len(fields) > 2:
                claimed_next, first = fields[1], fields[2]
        except (OSError, ValueError, IndexError) as e:
            horizon = self.segments[0].first_ts if self.segments and self.segments[0].count else now_ns
            if not isinstance(e, FileNotFoundError):
                self.log.warn(
                    "RETAINED({topic}): ignoring {fn} - {err}", topic=self.topic, fn=self.files.meta_file, err=e
                )
        self.horizon_ns = self.faults.find_gaps(self.segments, first, claimed_next, horizon, now_ns)
        if raw != self._meta_text():
            self.syncer.persist(self.files.meta_file, self._meta_text)

    def _identify(self, seg: Segment) -> None:
        """A segment read at start keeps the identity its index gave it; one
        without (indexed again after a kill, or by an older nsq-tw) gets a new one."""
        if not seg.uid:
            seg.uid = new_uid()
            self.syncer.persist(self.index_file(seg.num), seg.index_text)

    def _meta_text(self) -> bytes:
        """The horizon, the next segment's number and the first's."""
        first = self.segments[0].num if self.segments else self.next_num
        return b"%d\n%d\n%d\n" % (self.horizon_ns, self.next_num, first)

    def _load_index(self, num: int) -> Segment | None:
        """The segment as its index describes it, if the index matches the file."""
        try:
            text = read_regular(self.index_file(num))
            size = os.stat(self.data_file(num)).st_size
        except OSError:
            return None
        try:
            lines = text.split(b"\n")
            head = lines[0].split()
            if head[0] != b"v1":
                return None
            count, seg_size, first_ts, max_ts, appended = (int(x) for x in head[1:6])
            sparse = []
            for line in lines[1:]:
                if line:
                    a, b, c = line.split()
                    sparse.append((int(a), int(b), int(c)))
        except (ValueError, IndexError):
            return None
        if seg_size != size:
            return None
        return Segment(num, count, seg_size, first_ts, max_ts, appended, appended, sparse, index_uid(text))

    def _scan(self, num: int) -> Segment | None:
        """Read a segment without an index: its records (damage stepped over),
        whatever follows the last good one cut."""
        path = self.data_file(num)
        seg = Segment(num)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            self.log.error("RETAINED({topic}): cannot open {fn} - {err}", topic=self.topic, fn=path, err=e)
            return None
        try:
            end = os.fstat(fd).st_size
            next_sparse = 0
            at: int | None = 0
            while at is not None and at < end:
                for offset, data in _records(fd, at, end, self.min_size, self.max_size):
                    (ts,) = _unpack_ts(data)
                    if not MIN_TS <= ts:
                        break
                    if offset >= next_sparse:
                        seg.sparse.append((offset, seg.count, ts))
                        next_sparse = offset + SPARSE_BYTES
                    if not seg.count:
                        seg.first_ts = ts
                    seg.max_ts = max(seg.max_ts, ts)
                    seg.count += 1
                    at = seg.size = offset + 4 + len(data)
                if at < end:  # not a record: damage if a good one follows, else a torn tail
                    at = self.faults.scanned(fd, num, at, end, seg.count)
            if seg.size < end:
                self.log.warn(
                    "RETAINED({topic}): {fn}: {n} bytes after the last whole record at offset {at} cut",
                    topic=self.topic,
                    fn=path,
                    n=end - seg.size,
                    at=seg.size,
                )
                os.ftruncate(fd, seg.size)
        finally:
            os.close(fd)
        seg.appended_ns = seg.created_ns = seg.max_ts
        self.syncer.persist(self.index_file(num), seg.index_text)
        self.log.info(
            "RETAINED({topic}): indexed {fn}: {n} messages, {size} bytes",
            topic=self.topic,
            fn=path,
            n=seg.count,
            size=seg.size,
        )
        return seg

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
            for record_at, data in _records(fd, at, seg.size, self.min_size, self.max_size):
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

    def segment(self, num: int) -> Segment | None:
        for seg in self.segments:
            if seg.num == num:
                return seg
        return None

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


class RetainedReader:
    """Reads a log from one position to another at its reader's pace, a chunk
    at a time (only the read-ahead buffer is held: flat memory for any size)."""

    def __init__(self, log: RetainedLog, start: Position, end: Position, label: str = "a reader") -> None:
        """``label``: who reads, for the warnings (``CHANNEL(t:c) rewind``)."""
        self.log = log
        self.position = start
        self.end = end
        self.label = label
        # records skipped: a segment not there (deleted before it was read, missing),
        # or damage stepped over; the caller recounts from the position
        self.lost = False
        self._reader = RecordReader(READ_CHUNK)
        self._limit = 0
        self._warned = -1  # segments up to this one were warned about (peeks go over them again)

    @property
    def done(self) -> bool:
        return self.position[:2] >= self.end[:2]

    def extend(self, end: Position) -> None:
        """Read on to ``end`` (later than the end so far: the log grew)."""
        self.end = end
        r = self._reader
        if r.fd is not None:
            seg = self.log.segment(r.num)
            self._limit = r.limit = end.offset if r.num == end.segment else (seg.size if seg else self._limit)

    def peek(self, max_n: int, max_bytes: int | None = None) -> list[bytes]:
        """Up to ``max_n`` records from the position on, not read; with ``max_bytes``,
        as :meth:`IBackendQueue.peek` bounds them (a record that does not fit is not read)."""
        position, lost = self.position, self.lost
        out: list[bytes] = []
        total = 0
        r = self._reader
        try:
            while len(out) < max_n and (size := self._next_record()) is not None:
                num, offset, ordinal = self.position
                if max_bytes is not None and total + size > max_bytes:
                    if not out and len(data := r.read_at(offset + 4, max_bytes)) == max_bytes:
                        out.append(CutRecord(data, size))
                    break
                data = r.read_at(offset + 4, size)
                if len(data) < size:
                    self._next_segment()
                    continue
                out.append(data)
                total += size
                self.position = Position(num, offset + 4 + size, ordinal + 1)
            return out
        finally:
            self.position, self.lost = position, lost

    def read(self, max_n: int, max_bytes: int) -> list[bytes]:
        """Up to ``max_n`` records (at least one, and no more once ``max_bytes``
        are passed) from the position on, not past the end."""
        out: list[bytes] = []
        total = 0
        log = self.log
        r = self._reader
        while len(out) < max_n and total < max_bytes and (size := self._next_record()) is not None:
            num, offset, ordinal = self.position
            data = r.read_at(offset + 4, size)
            if len(data) < size:
                self._next_segment()
                continue
            out.append(data)
            total += size
            offset += 4 + size
            ordinal += 1
            # the records wholly in the read-ahead buffer, in one pass (same checks)
            buf, start = r.window()
            end = min(self._limit, start + len(buf))
            lo, hi = log.min_size, log.max_size
            while len(out) < max_n and total < max_bytes and offset + 4 <= end:
                (size,) = _unpack_size(buf, offset - start)
                if size < lo or size > hi or offset + 4 + size > end:
                    break  # the loop above looks at it (an error, or more to read first)
                i = offset - start + 4
                out.append(buf[i : i + size])
                total += size
                offset += 4 + size
                ordinal += 1
            self.position = Position(num, offset, ordinal)
        return out

    def _next_record(self) -> int | None:
        """The size of the record at the position (None: the end), its segment
        open; what is not a record is stepped over to the next good one."""
        log = self.log
        r = self._reader
        while not self.done:
            num, offset, ordinal = self.position
            if r.fd is None or r.num != num:
                if not self._open(num):
                    continue
            if offset + 4 > self._limit:
                self._next_segment()
                continue
            head = r.read_at(offset, 4)
            size: int = _unpack_size(head)[0] if len(head) == 4 else -1
            if log.min_size <= size <= log.max_size and offset + 4 + size <= self._limit:
                return size
            seg = log.segment(num)
            assert r.fd is not None
            resume, ordinal = log.faults.skip(r.fd, seg, offset, ordinal) if seg is not None else (None, ordinal)
            self.lost = True
            if resume is None or resume >= self._limit:
                self._next_segment()
            else:
                self.position = Position(num, resume, ordinal)
        return None

    def _open(self, num: int) -> bool:
        seg = self.log.segment(num)
        if seg is None:
            self._next_segment(missing=True)
            return False
        limit = self.end.offset if num == self.end.segment else seg.size
        if not self._reader.open(self.log.data_file(num), num, limit):
            self._warn(num, num, f"its file {self.log.data_file(num)} is gone")
            self._next_segment(lost=True)
            return False
        self._limit = limit
        return True

    def _next_segment(self, lost: bool = False, missing: bool = False) -> None:
        """On to the next segment still retained (or the end). Segments are
        numbered in order and deleted oldest first: what is not there was
        deleted before it was read, or is missing (a warning says which);
        ``missing``: the position's segment is not there either."""
        num = self.position.segment
        self._reader.close()
        later = [s.num for s in self.log.segments if num < s.num <= self.end.segment]
        end = self.end
        if later:
            self.position = Position(later[0], 0, 0)
            last = later[0] - 1
        else:
            self.position = end
            last = end.segment if end.offset > 0 else end.segment - 1
        first = num if missing else num + 1
        if last >= first:
            self._warn(first, last, self.log.faults.skipped(first, last))
            lost = True
        if lost:
            self.lost = True

    def _warn(self, first: int, last: int, why: str) -> None:
        """Once per reader and segment: the segments ``first`` to ``last`` are not read."""
        if last <= self._warned:
            return
        self._warned = last
        log = self.log
        log.log.warn(
            "RETAINED({topic}): {who} skipped {what}: {why}",
            topic=log.topic,
            who=self.label,
            what=f"segment {first}" if first == last else f"segments {first} to {last}",
            why=why,
        )

    def close(self) -> None:
        self._reader.close()


def _records(fd: int, offset: int, end: int, min_size: int, max_size: int) -> Iterator[tuple[int, bytes]]:
    """(offset, record) of the whole, plausible records from ``offset`` to ``end``."""
    reader = RecordReader(READ_CHUNK)
    reader.fd = fd
    reader.limit = end
    try:
        while offset + 4 <= end:
            head = reader.read_at(offset, 4)
            if len(head) < 4:
                return
            (size,) = _unpack_size(head)
            if size < min_size or size > max_size or offset + 4 + size > end:
                return
            data = reader.read_at(offset + 4, size)
            if len(data) < size:
                return
            yield offset, data
            offset += 4 + size
    finally:
        reader.fd = None  # the caller's fd: not closed here
