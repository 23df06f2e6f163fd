"""Draining: nsqd takes nothing new and stops once every queue is empty.

Beyond Go (the design of nsqio/nsq#1302, never merged there). A drain starts
with SIGTERM under ``--sigterm-mode drain`` or with ``PUT /config/drain`` and
cannot be cancelled. While it lasts the NSQD refuses publishes, new topics and
new channels and keeps serving consumers; the :class:`Drain` counts what is left
every :data:`CHECK_INTERVAL` seconds, logs its progress every
:data:`PROGRESS_INTERVAL`, and calls ``stop`` once nothing is queued, in flight
or deferred anywhere, or once ``--drain-timeout`` has passed (then it names
what is left, which the stop keeps on disk).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet.task import LoopingCall

from nsq_service.options import DURATION
from nsq_wire.gofmt import go_duration
from nsqd_tw.core.channel import Channel
from nsqd_tw.core.topic import Topic

CHECK_INTERVAL = 0.5
PROGRESS_INTERVAL = 5.0
SHOWN_QUEUES = 10  # queues named in one report of what is left


@dataclass
class Left:
    """Messages a drain still waits for: queued (memory and disk), in flight, deferred."""

    depth: int = 0
    in_flight: int = 0
    deferred: int = 0

    @property
    def total(self) -> int:
        return self.depth + self.in_flight + self.deferred

    def add(self, other: Left) -> None:
        self.depth += other.depth
        self.in_flight += other.in_flight
        self.deferred += other.deferred

    def text(self) -> str:
        return f"{self.total} messages (depth {self.depth}, in flight {self.in_flight}, deferred {self.deferred})"


def left_in(queue: Topic | Channel) -> Left:
    if isinstance(queue, Channel):
        return Left(queue.depth(), len(queue.in_flight), len(queue.deferred))
    return Left(queue.depth())


def why_stuck(queue: Topic | Channel) -> str:
    """What keeps a queue's messages from leaving, if anything obvious does."""
    if queue.paused:
        return " - paused"
    if isinstance(queue, Topic):
        return " - no channel" if not queue.channels else ""
    if not queue.clients:
        return " - no consumer"
    return ""


class Drain:
    """One drain of an nsqd's ``topics`` (a callable: they are read at each check).

    ``timeout``: seconds after which ``stop`` is called whatever is left (0: no
    limit); ``stop``: called once, when the drain is over.
    """

    def __init__(
        self,
        reactor: Any,
        log: Any,
        topics: Callable[[], Iterable[Topic]],
        timeout: float,
        stop: Callable[[], None],
    ) -> None:
        self.reactor = reactor
        self.log = log
        self.topics = topics
        self.timeout = timeout
        self._stop = stop
        self.started_at = reactor.seconds()
        self.over = False
        self._reported_at = self.started_at
        self._finished = self._finish_count()
        self._loop = LoopingCall(self.check)
        self._loop.clock = reactor

    def start(self) -> None:
        """Check from the next interval on (an answer to PUT /config/drain goes out first)."""
        self._loop.start(CHECK_INTERVAL, now=False)

    def cancel(self) -> None:
        """nsqd is stopping (for whatever reason): no more checks."""
        if self._loop.running:
            self._loop.stop()

    def queues(self) -> Iterable[Topic | Channel]:
        for topic in self.topics():
            yield topic
            yield from topic.channels.values()

    def left(self) -> Left:
        total = Left()
        for queue in self.queues():
            total.add(left_in(queue))
        return total

    def check(self) -> None:
        """One check: stop when empty or out of time, else report now and then."""
        if self.over:
            return
        try:
            self._check()
        except Exception:
            self.log.failure("DRAIN: check failed")

    def _check(self) -> None:
        now = self.reactor.seconds()
        left = self.left()
        elapsed = now - self.started_at
        if not left.total:
            self.log.info("DRAIN: done in {elapsed}: every topic and channel is empty", elapsed=_seconds(elapsed))
            self._end()
        elif self.timeout and elapsed >= self.timeout:
            self.log.warn(
                "DRAIN: --drain-timeout {timeout} passed with {left} left; stopping, they stay on disk",
                timeout=_seconds(self.timeout),
                left=left.text(),
            )
            self._report_queues(self.log.warn)
            self._end()
        elif now - self._reported_at >= PROGRESS_INTERVAL:
            self._progress(now, left)

    def _progress(self, now: float, left: Left) -> None:
        finished = self._finish_count()
        rate = (finished - self._finished) / (now - self._reported_at)
        self._finished, self._reported_at = finished, now
        self.log.info(
            "DRAIN: {left} left after {elapsed}; {rate} msgs/s finished",
            left=left.text(),
            elapsed=_seconds(now - self.started_at),
            rate=round(rate),
        )
        if not rate:
            self._report_queues(self.log.info)

    def _report_queues(self, emit: Callable[..., None]) -> None:
        """One line per queue with messages left (the first :data:`SHOWN_QUEUES`)."""
        waiting = [(q, left) for q in self.queues() if (left := left_in(q)).total]
        for queue, left in waiting[:SHOWN_QUEUES]:
            emit("DRAIN: {queue}: {left}{why}", queue=queue.save_name, left=left.text(), why=why_stuck(queue))
        if len(waiting) > SHOWN_QUEUES:
            emit("DRAIN: ... and {n} more queues", n=len(waiting) - SHOWN_QUEUES)

    def _finish_count(self) -> int:
        return sum(c.finish_count for t in self.topics() for c in t.channels.values())

    def _end(self) -> None:
        self.over = True
        self.cancel()
        self._stop()


class DrainHost(Protocol):
    """What starting a drain needs of its nsqd (the NSQD)."""

    opts: Any
    log: Any
    reactor: Any
    topics: dict[str, Topic]
    drain: Drain | None
    request_stop: Callable[[], None]


def on_sigterm(nsqd: DrainHost) -> bool:
    """SIGTERM arrived: True when nsqd takes it itself (``--sigterm-mode drain``:
    a drain starts, or goes on), False when it stops nsqd as usual."""
    if nsqd.opts.sigterm_mode != "drain":
        return False
    if nsqd.drain is None:
        start_drain(nsqd, "SIGTERM")
    else:
        nsqd.log.info("DRAIN: SIGTERM during the drain changes nothing (SIGINT or PUT /config/shutdown stops now)")
    return True


def start_drain(nsqd: DrainHost, why: str) -> None:
    """Refuse new messages, topics and channels from now on; stop once every
    queue is empty (see the module's docstring). A drain cannot be undone."""
    if nsqd.drain is not None:
        nsqd.log.info("DRAIN: already draining ({why} changes nothing)", why=why)
        return
    timeout = nsqd.opts.drain_timeout
    nsqd.drain = Drain(nsqd.reactor, nsqd.log, nsqd.topics.values, timeout, lambda: nsqd.request_stop())
    nsqd.log.info(
        "DRAIN: started by {why}: refusing new messages, topics and channels; {left} left; stopping when "
        "every queue is empty{limit}",
        why=why,
        left=nsqd.drain.left().text(),
        limit=f" or after --drain-timeout {DURATION.show(timeout)}" if timeout else "",
    )
    nsqd.drain.start()


def _seconds(seconds: float) -> str:
    """A Go duration to the millisecond: ``12.345s``, ``1m30s``."""
    return go_duration(round(seconds * 1000) * 1_000_000)
