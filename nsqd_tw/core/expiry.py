"""TTL expiry (beyond Go): what passed a queue's ``max_age`` leaves it, at a bounded cost.

Two places drop expired messages. A delivery steps over them (``Channel``,
one comparison per message when a TTL is set), at most :data:`DISPATCH_LIMIT`
in one reactor turn, then goes on in the next. And :class:`ExpirySweep`, once a
second from the queue scan, looks at the heads of the queues that have a TTL
(memory's and the backend's, the oldest of each) and drops what expired, so a
queue nobody reads empties itself: at most :data:`RATE` messages a second, a
slice of at most :data:`SLICE` messages or :data:`SLICE_SECONDS` per reactor
turn, so that the reactor serves clients in between however much expires. A
queue left empty gives its read files back at once.

A message stamped more than :data:`FUTURE_SLACK_NS` ahead of the clock (an nsqd
whose clock ran ahead wrote it) cannot be dated: met at a head, it is re-dated
to now and moved behind the others (a WARNING counts them), so it expires
``max_age`` later and does not stop the sweep of what is behind it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.logger import LogLevel

from nsqd_tw.core.message import Message
from nsqd_tw.core.pqueue import TimeoutQueue
from nsqd_tw.core.skips import forget, skipped

if TYPE_CHECKING:
    from nsqd_tw.core.queue import MessageQueue

SWEEP_INTERVAL = 1.0  # seconds between passes over the queues with a TTL
RATE = 100_000  # messages the sweep expires a second, at most
BURST = RATE // 10  # ... and in any tenth of a second (what the rate has left unused is not saved up)
SLICE = 2_000  # messages one reactor turn of the sweep expires, at most
SLICE_SECONDS = 0.01  # ... or for this long, whichever comes first
DISPATCH_LIMIT = 1_000  # expired messages one delivery steps over before the next reactor turn
FUTURE_SLACK_NS = 1_000_000_000  # a head stamped further ahead than this is re-dated


def release_if_empty(queue: MessageQueue | Channel) -> None:
    """A queue that expiry left empty gives back the data file it read to its end
    (Go keeps it until the next write rolls to a new file)."""
    if not queue.depth():
        release = getattr(queue.backend, "release_files", None)
        if release is not None:
            release()


class Channel(Protocol):
    """What a delivery's expiry needs of its channel (:class:`nsqd_tw.core.channel.Channel`)."""

    ctx: Any
    backend: Any
    exiting: bool
    more_scheduled: bool
    in_flight: TimeoutQueue
    skips: dict[bytes, int]
    copies: Any  # a rewind's copies (core/rewind.py), or None

    def expired(self, msg: Message) -> None: ...
    def take_next(self) -> Message | None: ...
    def kick(self) -> None: ...
    def depth(self) -> int: ...


def step_over_expired(channel: Channel, msg: Message | None, expire_before: int) -> Message | None:
    """A delivery in ``channel`` drops ``msg`` and the expired messages after it
    (none is delivered past its TTL): the first one due now that has not expired,
    or None. At most :data:`DISPATCH_LIMIT` a call: past that, None, and the
    delivery goes on next reactor turn."""
    n = 0
    while msg is not None and msg.timestamp < expire_before:
        channel.expired(msg)
        n += 1
        if n >= DISPATCH_LIMIT:
            if not channel.more_scheduled:
                channel.more_scheduled = True
                channel.ctx.schedule(lambda: _deliver_again(channel))
            return None
        msg = channel.take_next()
    if msg is None:
        release_if_empty(channel)
    return msg


def deliver_one(channel: Channel, c: Any, now: float, expire_before: int) -> bool:
    """One message of ``channel`` to its consumer ``c``, for a channel with a TTL
    or a consumer with a sample rate (``Channel._dispatch`` looks at each message
    then): False when nothing is queued (due now)."""
    msg = channel.take_next()
    while msg is not None and channel.skips and skipped(channel, msg.id):
        forget(channel, msg)  # (a promoted standby) finished on its old primary
        msg = channel.take_next()
    if expire_before and msg is not None and msg.timestamp < expire_before:
        msg = step_over_expired(channel, msg, expire_before)
    if msg is None:
        return False
    if channel.copies is not None and msg.id in channel.in_flight:
        channel.copies.drop(channel, msg)
        return True
    if c.sample_rate and random.randrange(100) > c.sample_rate:
        if channel.ctx.shipper is not None:
            channel.ctx.shipper.gone(channel, (msg.id,))
        return True  # sampled out: gone from the channel, as in Go
    if msg.attempts < 65535:
        msg.attempts += 1
    msg.client_id = c.id
    msg.delivery_ts = now
    channel.in_flight.push(msg, now + c.msg_timeout)
    c.send_messages([msg])
    return True


def _deliver_again(channel: Channel) -> None:
    channel.more_scheduled = False
    if not channel.exiting:
        channel.kick()


def expire_queue(
    queue: MessageQueue,
    before_ns: int,
    now_ns: int,
    limit: int,
    deadline: float,
    stopwatch: Callable[[], float] = time.perf_counter,
) -> tuple[int, int]:
    """Drop (or dead-letter) the queued messages of ``queue`` published before
    ``before_ns``, oldest first, at most ``limit`` (or until ``stopwatch()``
    passes ``deadline``): (messages handled, of them re-dated). Fewer than
    ``limit`` handled before the deadline: nothing more has expired."""
    n = redated = 0
    future = now_ns + FUTURE_SLACK_NS
    while n < limit:
        mem, disk = queue.heads()
        if disk is not None and disk > future:
            _redate(queue, queue.take_backend_head(), now_ns)
            n += 1
            redated += 1
            continue
        if mem is not None and mem > future:
            _redate(queue, queue.take_memory_head(), now_ns)
            n += 1
            redated += 1
            continue
        if disk is not None and (mem is None or disk < mem):
            if disk >= before_ns:
                break
        elif mem is None or mem >= before_ns:
            break
        msg = queue.take_oldest()
        if msg is None:
            break
        if msg.timestamp >= before_ns:  # a head that could not be looked at: put it back
            queue.hold_first(msg)
            break
        queue.expired(msg)
        n += 1
        if not n & 63 and stopwatch() > deadline:
            break
    if n:
        release_if_empty(queue)
    return n, redated


def _redate(queue: MessageQueue, msg: Message | None, now_ns: int) -> None:
    """``msg``, taken from a head, goes behind the others stamped ``now_ns`` (as a
    new record: its record in durable mode is done once the copy is written)."""
    if msg is None:
        return
    msg.timestamp = now_ns
    record = msg.encode()
    if queue._room_for(msg):
        queue._hold(record)
    elif not queue.ephemeral:
        try:
            queue._write([record])
        except Exception:
            queue.hold_first(msg)  # kept where it was rather than lost
            return
    if msg.ref is not None:
        queue.backend.done(msg.ref)


class SweepHost(Protocol):
    """What the sweep needs of its nsqd (the NSQD)."""

    reactor: Any
    log: Any
    standby: Any
    queue_events: Any

    def now_ns(self) -> int: ...


class ExpirySweep:
    """The NSQD's queues with a TTL, and the sweep over them."""

    def __init__(self, nsqd: SweepHost) -> None:
        self.nsqd = nsqd
        self.queues: dict[MessageQueue, None] = {}
        self._tokens = float(BURST)
        self._refilled_at: float | None = None
        self._swept_at = float("-inf")
        self._pending: list[MessageQueue] = []  # the queues this pass has still to look at
        self._call: Any = None  # the next slice, on a later reactor turn
        # what times a slice (:data:`SLICE_SECONDS`): the machine's time, not the
        # reactor's; the tests' nsqd has one that stands still, so that what a
        # slice does depends on counts alone, however busy the machine is
        self.stopwatch: Callable[[], float] = time.perf_counter

    def policy_changed(self, queue: MessageQueue) -> None:
        if queue.policy.max_age:
            self.queues[queue] = None
        else:
            self.forget(queue)

    def forget(self, queue: MessageQueue) -> None:
        self.queues.pop(queue, None)
        if queue in self._pending:
            self._pending.remove(queue)

    def stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self._pending = []

    def tick(self, now: float) -> None:
        """The queue scan's tick: start a pass once a second (or go on with one
        that ran out of its rate), its first slice now."""
        if self._refilled_at is not None:
            self._tokens = min(float(BURST), self._tokens + RATE * max(0.0, now - self._refilled_at))
        self._refilled_at = now
        if not self.queues or self.nsqd.standby is not None:
            return  # (a standby expires what its primary does, told by it)
        if self._call is not None:
            return  # a pass runs, a slice a turn
        if not self._pending:
            if now < self._swept_at + SWEEP_INTERVAL:
                return
            self._swept_at = now
            self._pending = list(self.queues)
        self._slice()

    def _slice(self) -> None:
        self._call = None
        nsqd = self.nsqd
        stopwatch = self.stopwatch
        deadline = stopwatch() + SLICE_SECONDS
        budget = min(SLICE, int(self._tokens))
        now_ns = nsqd.now_ns()
        spent = 0
        pending = self._pending
        while pending and spent < budget and stopwatch() < deadline:
            queue = pending[0]
            left = budget - spent
            try:
                before_ns = now_ns - int(queue.policy.max_age * 1e9)
                n, redated = expire_queue(queue, before_ns, now_ns, left, deadline, stopwatch)
            except Exception:
                nsqd.log.failure("TTL: failed to expire messages of {queue}", queue=queue)
                n = redated = 0
            if redated:
                self._redated(queue, redated)
            spent += n
            if n < left and stopwatch() < deadline:
                pending.pop(0)  # nothing more expired there
        self._tokens -= spent
        if pending and self._tokens >= 1:
            self._call = nsqd.reactor.callLater(0, self._slice)
        # else: out of this second's rate, the next tick goes on

    def _redated(self, queue: MessageQueue, n: int) -> None:
        name = getattr(queue, "save_name", queue.name)
        self.nsqd.queue_events.emit(
            (name, "future"),
            LogLevel.warn,
            lambda c: (
                f"{name}: {c['n']} message(s) stamped in the future (the clock was ahead when they were written): "
                "re-dated to now and moved behind the others"
            ),
            n=n,
        )
