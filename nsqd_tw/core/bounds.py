"""Bounded queues (beyond Go): ``max_depth``, ``max_bytes`` and what ``overflow`` does.

A bound counts what a queue holds for delivery: its queued messages (memory and
disk, ``depth``) and, for a channel, its deferred ones (``deferred_count``: a
DPUB counts from its publish, a REQ with a delay from its REQ), not those in
flight. ``overflow: reject`` refuses a publish (PUB, MPUB, DPUB, over TCP or
HTTP) that would pass it, whole. ``drop_oldest`` drops the oldest *queued*
messages until the queue is within it: after a publish, after messages come
back from consumers (REQ, timeout, a consumer gone), when deferred ones come
due, when a bound is set or lowered, and at start. A deferred message is not
dropped before it is due. A message given back by a consumer is never refused:
with ``reject`` it may take a queue past its bound by what was in flight.

In durable mode a dropped message does not come back after a crash (the disk
queue keeps a tombstone while older records are still owned), and
``dropped_count`` is kept in ``nsqd.dat``, so that what was acknowledged equals
what was finished plus what was dropped across kill -9.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nsqd_tw.core.queue import MessageQueue


def would_overflow(queue: MessageQueue, n: int, size: int) -> str | None:
    """Whether ``n`` more messages of ``size`` bytes would pass a bound that
    ``queue`` rejects at: the bound's description, else None."""
    policy = queue.policy
    if policy.overflow != "reject":
        return None
    count, held = queue.waiting()
    if policy.max_depth is not None and count + n > policy.max_depth:
        return f"max_depth {policy.max_depth} reached"
    if policy.max_bytes is not None and held + size > policy.max_bytes:
        return f"max_bytes {policy.max_bytes} reached"
    return None


def trim(queue: MessageQueue) -> int:
    """``overflow: drop_oldest``: drop the oldest queued messages past the bounds;
    how many were dropped."""
    policy = queue.policy
    if policy.overflow != "drop_oldest":
        return 0
    max_depth, max_bytes = policy.max_depth, policy.max_bytes
    dropped = 0
    while True:
        count, held = queue.waiting()
        if not ((max_depth is not None and count > max_depth) or (max_bytes is not None and held > max_bytes)):
            break
        if not queue.depth():
            break  # only deferred messages are left: dropped once due
        msg = queue.take_oldest()
        if msg is None:
            break
        queue.discard(msg)
        dropped += 1
    if dropped:
        queue.dropped_count += dropped
        if queue.backend.acked:  # durable: the count is written with the commit that holds the drops
            queue.ctx.metadata_changed(getattr(queue, "topic_name", queue.name))
    return dropped
