"""Reading a retained log (beyond Go): from one position to another, at the reader's pace.

A rewind (core/rewind.py) and a channel's spilled backlog (storage/spill.py) read
through a :class:`RetainedReader`, which :meth:`RetainedLog.reader` makes; what is
not a record is stepped over (:mod:`nsqd_tw.storage.faults`).
"""

from __future__ import annotations

from nsqd_tw.storage.backend import CutRecord
from nsqd_tw.storage.layout import RECORD_SIZE
from nsqd_tw.storage.records import READ_CHUNK, RecordReader
from nsqd_tw.storage.retained_segments import Position, SegmentFiles

_unpack_size = RECORD_SIZE.unpack_from


class RetainedReader:
    """Reads a log from one position to another at its reader's pace, a chunk
    at a time (only the read-ahead buffer is held: flat memory for any size)."""

    def __init__(self, log: SegmentFiles, start: Position, end: Position, label: str = "a reader") -> None:
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
