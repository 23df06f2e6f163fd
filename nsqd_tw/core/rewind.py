"""A channel's rewind (beyond Go): its topic's retained messages from a time on, delivered again.

``POST /channel/rewind?topic=T&channel=C&since=X`` (and ``/channel/create`` with
``since``) starts one: a :class:`Rewind` reads the topic's retained log from the
first message published at or after X (:meth:`RetainedLog.locate`) up to where
the log ended when it started, and hands the records to the channel's memory
queue, in publish order, as if they were published again (same IDs, timestamps
and bodies): the channel delivers them with what it has queued, at least once.

It reads at the channel's pace, within what all rewinds share
(:class:`RewindBudget`): a batch (at most :data:`FEED_MESSAGES` and
:data:`FEED_BYTES`) only while the channel's memory queue holds less than its
share (:data:`ROOM_MESSAGES` and :data:`ROOM_BYTES` while few channels rewind,
:data:`BUDGET_MESSAGES` and :data:`BUDGET_BYTES` divided between them when more
do), and all rewinds together read at most :data:`TURN_MESSAGES` and
:data:`TURN_BYTES` in one reactor turn. So logs of any size, rewound into any
number of channels, take a bounded amount of memory and of each reactor turn.
The channel pokes it when its consumers take messages; the NSQD's
once-a-second tick pokes it too, logs its progress and persists where it is
*safe* to start again (an extra ``rewind`` key of the channel in ``nsqd.dat``):
its position when the channel was last seen holding nothing (every copy queued
before was finished), or at a clean stop. So a rewind goes on after a restart,
and after a kill starts again from there: at least once.

At a clean stop the copies it queued that are still in the channel's memory are
not saved with the rest of what the channel holds: its position goes back to the
first of them (:meth:`Rewind.take_back`). Saved, they would sit in the channel's
disk queue after the start while it fed the next ones to memory, and the channel
delivers memory and disk in turns: the copies would come out of order. Read
again, they reach the consumers in publish order across the restart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from nsq_wire.gofmt import rfc3339_nano
from nsq_wire.message import ID_OFFSET, MESSAGE_HEADER_LENGTH
from nsqd_tw.core.message import Message
from nsqd_tw.storage.retained import RetainedLog
from nsqd_tw.storage.retained_segments import Position


class Channel(Protocol):
    """What a rewind and its copies need of their channel (:class:`nsqd_tw.core.channel.Channel`)."""

    name: str
    topic_name: str
    ctx: Any
    exiting: bool
    ephemeral: bool
    memory: deque[Any]
    memory_bytes: int
    message_count: int
    duplicate_count: int
    backend: Any
    in_flight: Any
    deferred: Any
    copies: Copies | None

    @property
    def rewind(self) -> Rewind | None: ...

    def _dispatch(self) -> None: ...


ROOM_MESSAGES = 5000  # the most a rewinding channel's memory queue holds (less when many rewind)
ROOM_BYTES = 4 << 20
FEED_MESSAGES = 2500  # the most one batch reads
FEED_BYTES = 1 << 20
BUDGET_MESSAGES = 20_000  # what the memory queues of all rewinding channels hold together, at most
BUDGET_BYTES = 16 << 20
TURN_MESSAGES = 2500  # what all rewinds together read in one reactor turn, at most
TURN_BYTES = 1 << 20


class RewindBudget:
    """What all the rewinds of an nsqd may hold and do together (beyond Go).

    Memory: each rewinding channel's memory queue holds at most its *share*,
    :data:`BUDGET_MESSAGES` and :data:`BUDGET_BYTES` divided by how many
    channels rewind (never more than :data:`ROOM_MESSAGES` and
    :data:`ROOM_BYTES`), so that together they hold at most the budget. A
    rewind that starts makes the shares smaller at once: a channel holding
    more than its new share gives back its last copies (they are read again
    when their turn comes, in order). Time: the rewinds that have room are fed
    in turns, at most :data:`TURN_MESSAGES` and :data:`TURN_BYTES` in one
    reactor turn for all of them, so that however many rewind, the reactor
    gets back to its sockets (and ``/ping``) between two batches.
    """

    def __init__(self, schedule: Callable[[Callable[[], None]], None]) -> None:
        self.schedule = schedule
        self.rewinds: dict[Rewind, None] = {}
        self.waiting: dict[Rewind, None] = {}  # rewinds with room, in turn order
        self._scheduled = False
        self.share = (ROOM_MESSAGES, ROOM_BYTES)  # what one channel's memory queue may hold
        self.low = (FEED_MESSAGES, FEED_BYTES)  # the room below which it is not fed (no tiny batches)

    def add(self, rewind: Rewind) -> None:
        """``rewind`` starts: the shares get smaller, each channel gives back what it holds past its own."""
        self.rewinds[rewind] = None
        self._reshare()
        for other in list(self.rewinds):
            if other is not rewind:
                other.keep_to_share()

    def remove(self, rewind: Rewind) -> None:
        self.waiting.pop(rewind, None)
        if rewind in self.rewinds:
            del self.rewinds[rewind]
            self._reshare()
            for other in self.rewinds:
                other.poke()  # the shares grew

    def _reshare(self) -> None:
        n = max(1, len(self.rewinds))
        messages = max(1, min(ROOM_MESSAGES, BUDGET_MESSAGES // n))
        size = max(1, min(ROOM_BYTES, BUDGET_BYTES // n))
        self.share = (messages, size)
        self.low = (max(1, min(FEED_MESSAGES, messages // 2)), max(1, min(FEED_BYTES, size // 2)))

    def want(self, rewind: Rewind) -> None:
        """``rewind``'s channel has room: fed in the next reactor turn with its turn."""
        self.waiting[rewind] = None
        if not self._scheduled:
            self._scheduled = True
            self.schedule(self._turn)

    def _turn(self) -> None:
        self._scheduled = False
        messages, size = TURN_MESSAGES, TURN_BYTES
        waiting = self.waiting
        while waiting and messages > 0 and size > 0:
            rewind = next(iter(waiting))
            del waiting[rewind]
            n, b = rewind.feed_turn(messages, size)  # it asks again (last in line) if it has room still
            messages -= n
            size -= b
        if waiting and not self._scheduled:
            self._scheduled = True
            self.schedule(self._turn)


class Rewind:
    """What a rewinding channel is owed: the retained log from a position to an end."""

    def __init__(
        self,
        channel: Channel,
        log: RetainedLog,
        since_ns: int | None,
        start: Position,
        end: Position,
        budget: RewindBudget,
    ) -> None:
        """``since_ns``: what was asked (None: the oldest retained)."""
        self.channel = channel
        self.log = log
        self.since_ns = since_ns
        self.horizon_ns = log.horizon_ns
        self.budget = budget
        self.reader = log.reader(start, end)
        # where to read again from after a kill: copies before it were all finished
        self.safe = start
        self.left = log.count_between(start, end)
        self.queued = 0  # handed to the channel so far
        self.closed = False
        self.progress_at = 0.0  # when progress was last logged (the NSQD's tick)
        # the last batches fed (where each starts, its records): what may still be queued in
        # the channel's memory, so that it can be given back (keep_to_share, take_back)
        self.fed: deque[_Fed] = deque()
        self.fed_count = 0
        budget.add(self)

    def __repr__(self) -> str:
        return f"<Rewind {self.channel!r} left={self.left}>"

    @property
    def done(self) -> bool:
        return self.reader.done

    def since_text(self) -> str:
        return "the oldest retained message" if self.since_ns is None else rfc3339_nano(self.since_ns)

    def room(self) -> tuple[int, int]:
        """How many messages and bytes its channel's memory queue may take (its share, less what it holds)."""
        c = self.channel
        messages, size = self.budget.share
        return messages - len(c.memory), size - c.memory_bytes

    def has_room(self) -> bool:
        """Room for a batch worth reading: half its share or a whole batch, in messages or in bytes."""
        messages, size = self.room()
        low_messages, low_size = self.budget.low
        return messages > 0 and size > 0 and (messages >= low_messages or size >= low_size)

    def poke(self) -> None:
        """The channel may have room: fed in the next reactor turn (with the other rewinds)."""
        if self.fed:
            self._forget_delivered()
        if not self.closed and self.has_room():
            self.budget.want(self)

    def feed_now(self) -> None:
        """Queue the first batch at once (then as the channel has room)."""
        messages, size = self.room()
        if messages > 0 and size > 0:
            self.feed_turn(FEED_MESSAGES, FEED_BYTES)
        else:
            self.poke()

    def feed_turn(self, most: int, most_bytes: int) -> tuple[int, int]:
        """Feed the channel a batch of at most ``most`` messages, ``most_bytes``
        bytes and the room it has; how many messages and bytes were read."""
        channel = self.channel
        if self.closed or channel.exiting or channel.rewind is not self:
            return 0, 0
        room, room_bytes = self.room()
        most, most_bytes = min(most, room, FEED_MESSAGES), min(most_bytes, room_bytes, FEED_BYTES)
        if most <= 0 or most_bytes <= 0:
            return 0, 0  # poked again when it has room
        start = self.reader.position
        try:
            records = self.reader.read(most, most_bytes)
        except OSError as e:
            channel.ctx.log.error(
                "CHANNEL({topic}:{name}): rewind stopped, the retained log could not be read - {err}",
                topic=channel.topic_name,
                name=channel.name,
                err=e,
            )
            channel.ctx.retention.rewind_finished(channel, self)
            return 0, 0
        if self.reader.lost:  # segments deleted (aged out, evicted) before they were read
            self.reader.lost = False
            self.left = self.log.count_between(self.reader.position, self.reader.end)
        else:
            self.left = max(0, self.left - len(records))
        self.queued += len(records)
        size = sum(map(len, records))
        if records:
            self._remember(start, records, size)
            self._feed(records)
        elif not self.reader.done:
            return 0, 0  # nothing could be read now: the next poke (at the latest the tick's) tries again
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
        return len(records), size

    def _feed(self, records: list[bytes]) -> None:
        """Its records: queued in the channel's memory behind what is there, whatever
        --mem-queue-size (the rewind keeps to a few MiB), then delivered."""
        c = self.channel
        c.memory.extend(records)
        c.memory_bytes += sum(map(len, records)) - MESSAGE_HEADER_LENGTH * len(records)
        c.message_count += len(records)
        if c.ctx.shipper is not None:
            c.ctx.shipper.fed(c, records)
        c._dispatch()

    def cancel(self, why: str) -> None:
        """Stop it before its end (its channel emptied or deleted, retention turned off)."""
        c = self.channel
        c.ctx.log.info(
            "CHANNEL({topic}:{name}): rewind since {since} cancelled ({why}), {left} messages left",
            topic=c.topic_name,
            name=c.name,
            since=self.since_text(),
            why=why,
            left=self.left,
        )
        c.ctx.retention.rewind_finished(c, self)

    # -- its copies queued in memory, given back ------------------------------------------

    def _remember(self, start: Position, records: list[bytes], size: int) -> None:
        """Keep where the batch just read starts (each record's position follows)."""
        end = self.reader.position
        n = len(records)
        if end[:2] == (start.segment, start.offset + size + 4 * n) and end.ordinal == start.ordinal + n:
            self.fed.append(_Fed(start, records, True))
        else:  # across segments (or past what could not be read): split where each segment starts
            self.fed.extend(_split(self.log, start, end, records))
        self.fed_count += n

    def _forget_delivered(self) -> None:
        """Forget the batches none of whose copies can still be in memory: those
        queued there are the last ones fed (it is first in, first out)."""
        held = len(self.channel.memory)
        fed = self.fed
        while fed and self.fed_count - len(fed[0].records) >= held:
            self.fed_count -= len(fed.popleft().records)

    def _queued_copies(self) -> list[tuple[int, int]]:
        """Where (batch, index) its copies still in the channel's memory are, in the order fed."""
        self._forget_delivered()
        where = {id(r): (i, k) for i, batch in enumerate(self.fed) for k, r in enumerate(batch.records)}
        # the batches keep their records alive: no other object has one of these ids
        return sorted(where[id(item)] for item in self.channel.memory if id(item) in where)

    def keep_to_share(self) -> None:
        """Give back the last copies its channel holds past its share (a rewind started)."""
        c = self.channel
        messages, size = self.budget.share
        if self.closed or (len(c.memory) <= messages and c.memory_bytes <= size):
            return
        copies = self._queued_copies()
        n, over, over_bytes = 0, len(c.memory) - messages, c.memory_bytes - size
        for i, k in reversed(copies):
            if over <= 0 and over_bytes <= 0:
                break
            n += 1
            over -= 1
            over_bytes -= len(self.fed[i].records[k]) - MESSAGE_HEADER_LENGTH
        if n:
            self._give_back(copies[-n])

    def take_back(self) -> None:
        """A clean stop: its copies still in the channel's memory leave it (they are
        not saved with it) and its position goes back to the first of them, so that
        after the start they come again in order, before the rest of the rewind."""
        copies = self._queued_copies()
        if copies:
            self._give_back(copies[0])

    def _give_back(self, cut: tuple[int, int]) -> None:
        """Take every copy fed from ``cut`` (batch, index) on out of the channel's
        memory, and read on from there again."""
        i, k = cut
        batch = self.fed[i]
        if not batch.exact:  # where its records are is not known: the whole batch again
            k = 0
        position = batch.position(k)
        gone: set[int] = set()
        for j in range(i, len(self.fed)):
            gone.update(map(id, self.fed[j].records[k if j == i else 0 :]))
        while len(self.fed) > i + 1:
            self.fed.pop()
        if k:
            self.fed[i] = _Fed(batch.start, batch.records[:k], batch.exact)
        else:
            self.fed.pop()
        self.fed_count = sum(len(b.records) for b in self.fed)
        c = self.channel
        kept: list[Any] = []
        taken: list[bytes] = []
        for item in c.memory:
            (taken if id(item) in gone else kept).append(item)
        c.memory.clear()
        c.memory.extend(kept)
        c.memory_bytes -= sum(map(len, taken)) - MESSAGE_HEADER_LENGTH * len(taken)
        c.message_count -= len(taken)
        self.queued -= len(taken)
        end = self.reader.end
        self.reader.close()
        self.reader = self.log.reader(position, end)
        self.left = self.log.count_between(position, end)
        shipper = c.ctx.shipper
        if shipper is not None and taken and not c.exiting:  # a standby has them: it drops one copy of each
            shipper.gone(c, [r[ID_OFFSET:MESSAGE_HEADER_LENGTH] for r in taken])
            c.ctx.retention.ship_rewind(c)  # and goes on from here once promoted

    def close(self) -> None:
        """Stop reading (the position stays, for nsqd.dat)."""
        self.closed = True
        self.reader.close()
        self.fed.clear()
        self.fed_count = 0
        self.budget.remove(self)

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


class Copies:
    """A rewound channel's copies (beyond Go): the channel's ``copies`` while one of
    them may be queued, in flight or deferred there (None: the plain path, from
    when it is found holding nothing). A copy shares the channel's queues with the
    message it copies: a burst drops one whose ID is in flight already."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        # a rewind read to its end whose copies are not all finished: done again after a kill
        self.pending: dict[str, Any] | None = None

    def unique(self, channel: Channel, burst: list[Message]) -> list[Message]:
        """A burst without the copies of a message already in flight (a rewind's
        copy meeting its original): the consumer has that message, a second
        copy under the same ID could not be told apart by FIN."""
        in_flight = channel.in_flight
        ids: set[bytes] = set()
        out = []
        for msg in burst:
            if msg.id in in_flight or msg.id in ids:
                self.drop(channel, msg)
            else:
                ids.add(msg.id)
                out.append(msg)
        return out

    def drop(self, channel: Channel, msg: Message) -> None:
        channel.duplicate_count += 1
        if msg.ref is not None:
            channel.backend.done(msg.ref)
        if channel.ctx.shipper is not None:
            channel.ctx.shipper.gone(channel, (msg.id,))

    def gone(self, channel: Channel) -> None:
        """Nothing queued: once nothing is in flight or deferred either, no copy
        of a rewind is left (and a rewind read to its end is over for good)."""
        if channel.rewind is None and not channel.in_flight and not channel.deferred:
            channel.copies = None
            if self.pending is not None:
                self.pending = None
                if not channel.ephemeral:
                    channel.ctx.metadata_changed(channel.topic_name)

    def state(self, channel: Channel) -> dict[str, Any]:
        """What nsqd.dat keeps of the channel's rewind: where to read again from after
        a kill (its copies finished up to there), ``{}`` when only copies may be
        left (a clean stop saved them)."""
        if channel.rewind is not None:
            return channel.rewind.state()
        if self.pending is not None:
            return self.pending
        return {}

    def close(self, channel: Channel) -> None:
        """The channel closes (nsqd stops): its rewind's copies in memory are not
        saved with what it holds (after the start they would be delivered in turns
        with the copies it reads on): it reads them again, in order."""
        rewind = channel.rewind
        if rewind is not None:
            rewind.take_back()
            rewind.safe = rewind.reader.position  # what else it queued is saved with the rest
            rewind.close()  # its position stays, for nsqd.dat
        elif self.pending is not None:
            self.pending = {}  # its copies are saved with the rest: nothing to read again
        else:
            return
        if not channel.ephemeral:
            channel.ctx.metadata_changed(channel.topic_name)  # nsqd.dat, written after the close, says so


class _Fed(NamedTuple):
    """A batch fed to the channel, its records all in one segment from ``start``
    on (``exact``: where each one is follows from their sizes)."""

    start: Position
    records: list[bytes]
    exact: bool

    def position(self, k: int) -> Position:
        """Where its ``k``-th record is (its start when not ``exact``)."""
        if not k or not self.exact:
            return self.start
        start = self.start
        return Position(start.segment, start.offset + sum(map(len, self.records[:k])) + 4 * k, start.ordinal + k)


def _split(log: RetainedLog, start: Position, end: Position, records: list[bytes]) -> list[_Fed]:
    """A batch read across segments, as one per segment: the reader went on to the
    next segment retained where the one it read ended. If that does not lead to
    where the reader is (a bad record skipped the rest of a segment), the
    positions are not known: the parts are not ``exact``."""
    parts: list[_Fed] = []
    position = part_start = start
    first = 0
    for i, record in enumerate(records):
        seg = log.segment(position.segment)
        limit = seg.size if seg is not None else 0
        if position.offset + 4 + len(record) > limit:  # the rest is in the next segment(s)
            if i > first:
                parts.append(_Fed(part_start, records[first:i], True))
            later = [s.num for s in log.segments if s.num > position.segment]
            position = Position(later[0], 0, 0) if later else end
            first = i
        if i == first:
            part_start = position
        position = Position(position.segment, position.offset + 4 + len(record), position.ordinal + 1)
    if len(records) > first:
        parts.append(_Fed(part_start, records[first:], True))
    if position != end:
        return [_Fed(p.start, p.records, False) for p in parts]
    return parts


def position_of(value: Any) -> Position | None:
    """A position as :meth:`Rewind.state` wrote it, else None."""
    if (
        isinstance(value, list)
        and len(value) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return Position(*value)
    return None
