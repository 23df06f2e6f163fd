"""A disk-backed FIFO queue, file-compatible with go-diskqueue (Go nsqd's).

Files in the data path, for a queue named ``name`` (``topic`` or
``topic:channel``):

- ``name.diskqueue.000000.dat``, ``...000001.dat``: records, each a 4-byte
  big-endian size then that many bytes (an encoded message);
- ``name.diskqueue.meta.dat``: ``depth\\nreadFileNum,readPos\\nwriteFileNum,writePos\\n``.

Go nsqd can open a data path this queue wrote, and the reverse. Beyond Go:

- ``name.diskqueue.deferred.dat`` (which Go ignores) keeps the deliver-at time
  of deferred messages written to the queue, as ``ID NS\\n`` lines;
- corrupt bytes are skipped to the next good record (kept aside in
  ``<file>.bad.<offset>``) instead of discarding the rest of the file;
- in *acknowledged* mode (nsqd's durable mode) the read cursor that is
  persisted does not pass a record until its message is finished (:meth:`done`),
  so a message delivered but not FINed survives a crash.

Writes go to the file with ``pwrite`` before ``put`` returns (in the page
cache, as Go's), so a killed process loses nothing written; fsync and the
metadata are the :class:`Syncer`'s job, off the reactor thread.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from twisted.internet import defer
from twisted.python.failure import Failure
from zope.interface import implementer

from nsq_wire.message import ID_OFFSET, MSG_ID_LENGTH, TIMESTAMP
from nsqd_tw.storage.backend import IBackendQueue
from nsqd_tw.storage.files import write_atomic

_SIZE = struct.Struct(">i")
_META_RE = re.compile(rb"^(-?\d+)\n(-?\d+),(-?\d+)\n(-?\d+),(-?\d+)\n?")
_ID_RE = re.compile(rb"[0-9a-f]{16}")
READ_CHUNK = 1 << 20
# where a record's message ID starts (after the record's 4-byte size)
_ID_OFFSET = 4 + ID_OFFSET
_MIN_TS = 1_300_000_000 * 10**9  # 2011, before Go's ID epoch


class DiskQueueError(Exception):
    pass


class WriteMark(NamedTuple):
    """The write position, depth and queued bytes before a put_many, to take it back."""

    file: int
    pos: int
    depth: int
    queued: int


class DiskBudget:
    """--max-disk-bytes (beyond Go): the bytes queued in all the disk queues of an
    nsqd, and the most they may be. Queued bytes are those not yet read (in durable
    mode: not yet finished); a file keeps what was read of it until the queue moves
    to its next file, so the files may hold up to --max-bytes-per-file more per queue.
    """

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.used = 0
        self.enforcing = True  # nsqd stopping writes what it holds whatever the budget

    def check(self, more: int) -> None:
        if self.limit and self.enforcing and self.used + more > self.limit:
            raise DiskBudgetFull(
                f"disk budget full: {self.used} of {self.limit} bytes (--max-disk-bytes) queued, {more} more asked"
            )


class DiskBudgetFull(DiskQueueError):
    """A write refused because it would pass --max-disk-bytes."""


class Ref:
    """Where a record read in acknowledged mode lives, its size, and whether it is done."""

    __slots__ = ("done", "file", "pos", "size")

    def __init__(self, file: int, pos: int, size: int) -> None:
        self.file = file
        self.pos = pos
        self.size = size
        self.done = False


@implementer(IBackendQueue)
class DiskQueue:
    acked: bool

    def __init__(
        self,
        name: str,
        data_path: str,
        max_bytes_per_file: int,
        min_msg_size: int,
        max_msg_size: int,
        sync_every: int,
        syncer: Syncer,
        log: Any,
        acked: bool = False,
        budget: DiskBudget | None = None,
    ) -> None:
        self.name = name
        self.data_path = data_path
        self.max_bytes_per_file = max_bytes_per_file
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size
        self.sync_every = sync_every
        self.syncer = syncer
        self.log = log
        self.acked = acked
        self.budget = budget
        self.exiting = False
        self.deleted = False
        self.queued_bytes = 0  # bytes of records not yet read (durable mode: not finished)

        self.read_file_num = 0
        self.read_pos = 0
        self.write_file_num = 0
        self.write_pos = 0
        self._depth = 0

        self._wfd: int | None = None
        self._wfd_num = -1
        self._rfd: int | None = None
        self._rfd_num = -1
        self._rlimit = 0  # bytes readable in the open read file
        self._rbuf = b""
        self._rbuf_start = 0
        self._sidecar_fd: int | None = None
        self._sidecar_lines = 0

        self.count = 0  # writes and reads since the last sync
        self._outstanding: deque[Ref] = deque()
        self.deferred_at: dict[bytes, int] = {}
        self._load()
        syncer.register(self)

    def __repr__(self) -> str:
        return f"<DiskQueue {self.name}>"

    # -- names -------------------------------------------------------------

    def file_name(self, num: int) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.{num:06d}.dat")

    def meta_file_name(self) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.meta.dat")

    def sidecar_file_name(self) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.deferred.dat")

    def _existing_file_nums(self) -> list[int]:
        pattern = os.path.join(glob.escape(self.data_path or "."), glob.escape(self.name) + ".diskqueue.*.dat")
        nums = []
        for path in glob.glob(pattern):
            middle = os.path.basename(path)[len(self.name) + len(".diskqueue.") : -len(".dat")]
            if middle.isdigit():
                nums.append(int(middle))
        return sorted(nums)

    # -- start-up ---------------------------------------------------------------

    def _load(self) -> None:
        try:
            with open(self.meta_file_name(), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raw = None
        except OSError as e:
            self.log.error("DISKQUEUE({name}) failed to retrieveMetaData - {err}", name=self.name, err=e)
            raw = None
        if raw is not None:
            m = _META_RE.match(raw)
            if m is None:
                self.log.error(
                    "DISKQUEUE({name}) failed to retrieveMetaData - unexpected metadata {raw!r}",
                    name=self.name,
                    raw=raw[:100],
                )
            else:
                depth, rf, rp, wf, wp = (int(x) for x in m.groups())
                self._depth = depth
                self.read_file_num, self.read_pos = rf, rp
                self.write_file_num, self.write_pos = wf, wp

        unclean = False
        try:
            size = os.stat(self.file_name(self.write_file_num)).st_size
        except FileNotFoundError:
            size = 0
        if self.write_pos < size:
            self.log.warn(
                "DISKQUEUE({name}) {fn} metadata writePos {pos} < file size of {size}, skipping to new file",
                name=self.name,
                fn=self.file_name(self.write_file_num),
                pos=self.write_pos,
                size=size,
            )
            self.write_file_num += 1
            self.write_pos = 0
            unclean = True
        # never write over a file the metadata did not know about
        existing = self._existing_file_nums()
        if existing and existing[-1] > self.write_file_num:
            self.write_file_num = existing[-1] + 1
            self.write_pos = 0
            unclean = True
        if raw is None and existing and existing[0] > self.read_file_num:
            # no metadata (lost, or never synced): salvage from the oldest file
            self.read_file_num, self.read_pos = existing[0], 0
            unclean = True
        self._load_sidecar()
        if unclean:
            self._recount("after an unclean shutdown")
        self._set_queued(self._measure_queued())

    def _measure_queued(self) -> int:
        """The bytes from the read position to the write position, across files."""
        total = 0
        for num in range(self.read_file_num, self.write_file_num + 1):
            if num == self.write_file_num:
                end = self.write_pos
            else:
                try:
                    end = os.stat(self.file_name(num)).st_size
                except FileNotFoundError:
                    continue
            total += max(0, end - (self.read_pos if num == self.read_file_num else 0))
        return total

    def _set_queued(self, n: int) -> None:
        if self.budget is not None:
            self.budget.used += n - self.queued_bytes
        self.queued_bytes = n

    def _load_sidecar(self) -> None:
        try:
            with open(self.sidecar_file_name(), "rb") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and len(parts[0]) == 16:
                        try:
                            self.deferred_at[parts[0]] = int(parts[1])
                        except ValueError:
                            continue
        except FileNotFoundError:
            pass

    def _recount(self, why: str) -> None:
        """Count the records left to read by walking their headers."""
        old = self._depth
        count = 0
        num, pos = self.read_file_num, self.read_pos
        while num <= self.write_file_num:
            try:
                fd = os.open(self.file_name(num), os.O_RDONLY)
            except FileNotFoundError:
                num, pos = num + 1, 0
                continue
            try:
                end = self.write_pos if num == self.write_file_num else os.fstat(fd).st_size
                while pos + 4 <= end:
                    head = os.pread(fd, 4, pos)
                    if len(head) < 4:
                        break
                    (size,) = _SIZE.unpack(head)
                    if size < self.min_msg_size or size > self.max_msg_size or pos + 4 + size > end:
                        break
                    count += 1
                    pos += 4 + size
            finally:
                os.close(fd)
            num, pos = num + 1, 0
        self._depth = count
        if count != old:
            self.log.warn(
                "DISKQUEUE({name}) depth corrected from {old} to {new} {why}",
                name=self.name,
                old=old,
                new=count,
                why=why,
            )

    # -- IBackendQueue -----------------------------------------------------------

    def depth(self) -> int:
        return self._depth

    def put(self, data: bytes) -> None:
        self.put_many((data,))

    def put_many(self, records: Sequence[bytes]) -> WriteMark:
        """Append records; they are in the file (page cache) when this returns.

        All or nothing: if a write fails (a full disk), what this call wrote is
        cut off the files again before the error is raised, so neither this
        process nor one restarted after a crash reads any of it. Returns a mark
        for :meth:`unput`.
        """
        if self.exiting:
            raise DiskQueueError("exiting")
        lo, hi = self.min_msg_size, self.max_msg_size
        for data in records:
            n = len(data)
            if n < lo or n > hi:
                raise DiskQueueError(f"invalid message write size ({n}) minMsgSize={lo} maxMsgSize={hi}")
        mark = WriteMark(self.write_file_num, self.write_pos, self._depth, self.queued_bytes)
        chunks = self._plan(records)
        total = sum(len(chunk[2]) for chunk in chunks)
        if self.budget is not None:
            self.budget.check(total)
        try:
            for file_num, offset, data, _ in chunks:
                self._pwrite(file_num, offset, data)
        except BaseException:
            self._cut(mark, chunks[-1][0] if chunks else mark.file)
            raise
        for file_num, offset, data, n in chunks:
            if file_num != self.write_file_num:
                self._file_complete()
            self._commit_write(file_num, offset + len(data), n)
        self._set_queued(self.queued_bytes + total)
        return mark

    def _plan(self, records: Sequence[bytes]) -> list[tuple[int, int, bytes, int]]:
        """Split records into (file, offset, bytes, count) writes, a new file
        whenever the next record would pass --max-bytes-per-file."""
        pack = _SIZE.pack
        limit = self.max_bytes_per_file
        file_num, pos = self.write_file_num, self.write_pos
        chunks: list[tuple[int, int, bytes, int]] = []
        parts: list[bytes] = []
        start = pos
        for data in records:
            total = 4 + len(data)
            if pos > 0 and pos + total > limit:
                if parts:
                    chunks.append((file_num, start, b"".join(parts), len(parts) // 2))
                    parts = []
                file_num, pos = file_num + 1, 0
                start = 0
            parts.append(pack(len(data)))
            parts.append(data)
            pos += total
        if parts:
            chunks.append((file_num, start, b"".join(parts), len(parts) // 2))
        return chunks

    def unput(self, mark: object) -> None:
        """Take back everything written since ``mark`` (which put_many returned),
        as if never written: the staged batch of a publish that failed elsewhere.
        Nothing written since may have been read."""
        assert isinstance(mark, WriteMark)
        if (self.read_file_num, self.read_pos) > (mark.file, mark.pos):
            raise DiskQueueError("cannot take back records already read")
        self._cut(mark, self.write_file_num)
        self._set_queued(mark.queued)
        self.syncer.request(self)

    def _cut(self, mark: WriteMark, last_file: int) -> None:
        """Truncate the files back to ``mark`` and forget what lies past it."""
        for num in range(mark.file + 1, last_file + 1):
            if self._wfd_num == num:
                assert self._wfd is not None
                os.close(self._wfd)
                self._wfd, self._wfd_num = None, -1
            self._remove_quietly(self.file_name(num))
        try:
            os.truncate(self.file_name(mark.file), mark.pos)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.log.error("DISKQUEUE({name}) failed to take back a failed write - {err}", name=self.name, err=e)
        self.write_file_num, self.write_pos, self._depth = mark.file, mark.pos, mark.depth

    def _commit_write(self, file_num: int, pos: int, n: int) -> None:
        self.write_file_num, self.write_pos = file_num, pos
        self._depth += n
        self.count += n
        self.syncer.wrote(self, n)

    def _pwrite(self, file_num: int, offset: int, data: bytes) -> None:
        if self._wfd is None or self._wfd_num != file_num:
            self._close_write()
            self._wfd = os.open(self.file_name(file_num), os.O_RDWR | os.O_CREAT, 0o600)
            self._wfd_num = file_num
            self.log.info("DISKQUEUE({name}): writeOne() opened {fn}", name=self.name, fn=self.file_name(file_num))
        view = memoryview(data)
        while view:
            n = os.pwrite(self._wfd, view, offset)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            view = view[n:]
            offset += n

    def _file_complete(self) -> None:
        """The write file is full: the next write goes to a new file (opened by
        _pwrite, which hands the old fd to the next sync to fsync and close)."""
        if self._rfd_num == self.write_file_num:
            self._rlimit = self.write_pos  # the reader's file is complete now
        self.syncer.request(self)

    def get(self) -> bytes | None:
        item = self.read()
        return None if item is None else item[0]

    def read(self) -> tuple[bytes, Ref | None] | None:
        """The next record and, in acknowledged mode, its :class:`Ref`."""
        while True:
            if self.read_file_num > self.write_file_num or (
                self.read_file_num == self.write_file_num and self.read_pos >= self.write_pos
            ):
                self._check_tail()
                return None
            if self._rfd is None or self._rfd_num != self.read_file_num:
                if not self._open_read():
                    continue
            if self.read_file_num == self.write_file_num:
                self._rlimit = self.write_pos
            pos = self.read_pos
            if pos >= self._rlimit:
                self._next_read_file()
                continue
            head = self._read_at(pos, 4)
            if len(head) < 4:
                self._corrupt(pos, "truncated record size")
                continue
            (size,) = _SIZE.unpack(head)
            if size < self.min_msg_size or size > self.max_msg_size:
                self._corrupt(pos, f"invalid message read size ({size})")
                continue
            if pos + 4 + size > self._rlimit:
                self._corrupt(pos, f"record of {size} bytes runs past the end of the file")
                continue
            data = self._read_at(pos + 4, size)
            if len(data) < size:
                self._corrupt(pos, "truncated record")
                continue
            ref = None
            if self.acked:
                ref = Ref(self.read_file_num, pos, 4 + size)
                self._outstanding.append(ref)
            else:
                self._set_queued(self.queued_bytes - 4 - size)
            self.read_pos = pos + 4 + size
            self._depth -= 1
            self.count += 1
            self.syncer.read(self)
            if self.read_pos >= self._rlimit and self.read_file_num < self.write_file_num:
                self._next_read_file()
            return data, ref

    def done(self, ref: object | None) -> None:
        """Acknowledged mode: the message of ``ref`` is finished (or copied elsewhere)."""
        if not isinstance(ref, Ref) or ref.done:
            return
        ref.done = True
        self._set_queued(self.queued_bytes - ref.size)
        self.count += 1
        self.syncer.read(self)
        out = self._outstanding
        if out and out[0] is ref:
            first_file = ref.file
            while out and out[0].done:
                out.popleft()
            self._remove_files_before(self._cursor()[0], first_file)

    def empty(self) -> None:
        if self.exiting:
            raise DiskQueueError("exiting")
        self.log.info("DISKQUEUE({name}): emptying", name=self.name)
        self._skip_to_next_rw_file()
        self._set_queued(0)
        self._remove_quietly(self.meta_file_name())
        self._remove_quietly(self.sidecar_file_name())
        self.deferred_at.clear()
        self.syncer.request(self)

    def delete(self) -> None:
        self.log.info("DISKQUEUE({name}): deleting", name=self.name)
        self.exiting = True
        self.deleted = True
        self._set_queued(0)
        self._close_fds()
        for num in self._existing_file_nums():
            self._remove_quietly(self.file_name(num))
        self._remove_quietly(self.meta_file_name())
        self._remove_quietly(self.sidecar_file_name())
        self.deferred_at.clear()
        self.syncer.unregister(self)

    def close(self) -> None:
        """fsync, persist the metadata and the deferred times, release the files."""
        if self.exiting:
            return
        self.log.info("DISKQUEUE({name}): closing", name=self.name)
        self.exiting = True
        try:
            self.sync_now()
        finally:
            self._close_fds()
            self.syncer.unregister(self)

    # -- deferred times (beyond Go) ----------------------------------------------

    def set_deferred(self, msg_id: bytes, deliver_at_ns: int) -> None:
        """Remember when the message ``msg_id`` (written to this queue) is due."""
        self.deferred_at[msg_id] = deliver_at_ns
        line = b"%s %d\n" % (msg_id, deliver_at_ns)
        try:
            if self._sidecar_fd is None:
                self._sidecar_fd = os.open(self.sidecar_file_name(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(self._sidecar_fd, line)
            self._sidecar_lines += 1
        except OSError as e:
            self.log.error("DISKQUEUE({name}) failed to record a deferred time - {err}", name=self.name, err=e)
        if self._sidecar_lines > 2 * len(self.deferred_at) + 100_000:
            self._write_sidecar()  # compact the append-only log
        if self.acked:
            self.syncer.request(self)

    def take_deferred(self, msg_id: bytes) -> int | None:
        if not self.deferred_at:
            return None
        return self.deferred_at.pop(msg_id, None)

    # -- sync ----------------------------------------------------------------------

    def _cursor(self) -> tuple[int, int]:
        if self._outstanding:
            ref = self._outstanding[0]
            return ref.file, ref.pos
        return self.read_file_num, self.read_pos

    def meta_text(self) -> bytes:
        """The metadata as Go writes it. In acknowledged mode the read position is
        the oldest unfinished record's, and depth counts what will be read again
        from there."""
        rf, rp = self._cursor()
        depth = self._depth + len(self._outstanding)
        return b"%d\n%d,%d\n%d,%d\n" % (depth, rf, rp, self.write_file_num, self.write_pos)

    def sync_snapshot(self) -> tuple[list[int], str, bytes]:
        """What a sync needs, taken on the reactor thread: fds to fsync (dup'd), metadata."""
        fds = []
        for fd in (self._wfd, self._sidecar_fd):
            if fd is not None:
                fds.append(os.dup(fd))
        self.count = 0
        return fds, self.meta_file_name(), self.meta_text()

    def sync_now(self) -> None:
        """A synchronous sync (shutdown): fsync, then write the metadata."""
        if self._wfd is not None:
            os.fsync(self._wfd)
        self._write_sidecar()
        write_atomic(self.meta_file_name(), self.meta_text())
        self.count = 0

    def _write_sidecar(self) -> None:
        if self._sidecar_fd is not None:
            os.close(self._sidecar_fd)
            self._sidecar_fd = None
        self._sidecar_lines = len(self.deferred_at)
        if self.deferred_at:
            body = b"".join(b"%s %d\n" % item for item in self.deferred_at.items())
            write_atomic(self.sidecar_file_name(), body)
        else:
            self._remove_quietly(self.sidecar_file_name())

    # -- reading internals ---------------------------------------------------------

    def _open_read(self) -> bool:
        self._close_read()
        fn = self.file_name(self.read_file_num)
        try:
            self._rfd = os.open(fn, os.O_RDONLY)
        except FileNotFoundError:
            if self.read_file_num < self.write_file_num:
                self.log.error("DISKQUEUE({name}) {fn} is missing, skipping to the next file", name=self.name, fn=fn)
                self.read_file_num += 1
                self.read_pos = 0
                self._recount("after a missing file")
                return False
            # the write file not created yet (nothing written to it)
            self._rlimit = 0
            self.read_pos = self.write_pos
            return False
        self._rfd_num = self.read_file_num
        self._rbuf = b""
        self._rbuf_start = 0
        if self.read_file_num < self.write_file_num:
            self._rlimit = os.fstat(self._rfd).st_size
        else:
            self._rlimit = self.write_pos
        self.log.info("DISKQUEUE({name}): readOne() opened {fn}", name=self.name, fn=fn)
        return True

    def _read_at(self, pos: int, n: int) -> bytes:
        start = pos - self._rbuf_start
        if 0 <= start and start + n <= len(self._rbuf):
            return self._rbuf[start : start + n]
        want = max(n, min(READ_CHUNK, self._rlimit - pos))
        assert self._rfd is not None
        self._rbuf = os.pread(self._rfd, want, pos)
        self._rbuf_start = pos
        return self._rbuf[:n]

    def _next_read_file(self) -> None:
        old = self.read_file_num
        self._close_read()
        self.read_file_num += 1
        self.read_pos = 0
        self.syncer.request(self)
        if not self.acked:
            self._remove_quietly(self.file_name(old))
        elif not self._outstanding:
            self._remove_files_before(self.read_file_num, old)

    def _remove_files_before(self, cursor_file: int, first: int) -> None:
        for num in range(first, min(cursor_file, self.read_file_num)):
            self._remove_quietly(self.file_name(num))

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
        fn = self.file_name(self.read_file_num)
        end = self._rlimit
        resume = self._find_record(pos + 1, end)
        bad_end = end if resume is None else resume
        kept = f"{fn}.bad.{pos}"
        try:
            assert self._rfd is not None
            chunk = os.pread(self._rfd, bad_end - pos, pos)
            with open(kept, "wb") as f:
                f.write(chunk)
        except OSError as e:
            kept = f"(not kept: {e})"
        where = f"the next good record at offset {resume}" if resume is not None else "the end of the file"
        old = self._depth
        self.read_pos = bad_end
        self._rbuf = b""
        self._set_queued(max(0, self.queued_bytes - (bad_end - pos)))
        self._recount_quiet()
        self.log.error(
            "DISKQUEUE({name}) corrupt data in {fn} at offset {pos} ({reason}): skipped {n} bytes to {where}, "
            "kept in {kept}; depth corrected from {old} to {new}",
            name=self.name,
            fn=fn,
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

    def _recount_quiet(self) -> None:
        log, self.log = self.log, _NullLog()
        try:
            self._recount("")
        finally:
            self.log = log

    def _find_record(self, start: int, end: int) -> int | None:
        """The first offset in [start, end) where a plausible record begins."""
        assert self._rfd is not None
        window = 1 << 20
        pos = start
        now_ns = time.time_ns() + 86_400 * 10**9
        while pos < end:
            buf = os.pread(self._rfd, min(window + 64, end - pos), pos)
            if not buf:
                return None
            for m in _ID_RE.finditer(buf):
                cand = pos + m.start() - _ID_OFFSET
                if cand < start:
                    continue
                if self._plausible(cand, end, now_ns) and self._plausible_next(cand, end, now_ns):
                    return cand
            pos += window
        return None

    def _plausible(self, at: int, end: int, now_ns: int) -> bool:
        assert self._rfd is not None
        head = os.pread(self._rfd, _ID_OFFSET + MSG_ID_LENGTH, at)
        if len(head) < _ID_OFFSET + MSG_ID_LENGTH:
            return False
        (size,) = _SIZE.unpack_from(head)
        if size < self.min_msg_size or size > self.max_msg_size or at + 4 + size > end:
            return False
        (ts,) = TIMESTAMP.unpack_from(head, 4)
        return _MIN_TS <= ts <= now_ns and _ID_RE.fullmatch(head[_ID_OFFSET:]) is not None

    def _plausible_next(self, at: int, end: int, now_ns: int) -> bool:
        assert self._rfd is not None
        (size,) = _SIZE.unpack(os.pread(self._rfd, 4, at))
        nxt = at + 4 + size
        return nxt == end or self._plausible(nxt, end, now_ns)

    # -- housekeeping ----------------------------------------------------------------

    def _skip_to_next_rw_file(self) -> None:
        self._close_fds()
        for num in range(min(self._cursor()[0], self.read_file_num), self.write_file_num + 1):
            self._remove_quietly(self.file_name(num))
        self.write_file_num += 1
        self.write_pos = 0
        self.read_file_num = self.write_file_num
        self.read_pos = 0
        self._depth = 0
        self._outstanding.clear()

    def _remove_quietly(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.log.error("DISKQUEUE({name}) failed to Remove({fn}) - {err}", name=self.name, fn=path, err=e)

    def _close_read(self) -> None:
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd = None
            self._rfd_num = -1
            self._rbuf = b""

    def _close_write(self) -> None:
        if self._wfd is not None:
            self.syncer.retire_fd(self._wfd)
            self._wfd = None
            self._wfd_num = -1

    def _close_fds(self) -> None:
        self._close_read()
        if self._wfd is not None:
            os.close(self._wfd)
            self._wfd = None
            self._wfd_num = -1
        if self._sidecar_fd is not None:
            os.close(self._sidecar_fd)
            self._sidecar_fd = None


class _NullLog:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


SyncJob = tuple[list[int], list[tuple[str, bytes]]]


def run_sync_job(job: SyncJob) -> None:
    """fsync the data, then write the metadata files (in a thread)."""
    fds, files = job
    error: BaseException | None = None
    for fd in fds:
        try:
            os.fsync(fd)
        except OSError as e:
            error = error or e
        finally:
            os.close(fd)
    if error is not None:
        raise error
    for path, data in files:
        write_atomic(path, data)


class Syncer:
    """Group commit for every disk queue of an nsqd.

    Queues report writes and reads. A sync (fsync of the files written, then
    the metadata of every queue touched, then ``nsqd.dat`` if it changed) runs
    in a thread, one at a time. :meth:`commit` returns a Deferred that fires
    once everything written before the call is fsynced: all the commits
    requested while one sync runs share the next one. Without waiters a queue
    is synced every ``sync_every`` operations or by :meth:`tick`
    (``--sync-timeout``), as Go's diskqueue.
    """

    def __init__(
        self,
        reactor: Any,
        run_blocking: Callable[[Callable[[], None]], defer.Deferred[None]] | None = None,
        on_error: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        self.reactor = reactor
        self._run_blocking = run_blocking or self._in_thread
        self.on_error = on_error or (lambda e: None)
        self.queues: dict[DiskQueue, None] = {}
        self._dirty: dict[DiskQueue, None] = {}
        self._retired: list[int] = []
        self._waiters: list[defer.Deferred[None]] = []
        self._extra: dict[str, Callable[[], bytes]] = {}
        self._running = False
        self._call: Any = None
        self._idle_waiters: list[defer.Deferred[None]] = []
        self.stopping = False
        self.syncs = 0

    def _in_thread(self, fn: Callable[[], None]) -> defer.Deferred[None]:
        from twisted.internet.threads import deferToThreadPool

        return deferToThreadPool(self.reactor, self.reactor.getThreadPool(), fn)

    def register(self, q: DiskQueue) -> None:
        self.queues[q] = None

    def unregister(self, q: DiskQueue) -> None:
        self.queues.pop(q, None)
        self._dirty.pop(q, None)

    def wrote(self, q: DiskQueue, n: int) -> None:
        self._dirty[q] = None
        if q.count >= q.sync_every:
            self._schedule()

    def read(self, q: DiskQueue) -> None:
        self._dirty[q] = None
        if q.count >= q.sync_every:
            self._schedule()

    def request(self, q: DiskQueue | None = None) -> None:
        if q is not None:
            self._dirty[q] = None
        self._schedule()

    def retire_fd(self, fd: int) -> None:
        """A write fd being replaced: fsync and close it with the next sync."""
        self._retired.append(fd)

    def persist(self, path: str, snapshot: Callable[[], bytes]) -> None:
        """Write ``snapshot()`` to ``path`` (atomically) with the next sync."""
        self._extra[path] = snapshot
        self._schedule()

    def commit(self) -> defer.Deferred[None]:
        d: defer.Deferred[None] = defer.Deferred()
        self._waiters.append(d)
        self._schedule()
        return d

    def tick(self) -> None:
        """--sync-timeout: sync the queues with unsynced operations."""
        for q in self.queues:
            if q.count:
                self._dirty[q] = None
        if self._dirty:
            self._schedule()

    @property
    def idle(self) -> bool:
        return not self._running and not self._dirty and not self._waiters and not self._extra

    def _schedule(self) -> None:
        if self._call is None and not self._running and not self.stopping:
            self._call = self.reactor.callLater(0, self._start)

    def _start(self) -> None:
        self._call = None
        if self._running or (not self._dirty and not self._waiters and not self._extra and not self._retired):
            return
        fds, self._retired = self._retired, []
        files: list[tuple[str, bytes]] = []
        synced: list[DiskQueue] = []
        for q in list(self._dirty):
            if q.exiting:
                continue
            q_fds, meta_path, meta = q.sync_snapshot()
            fds.extend(q_fds)
            files.append((meta_path, meta))
            synced.append(q)
        self._dirty.clear()
        for path, snapshot in self._extra.items():
            files.append((path, snapshot()))
        self._extra.clear()
        waiters, self._waiters = self._waiters, []
        self._running = True
        self.syncs += 1
        d = self._run_blocking(lambda: run_sync_job((fds, files)))
        d.addBoth(self._finished, waiters, synced)

    def _finished(self, result: Any, waiters: Iterable[defer.Deferred[None]], synced: Iterable[DiskQueue]) -> None:
        self._running = False
        for q in synced:
            if q.deleted:  # deleted while its metadata was being written: remove it again
                q._remove_quietly(q.meta_file_name())
        failed = isinstance(result, Failure)
        self.on_error(result.value if failed else None)
        for d in waiters:
            if failed:
                d.errback(result)
            else:
                d.callback(None)
        if self.stopping:
            idle, self._idle_waiters = self._idle_waiters, []
            for d in idle:
                d.callback(None)
        elif self._dirty or self._waiters or self._extra or self._retired:
            self._schedule()

    def wait_idle(self) -> defer.Deferred[None]:
        """Stop starting syncs; fire once the one running (if any) is done."""
        self.stopping = True
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        if not self._running:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._idle_waiters.append(d)
        return d

    def sync_all_now(self) -> None:
        """Shutdown: a synchronous sync of everything pending."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        for fd in self._retired:
            try:
                os.fsync(fd)
            except OSError:
                pass
            os.close(fd)
        self._retired = []
        for path, snapshot in self._extra.items():
            write_atomic(path, snapshot())
        self._extra.clear()
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)
