"""Beyond Go, replication: a standby channel drops the copies its primary is done with.

A standby's channel holds a copy of every message its primary's channel holds
(docs/replication.md). When the primary finishes one (or expires, trims,
dead-letters it, or queues it again: REQ, timeout, its consumer gone), the
standby counts one copy of that ID to skip in the channel's ``skips``
(:func:`skip`, :func:`supersede`, from :class:`~nsqd_tw.core.replica.StandbyApply`)
and drops the skipped copies at the heads of its queues (:func:`compact`), so
that its queues shrink as the primary's consumers finish. What is left when it
is promoted is dropped as its consumers' bursts meet it (:func:`unskipped`).

The seam in :class:`~nsqd_tw.core.channel.Channel` is ``skips``, a dict empty
unless a primary said so: a burst looks at it once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from nsq_wire.message import ID_OFFSET, MESSAGE_HEADER_LENGTH
from nsqd_tw.core.message import Message
from nsqd_tw.core.pqueue import DeferredQueue
from nsqd_tw.core.queue import Item, body_size


class Counted(Protocol):
    """What a burst's skipping needs of its channel."""

    backend: Any
    # how many copies of each message ID its primary finished or superseded that are still queued here
    skips: dict[bytes, int]


class Channel(Counted, Protocol):
    """What skip counts need of a channel (:class:`nsqd_tw.core.channel.Channel`)."""

    memory: deque[Item]
    memory_bytes: int
    deferred: DeferredQueue

    def stage(self, items: Sequence[Item], keep_on_failure: bool = False) -> Callable[[], None]: ...


def skip(channel: Channel, ids: Sequence[bytes]) -> None:
    """The primary is done with a copy of each of ``ids`` (finished, expired,
    trimmed, dead-lettered): the next copy of each met here is dropped."""
    skips = channel.skips
    for msg_id in ids:
        skips[msg_id] = skips.get(msg_id, 0) + 1
    compact(channel)


def supersede(channel: Channel, msg: Message, delay: float) -> None:
    """The primary queued ``msg`` again (REQ, timeout, its consumer gone), after
    ``delay`` seconds: its copy here gives way to this one, which keeps the
    attempts and the delay the primary gave it."""
    old = channel.deferred.remove(msg.id)
    if old is None:
        channel.skips[msg.id] = channel.skips.get(msg.id, 0) + 1
    elif old.ref is not None:
        channel.backend.done(old.ref)
    msg.deferred = delay
    channel.stage([msg] if delay else [msg.encode()])
    compact(channel)


def compact(channel: Channel) -> None:
    """Drop the skipped copies at the heads of memory and the backend, so the
    standby's queues shrink as the primary's consumers finish (counts left
    once nothing is held here are of copies this channel never had)."""
    skips = channel.skips
    if not skips:
        return
    memory, backend = channel.memory, channel.backend
    head = getattr(backend, "head", None)
    while True:
        moved = False
        while memory:
            held = memory[0]
            msg_id = held[ID_OFFSET:MESSAGE_HEADER_LENGTH] if isinstance(held, bytes) else held.id
            if not skipped(channel, msg_id):
                break
            memory.popleft()
            channel.memory_bytes -= body_size(held)
            if not isinstance(held, bytes) and held.ref is not None:
                backend.done(held.ref)
            moved = True
        if backend.depth():
            record = head() if head is not None else next(iter(backend.peek(1)), None)
            if record is not None and skipped(channel, record[ID_OFFSET:MESSAGE_HEADER_LENGTH]):
                read = backend.read()
                if read is not None:
                    backend.done(read[1])
                    backend.take_deferred(read[0][ID_OFFSET:MESSAGE_HEADER_LENGTH])
                moved = True
        if not moved or not skips:
            break
    if not memory and not backend.depth() and not channel.deferred:
        skips.clear()


def unskipped(channel: Channel, burst: list[Message]) -> list[Message]:
    """A promoted standby's burst without the copies its old primary finished
    or superseded (one check per burst while any count is left)."""
    out = []
    for msg in burst:
        if channel.skips and skipped(channel, msg.id):
            forget(channel, msg)
        else:
            out.append(msg)
    return out


def forget(channel: Counted, msg: Message) -> None:
    if msg.ref is not None:
        channel.backend.done(msg.ref)


def skipped(channel: Counted, msg_id: bytes) -> bool:
    """Whether a copy of ``msg_id`` is to be dropped (and count it dropped)."""
    skips = channel.skips
    n = skips.get(msg_id)
    if not n:
        return False
    if n == 1:
        del skips[msg_id]
    else:
        skips[msg_id] = n - 1
    return True
