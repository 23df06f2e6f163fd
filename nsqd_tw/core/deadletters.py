"""Dead letters (beyond Go): moving them, and where each recent one came from.

A channel gives up on a message (``max_attempts``, or ``max_age`` with
``expire_to_dead_letter``) by publishing it to its dead-letter topic:
:class:`DeadLetters` does that for the NSQD. A dead letter keeps its ID, body,
publish timestamp and attempts. One moved because it expired is not queued in a
channel where it is already past the TTL (it counts as expired there), so a
cycle of dead-letter topics with TTLs ends after one move instead of bouncing
for ever (RabbitMQ drops dead letters in such a cycle too).

An NSQ message has no headers, and nowhere to say which channel gave up on it.
nsqd remembers that in a :class:`DeadLetterLedger`, by dead-letter topic and
message ID, for the most recent :data:`LEDGER_SIZE` dead letters, kept in
``dead_letters.json`` under the data path (written at most once a second, read
at start): a dead-letter consumer asks ``GET /topic/dead_letter?topic=T&id=ID``.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from twisted.logger import LogLevel

from nsq_wire.names import is_valid_topic_name
from nsqd_tw.core.message import Message
from nsqd_tw.storage.files import read_regular, write_atomic

LEDGER_SIZE = 10_000
LEDGER_FILE = "dead_letters.json"


class DeadLetterLedger:
    def __init__(self, size: int = LEDGER_SIZE) -> None:
        self.size = size
        self._origins: OrderedDict[tuple[str, bytes], dict[str, Any]] = OrderedDict()
        self.changed = False

    def record(self, topic: str, msg_id: bytes, origin: dict[str, Any]) -> None:
        """``origin``: ``topic``, ``channel``, ``attempts``, ``reason``, ``timestamp`` (ns)."""
        key = (topic, msg_id)
        self._origins.pop(key, None)
        self._origins[key] = origin
        while len(self._origins) > self.size:
            self._origins.popitem(last=False)
        self.changed = True

    def origin(self, topic: str, msg_id: bytes) -> dict[str, Any] | None:
        return self._origins.get((topic, msg_id))

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._origins if k[0] == topic]:
            del self._origins[key]
            self.changed = True

    def encode(self) -> bytes:
        self.changed = False
        entries = [{"dead_letter_topic": t, "id": i.decode("latin-1"), **o} for (t, i), o in self._origins.items()]
        return json.dumps(entries, separators=(",", ":")).encode()

    def load(self, data: bytes) -> None:
        """Entries from :meth:`encode`'s bytes; raises ValueError for bytes that are not."""
        entries = json.loads(data)
        if not isinstance(entries, list):
            raise ValueError("not a list of dead letters")
        for entry in entries:
            if not isinstance(entry, dict):
                raise ValueError("not a list of dead letters")
            entry = dict(entry)
            topic, msg_id = entry.pop("dead_letter_topic", None), entry.pop("id", None)
            if isinstance(topic, str) and isinstance(msg_id, str):
                self.record(topic, msg_id.encode("latin-1"), entry)
        self.changed = False


def dead_at_return(channel: Channel, msg: Message) -> bool:
    """Whether ``msg``, back from a consumer of ``channel`` (REQ, timeout, its
    consumer gone) past ``max_attempts``, was moved to the dead-letter topic."""
    limit = channel.policy.max_attempts
    return bool(limit) and msg.attempts >= limit and dead_letter(channel, msg, "max_attempts")


def expired_to_dead_letter(channel: Channel, msg: Message) -> bool:
    """``msg`` expired in ``channel``: whether it was moved to the dead-letter
    topic (``expire_to_dead_letter``), counted as expired there."""
    if not (channel.policy.expire_to_dead_letter and dead_letter(channel, msg, "max_age")):
        return False
    channel.expired_count += 1
    if channel.ctx.shipper is not None:
        channel.ctx.shipper.gone(channel, (msg.id,))
    return True


def dead_letter(channel: Channel, msg: Message, why: str) -> bool:
    """Publish ``msg`` to the channel's dead-letter topic (False: it has none, or
    that could not take the message: then it stays in the channel)."""
    target = channel.policy.dead_letter_to(channel.topic_name)
    if target is None:
        return False
    dead_letters = channel.ctx.dead_letters
    if not dead_letters.move(channel, target, msg, why):
        return False
    ref = msg.ref
    if ref is not None:  # durable: done once the copy is on disk; a crash before leaves it in both

        def done() -> None:
            if not channel.exiting:  # closed meanwhile: its record stays, read again at the next start
                channel.backend.done(ref)

        dead_letters.after_sync(done)
    channel.dead_letter_count += 1
    return True


def _arrived_expired(channel: Channel, source: Channel) -> Callable[[dict[str, int]], str]:
    def text(n: dict[str, int]) -> str:
        return (
            f"CHANNEL({channel.topic_name}:{channel.name}): {n['n']} dead letter(s) from {source.topic_name}:"
            f"{source.name} arrived already past max_age: expired here, not moved on"
        )

    return text


class Channel(Protocol):
    """What dead letters need of a channel (:class:`nsqd_tw.core.channel.Channel`)."""

    topic_name: str
    name: str
    ctx: Any
    backend: Any
    policy: Any
    exiting: bool
    dead_letter_count: int
    expired_count: int


class DeadLetterHost(Protocol):
    """What dead letters need of their nsqd (the NSQD)."""

    opts: Any
    log: Any
    shipper: Any
    queue_events: Any
    syncer: Any
    backend_factory: Any
    metadata_loaded: bool
    running: bool | int

    def now_ns(self) -> int: ...
    def get_topic(self, name: str, replicated: bool = False) -> Any: ...


class DeadLetters:
    """The NSQD's dead letters: :meth:`move` publishes one, the ledger says
    where each came from (:meth:`origin`), saved with the syncs."""

    def __init__(self, nsqd: DeadLetterHost) -> None:
        self.nsqd = nsqd
        self.ledger = DeadLetterLedger()
        self._saved_at = 0.0

    def origin(self, topic: str, msg_id: bytes) -> dict[str, Any] | None:
        return self.ledger.origin(topic, msg_id)

    def forget_topic(self, topic: str) -> None:
        self.ledger.forget_topic(topic)

    def move(self, channel: Channel, target: str, msg: Message, why: str) -> bool:
        """Publish a copy of ``msg`` (ID, timestamp, attempts and body kept) to the
        topic ``target``; False if it could not be stored there (it stays in its
        channel, and an ERROR says why)."""
        nsqd = self.nsqd
        if target == channel.topic_name:
            return False
        try:
            if not is_valid_topic_name(target):  # <topic>.dead of a 60-character topic name
                raise ValueError(f"invalid topic name {target!r}: set the channel's dead_letter_topic")
            topic = nsqd.get_topic(target)
            record = msg.encode()
            expired = self._past_ttl(topic, msg) if why == "max_age" else ()
            topic.put_items([record], len(msg.body), skip=expired)
            shipper = nsqd.shipper
            if shipper is not None and not topic.ephemeral:
                shipper.published(topic, [record])
        except Exception as e:
            err = e
            nsqd.queue_events.emit(
                (target, "failed"),
                LogLevel.error,
                lambda n: f"TOPIC({target}): failed to take {n['n']} dead letter(s), kept in their channel - {err}",
                n=1,
            )
            return False
        if expired:
            self._expired_on_arrival(channel, expired, msg)
        origin = {
            "topic": channel.topic_name,
            "channel": channel.name,
            "attempts": msg.attempts,
            "reason": why,
            "timestamp": nsqd.now_ns(),
        }
        self.ledger.record(target, msg.id, origin)
        nsqd.queue_events.emit(
            (channel.topic_name, channel.name, why),
            LogLevel.info,
            lambda n: (
                f"CHANNEL({channel.topic_name}:{channel.name}): {n['n']} message(s) moved to dead-letter topic "
                f"{target} ({'max_attempts' if why == 'max_attempts' else 'max_age'} reached)"
            ),
            n=1,
        )
        return True

    def _past_ttl(self, topic: Any, msg: Message) -> list[Channel]:
        """The channels of ``topic`` where ``msg`` would arrive already past their
        TTL (only a topic that hands a publish to its channels at once can skip them)."""
        if not topic.channels or not topic.flowing():
            return []
        now_ns = self.nsqd.now_ns()
        return [
            c
            for c in topic.channels.values()
            if c.policy.max_age and msg.timestamp < now_ns - int(c.policy.max_age * 1e9)
        ]

    def _expired_on_arrival(self, source: Channel, channels: list[Channel], msg: Message) -> None:
        shipper = self.nsqd.shipper
        for c in channels:
            c.expired_count += 1
            if shipper is not None:
                shipper.gone(c, (msg.id,))  # the standby's channel had it from the publish
            self.nsqd.queue_events.emit(
                (c.topic_name, c.name, "arrived expired"), LogLevel.info, _arrived_expired(c, source), n=1
            )

    def after_sync(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once everything written so far is fsynced (not if the sync fails)."""
        d = self.nsqd.syncer.commit()
        d.addCallback(lambda _: fn())
        d.addErrback(lambda f: None)  # the failure is logged and is the health error (QueueStores.sync_result)

    # -- dead_letters.json ----------------------------------------------------------

    @property
    def path(self) -> str:
        return os.path.join(self.nsqd.opts.data_path, LEDGER_FILE)

    def save(self, now: float) -> None:
        """The origins, with the next sync, at most once a second."""
        nsqd = self.nsqd
        if not self.ledger.changed or now < self._saved_at + 1.0:
            return
        if nsqd.backend_factory is None and nsqd.metadata_loaded and nsqd.running:
            self._saved_at = now
            nsqd.syncer.persist(self.path, self.ledger.encode)

    def save_now(self) -> None:
        """At stop: write what changed since the last save."""
        if self.ledger.changed:
            write_atomic(self.path, self.ledger.encode())

    def load(self) -> None:
        """The origins kept at the last stop; a file that cannot be read is
        ignored with a warning (never a failed start)."""
        try:
            self.ledger.load(read_regular(self.path))
        except FileNotFoundError:
            pass
        except Exception as e:  # a damaged or hand-made file: RecursionError, MemoryError...
            self.ledger = DeadLetterLedger()
            self.nsqd.log.warn("ignoring {path} - {err}", path=self.path, err=f"{type(e).__name__}: {e}"[:200])
