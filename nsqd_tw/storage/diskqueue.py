"""A disk-backed FIFO queue, file-compatible with go-diskqueue (Go nsqd's).

Go nsqd can open a data path this queue wrote, and the reverse: the files, and
their recovery after an unclean stop or corruption, are
:mod:`nsqd_tw.storage.layout`'s. Beyond Go, in *acknowledged* mode (nsqd's
durable mode) the read cursor that is persisted does not pass a record until
its message is finished (:meth:`DiskQueue.done`), so a message delivered but not
FINed survives a crash; and deferred messages keep their time
(:mod:`nsqd_tw.storage.deferred`).

Writes go to the file with ``pwrite`` before ``put`` returns (in the page
cache, as Go's), so a killed process loses nothing written; fsync and the
metadata are the :class:`~nsqd_tw.storage.syncer.Syncer`'s job, off the
reactor thread.

This module is the writing side, sync and housekeeping; the reading side (read,
done, peek, a damaged or missing file met while reading) is the queue's base
class, :class:`~nsqd_tw.storage.diskqueue_read.DiskQueueReading`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from zope.interface import implementer

from nsqd_tw.storage.backend import IBackendQueue
from nsqd_tw.storage.budget import DiskBudget
from nsqd_tw.storage.deferred import DeferredTimes
from nsqd_tw.storage.diskqueue_read import DiskQueueReading, Ref
from nsqd_tw.storage.errors import DiskQueueError
from nsqd_tw.storage.files import write_atomic
from nsqd_tw.storage.layout import DataDirectory, FramedRecords, Meta, QueueFiles, Write, plan_writes
from nsqd_tw.storage.records import RecordReader, RecordWriter
from nsqd_tw.storage.syncer import Syncer


class WriteMark(NamedTuple):
    """The write position, depth and queued bytes before a put_many, to take it back."""

    file: int
    pos: int
    depth: int
    queued: int


@implementer(IBackendQueue)
class DiskQueue(DiskQueueReading):
    """One topic's or channel's queue: records put, read and (acknowledged mode) done
    (reading: :class:`~nsqd_tw.storage.diskqueue_read.DiskQueueReading`)."""

    spilling = False  # see nsqd_tw.storage.spill

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
        directory: DataDirectory | None = None,
    ) -> None:
        """``directory``: the data path's listing shared by its queues (one
        listing of the files for all of them, not one each)."""
        self.name = name
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
        self.count = 0  # writes and reads since the last sync

        self._outstanding: deque[Ref] = deque()
        self._head: tuple[tuple[int, int], int | None] | None = None  # (read position, its timestamp)

        self.files = QueueFiles(data_path, name, min_msg_size, max_msg_size, log, directory)
        self._reader = RecordReader()
        self._writer = RecordWriter(self.files, syncer.retire_fd)
        meta, unclean = self.files.recover()
        self._depth, self.read_file_num, self.read_pos, self.write_file_num, self.write_pos = meta
        self.deferred = DeferredTimes(self.files)
        if unclean:
            self._recount("after an unclean shutdown")
        if self.deferred.dropped:
            self._count_tombstones()
        self._set_queued(self.files.count_bytes(*self._positions()))
        syncer.register(self)

    def __repr__(self) -> str:
        return f"<DiskQueue {self.name}>"

    def depth(self) -> int:
        return self._depth

    # -- writing -------------------------------------------------------------------

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
        if records and (min(map(len, records)) < lo or max(map(len, records)) > hi):
            n = next(n for n in map(len, records) if n < lo or n > hi)
            raise DiskQueueError(f"invalid message write size ({n}) minMsgSize={lo} maxMsgSize={hi}")
        return self._put_chunks(plan_writes(records, self.write_file_num, self.write_pos, self.max_bytes_per_file))

    def takes_framed(self, batch: FramedRecords) -> bool:
        """Whether :meth:`put_framed` can take ``batch``: its records are within
        this queue's sizes, and they fit in the write file."""
        return (
            not self.exiting
            and self.min_msg_size <= batch.smallest
            and batch.largest <= self.max_msg_size
            and self.write_pos + len(batch.data) <= self.max_bytes_per_file
        )

    def put_framed(self, batch: FramedRecords) -> WriteMark:
        """Append records framed already, in one write, all or nothing as
        :meth:`put_many`; only what :meth:`takes_framed` takes."""
        if not self.takes_framed(batch):
            raise DiskQueueError("framed records that do not fit the write file")
        return self._put_chunks([(self.write_file_num, self.write_pos, batch.data, batch.count)])

    def _put_chunks(self, chunks: list[Write]) -> WriteMark:
        mark = WriteMark(self.write_file_num, self.write_pos, self._depth, self.queued_bytes)
        total = sum(len(chunk[2]) for chunk in chunks)
        if self.budget is not None:
            self.budget.check(total)
        write = self._writer.write
        try:
            for file_num, offset, data, _ in chunks:
                write(file_num, offset, data)
        except BaseException:
            self._cut(mark, chunks[-1][0] if chunks else mark.file)
            raise
        for file_num, offset, data, n in chunks:
            if file_num != self.write_file_num:
                self._file_complete()
            self._commit_write(file_num, offset + len(data), n)
        self._set_queued(self.queued_bytes + total)
        return mark

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
            if self._writer.num == num:
                self._writer.close()
            self.files.remove(self.files.data_file(num))
        try:
            os.truncate(self.files.data_file(mark.file), mark.pos)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.log.error("DISKQUEUE({name}) failed to take back a failed write - {err}", name=self.name, err=e)
        self.write_file_num, self.write_pos, self._depth = mark.file, mark.pos, mark.depth
        self._head = None  # the head may have been one of the records cut

    def _commit_write(self, file_num: int, pos: int, n: int) -> None:
        self.write_file_num, self.write_pos = file_num, pos
        self._depth += n
        self.count += n
        self.syncer.wrote(self, n)

    def _file_complete(self) -> None:
        """The write file is full: the next write goes to a new file (opened by
        the writer, which hands the old fd to the next sync to fsync and close)."""
        if self._reader.num == self.write_file_num:
            self._reader.limit = self.write_pos  # the reader's file is complete now
        self.syncer.request(self)

    # -- emptying and closing --------------------------------------------------------

    def release_files(self) -> None:
        """Nothing queued and nothing read still owned: remove the data file read
        to its end now (as Go, it would otherwise stay until the next write rolls)."""
        if (
            self._depth == 0
            and not self._outstanding
            and not self.exiting
            and (self.write_pos or self.write_file_num != self.read_file_num)
        ):
            self._skip_to_next_rw_file()
            self.syncer.request(self)

    def empty(self) -> None:
        if self.exiting:
            raise DiskQueueError("exiting")
        self.log.info("DISKQUEUE({name}): emptying", name=self.name)
        self._skip_to_next_rw_file()
        self._set_queued(0)
        self.files.remove(self.files.meta_file)
        self.deferred.clear()
        self.syncer.request(self)

    def delete(self) -> None:
        self.log.info("DISKQUEUE({name}): deleting", name=self.name)
        self.exiting = True
        self.deleted = True
        self._set_queued(0)
        self._close_fds()
        nums = [*self.files.orphans, *range(min(self._cursor()[0], self.read_file_num), self.write_file_num + 1)]
        self.files.directory.kept(self.name, self._remove_data_files(nums))
        self.files.remove(self.files.meta_file)
        self.deferred.clear()
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
        self.deferred.set(msg_id, deliver_at_ns)
        if self.acked:
            self.syncer.request(self)

    def take_deferred(self, msg_id: bytes) -> int | None:
        d = self.deferred
        return d.take(msg_id, hold=False) if d.at or d.held else None

    # -- sync ----------------------------------------------------------------------

    def meta_text(self) -> bytes:
        """The metadata as Go writes it. In acknowledged mode the read position is
        the oldest unfinished record's, and depth counts what will be read again
        from there."""
        rf, rp = self._cursor()
        return Meta(self._depth + len(self._outstanding), rf, rp, self.write_file_num, self.write_pos).text()

    def sync_snapshot(self) -> tuple[list[int], str, bytes]:
        """What a sync needs, taken on the reactor thread: fds to fsync (dup'd), metadata."""
        fds = []
        for fd in (self._writer.fd, self.deferred.fd):
            if fd is not None:
                fds.append(os.dup(fd))
        self.count = 0
        self.files.meta_on_disk = None  # written by the syncer's thread, if it can
        return fds, self.files.meta_file, self.meta_text()

    def sync_now(self) -> None:
        """A synchronous sync (shutdown): fsync, then write the metadata."""
        if self._writer.fd is not None:
            os.fsync(self._writer.fd)
        self.deferred.write()
        text = self.meta_text()
        if text != self.files.meta_on_disk:  # thousands of idle queues stop without an fsync each
            write_atomic(self.files.meta_file, text)
            self.files.meta_on_disk = text
        self.count = 0

    # -- housekeeping ----------------------------------------------------------------

    def _skip_to_next_rw_file(self) -> None:
        self._close_fds()
        self._remove_data_files(range(min(self._cursor()[0], self.read_file_num), self.write_file_num + 1))
        self.write_file_num += 1
        self.write_pos = 0
        self.read_file_num = self.write_file_num
        self.read_pos = 0
        self._depth = 0
        self._outstanding.clear()

    def _remove_data_files(self, nums: Iterable[int]) -> list[int]:
        """Remove data files; those still there are orphans (and returned)."""
        files = self.files
        nums = list(nums)
        failed = [num for num in nums if not files.remove(files.data_file(num))]
        files.orphans = sorted((set(files.orphans) - set(nums)) | set(failed))
        return failed

    def _close_fds(self) -> None:
        self._reader.close()
        self._writer.close()
        self.deferred.close()
