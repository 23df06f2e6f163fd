"""How the NSQD's queues are stored, beyond Go's one disk queue per queue.

In Go each topic and channel makes its disk queue from nsqd's options. Here the
NSQD's :class:`QueueStores` makes them (``ctx.stores.new_backend``, a queue's
seam), with what they share beyond Go, which the NSQD holds: one
:class:`~nsqd_tw.storage.syncer.Syncer` (fsyncs off the reactor thread, durable
mode's group commit), whose failure is nsqd's health until a sync works again;
the disk budget; the data path listed once. What a stop could not write is
counted here (``could_not_save``, ``could_not_close``) and makes the exit
status 1, where Go exits 0 having lost it.
"""

from __future__ import annotations

from typing import Any, Protocol

from nsq_wire.message import MESSAGE_HEADER_LENGTH
from nsqd_tw.options import NSQDOptions
from nsqd_tw.storage.backend import DummyBackendQueue, IBackendQueue
from nsqd_tw.storage.budget import DiskBudget
from nsqd_tw.storage.diskqueue import DiskQueue
from nsqd_tw.storage.layout import DataDirectory
from nsqd_tw.storage.syncer import NEVER_BY_COUNT, Syncer


class StoresHost(Protocol):
    """What the queues' stores need of their nsqd (the NSQD)."""

    opts: NSQDOptions
    log: Any
    backend_factory: Any
    durable: bool
    standby: Any
    syncer: Syncer
    disk_budget: DiskBudget
    data_dir: DataDirectory
    health_error: BaseException | None

    def set_health(self, err: BaseException | None) -> None: ...


class QueueStores:
    """The backends of an nsqd's queues (see the module's docstring)."""

    def __init__(self, nsqd: StoresHost) -> None:
        self.nsqd = nsqd
        self._sync_failed: BaseException | None = None
        # a stop that could not write everything: the errors, the messages lost
        self.stop_errors = 0
        self.unsaved = 0

    def new_backend(self, name: str, ephemeral: bool) -> IBackendQueue:
        nsqd = self.nsqd
        if ephemeral:
            return DummyBackendQueue(name)
        if nsqd.backend_factory is not None:
            return nsqd.backend_factory(name, ephemeral)  # type: ignore[no-any-return]
        opts = nsqd.opts
        return DiskQueue(
            name,
            opts.data_path,
            opts.max_bytes_per_file,
            MESSAGE_HEADER_LENGTH,
            opts.max_msg_size + MESSAGE_HEADER_LENGTH,
            self.queue_sync_every(),
            nsqd.syncer,
            nsqd.log,
            acked=nsqd.durable,
            budget=nsqd.disk_budget,
            directory=nsqd.data_dir,
        )

    def queue_sync_every(self) -> int:
        """A disk queue's --sync-every. A standby that is not durable fsyncs on the
        --sync-timeout tick only: its disk queues' writes are in the page cache
        when it acknowledges them (a kill -9 loses none), and it serves nobody
        until promoted, when --sync-every applies again."""
        if self.nsqd.standby is not None and not self.nsqd.durable:
            return NEVER_BY_COUNT
        return max(self.nsqd.opts.sync_every, 1)

    def sync_result(self, err: BaseException | None) -> None:
        """The Syncer's word on each sync: a failure is nsqd's health."""
        nsqd = self.nsqd
        if err is not None:
            nsqd.log.error("DISKQUEUE: failed to sync - {err}", err=err)
            nsqd.set_health(err)
            self._sync_failed = err
        elif self._sync_failed is not None:
            # a sync that works again clears only what a sync said (a refused write stays)
            if nsqd.health_error is self._sync_failed:
                nsqd.set_health(None)
            self._sync_failed = None

    def check_budget(self) -> None:
        """At start: a budget found full is unhealthy from the start, as a refused write makes it."""
        nsqd = self.nsqd
        full = nsqd.disk_budget.full_for(4 + MESSAGE_HEADER_LENGTH + nsqd.opts.max_msg_size)
        if full is not None:
            nsqd.set_health(full)

    def could_not_save(self, queue: str, lost: int, total: int, err: Exception) -> None:
        """A queue stopping could not write ``lost`` of the ``total`` messages it held."""
        self.unsaved += lost
        self.stop_errors += 1
        self.nsqd.log.error(
            "{queue}: {lost} of {total} messages could not be written to disk at exit - {err}",
            queue=queue,
            lost=lost,
            total=total,
            err=err,
        )

    def could_not_close(self, what: str, err: Exception) -> None:
        """Closing a topic or channel failed (its metadata, say): one line, no traceback."""
        self.stop_errors += 1
        self.nsqd.log.error("failed to close {what} - {err}", what=what, err=err)

    def exit_code(self) -> int:
        """Once stopped: 1 if something could not be written (said in one line), else 0."""
        if not self.stop_errors:
            return 0
        # beyond Go, which exits 0 having lost what it could not write
        self.nsqd.log.error(
            "NSQ: stopped with {n} error(s); {lost} messages could not be written",
            n=self.stop_errors,
            lost=self.unsaved,
        )
        return 1
