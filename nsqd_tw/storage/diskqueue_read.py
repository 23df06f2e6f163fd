"""A disk queue's reading side: read, done, peek, and what a damaged or missing file costs.

:class:`DiskQueueReading` is the half of :class:`~nsqd_tw.storage.diskqueue.DiskQueue`
that moves the read position: records read one at a time or, from the read-ahead
buffer, a batch in one pass (:meth:`~DiskQueueReading.read_many`); in acknowledged
mode each comes with its :class:`Ref` and the persisted cursor waits for the oldest
one to be done; records peeked, left unread (beyond Go); and a read that meets
something not a record skips to the next good one and corrects the depth (Go's
go-diskqueue does the same). The writing side, sync and housekeeping are the
queue's own (storage/diskqueue.py).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nsq_wire.message import ID_OFFSET, MSG_ID_LENGTH, TIMESTAMP
from nsqd_tw.storage.backend import CutRecord
from nsqd_tw.storage.budget import DiskBudget
from nsqd_tw.storage.deferred import DeferredTimes
from nsqd_tw.storage.layout import RECORD_SIZE, QueueFiles
from nsqd_tw.storage.records import RecordReader
from nsqd_tw.storage.snapshot import FileSnapshot
from nsqd_tw.storage.syncer import Syncer

try:
    import cython
except ModuleNotFoundError:
    from nsq_wire import cython_shim as cython


# read_views: a record this large (past the allocator of small objects, where a
# copy also costs a malloc and a free) comes out as a view of the read buffer
VIEW_FROM = 512


class Ref:
    """Where a record read in acknowledged mode lives, its size, whether it is
    done, the ID of its message if a deliver-at time is held for it, and if a
    tombstone is (see :meth:`DiskQueue.drop`)."""

    __slots__ = ("deferred_id", "done", "file", "pos", "size", "tombstone")

    def __init__(self, file: int, pos: int, size: int) -> None:
        self.file = file
        self.pos = pos
        self.size = size
        self.done = False
        self.deferred_id: bytes | None = None
        self.tombstone: bytes | None = None


class DiskQueueReading:
    """The reading half of :class:`~nsqd_tw.storage.diskqueue.DiskQueue` (its base class)."""

    # the queue's (see DiskQueue.__init__)
    name: str
    min_msg_size: int
    max_msg_size: int
    syncer: Syncer
    log: Any
    acked: bool
    budget: DiskBudget | None
    exiting: bool
    queued_bytes: int
    count: int
    files: QueueFiles
    deferred: DeferredTimes
    _reader: RecordReader
    _outstanding: deque[Ref]
    _head: tuple[tuple[int, int], int | None] | None
    _depth: int
    read_file_num: int
    read_pos: int
    write_file_num: int
    write_pos: int
    sync_every: int
    deleted: bool

    if TYPE_CHECKING:  # the queue's too: what makes it a SyncedQueue for the Syncer

        def sync_snapshot(self) -> tuple[list[int], str, bytes]: ...

    # -- reading -------------------------------------------------------------------

    def get(self) -> bytes | None:
        item = self.read()
        return None if item is None else item[0]

    def read(self) -> tuple[bytes, Ref | None] | None:
        """The next record and, in acknowledged mode, its :class:`Ref`."""
        r = self._reader
        while True:
            if self.read_file_num > self.write_file_num or (
                self.read_file_num == self.write_file_num and self.read_pos >= self.write_pos
            ):
                self._check_tail()
                return None
            if r.fd is None or r.num != self.read_file_num:
                if not self._open_read():
                    continue
            if self.read_file_num == self.write_file_num:
                r.limit = self.write_pos
            pos = self.read_pos
            if pos >= r.limit:
                self._next_read_file()
                continue
            head = r.read_at(pos, 4)
            if len(head) < 4:
                self._corrupt(pos, "truncated record size")
                continue
            (size,) = RECORD_SIZE.unpack(head)
            if size < self.min_msg_size or size > self.max_msg_size:
                self._corrupt(pos, f"invalid message read size ({size})")
                continue
            if pos + 4 + size > r.limit:
                self._corrupt(pos, f"record of {size} bytes runs past the end of the file")
                continue
            data = r.read_at(pos + 4, size)
            if len(data) < size:
                self._corrupt(pos, "truncated record")
                continue
            ref = None
            tombstone = None
            if self.acked:
                ref = Ref(self.read_file_num, pos, 4 + size)
                self._outstanding.append(ref)
                deferred = self.deferred
                if deferred.at or deferred.dropped:  # its time is kept (on file) until it is done
                    msg_id = data[ID_OFFSET : ID_OFFSET + MSG_ID_LENGTH]
                    if msg_id in deferred.dropped:
                        tombstone = msg_id
                    elif deferred.take(msg_id, hold=True) is not None:
                        ref.deferred_id = msg_id
            else:
                self._set_queued(self.queued_bytes - 4 - size)
            self.read_pos = pos + 4 + size
            if tombstone is None:
                self._depth -= 1
            self.count += 1
            self.syncer.read(self)
            if self.read_pos >= r.limit and self.read_file_num < self.write_file_num:
                self._next_read_file()
            if tombstone is not None:  # dropped before a crash: done, not counted, not read again
                assert ref is not None
                ref.tombstone = tombstone
                self.done(ref)
                continue
            return data, ref

    def read_many(self, n: int, views: bool = False) -> list[tuple[bytes, Ref | None]]:
        """Up to ``n`` of the next records, as :meth:`read` gives them one by one.
        Records the read-ahead buffer already holds come out in one pass (not in
        acknowledged mode, and not while deliver-at times are kept).

        ``views``: those of :data:`VIEW_FROM` bytes or more come out as memoryviews
        of the buffer, not copied out of it (:meth:`read_views`)."""
        out: list[tuple[bytes, Ref | None]] = []
        read = self.read
        while len(out) < n:
            item = read()
            if item is None:
                break
            out.append(item)
            if not self.acked and not self.deferred.at and not self.deferred.held and len(out) < n:
                self._read_buffered(out, n, views)
        return out

    def read_views(self, n: int) -> list[tuple[bytes | memoryview, Ref | None]]:
        """:meth:`read_many` for a reader that decodes each record at once (a
        channel's messages): a large record in the read-ahead buffer is a view of
        it, and the message's body is the one copy made of it. A view holds the
        whole buffer: it must not be kept."""
        return self.read_many(n, True)  # type: ignore[return-value]

    # compiled: the loop's arithmetic in C, the buffer (os.pread's bytes) sliced directly
    @cython.locals(
        buf=bytes,
        start=cython.Py_ssize_t,
        end=cython.Py_ssize_t,
        pos=cython.Py_ssize_t,
        lo=cython.Py_ssize_t,
        hi=cython.Py_ssize_t,
        size=cython.Py_ssize_t,
        i=cython.Py_ssize_t,
        taken=cython.Py_ssize_t,
        size_total=cython.Py_ssize_t,
        want=cython.Py_ssize_t,
        view_from=cython.Py_ssize_t,
    )
    def _read_buffered(self, out: list[tuple[bytes, Ref | None]], n: int, views: bool = False) -> None:
        """:meth:`read`'s loop for the records wholly in the reader's buffer, with
        the same checks; it stops at the first record it cannot take from there.
        ``views``: records of :data:`VIEW_FROM` bytes or more as views of the buffer."""
        r = self._reader
        if r.fd is None or r.num != self.read_file_num:
            return
        limit = r.limit
        if self.read_file_num == self.write_file_num and self.write_pos < limit:
            limit = self.write_pos
        buf, start = r.window()
        end = min(limit, start + len(buf))  # what is readable and buffered
        pos = self.read_pos
        lo, hi = self.min_msg_size, self.max_msg_size
        unpack = RECORD_SIZE.unpack_from
        taken = 0
        size_total = 0
        want = n - len(out)
        view_from = VIEW_FROM if views else hi + 1
        view: Any = memoryview(buf) if views else None
        while taken < want and pos + 4 <= end:
            (size,) = unpack(buf, pos - start)
            if size < lo or size > hi or pos + 4 + size > end:
                break  # read() looks at it (an error, or more to read first)
            i = pos - start + 4
            out.append((buf[i : i + size] if size < view_from else view[i : i + size], None))
            pos += 4 + size
            size_total += 4 + size
            taken += 1
        if not taken:
            return
        self.read_pos = pos
        self._set_queued(self.queued_bytes - size_total)
        self._depth -= taken
        self.count += taken
        self.syncer.read(self)
        if pos >= r.limit and self.read_file_num < self.write_file_num:
            self._next_read_file()

    def done(self, ref: object | None) -> None:
        """Acknowledged mode: the message of ``ref`` is finished (or copied elsewhere)."""
        if not isinstance(ref, Ref) or ref.done:
            return
        ref.done = True
        if ref.deferred_id is not None:
            self.deferred.done(ref.deferred_id)
        self._set_queued(self.queued_bytes - ref.size)
        self.count += 1
        self.syncer.read(self)
        out = self._outstanding
        if out and out[0] is ref:
            first_file = ref.file
            while out and out[0].done:
                passed = out.popleft()
                if passed.tombstone is not None:
                    self.deferred.undrop(passed.tombstone)
            self._remove_files_before(self._cursor()[0], first_file)

    def drop(self, ref: object | None, msg_id: bytes) -> None:
        """Acknowledged mode: the message of ``ref`` is gone for good (dropped by a
        bound, expired). :meth:`done`, and while an older record is still owned
        (the persisted read position stays before it) a tombstone is kept, so
        that the record is not read again after a crash."""
        if not isinstance(ref, Ref) or ref.done:
            return
        out = self._outstanding
        if out and out[0] is not ref:
            self.deferred.drop(msg_id, ref.file, ref.pos)
            ref.tombstone = msg_id
        self.done(ref)

    def _count_tombstones(self) -> None:
        """At open: forget the tombstones the read position passed already, and
        leave the records of the others out of the depth."""
        cursor = (self.read_file_num, self.read_pos)
        dropped = self.deferred.dropped
        for msg_id, at in list(dropped.items()):
            if at < cursor or at >= (self.write_file_num, self.write_pos):
                del dropped[msg_id]
        self._depth = max(0, self._depth - len(dropped))

    # -- peeking (beyond Go): the next records, left where they are -------------------

    def peek(self, n: int, max_bytes: int | None = None) -> list[bytes]:
        """Up to ``n`` records from the read position on, not read (the read
        position, the reader and its buffer stay as they are); with ``max_bytes``,
        as :meth:`IBackendQueue.peek` bounds them (a record that does not fit is not read)."""
        found: list[bytes] = []
        if n <= 0:
            return found
        total = 0
        reader = RecordReader()
        try:
            for pos, size in self._unread(reader):
                if max_bytes is not None and total + size > max_bytes:
                    if not found:
                        data = reader.read_at(pos + 4, max_bytes)
                        if len(data) == max_bytes:
                            found.append(CutRecord(data, size))
                    break
                data = reader.read_at(pos + 4, size)
                if len(data) < size:
                    break
                found.append(data)
                total += size
                if len(found) == n:
                    break
        finally:
            reader.close()
        return found

    def head(self) -> bytes | None:
        """The next record to read, left unread: from the read-ahead buffer when
        it holds it (a replication standby looks at its head after every batch)."""
        if not self._depth:
            return None
        r, num, pos = self._reader, self.read_file_num, self.read_pos
        size_bytes = r.buffered(num, pos, 4)
        if size_bytes is not None:
            (size,) = RECORD_SIZE.unpack(size_bytes)
            end = pos + 4 + size
            if self.min_msg_size <= size <= self.max_msg_size and (num < self.write_file_num or end <= self.write_pos):
                data = r.buffered(num, pos + 4, size)
                if data is not None:
                    return data
        found = self.peek(1)
        return found[0] if found else None

    def head_timestamp(self) -> int | None:
        """The timestamp (ns) of the next record to read (None: none), read again
        only when the read position has moved, and from the reader's buffer when
        it holds it: cheap enough for every /stats."""
        if not self._depth:
            return None
        at = (self.read_file_num, self.read_pos)
        if self._head is None or self._head[0] != at:
            self._head = (at, self._read_head_timestamp())
        return self._head[1]

    def _read_head_timestamp(self) -> int | None:
        end = 4 + TIMESTAMP.size
        head = self._reader.buffered(self.read_file_num, self.read_pos, end)
        if head is not None and self.min_msg_size <= RECORD_SIZE.unpack_from(head)[0] <= self.max_msg_size:
            return int(TIMESTAMP.unpack_from(head, 4)[0])
        reader = RecordReader(chunk=end)
        try:
            for pos, _ in self._unread(reader):
                data = reader.read_at(pos + 4, TIMESTAMP.size)
                return int(TIMESTAMP.unpack(data)[0]) if len(data) == TIMESTAMP.size else None
            return None
        finally:
            reader.close()

    def _unread(self, reader: RecordReader) -> Iterator[tuple[int, int]]:
        """The position and size of each record not read yet, in order, found
        through ``reader``; they end at the write position, a missing file, or
        anything that is not a record (:meth:`read` deals with those)."""
        num, pos = self.read_file_num, self.read_pos
        while (num, pos) < (self.write_file_num, self.write_pos):
            if reader.num != num:
                limit = self.write_pos if num == self.write_file_num else None
                if not reader.open(self.files.data_file(num), num, limit):
                    return
            if pos >= reader.limit:
                num, pos = num + 1, 0
                continue
            head = reader.read_at(pos, 4)
            if len(head) < 4:
                return
            (size,) = RECORD_SIZE.unpack(head)
            if size < self.min_msg_size or size > self.max_msg_size or pos + 4 + size > reader.limit:
                return
            yield pos, size
            pos += 4 + size

    def snapshot(self) -> FileSnapshot:
        """The records queued now (from the read position: in acknowledged mode
        those read and not done are the reader's to account for), readable later
        whatever this queue does meanwhile; with their deliver-at times."""
        fds: dict[int, int] = {}
        for num in range(self.read_file_num, self.write_file_num + 1):
            try:
                fds[num] = os.open(self.files.data_file(num), os.O_RDONLY)
            except FileNotFoundError:
                continue
        return FileSnapshot(
            fds,
            (self.read_file_num, self.read_pos),
            (self.write_file_num, self.write_pos),
            dict(self.deferred.at),
            self.min_msg_size,
            self.max_msg_size,
        )

    def _cursor(self) -> tuple[int, int]:
        if self._outstanding:
            ref = self._outstanding[0]
            return ref.file, ref.pos
        return self.read_file_num, self.read_pos

    # -- reading internals ---------------------------------------------------------

    def _open_read(self) -> bool:
        fn = self.files.data_file(self.read_file_num)
        last = self.read_file_num == self.write_file_num
        if not self._reader.open(fn, self.read_file_num, self.write_pos if last else None):
            if not last:
                self.log.error("DISKQUEUE({name}) {fn} is missing, skipping to the next file", name=self.name, fn=fn)
                self.read_file_num += 1
                self.read_pos = 0
                self._recount("after a missing file")
                return False
            # the write file not created yet (nothing written to it)
            self._reader.limit = 0
            self.read_pos = self.write_pos
            return False
        self.log.info("DISKQUEUE({name}): readOne() opened {fn}", name=self.name, fn=fn)
        return True

    def _next_read_file(self) -> None:
        old = self.read_file_num
        self._reader.close()
        self.read_file_num += 1
        self.read_pos = 0
        self.syncer.request(self)
        if not self.acked:
            self.files.remove(self.files.data_file(old))
        elif not self._outstanding:
            self._remove_files_before(self.read_file_num, old)

    def _remove_files_before(self, cursor_file: int, first: int) -> None:
        for num in range(first, min(cursor_file, self.read_file_num)):
            self.files.remove(self.files.data_file(num))

    def _check_tail(self) -> None:
        if self._depth != 0:
            if self._depth < 0:
                self.log.error(
                    "DISKQUEUE({name}) negative depth at tail ({d}), metadata corruption, resetting 0...",
                    name=self.name,
                    d=self._depth,
                )
            else:
                self.log.error(
                    "DISKQUEUE({name}) positive depth at tail ({d}), data loss, resetting 0...",
                    name=self.name,
                    d=self._depth,
                )
            self._depth = 0
            self.syncer.request(self)
        if not self.acked and self.queued_bytes:
            self._set_queued(0)

    def _corrupt(self, pos: int, reason: str) -> None:
        """Skip bad bytes to the next plausible record; keep them aside; fix depth."""
        r = self._reader
        assert r.fd is not None
        end = r.limit
        resume, kept = self.files.resync(r.fd, self.read_file_num, pos, end)
        bad_end = end if resume is None else resume
        where = f"the next good record at offset {resume}" if resume is not None else "the end of the file"
        old = self._depth
        self.read_pos = bad_end
        r.drop_buffer()
        self._set_queued(max(0, self.queued_bytes - (bad_end - pos)))
        self._depth = self.files.count_records(*self._positions())
        self.log.error(
            "DISKQUEUE({name}) corrupt data in {fn} at offset {pos} ({reason}): skipped {n} bytes to {where}, "
            "kept in {kept}; depth corrected from {old} to {new}",
            name=self.name,
            fn=self.files.data_file(self.read_file_num),
            pos=pos,
            reason=reason,
            n=bad_end - pos,
            where=where,
            kept=kept,
            old=old,
            new=self._depth,
        )
        self.syncer.request(self)
        if resume is None and self.read_file_num < self.write_file_num:
            self._next_read_file()

    def _recount(self, why: str) -> None:
        old = self._depth
        self._depth = self.files.count_records(*self._positions())
        if self._depth != old:
            self.log.warn(
                "DISKQUEUE({name}) depth corrected from {old} to {new} {why}",
                name=self.name,
                old=old,
                new=self._depth,
                why=why,
            )

    def _set_queued(self, n: int) -> None:
        if self.budget is not None:
            self.budget.used += n - self.queued_bytes
        self.queued_bytes = n

    def _positions(self) -> tuple[int, int, int, int]:
        return self.read_file_num, self.read_pos, self.write_file_num, self.write_pos
