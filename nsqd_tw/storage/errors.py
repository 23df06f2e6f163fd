"""What the disk queues raise when they refuse a write."""

from __future__ import annotations


class DiskQueueError(Exception):
    pass


class DiskBudgetFull(DiskQueueError):
    """A write refused because it would pass --max-disk-bytes."""
