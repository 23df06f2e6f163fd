"""What a topic and a channel have in common: messages held in memory, then in a backend.

A message stays in memory while it holds fewer than ``--mem-queue-size``
messages and (beyond Go) at most ``--mem-queue-bytes`` bytes of bodies; the rest
goes to the backend, a batch in one write. In memory a message as published is
kept as its record (the bytes the backend would store): one object per message,
shared by every channel of its topic; one coming back (REQ, timeout) stays a
:class:`Message`, which also carries its attempts and durable-mode record. A failed write turns nsqd's health
to the error and is taken back whole; the next good one turns it back. Read
back, memory and backend take turns, like Go's select over both channels (a
consumer's messagePump; a channel's bursts: core/channelqueue.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import repeat
from typing import Any, Protocol

from nsq_wire.message import ID_OFFSET, MESSAGE_HEADER_LENGTH, TIMESTAMP
from nsqd_tw.core.message import Message
from nsqd_tw.core.peek import peek
from nsqd_tw.core.settings import Policy, settings_json
from nsqd_tw.options import NSQDOptions
from nsqd_tw.storage.backend import IBackendQueue

# what memory and a backend write take: a record, or a Message (one coming back, or deferred)
Item = bytes | Message
BYTES = repeat(bytes)  # all(map(isinstance, items, BYTES)): every item a record, checked in C


def body_size(item: Item) -> int:
    return len(item) - MESSAGE_HEADER_LENGTH if isinstance(item, bytes) else len(item.body)


def timestamp(item: Item) -> int:
    return int(TIMESTAMP.unpack_from(item)[0]) if isinstance(item, bytes) else item.timestamp


class QueueFull(Exception):
    """A publish refused by a bounded queue (``overflow: reject``); ``str()`` names the limit."""


def as_items(msgs: Sequence[Message]) -> list[Item]:
    """Messages as a topic or channel queues them: records, deferred ones as they are."""
    return [m if m.deferred else m.encode() for m in msgs]


class Retained(Protocol):
    """What topics and channels call of nsqd's retained logs and rewinds (beyond Go)."""

    def open_retained(self, topic: Any) -> Any: ...
    def drop_retained(self, topic: Any, why: str) -> None: ...
    def keep_retained(self, topic: Any) -> None: ...
    def retention_changed(self, topic: Any) -> None: ...
    def rewind_finished(self, channel: Any, rewind: Any, completed: bool = False) -> None: ...


class Stores(Protocol):
    """Where topics and channels get their backend, and report what they could not
    write at stop (nsqd_tw.core.stores.QueueStores)."""

    def new_backend(self, name: str, ephemeral: bool) -> IBackendQueue: ...
    def could_not_save(self, queue: str, lost: int, total: int, err: Exception) -> None: ...
    def could_not_close(self, what: str, err: Exception) -> None: ...


class Context(Protocol):
    """What topics and channels need of their nsqd (the NSQD)."""

    opts: NSQDOptions
    log: Any
    health_error: BaseException | None
    # beyond Go, replication: where a primary ships what changes (None: no replica),
    # and the refusal of a standby (None: not one)
    shipper: Any
    standby: Any

    @property
    def draining(self) -> bool: ...

    def now(self) -> float: ...
    def now_ns(self) -> int: ...
    def schedule(self, fn: Any) -> None: ...
    def set_health(self, err: BaseException | None) -> None: ...
    def metadata_changed(self, topic_name: str | None = None) -> None: ...

    @property
    def stores(self) -> Stores: ...

    # beyond Go: the settings the flags give every queue; the TTL sweep (core/expiry.py),
    # told when a queue's policy changes; dead letters (core/deadletters.py)
    settings_defaults: dict[str, Any]
    expiry: Any
    dead_letters: Any

    loading: bool

    # beyond Go: the retained logs and rewinds (nsqd_tw.core.retention.Retention)
    @property
    def retention(self) -> Retained: ...

    def channel_created(self, channel: Any) -> None: ...
    def channel_deleted(self, channel: Any) -> None: ...
    def channel_emptied(self, channel: Any) -> None: ...
    def topic_emptied(self, topic: Any) -> None: ...


SAVE_CHUNK = 256  # a stop that cannot write all of a queue writes what fits, this many at a time


class MessageQueue:
    """The queue of a topic or channel named ``name`` (its backend: ``backend_name``).

    ``in_memory`` false sends every message through the backend (Go's
    ``--mem-queue-size=0``). ``write_error`` is the log line of a failed write.
    """

    write_error = "failed to write message to backend - {err}"

    def __init__(self, name: str, backend_name: str, ctx: Context, ephemeral: bool, in_memory: bool = True) -> None:
        self.name = name
        self.ctx = ctx
        self.ephemeral = ephemeral
        opts = ctx.opts
        self._mem_size = opts.mem_queue_size if in_memory else 0
        self._mem_bytes = opts.mem_queue_bytes  # 0: no budget in bytes
        self.memory: deque[Item] = deque()
        self.memory_bytes = 0  # the bodies' bytes in self.memory
        self.backend = ctx.stores.new_backend(backend_name, ephemeral)
        self._take_backend = False
        # beyond Go: the queue's own settings and what applies (see nsqd_tw.core.settings)
        self.own_settings: dict[str, Any] = {}
        self.policy = Policy()
        self.expired_count = 0
        self.dropped_count = 0
        self.trims = False  # overflow drop_oldest applies (set by the topic's apply_policies)

    def depth(self) -> int:
        return len(self.memory) + self.backend.depth()

    def queued_bytes(self) -> int:
        """The bytes a ``max_bytes`` bound counts: memory_bytes + backend_bytes of /stats."""
        return self.memory_bytes + getattr(self.backend, "queued_bytes", 0)

    def settings_json(self) -> dict[str, Any]:
        return settings_json(self.own_settings)

    def set_policy(self, policy: Policy) -> None:
        if policy != self.policy:
            self.policy = policy
            self.ctx.expiry.policy_changed(self)

    # -- beyond Go: what TTL expiry and bounds use (nsqd_tw.core.expiry, .bounds) ------------

    def waiting(self) -> tuple[int, int]:
        """What a bound counts: the messages held for delivery and their bodies' bytes."""
        return self.depth(), self.queued_bytes()

    def expired(self, msg: Message) -> None:
        """A message past the TTL leaves the queue (a channel may dead-letter it)."""
        self.expired_count += 1
        self.discard(msg)

    def discard(self, msg: Message) -> None:
        """``msg``, taken from the queue, is gone for good (expired, dropped by a
        bound): in durable mode its record is never read again, even after a crash."""
        if msg.ref is not None:
            drop = getattr(self.backend, "drop", None)
            if drop is not None:
                drop(msg.ref, msg.id)
            else:
                self.backend.done(msg.ref)

    def heads(self) -> tuple[int | None, int | None]:
        """The publish times of memory's first message and the backend's (-1: the
        backend's head could not be looked at; None: empty)."""
        mem = timestamp(self.memory[0]) if self.memory else None
        disk = None
        if self.backend.depth():
            disk = _backend_head(self.backend)
            if disk is None:
                disk = -1
        return mem, disk

    def take_oldest(self) -> Message | None:
        """Remove and return the older of memory's first message and the backend's."""
        mem, disk = self.heads()
        if disk is not None and (mem is None or disk < mem):  # a tie: memory (filled first)
            msg = self.take_backend_head()
            if msg is not None:
                return msg
        return self.take_memory_head()

    def take_backend_head(self) -> Message | None:
        """Remove and return the backend's next message (None: none)."""
        backend = self.backend
        while (item := backend.read()) is not None:
            data, ref = item
            try:
                msg = Message.decode(data)
            except ValueError:
                backend.done(ref)
                continue
            msg.ref = ref
            backend.take_deferred(msg.id)
            return msg
        return None

    def take_memory_head(self) -> Message | None:
        if not self.memory:
            return None
        held = self.memory.popleft()
        self.memory_bytes -= body_size(held)
        return Message.decode(held) if isinstance(held, bytes) else held

    def hold_first(self, msg: Message) -> None:
        self.memory.appendleft(msg)
        self.memory_bytes += len(msg.body)

    def queued(self) -> list[Message]:
        """What memory holds, as messages (for inspection: tests and tools)."""
        return [Message.decode(m) if isinstance(m, bytes) else m for m in self.memory]

    # -- inspection (beyond Go): what depth counts, nothing taken (core/peek.py) -----------

    def peek(self, n: int, max_bytes: int | None = None) -> list[Message]:
        """Up to ``n`` queued messages in the order :meth:`_next` would take them,
        none taken (see :func:`nsqd_tw.core.peek.peek`)."""
        return peek(self, n, max_bytes)

    def oldest_timestamp(self) -> int | None:
        """The publish time (ns) of the older of the two messages next in line,
        memory's and the backend's (None: nothing queued). Only the heads: a
        message requeued behind others is seen when it reaches the head."""
        heads = [timestamp(self.memory[0])] if self.memory else []
        backend_head = _backend_head(self.backend)
        if backend_head is not None:
            heads.append(backend_head)
        return min(heads, default=None)

    def oldest_message_age_ms(self) -> int:
        """How long ago (ms) the oldest queued message was published; 0 if none."""
        ts = self.oldest_timestamp()
        return 0 if ts is None else max(0, (self.ctx.now_ns() - ts) // 1_000_000)

    # -- memory ----------------------------------------------------------------------

    def _room_for(self, msg: Message) -> bool:
        return len(self.memory) < self._mem_size and (
            not self._mem_bytes or self.memory_bytes + len(msg.body) <= self._mem_bytes
        )

    def _hold(self, item: Item) -> None:
        self.memory.append(item)
        self.memory_bytes += body_size(item)

    def _hold_records(self, records: Sequence[bytes]) -> int:
        """Hold in memory, in one go, as many of ``records`` as it has room for
        (a memory bounded by count alone: no ``mem_bytes``); how many."""
        room = self._mem_size - len(self.memory)
        held = records if room >= len(records) else records[: max(room, 0)]
        self.memory.extend(held)
        self.memory_bytes += sum(map(len, held)) - MESSAGE_HEADER_LENGTH * len(held)
        return len(held)

    def _unhold(self, n: int) -> None:
        """Take back the last ``n`` messages put in memory."""
        for _ in range(n):
            self.memory_bytes -= body_size(self.memory.pop())

    def _clear_memory(self) -> list[Item]:
        items = list(self.memory)
        self.memory.clear()
        self.memory_bytes = 0
        return items

    # -- the backend -------------------------------------------------------------------

    def _write(self, items: Sequence[Item]) -> object:
        """Write records and messages to the backend, deferred ones with their
        deliver-at time; return the backend's mark for taking them back (:meth:`_unwrite`)."""
        ctx = self.ctx
        try:
            records = items
            if not all(map(isinstance, items, BYTES)):
                records = [m if isinstance(m, bytes) else m.encode() for m in items]
            mark = self.backend.put_many(records)  # type: ignore[arg-type]
        except Exception as e:
            ctx.set_health(e)
            ctx.log.error(self.write_error, name=self.name, err=e)
            raise
        if ctx.health_error is not None:
            ctx.set_health(None)
        if records is not items:
            self._remember_delays(items)
        return mark

    def _remember_delays(self, items: Sequence[Item]) -> None:
        # a record has no room for the DPUB delay: the backend keeps it aside
        now_ns = None
        for m in items:
            if not isinstance(m, bytes) and m.deferred:
                if now_ns is None:
                    now_ns = self.ctx.now_ns()
                self.backend.set_deferred(m.id, now_ns + int(m.deferred * 1e9))

    def _unwrite(self, mark: object, items: Sequence[Item]) -> None:
        self.backend.unput(mark)
        for m in items:
            if not isinstance(m, bytes) and m.deferred:
                self.backend.take_deferred(m.id)

    def _next(self) -> tuple[Message | None, int | None]:
        """The next queued message and, when it comes from the backend with a
        deliver-at time, that time (ns); memory and backend take turns."""
        self._take_backend = not self._take_backend
        if self._take_backend or not self.memory:
            backend = self.backend
            while (item := backend.read()) is not None:
                data, ref = item
                try:
                    msg = Message.decode(data)
                except ValueError as e:
                    self.ctx.log.error("failed to decode message - {err}", err=e)
                    backend.done(ref)
                    continue
                msg.ref = ref
                return msg, backend.take_deferred(msg.id)
        if self.memory:
            held = self.memory.popleft()
            if isinstance(held, bytes):
                self.memory_bytes -= len(held) - MESSAGE_HEADER_LENGTH
                return Message.decode(held), None
            self.memory_bytes -= len(held.body)
            return held, None
        return None, None

    def _next_item(self) -> tuple[Item | None, object | None, int | None]:
        """:meth:`_next` for a queue that only hands its messages on (a topic's
        pump): the item as held (a record is not decoded), the backend's ref
        (durable mode) and deliver-at time (ns) of one read from the backend."""
        self._take_backend = not self._take_backend
        if self._take_backend or not self.memory:
            backend = self.backend
            while (read := backend.read()) is not None:
                data, ref = read
                if len(data) < MESSAGE_HEADER_LENGTH:
                    self.ctx.log.error("failed to decode message - invalid message buffer size ({n})", n=len(data))
                    backend.done(ref)
                    continue
                return data, ref, backend.take_deferred(data[ID_OFFSET:MESSAGE_HEADER_LENGTH])
        if self.memory:
            held = self.memory.popleft()
            self.memory_bytes -= body_size(held)
            return held, None, None
        return None, None, None

    def _save(self, items: Sequence[Item], deferred: Sequence[Message]) -> None:
        """On close: write what is held to the backend, with the DPUB delays of
        ``items`` and the deliver-at times of ``deferred``; records these were read
        from (durable mode) are then done, so a clean restart reads each message
        once. What does not fit (a full disk) is counted and reported to the nsqd."""
        if not items and not deferred:
            return
        all_items: list[Item] = [*items, *deferred]
        saved, err = self._put_what_fits([m if isinstance(m, bytes) else m.encode() for m in all_items])
        if err is not None:
            self.ctx.stores.could_not_save(self.save_name, len(all_items) - saved, len(all_items), err)
        self._remember_delays(items[:saved])
        for d in deferred[: max(0, saved - len(items))]:
            self.backend.set_deferred(d.id, int(d.pri * 1e9))
        for item in all_items[:saved]:
            if not isinstance(item, bytes) and item.ref is not None:
                self.backend.done(item.ref)

    @property
    def save_name(self) -> str:
        """How the stop's log lines name this queue."""
        return self.name

    def _put_what_fits(self, records: list[bytes]) -> tuple[int, Exception | None]:
        """Write as many of ``records`` as the backend takes, in order: how many
        it took, and the error that stopped it (None: all of them)."""
        put = self.backend.put_many
        try:
            put(records)
            return len(records), None
        except Exception as e:
            err = e
        saved = 0
        for start in range(0, len(records), SAVE_CHUNK):
            chunk = records[start : start + SAVE_CHUNK]
            try:
                put(chunk)
                saved += len(chunk)
                continue
            except Exception as e:
                err = e
            for record in chunk:
                try:
                    put([record])
                except Exception as e:
                    return saved, e
                saved += 1
        return saved, err

    def _empty(self) -> None:
        self._clear_memory()
        self.backend.empty()

    def _release_backend(self, retire: bool) -> None:
        """At close: keep the backend's records for the next start, or (``retire``,
        a queue that held nothing) delete its storage."""
        if retire:
            self.backend.delete()
        else:
            self.backend.close()


# IBackendQueue's peek, head_timestamp and release_files came later than the rest:
# a backend written before them (an embedder's) shows nothing queued in it


def _backend_head(backend: IBackendQueue) -> int | None:
    head_timestamp = getattr(backend, "head_timestamp", None)
    return head_timestamp() if head_timestamp is not None else None
