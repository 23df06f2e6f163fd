"""A retained topic's channel backlog kept as runs of the topic's retained log (beyond Go).

A channel writes to its disk queue what its memory queue cannot hold. On a topic
with a retained log that is a second copy of records the log has just written.
A :class:`SpillQueue` stands in front of such a channel's disk queue and keeps
where those records are in the log instead (a *run*: from one position to
another, how many, how many bytes), so that a publish to a retained topic is
written to disk once however far behind its channels are (Kafka's model, where a
consumer's backlog is a position in the log). Once the channel has runs, every
publish to it joins them (memory waits until they are read: publish order is
kept, and a run stays one run). What else the channel puts (a message back from
a consumer, its memory saved at a stop, a deferred message) goes to the disk
queue, which is read before the runs.

How a put is known to be in the log: the log remembers the records of its last
append (:attr:`RetainedLog.last_append`); a put of the very same record objects,
all of them or the last ones, is a run from their position. Anything else is
written to the disk queue, so a run is never wrong, only sometimes not used.

A run outlives the retention: before the log deletes a segment (aged out, trimmed
by ``retention_bytes``, evicted for ``--max-disk-bytes``, the log deleted) the
records of the runs in it are copied to the disk queue.

The runs are kept in ``<queue name>.spill.dat`` (JSON, a file Go nsqd never
opens), written with the syncs and at a clean stop, with the log's end at the
time. After a kill, everything the log took after that end is owed to the
channel again (at least once: a message from then may come twice).

Only a non-durable nsqd uses it (durable mode's disk queue records stay until
finished, which a run of a shared log cannot do); the queue is put in front of
and taken away from a channel's disk queue by :class:`nsqd_tw.core.retention.Retention`.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Sequence
from operator import is_
from typing import Any, NamedTuple

from zope.interface import implementer

from nsq_wire.message import MESSAGE_HEADER_LENGTH, TIMESTAMP
from nsqd_tw.storage.backend import CutRecord, IBackendQueue
from nsqd_tw.storage.files import read_regular, write_atomic
from nsqd_tw.storage.retained import RetainedLog
from nsqd_tw.storage.retained_reader import RetainedReader
from nsqd_tw.storage.retained_segments import MetaFiles, Position, Segment
from nsqd_tw.storage.snapshot import CHUNK, QueueSnapshot
from nsqd_tw.storage.syncer import NEVER_BY_COUNT

READ_BYTES = 1 << 20  # the most one read of a run returns
COPY_MESSAGES = 10_000  # a run copied to the disk queue, a chunk at a time
SUFFIX = ".spill.dat"

_unpack_ts = TIMESTAMP.unpack_from


class Run:
    """Records of the retained log, from ``start`` up to ``end``, owed to the channel."""

    __slots__ = ("count", "end", "reader", "size", "start")

    def __init__(self, start: Position, end: Position, count: int, size: int) -> None:
        self.start = start
        self.end = end
        self.count = count
        self.size = size  # bytes of the records (with their size prefixes)
        self.reader: RetainedReader | None = None  # once read from

    def state(self) -> list[Any]:
        start = self.reader.position if self.reader is not None else self.start
        return [list(start), list(self.end), self.count, self.size]


@implementer(IBackendQueue)
class SpillQueue:
    """A channel's disk queue, and runs of its topic's retained log behind it (see the module)."""

    acked = False

    def __init__(self, inner: Any, log: RetainedLog, name: str, data_path: str, logger: Any) -> None:
        self.inner = inner
        self.log = log
        self.name = name
        self.logger = logger
        self.runs: deque[Run] = deque()
        self.spilled = 0  # messages in runs
        self.spilled_bytes = 0
        self.path = os.path.join(data_path, name + SUFFIX)
        # what the Syncer reads: the state file is written with every sync (the
        # log's end moves), never the cause of one
        self.count = 1
        self.sync_every = NEVER_BY_COUNT
        self._written = b""
        self.exiting = False
        self.deleted = False
        self.files = MetaFiles(self.path, logger, "SPILL")
        self._load()
        log.holders[self] = None
        log.syncer.register(self)
        log.syncer.persist(self.path, self.state_text)  # soon: a kill from now on finds it

    def __repr__(self) -> str:
        return f"<SpillQueue {self.name} runs={len(self.runs)} spilled={self.spilled}>"

    @property
    def _label(self) -> str:
        return f"SPILL({self.name})"

    @property
    def spilling(self) -> bool:
        """The channel's publishes join the runs (its memory waits)."""
        return bool(self.runs)

    # -- state -----------------------------------------------------------------

    def _load(self) -> None:
        """The runs a stop kept, and after a kill what the log took since."""
        try:
            state = json.loads(read_regular(self.path))
            runs = [_run(r) for r in state["runs"]]
            end = Position(*state["end"])
            clean = state["clean"] is True
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.logger.error("SPILL({name}): ignoring {fn} - {err}", name=self.name, fn=self.path, err=e)
            return
        owed = sum(r.count for r in runs)
        for run in runs:
            self._add_run(run)
        if owed > self.spilled:
            self.logger.warn(
                "SPILL({name}): {n} messages of its backlog are no longer in the retained log",
                name=self.name,
                n=owed - self.spilled,
            )
        log = self.log
        if not clean and end[:2] < log.end()[:2]:
            before = self.spilled
            self._add_run(Run(end, log.end(), 0, 0))
            if self.spilled > before:
                self.logger.info(
                    "SPILL({name}): not stopped cleanly: {n} messages published since its last sync queued again",
                    name=self.name,
                    n=self.spilled - before,
                )

    def _add_run(self, run: Run) -> None:
        """A run read back at start, counted against what the log still holds."""
        log = self.log
        # a segment scanned at start (no index) numbers the records after damage anew
        run.start, run.end = log.renumbered(run.start), log.renumbered(run.end)
        if log.segment(run.start.segment) is None:
            run.start = log.first_from(run.start.segment, run.end)
        run.count = log.count_between(run.start, run.end)
        run.size = log.bytes_between(run.start, run.end)
        if run.count <= 0:
            return
        last = self.runs[-1] if self.runs else None
        if last is not None and last.end == run.start:
            last.end = run.end
            last.count += run.count
            last.size += run.size
        else:
            self.runs.append(run)
        self.spilled += run.count
        self.spilled_bytes += run.size

    def state_text(self, clean: bool = False) -> bytes:
        runs = [r.state() for r in self.runs]
        return json.dumps({"runs": runs, "end": list(self.log.end()), "clean": clean}).encode()

    def sync_snapshot(self) -> tuple[list[int], str | None, bytes]:
        """Every sync looks (``count`` stays 1); the file is written when it changed."""
        text = self.state_text()
        if text == self._written:
            return [], None, b""
        self._written = text
        return [], self.path, text

    # -- putting ---------------------------------------------------------------

    def put(self, data: bytes) -> None:
        self.inner.put(data)

    def put_many(self, records: Sequence[bytes]) -> object:
        n = len(records)
        last = self.log.last_append
        if last is not None and n:
            start, appended = last
            k = len(appended)
            tail = appended[k - n :] if n < k else appended
            if n <= k and records[-1] is appended[-1] and all(map(is_, records, tail)):
                return self._spill(start, appended, k - n, n)
        return self.inner.put_many(records)

    def _spill(self, start: Position, appended: Sequence[bytes], skip: int, n: int) -> object:
        if skip:
            offset = start.offset + 4 * skip + sum(map(len, appended[:skip]))
            start = Position(start.segment, offset, start.ordinal + skip)
        end = self.log.end()
        size = end.offset - start.offset
        runs = self.runs
        last = runs[-1] if runs else None
        if last is not None and last.end == start:
            mark = _RunMark(last, last.end, n, size)
            last.end = end
            last.count += n
            last.size += size
            if last.reader is not None:
                last.reader.extend(end)
        else:
            last = Run(start, end, n, size)
            runs.append(last)
            mark = _RunMark(last, None, n, size)
        self.spilled += n
        self.spilled_bytes += size
        return mark

    def unput(self, mark: object) -> None:
        """Take back the last put (a publish that failed in another channel)."""
        if not isinstance(mark, _RunMark):
            self.inner.unput(mark)
            return
        run = mark.run
        self.spilled -= mark.messages
        self.spilled_bytes -= mark.size
        if mark.end is None:
            if run in self.runs:
                self.runs.remove(run)
            if run.reader is not None:
                run.reader.close()
            return
        run.end = mark.end
        run.count -= mark.messages
        run.size -= mark.size
        if run.reader is not None:
            run.reader.end = mark.end

    # -- reading ---------------------------------------------------------------

    def read_many(self, n: int) -> list[tuple[bytes, object | None]]:
        """The disk queue's records first (messages back from consumers, copies), then the runs'."""
        out = _read_inner(self.inner, n) if self.inner.depth() else []
        runs = self.runs
        while len(out) < n and runs:
            run = runs[0]
            reader = run.reader
            if reader is None:
                reader = run.reader = self.log.reader(run.start, run.end, self._label)
            try:
                records = reader.read(n - len(out), READ_BYTES)
            except OSError as e:
                self.logger.error("SPILL({name}): failed to read the retained log - {err}", name=self.name, err=e)
                break
            taken = len(records)
            size = sum(map(len, records)) + 4 * taken
            if reader.lost:  # a segment went without being copied (removed from outside)
                reader.lost = False
                taken = run.count - self.log.count_between(reader.position, run.end)
            run.count -= taken
            run.size -= size
            self.spilled -= taken
            self.spilled_bytes -= size
            out.extend([(r, None) for r in records])
            if reader.done or run.count <= 0:
                reader.close()
                runs.popleft()
                self.spilled -= run.count
                self.spilled_bytes -= run.size
        return out

    def read(self) -> tuple[bytes, object | None] | None:
        got = self.read_many(1)
        return got[0] if got else None

    def get(self) -> bytes | None:
        got = self.read_many(1)
        return got[0][0] if got else None

    def done(self, token: object | None) -> None:
        pass

    def depth(self) -> int:
        return int(self.inner.depth()) + self.spilled

    @property
    def queued_bytes(self) -> int:
        return int(getattr(self.inner, "queued_bytes", 0)) + self.spilled_bytes

    def peek(self, n: int, max_bytes: int | None = None) -> list[bytes]:
        """The disk queue's next records, then the runs'. Bounded, a part that
        stops short of what it holds (its next record did not fit) ends the peek,
        and only the first record of all may come cut."""
        out: list[bytes] = []
        left = max_bytes
        parts: list[Run | None] = [None, *self.runs]
        for run in parts:
            want = n - len(out)
            if want <= 0:
                break
            if run is None:
                held = self.inner.depth()
                got = _peek_inner(self.inner, want, left) if held else []
            else:
                held = run.count
                if run.reader is None:  # made now, it keeps its read-ahead for the read to come
                    run.reader = self.log.reader(run.start, run.end, self._label)
                got = run.reader.peek(want, left)
            if got and out and isinstance(got[0], CutRecord):
                break
            out += got
            if left is not None:
                left -= sum(map(len, got))
                if len(got) < min(want, held) or (got and isinstance(got[-1], CutRecord)):
                    break
        return out

    def head(self) -> bytes | None:
        got = self.peek(1)
        return got[0] if got else None

    def head_timestamp(self) -> int | None:
        data = self.head()
        return int(_unpack_ts(data)[0]) if data is not None and len(data) >= MESSAGE_HEADER_LENGTH else None

    def snapshot(self) -> QueueSnapshot:
        parts: list[QueueSnapshot] = [self.inner.snapshot()]
        for run in self.runs:
            start = run.reader.position if run.reader is not None else run.start
            parts.append(_RunSnapshot(self.log.reader(start, run.end)))
        return _Chain(parts)

    def set_deferred(self, msg_id: bytes, deliver_at_ns: int) -> None:
        self.inner.set_deferred(msg_id, deliver_at_ns)

    def take_deferred(self, msg_id: bytes) -> int | None:
        result: int | None = self.inner.take_deferred(msg_id)
        return result

    def release_files(self) -> None:
        release = getattr(self.inner, "release_files", None)
        if release is not None:
            release()

    # -- the log deletes a segment -----------------------------------------------

    def before_delete(self, seg: Segment) -> None:
        """Copy what the runs have in ``seg`` to the disk queue."""
        log = self.log
        while self.runs:
            run = self.runs[0]
            start = run.reader.position if run.reader is not None else run.start
            if start.segment > seg.num:
                break
            if run.reader is not None:
                run.reader.close()
                run.reader = None
            whole = run.end.segment <= seg.num
            self._copy(start, run.end if whole else Position(seg.num, seg.size, seg.count))
            self.spilled -= run.count
            self.spilled_bytes -= run.size
            if whole:
                self.runs.popleft()
                continue
            run.start = log.first_from(seg.num + 1, run.end)
            run.count = log.count_between(run.start, run.end)
            run.size = log.bytes_between(run.start, run.end)
            if run.count <= 0:
                self.runs.popleft()
                continue
            self.spilled += run.count
            self.spilled_bytes += run.size
            break

    def _copy(self, start: Position, end: Position) -> None:
        """Write the log's records from ``start`` to ``end`` to the disk queue,
        whatever the disk budget (the segment they are in goes next)."""
        reader = self.log.reader(start, end, self._label)
        budget = getattr(self.inner, "budget", None)
        enforcing = budget.enforcing if budget is not None else True
        n = 0
        try:
            if budget is not None:
                budget.enforcing = False
            while not reader.done:
                records = reader.read(COPY_MESSAGES, READ_BYTES * 4)
                if not records:
                    break
                self.inner.put_many(records)
                n += len(records)
        except OSError as e:
            self.logger.error(
                "SPILL({name}): failed to copy {n}+ messages of a retained segment to the disk queue - {err}",
                name=self.name,
                n=n,
                err=e,
            )
        finally:
            if budget is not None:
                budget.enforcing = enforcing
            reader.close()

    def release_log(self) -> None:
        """The log is deleted (or retention turned off): every run goes to the disk queue."""
        for run in self.runs:
            start = run.reader.position if run.reader is not None else run.start
            if run.reader is not None:
                run.reader.close()
            self._copy(start, run.end)
        self.runs.clear()
        self.spilled = self.spilled_bytes = 0
        self._detach()

    def _detach(self) -> None:
        self.log.holders.pop(self, None)
        self.log.syncer.unregister(self)

    # -- the end ---------------------------------------------------------------

    def unwrap(self) -> Any:
        """Runs copied to the disk queue, the state file removed: the disk queue alone."""
        if self in self.log.holders:
            self.release_log()
        self._remove_state()
        return self.inner

    def _drop_runs(self) -> None:
        for run in self.runs:
            if run.reader is not None:
                run.reader.close()
        self.runs.clear()
        self.spilled = self.spilled_bytes = 0

    def empty(self) -> None:
        self._drop_runs()
        self.inner.empty()

    def delete(self) -> None:
        self._drop_runs()
        self.exiting = self.deleted = True
        self._detach()
        self._remove_state()
        self.inner.delete()

    def close(self) -> None:
        self.exiting = True
        self._detach()
        try:
            if self.runs:
                write_atomic(self.path, self.state_text(clean=True))
            else:
                self._remove_state()
        finally:
            for run in self.runs:
                if run.reader is not None:
                    run.reader.close()
            self.inner.close()

    def _remove_state(self) -> None:
        self.log.syncer.forget(self.path)
        self.files.remove(self.path)


class _RunMark(NamedTuple):
    """What :meth:`SpillQueue.unput` takes back: ``count`` messages at the end of
    ``run``, which ended at ``end`` before (None: the put made the run)."""

    run: Run
    end: Position | None
    messages: int
    size: int


def _run(value: Any) -> Run:
    start, end, count, size = value
    return Run(Position(*start), Position(*end), int(count), int(size))


def _peek_inner(inner: Any, n: int, max_bytes: int | None) -> list[bytes]:
    """The disk queue's peek, bounded (a disk queue of ours takes the bound)."""
    return list(inner.peek(n) if max_bytes is None else inner.peek(n, max_bytes))


def _read_inner(inner: Any, n: int) -> list[tuple[bytes, object | None]]:
    read_many = getattr(inner, "read_many", None)
    if read_many is not None:
        return list(read_many(n))
    out: list[tuple[bytes, object | None]] = []
    while len(out) < n and (item := inner.read()) is not None:
        out.append(item)
    return out


class _RunSnapshot(QueueSnapshot):
    def __init__(self, reader: RetainedReader) -> None:
        self._reader = reader

    def take(self, max_bytes: int = CHUNK) -> list[tuple[int, bytes]]:
        records = self._reader.read(1 << 30, max_bytes)
        if self._reader.done:
            self._reader.close()
        return [(0, r) for r in records]

    @property
    def done(self) -> bool:
        return self._reader.done

    def close(self) -> None:
        self._reader.close()


class _Chain(QueueSnapshot):
    def __init__(self, parts: Iterable[QueueSnapshot]) -> None:
        self._parts = deque(parts)

    def take(self, max_bytes: int = CHUNK) -> list[tuple[int, bytes]]:
        while self._parts:
            got = self._parts[0].take(max_bytes)
            if got:
                return got
            if self._parts[0].done:
                self._parts.popleft().close()
        return []

    @property
    def done(self) -> bool:
        while self._parts and self._parts[0].done:
            self._parts.popleft().close()
        return not self._parts

    def close(self) -> None:
        for part in self._parts:
            part.close()
        self._parts.clear()
