"""--max-disk-bytes (beyond Go): one budget of queued bytes shared by the disk queues of an nsqd."""

from __future__ import annotations

from collections.abc import Callable

from nsqd_tw.storage.errors import DiskBudgetFull


class DiskBudget:
    """The bytes queued in all the disk queues of an nsqd, and the most they may be.

    Queued bytes are those not yet read (in durable mode: not yet finished); a
    file keeps what was read of it until the queue moves to its next file, so the
    files may hold up to --max-bytes-per-file more per queue. The topics'
    retained logs count too, and are what gives way: ``reclaim(n)`` deletes
    their oldest segments to free ``n`` bytes before a write is refused.
    """

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.used = 0
        self.enforcing = True  # nsqd stopping writes what it holds whatever the budget
        self.reclaim: Callable[[int], None] | None = None

    def full_for(self, largest: int) -> DiskBudgetFull | None:
        """At start: the error a write of ``largest`` bytes would get now, if the
        queues hold anything at all (an empty budget smaller than one message is
        not full), else None."""
        if self.limit and self.used and self.used + largest > self.limit and self.reclaim is not None:
            self.reclaim(self.used + largest - self.limit)
        if self.limit and self.used and self.used + largest > self.limit:
            return DiskBudgetFull(
                f"disk budget full: {self.used} of {self.limit} bytes (--max-disk-bytes) queued, "
                f"no room for a message of --max-msg-size"
            )
        return None

    def check(self, more: int) -> None:
        if self.limit and self.enforcing and self.used + more > self.limit:
            if self.reclaim is not None:
                self.reclaim(self.used + more - self.limit)
                if self.used + more <= self.limit:
                    return
            raise DiskBudgetFull(
                f"disk budget full: {self.used} of {self.limit} bytes (--max-disk-bytes) queued, {more} more asked"
            )
