"""A replication standby's copy of its primary's retained logs (beyond Go).

On a pair (docs/replication.md, "Retained logs"), the standby's retained log of a
topic is a copy of the primary's, segment for segment: the same numbers, the
same bytes at the same offsets, the same identity (:attr:`Segment.uid`, made by
whoever started the segment). So a position in one (a rewind's, a channel's
spilled backlog) is the same place in the other, and a promoted standby goes on
where its primary was.

- While linked, each publish to a retained topic comes with where the primary
  wrote it (segment, offset, uid): the standby's log writes exactly there
  (:attr:`RetainedLog.mirror_at`, checked first by :func:`check_at`), and
  deletes a segment when the primary says it deleted it (:func:`delete_through`).
- Each new link starts with a snapshot: the primary seals the segment it was
  writing (every segment then has one writer, and a sealed one only ever goes
  whole), lists its segments (:func:`inventory`), and the standby keeps what it
  has of them (:func:`reconcile`): a segment with the same identity and size is
  kept as it is; one of the same identity but shorter is completed from its end;
  one of the same identity but longer (a deposed primary that went on alone) is
  cut to the primary's size; one of another identity, or missing, is sent whole
  and replaces the standby's only once it has arrived (:class:`Receiver`).
  Segments the primary no longer has are deleted.
- Promoted, a standby seals the segment it was copying: what it writes from
  then on is a segment of its own.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
from itertools import pairwise
from typing import Any, NamedTuple

from nsqd_tw.storage.faults import Gap
from nsqd_tw.storage.files import fsync_dir
from nsqd_tw.storage.retained import RetainedLog
from nsqd_tw.storage.retained_segments import Segment

PART = ".part"  # a segment being received whole (``<segment>.<uid>.part``), beside the one it will replace


class MirrorDiverged(Exception):
    """The standby's copy is not in step with its primary's log; ``str()`` says how."""


class Theirs(NamedTuple):
    """A segment of the primary's log, as :func:`inventory` lists it."""

    num: int
    uid: str
    size: int
    messages: int
    first_ts: int
    max_ts: int
    appended_ns: int


def inventory(log: RetainedLog) -> dict[str, Any]:
    """What a snapshot's ``BEGIN`` says of a primary's retained log."""
    return {
        "horizon": log.horizon_ns,
        "next": log.next_num,
        "segments": [[s.num, s.uid, s.size, s.count, s.first_ts, s.max_ts, s.appended_ns] for s in log.segments],
    }


def _theirs(doc: Any) -> tuple[int, int, list[Theirs]]:
    """(horizon, next number, segments) of an inventory; raises ValueError if it is not one."""
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    horizon, nxt, segments = doc.get("horizon"), doc.get("next"), doc.get("segments")
    if not isinstance(horizon, int) or not isinstance(nxt, int) or not isinstance(segments, list):
        raise ValueError("bad horizon, next or segments")
    out = []
    for entry in segments:
        if not isinstance(entry, list) or len(entry) != 7:
            raise ValueError("bad segment")
        num, uid, *numbers = entry
        if not isinstance(uid, str) or not all(isinstance(n, int) and n >= 0 for n in [num, *numbers]):
            raise ValueError("bad segment")
        out.append(Theirs(num, uid, *numbers))
    return horizon, nxt, out


def check_at(log: RetainedLog, num: int, offset: int, uid: str) -> None:
    """Raises :class:`MirrorDiverged` unless the primary's next append, at
    ``offset`` of its segment ``num`` (identity ``uid``), is where this copy ends."""
    active = log._active
    if active is not None and log._fd is not None and active.num == num:
        if active.uid != uid or active.size != offset:
            raise MirrorDiverged(
                f"segment {num} of {log.topic}: the primary writes at {offset} of {uid}, "
                f"this copy ends at {active.size} of {active.uid}"
            )
        return
    last = log.segments[-1].num if log.segments else -1
    if offset != 0 or num <= last:
        raise MirrorDiverged(
            f"segment {num} of {log.topic}: the primary writes at {offset}, this copy's last segment is {last}"
        )


def reconcile(log: RetainedLog, doc: Any) -> list[list[int]]:
    """Keep what this copy has of the primary's segments (``doc``: its
    :func:`inventory`), delete what the primary no longer has; the segments to
    receive, each as ``[number, from offset]``. Raises ValueError for a bad ``doc``."""
    horizon, nxt, theirs = _theirs(doc)
    log.seal_active()
    by_num = {t.num: t for t in theirs}
    parts: dict[int, int] = {}  # what a lost link brought of a segment, by number: its size
    pattern = os.path.join(glob.escape(log.data_path), glob.escape(f"{log.topic}.retained.") + "*" + PART)
    for path in glob.glob(pattern):
        t = _part_of(log, path, by_num)
        try:
            if t is not None:
                parts[t.num] = os.stat(path).st_size
                continue
        except OSError:
            pass
        log.files.remove(path)
    wants: list[list[int]] = []
    dropped = dropped_bytes = 0
    for seg in list(log.segments):
        t = by_num.get(seg.num)
        if t is None:
            dropped += seg.count if theirs and seg.num > theirs[0].num else 0
            dropped_bytes += seg.size
            _remove(log, seg)
        elif t.uid != seg.uid:
            wants.append([seg.num, min(parts.get(seg.num, 0), t.size)])  # kept until the primary's has arrived
        elif seg.size > t.size:
            dropped += seg.count - t.messages
            _cut(log, seg, t)
        elif seg.size < t.size:
            wants.append([seg.num, seg.size])
    wants += [[t.num, min(parts.get(t.num, 0), t.size)] for t in theirs if log.segment(t.num) is None]
    wants.sort()
    _regap(log)
    log.horizon_ns = horizon
    log.next_num = max(log.next_num, nxt)
    log.syncer.persist(log.files.meta_file, log._meta_text)
    if dropped:
        log.log.warn(
            "RETAINED({topic}): {n} messages retained here and not by primary were dropped (what this node took "
            "alone before another took over)",
            topic=log.topic,
            n=dropped,
        )
    return wants


def part_path(log: RetainedLog, num: int, uid: str) -> str:
    return f"{log.data_file(num)}.{uid}{PART}"


def _part_of(log: RetainedLog, path: str, theirs: dict[int, Theirs]) -> Theirs | None:
    """The primary's segment a part file is of, if it is one of them (same identity)."""
    for t in theirs.values():
        if path == part_path(log, t.num, t.uid):
            return t
    return None


def _regap(log: RetainedLog) -> None:
    """The gaps of a copy are the numbers missing between its segments: those its
    primary lacks too, and while a snapshot goes on, those not arrived yet."""
    segs = log.segments
    log.faults.gaps = [
        Gap(a.num + 1, b.num - 1, a.max_ts, b.first_ts, False) for a, b in pairwise(segs) if b.num > a.num + 1
    ]


def _remove(log: RetainedLog, seg: Segment) -> None:
    """Delete ``seg``, wherever it is in the log (not the primary's any more)."""
    log.segments.remove(seg)
    if seg is log._active:
        log.seal_active()
    log.files.remove(log.data_file(seg.num))
    log._remove_index(seg.num)
    log.messages -= seg.count
    log.bytes -= seg.size
    log._add_bytes(-seg.size)


def _cut(log: RetainedLog, seg: Segment, t: Theirs) -> None:
    """``seg`` is the primary's ``t`` and more: cut to it."""
    os.truncate(log.data_file(seg.num), t.size)
    _describe(log, seg, t, [e for e in seg.sparse if e[0] < t.size])


def _describe(log: RetainedLog, seg: Segment, t: Theirs, sparse: list[tuple[int, int, int]]) -> None:
    """``seg`` now holds what ``t`` says (its index written with the next sync)."""
    log.messages += t.messages - seg.count
    log.bytes += t.size - seg.size
    log._add_bytes(t.size - seg.size)
    seg.count, seg.size, seg.first_ts, seg.max_ts = t.messages, t.size, t.first_ts, t.max_ts
    seg.appended_ns = seg.created_ns = t.appended_ns
    seg.sparse = sparse
    log.syncer.persist(log.index_file(seg.num), seg.index_text)


def delete_through(log: RetainedLog, num: int, horizon_ns: int) -> None:
    """The primary deleted its segments up to ``num`` (aged out, trimmed, evicted)."""
    while log.segments and log.segments[0].num <= num:
        log._delete_first("deleted by the primary")
    if horizon_ns > log.horizon_ns:
        log.horizon_ns = horizon_ns
        log.syncer.persist(log.files.meta_file, log._meta_text)


class _Part:
    __slots__ = ("fd", "in_place", "num", "path", "uid")

    def __init__(self, num: int, uid: str, fd: int, path: str, in_place: bool) -> None:
        self.num = num
        self.uid = uid
        self.fd = fd
        self.path = path
        self.in_place = in_place


class Receiver:
    """The segments a snapshot sends one log (``SEGMENT`` frames, then each one's
    summary), written where they go: after the end of this copy's segment of the
    same identity, or beside one of another identity (``<segment>.dat.part``),
    which it replaces once whole."""

    def __init__(self, log: RetainedLog, durable: bool) -> None:
        self.log = log
        self.durable = durable
        self.parts: dict[int, _Part] = {}

    def data(self, num: int, uid: str, offset: int, data: bytes) -> None:
        part = self.parts.get(num)
        if part is None or part.uid != uid:
            if part is not None:
                self._discard(part)
            part = self._open(num, uid)
        view = memoryview(data)
        at = offset
        while view:
            n = os.pwrite(part.fd, view, at)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            view = view[n:]
            at += n

    def _open(self, num: int, uid: str) -> _Part:
        log = self.log
        seg = log.segment(num)
        if seg is not None and seg.uid == uid:
            path, flags, in_place = log.data_file(num), os.O_RDWR, True
        else:  # what a lost link brought of it is there (reconcile asked for the rest)
            path, flags, in_place = part_path(log, num, uid), os.O_RDWR | os.O_CREAT, False
        part = self.parts[num] = _Part(num, uid, os.open(path, flags, 0o600), path, in_place)
        return part

    def done(self, doc: Any) -> None:
        """A segment arrived whole (``doc``: its summary and sparse index): it takes
        its place in the log. Raises ValueError for a summary that is not one."""
        try:
            t = Theirs(
                doc["segment"],
                doc["uid"],
                doc["size"],
                doc["count"],
                doc["first_ts"],
                doc["max_ts"],
                doc["appended_ns"],
            )
            sparse = [(int(a), int(b), int(c)) for a, b, c in doc["sparse"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad segment summary - {e!r}") from None
        if not isinstance(t.num, int) or not isinstance(t.size, int):
            raise ValueError("bad segment summary")
        log = self.log
        part = self.parts.pop(t.num, None)
        if part is None:
            part = self._open(t.num, t.uid)  # nothing to send: an empty segment
            self.parts.pop(t.num, None)
        try:
            os.ftruncate(part.fd, t.size)
            if self.durable:
                os.fsync(part.fd)
        finally:
            os.close(part.fd)
        seg = log.segment(t.num)
        if not part.in_place:
            os.replace(part.path, log.data_file(t.num))
            if self.durable:
                fsync_dir(log.data_path)
            if seg is not None:  # the one it replaces: the bytes and messages it held go
                log.messages -= seg.count
                log.bytes -= seg.size
                log._add_bytes(-seg.size)
                seg.count = seg.size = 0
                seg.uid = t.uid
        if seg is None:
            seg = Segment(t.num, uid=t.uid)
            at = next((i for i, s in enumerate(log.segments) if s.num > t.num), len(log.segments))
            log.segments.insert(at, seg)
        _describe(log, seg, t, sparse)
        _regap(log)

    def drop(self, through: int) -> None:
        """The primary deleted its segments up to ``through``: so much less to receive."""
        for num in [n for n in self.parts if n <= through]:
            self._discard(self.parts.pop(num))

    def _discard(self, part: _Part) -> None:
        with contextlib.suppress(OSError):
            os.close(part.fd)
        if not part.in_place:
            self.log.files.remove(part.path)

    def close(self) -> None:
        """The link is gone: what arrived is kept, and the next link's snapshot
        sends the rest (a segment completed in place, from the end the log knows;
        a part file, from its end)."""
        for part in self.parts.values():
            with contextlib.suppress(OSError):
                os.close(part.fd)
        self.parts.clear()
