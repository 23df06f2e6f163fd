"""What can be wrong with a retained log's files (beyond Go): damaged records, missing segments.

*Damage*: bytes where a record should start that are not one (a flipped size
prefix, a torn sector). Every reader of a segment (rewinds, a channel's runs,
peeks, the start-up scan of a segment without its index) steps over them to the
next good record instead of giving up on the segment, as a disk queue does: the
next offset where a plausible record starts (:func:`~nsqd_tw.storage.layout.find_record`).
The segment's sparse index bounds the search: its next entry is a record
boundary, so the search never goes past it, and resumes there if nothing before
it looks like a record; the ordinal of the record resumed at is known from that
entry (or from the segment's end). Each damaged spot is logged once, its bytes
kept in ``<segment>.bad.<offset>`` once, and counted while its segment is
retained (``damaged`` in ``/stats``).

*Gaps*: segment numbers only grow, and segments are deleted oldest first, so
every number from the log's first segment (kept in ``T.retained.meta.dat``) to
its last should be on disk. One that is not, found at start-up, is a *gap*: the
messages published between the newest retained before it and the oldest
retained after it are not in the log. Each is logged (a WARNING per gap); a gap
at the head moves the horizon past it, and a rewind from a time inside a gap in
the middle is refused (:class:`RetainedGap`) rather than starting late in silence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from nsq_wire.gofmt import rfc3339_nano
from nsqd_tw.storage.layout import RECORD_SIZE, find_record, keep_bad
from nsqd_tw.storage.records import READ_CHUNK, RecordReader

_unpack_size = RECORD_SIZE.unpack_from


class SegmentView(Protocol):
    """What the faults need of a segment (:class:`~nsqd_tw.storage.retained_segments.Segment`)."""

    num: int
    count: int
    size: int
    first_ts: int
    max_ts: int
    sparse: list[tuple[int, int, int]]


class Gap(NamedTuple):
    """Segments ``first`` to ``last`` missing: the messages published after
    ``after_ns`` and before ``before_ns`` are not in the log."""

    first: int
    last: int
    after_ns: int  # the newest message retained before it (at the head: the horizon it had)
    before_ns: int  # the oldest retained after it (none: when nsqd started)
    head: bool  # nothing retained before it: the horizon moved past it

    def answer(self) -> dict[str, Any]:
        """The gap in a rewind's answer."""
        return {"segments": [self.first, self.last], "from": self.after_ns, "to": self.before_ns}

    def text(self) -> str:
        return f"messages published from {rfc3339_nano(self.after_ns)} to {rfc3339_nano(self.before_ns)}"


class RetainedGap(Exception):
    """A rewind from a time inside a gap: the messages from then on would not all come."""

    def __init__(self, gap: Gap) -> None:
        super().__init__(gap)
        self.gap = gap


class _Damage(NamedTuple):
    resume: int | None  # the next good record (None: none up to ``end``)
    end: int  # the segment's size when it was looked at
    ordinal: int | None  # the ordinal of the record at ``resume``, when known


class Faults:
    """The damaged spots and the gaps of one topic's retained log."""

    def __init__(self, topic: str, logger: Any, data_file: Callable[[int], str], min_size: int, max_size: int) -> None:
        self.topic = topic
        self.log = logger
        self.data_file = data_file
        self.min_size = min_size
        self.max_size = max_size
        self.damage: dict[tuple[int, int], _Damage] = {}  # (segment, offset): what follows it
        self.gaps: list[Gap] = []

    @property
    def damaged(self) -> int:
        """Damaged spots met in the segments retained."""
        return len(self.damage)

    @property
    def missing(self) -> int:
        """Segments missing between segments retained."""
        return sum(g.last - g.first + 1 for g in self.gaps if not g.head)

    # -- damage ----------------------------------------------------------------------

    def skip(self, fd: int, seg: SegmentView, pos: int, ordinal: int) -> tuple[int | None, int]:
        """Not a record at ``pos`` of ``seg`` (``fd`` open on it; ``ordinal``: the
        caller's count there): the offset of the next good record (None: none in
        the segment) and its ordinal (``ordinal`` if it cannot be known: never more
        than it is, so no count comes out short)."""
        key = (seg.num, pos)
        known = self.damage.get(key)
        if known is not None and (known.resume is not None or known.end >= seg.size):
            return known.resume, ordinal if known.ordinal is None else known.ordinal
        bound, at_bound = seg.size, seg.count
        for entry_offset, entry_ordinal, _ in seg.sparse:
            if entry_offset > pos:
                bound, at_bound = entry_offset, entry_ordinal
                break
        resume = find_record(fd, pos + 1, bound, self.min_size, self.max_size)
        if resume is None and bound < seg.size:
            resume = bound  # an index entry: a record starts there
        exact = None
        if resume is not None:
            n = count_records(fd, resume, bound, self.min_size, self.max_size)
            exact = None if n is None else at_bound - n
        self.damage[key] = _Damage(resume, seg.size, exact)
        if known is None:
            self._report(fd, seg.num, pos, resume, seg.size)
        return resume, ordinal if exact is None else exact

    def scanned(self, fd: int, num: int, pos: int, end: int, ordinal: int) -> int | None:
        """The start-up scan of segment ``num`` (no index) met bytes at ``pos`` that
        are not a record: the next good record (``ordinal``: the scan's count
        there), or None if no good record follows (a torn tail, the caller cuts it)."""
        resume = find_record(fd, pos + 1, end, self.min_size, self.max_size)
        if resume is not None:
            self.damage[(num, pos)] = _Damage(resume, end, ordinal)
            self._report(fd, num, pos, resume, end)
        return resume

    def damaged_before(self, num: int, offset: int) -> bool:
        return any(n == num and at < offset for n, at in self.damage)

    def _report(self, fd: int, num: int, pos: int, resume: int | None, end: int) -> None:
        fn = self.data_file(num)
        stop = end if resume is None else resume
        kept = keep_bad(fd, f"{fn}.bad.{pos}", pos, stop)
        self.log.error(
            "RETAINED({topic}): damaged record in {fn} at offset {at}: {n} bytes skipped to {where}, kept in {kept}",
            topic=self.topic,
            fn=fn,
            at=pos,
            n=stop - pos,
            where="the end of the segment" if resume is None else f"the next good record at offset {resume}",
            kept=kept,
        )

    # -- gaps ------------------------------------------------------------------------

    def find_gaps(
        self, segments: Sequence[SegmentView], first: int | None, next_num: int | None, horizon: int, now_ns: int
    ) -> int:
        """At start-up: the numbers from ``first`` (None: the lowest on disk) to
        ``next_num`` (None: the highest on disk) not in ``segments``, each run
        logged and kept as a gap. Returns the horizon, moved past a missing head."""
        present = [s.num for s in segments]
        if not present and (first is None or next_num is None):
            return horizon
        lo = min(x for x in (first, present[0] if present else None) if x is not None)
        hi = max(next_num or 0, present[-1] + 1 if present else 0)
        runs: list[tuple[int, int]] = []
        expect = lo
        for num in present:
            if num > expect:
                runs.append((expect, num - 1))
            expect = max(expect, num + 1)
        if hi > expect:
            runs.append((expect, hi - 1))
        for a, b in runs:
            before = [s for s in segments if s.num < a and s.count]
            after = [s for s in segments if s.num > b and s.count]
            before_ns = after[0].first_ts if after else now_ns
            files = self._files(a, b)
            if before:
                gap = Gap(a, b, before[-1].max_ts, before_ns, False)
                self.log.warn(
                    "RETAINED({topic}): {files} missing: {span} are not in the retained log; a rewind from a "
                    "time in between is refused (RETAINED_GAP), one from before it skips them",
                    topic=self.topic,
                    files=files,
                    span=gap.text(),
                )
            else:
                gap = Gap(a, b, horizon, max(horizon, before_ns), True)
                self.log.warn(
                    "RETAINED({topic}): {files} missing from the head of the retained log: {span} are not in it; "
                    "available_since moved to {to}",
                    topic=self.topic,
                    files=files,
                    span=gap.text(),
                    to=rfc3339_nano(gap.before_ns),
                )
                horizon = gap.before_ns
            self.gaps.append(gap)
        return horizon

    def _files(self, a: int, b: int) -> str:
        if a == b:
            return self.data_file(a)
        return f"{self.data_file(a)} to {self.data_file(b)} ({b - a + 1} segments)"

    def check(self, since_ns: int) -> None:
        """Raise :class:`RetainedGap` if ``since_ns`` is inside a gap."""
        for gap in self.gaps:
            if gap.after_ns < since_ns < gap.before_ns:
                raise RetainedGap(gap)

    def between(self, start_segment: int, end_segment: int) -> list[Gap]:
        """The gaps a reader from ``start_segment`` to ``end_segment`` crosses."""
        return [g for g in self.gaps if g.last >= start_segment and g.first < end_segment]

    def gap_of(self, num: int) -> Gap | None:
        for gap in self.gaps:
            if gap.first <= num <= gap.last:
                return gap
        return None

    def skipped(self, first: int, last: int) -> str:
        """Why a reader found no segments ``first`` to ``last``, for its warning."""
        gap = self.gap_of(first)
        if gap is not None:
            return f"missing from the data path: {gap.text()} are not in the retained log"
        return "deleted (retention, retention_bytes or --max-disk-bytes) before they were read"

    # -- deletion --------------------------------------------------------------------

    def forget(self, num: int, first_left: int) -> int:
        """Segment ``num`` was deleted, ``first_left`` is the first one left: its
        damage is no longer counted, and a gap it preceded is now at the head.
        Returns the horizon that gap implies (0: none)."""
        for key in [k for k in self.damage if k[0] == num]:
            del self.damage[key]
        horizon = 0
        while self.gaps and self.gaps[0].last < first_left:
            horizon = max(horizon, self.gaps.pop(0).before_ns)
        return horizon

    def clear(self) -> None:
        self.damage.clear()
        self.gaps.clear()


def count_records(fd: int, start: int, stop: int, min_size: int, max_size: int) -> int | None:
    """The records from ``start`` to ``stop`` of file ``fd``, by their sizes;
    None unless they end exactly at ``stop``."""
    reader = RecordReader(READ_CHUNK)
    reader.fd = fd
    reader.limit = stop
    n, at = 0, start
    try:
        while at < stop:
            head = reader.read_at(at, 4)
            if len(head) < 4:
                return None
            (size,) = _unpack_size(head)
            if size < min_size or size > max_size:
                return None
            at += 4 + size
            n += 1
        return n if at == stop else None
    finally:
        reader.fd = None  # the caller's
