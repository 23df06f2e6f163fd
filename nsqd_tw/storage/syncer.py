"""Group commit: fsync and metadata for every disk queue of an nsqd, off the reactor thread."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from twisted.internet import defer
from twisted.python.failure import Failure

from nsqd_tw.storage.files import write_atomic


class SyncedFiles(Protocol):
    """What the Syncer needs of a queue's files."""

    @property
    def meta_file(self) -> str: ...

    def remove(self, path: str) -> bool: ...


class SyncedQueue(Protocol):
    """What the Syncer needs of a queue."""

    count: int  # writes and reads since the last sync
    sync_every: int
    exiting: bool
    deleted: bool

    @property
    def files(self) -> SyncedFiles: ...

    def sync_snapshot(self) -> tuple[list[int], str | None, bytes]:
        """fds to fsync (dup'd), and the metadata file to write (None: none)."""


SyncJob = tuple[list[int], list[tuple[str, bytes]]]

NEVER_BY_COUNT = 1 << 62  # a sync_every never reached: synced by the tick (and commits) only


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
        self.queues: dict[SyncedQueue, None] = {}
        self._dirty: dict[SyncedQueue, None] = {}
        self._retired: list[int] = []
        self._waiters: list[defer.Deferred[None]] = []
        self._extra: dict[str, Callable[[], bytes]] = {}
        self._forgotten: list[str] = []  # files removed while a sync that writes them runs
        self._running = False
        self._call: Any = None
        self._idle_waiters: list[defer.Deferred[None]] = []
        self.stopping = False
        self.syncs = 0

    def _in_thread(self, fn: Callable[[], None]) -> defer.Deferred[None]:
        from twisted.internet.threads import deferToThreadPool

        return deferToThreadPool(self.reactor, self.reactor.getThreadPool(), fn)

    def register(self, q: SyncedQueue) -> None:
        self.queues[q] = None

    def unregister(self, q: SyncedQueue) -> None:
        self.queues.pop(q, None)
        self._dirty.pop(q, None)

    def wrote(self, q: SyncedQueue, n: int) -> None:
        self._dirty[q] = None
        if q.count >= q.sync_every:
            self._schedule()

    def read(self, q: SyncedQueue) -> None:
        self._dirty[q] = None
        if q.count >= q.sync_every:
            self._schedule()

    def request(self, q: SyncedQueue | None = None) -> None:
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

    def forget(self, path: str) -> None:
        """``path`` was removed: do not write it (again) with a sync."""
        self._extra.pop(path, None)
        if self._running:
            self._forgotten.append(path)

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
            self._call = self.reactor.callLater(0, self._next_turn)

    def _next_turn(self) -> None:
        # A sync starts a turn later: the answers of this turn (flushed at its end)
        # go out first, and do not wait for the snapshot of nsqd.dat, which grows
        # with the number of topics and channels.
        self._call = self.reactor.callLater(0, self._start)

    def _start(self) -> None:
        self._call = None
        if self._running or (not self._dirty and not self._waiters and not self._extra and not self._retired):
            return
        fds, self._retired = self._retired, []
        files: list[tuple[str, bytes]] = []
        synced: list[SyncedQueue] = []
        for q in list(self._dirty):
            if q.exiting:
                continue
            q_fds, meta_path, meta = q.sync_snapshot()
            fds.extend(q_fds)
            if meta_path is not None:
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

    def _finished(self, result: Any, waiters: Iterable[defer.Deferred[None]], synced: Iterable[SyncedQueue]) -> None:
        self._running = False
        for q in synced:
            if q.deleted:  # deleted while its metadata was being written: remove it again
                q.files.remove(q.files.meta_file)
        forgotten, self._forgotten = self._forgotten, []
        for path in forgotten:
            try:
                os.remove(path)
            except OSError:
                pass
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
