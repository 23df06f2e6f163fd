"""A channel's rewind (beyond Go): its topic's retained messages from a time on, delivered again.

``POST /channel/rewind?topic=T&channel=C&since=X`` (and ``/channel/create`` with
``since``) starts one: a :class:`Rewind` reads the topic's retained log from the
first message published at or after X (:meth:`RetainedLog.locate`) up to where
the log ended when it started, and hands the records to the channel's memory
queue, in publish order, as if they were published again (same IDs, timestamps
and bodies): the channel delivers them with what it has queued, at least once.

It reads at the channel's pace: a batch (:data:`FEED_MESSAGES` or
:data:`FEED_BYTES`) only while the channel's memory queue holds less than
:data:`ROOM_MESSAGES` and :data:`ROOM_BYTES`, so a log of any size rewinds in a
few MiB. The channel pokes it when its consumers take messages; the NSQD's
once-a-second tick pokes it too, logs its progress and persists where it is
*safe* to start again (an extra ``rewind`` key of the channel in ``nsqd.dat``):
its position when the channel was last seen holding nothing (every copy queued
before was finished), or at a clean stop (what is queued is saved). So a rewind
goes on after a restart, and after a kill starts again from there: at least once.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from nsq_wire.gofmt import rfc3339_nano
from nsqd_tw.storage.retained import Position, RetainedLog


class Channel(Protocol):
    """What a rewind needs of its channel (:class:`nsqd_tw.core.channel.Channel`)."""

    name: str
    topic_name: str
    ctx: Any
    exiting: bool
    memory: deque[Any]
    memory_bytes: int
    duplicate_count: int

    @property
    def rewind(self) -> Rewind | None: ...

    def feed(self, records: list[bytes]) -> None: ...


ROOM_MESSAGES = 5000  # a channel's memory queue below this takes another batch
ROOM_BYTES = 4 << 20
FEED_MESSAGES = 2500  # the most one batch reads
FEED_BYTES = 1 << 20


class Rewind:
    """What a rewinding channel is owed: the retained log from a position to an end."""

    def __init__(
        self,
        channel: Channel,
        log: RetainedLog,
        since_ns: int | None,
        start: Position,
        end: Position,
    ) -> None:
        """``since_ns``: what was asked (None: the oldest retained)."""
        self.channel = channel
        self.log = log
        self.since_ns = since_ns
        self.horizon_ns = log.horizon_ns
        self.reader = log.reader(start, end)
        # where to read again from after a kill: copies before it were all finished
        self.safe = start
        self.left = log.count_between(start, end)
        self.queued = 0  # handed to the channel so far
        self.closed = False
        self._scheduled = False
        self.progress_at = 0.0  # when progress was last logged (the NSQD's tick)

    def __repr__(self) -> str:
        return f"<Rewind {self.channel!r} left={self.left}>"

    @property
    def done(self) -> bool:
        return self.reader.done

    def since_text(self) -> str:
        return "the oldest retained message" if self.since_ns is None else rfc3339_nano(self.since_ns)

    def has_room(self) -> bool:
        c = self.channel
        return len(c.memory) < ROOM_MESSAGES and c.memory_bytes < ROOM_BYTES

    def poke(self) -> None:
        """The channel may have room: feed it on the next reactor turn."""
        if not self._scheduled and not self.closed and self.has_room():
            self._scheduled = True
            self.channel.ctx.schedule(self._feed)

    def feed_now(self) -> None:
        """Queue the first batch at once (then as the channel has room)."""
        if self.has_room():
            self._feed()
        else:
            self.poke()

    def _feed(self) -> None:
        self._scheduled = False
        channel = self.channel
        if self.closed or channel.exiting or channel.rewind is not self:
            return
        try:
            records = self.reader.read(FEED_MESSAGES, FEED_BYTES)
        except OSError as e:
            channel.ctx.log.error(
                "CHANNEL({topic}:{name}): rewind stopped, the retained log could not be read - {err}",
                topic=channel.topic_name,
                name=channel.name,
                err=e,
            )
            channel.ctx.retention.rewind_finished(channel, self)
            return
        if self.reader.lost:  # segments deleted (aged out, evicted) before they were read
            self.reader.lost = False
            self.left = self.log.count_between(self.reader.position, self.reader.end)
        else:
            self.left = max(0, self.left - len(records))
        self.queued += len(records)
        if records:
            channel.feed(records)
        if self.reader.done:
            self.left = 0
            channel.ctx.log.info(
                "CHANNEL({topic}:{name}): rewind since {since} done: {n} messages queued again",
                topic=channel.topic_name,
                name=channel.name,
                since=self.since_text(),
                n=self.queued,
            )
            channel.ctx.retention.rewind_finished(channel, self, completed=True)
        else:
            self.poke()

    def close(self) -> None:
        """Stop reading (the position stays, for nsqd.dat)."""
        self.closed = True
        self.reader.close()

    def stats(self) -> dict[str, Any]:
        """The channel's ``rewind`` object in /stats."""
        return {
            # ``since=earliest``: the horizon when it started (everything retained since then)
            "since": self.since_ns if self.since_ns is not None else self.horizon_ns,
            "messages_left": self.left,
            "messages_queued": self.queued,
            # copies not delivered because their message was in flight then (the channel's count)
            "copies_dropped": self.channel.duplicate_count,
        }

    def copied_state(self) -> dict[str, Any]:
        """:meth:`state` from where it has read to: what a replication standby, which
        holds every copy queued so far, goes on from once promoted."""
        return {"since": self.since_ns, "from": list(self.reader.position), "to": list(self.reader.end)}

    def state(self) -> dict[str, Any]:
        """What nsqd.dat keeps of it (the channel's extra ``rewind`` key)."""
        return {
            "since": self.since_ns,
            "from": list(self.safe),
            "to": list(self.reader.end),
        }


def position_of(value: Any) -> Position | None:
    """A position as :meth:`Rewind.state` wrote it, else None."""
    if (
        isinstance(value, list)
        and len(value) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return Position(*value)
    return None
