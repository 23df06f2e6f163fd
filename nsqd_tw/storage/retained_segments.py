"""A retained log's files (beyond Go): segments, their indexes, the meta file, read at start.

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

:class:`SegmentFiles` is the part of a :class:`~nsqd_tw.storage.retained.RetainedLog`
that names these files and reads them when the log opens (each segment from its
index, or scanned when it has none, and the meta file); the log writes, rolls
and deletes them.
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nsq_wire.message import TIMESTAMP
from nsqd_tw.storage.faults import Faults
from nsqd_tw.storage.files import read_regular
from nsqd_tw.storage.layout import MIN_TS, RECORD_SIZE
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


class SegmentFiles:
    """A retained log's files: their names, the segments (their summaries and
    sparse indexes) and the meta file as read when the log opens."""

    # the log's (see RetainedLog.__init__)
    topic: str
    data_path: str
    syncer: Syncer
    log: Any
    files: MetaFiles
    faults: Faults
    min_size: int
    max_size: int
    segments: list[Segment]
    messages: int
    bytes: int  # (the type is ``builtins.bytes`` in this class)
    next_num: int
    horizon_ns: int

    def _path(self, suffix: str) -> str:
        return os.path.join(self.data_path, f"{self.topic}{INFIX}{suffix}")

    def data_file(self, num: int) -> str:
        return self._path(f"{num:06d}.dat")

    def index_file(self, num: int) -> str:
        return self._path(f"{num:06d}.idx")

    def segment(self, num: int) -> Segment | None:
        for seg in self.segments:
            if seg.num == num:
                return seg
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

    def _meta_text(self) -> builtins.bytes:
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
                for offset, data in records_from(fd, at, end, self.min_size, self.max_size):
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


def records_from(fd: int, offset: int, end: int, min_size: int, max_size: int) -> Iterator[tuple[int, bytes]]:
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
