"""A topic: where producers publish; it copies each message to every channel.

While a topic has no channel, is paused or is not yet started, it holds what
is published (memory, then backend) and a pump hands the backlog to the
channels later, a batch per reactor turn. Otherwise messages go straight to
the channels.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from nsq_wire.names import is_ephemeral
from nsqd_tw.core.bounds import trim, would_overflow
from nsqd_tw.core.channel import Channel, ChannelError
from nsqd_tw.core.expiry import release_if_empty
from nsqd_tw.core.message import Message
from nsqd_tw.core.quantile import Quantile, new_latency_quantile
from nsqd_tw.core.queue import BYTES, Context, Item, MessageQueue, QueueFull, as_items, body_size, timestamp
from nsqd_tw.core.settings import CHANNEL_KEYS, KEYS, TOPIC_ONLY, SettingsError, merge_settings, resolve

if TYPE_CHECKING:
    from nsqd_tw.storage.retained import RetainedLog

PUMP_BATCH = 512


class TopicError(Exception):
    """A refused topic operation; ``str()`` is Go's text."""


class RefusedError(TopicError):
    """nsqd takes no new message, topic or channel now (draining, a standby)."""


class DrainingError(RefusedError):
    """nsqd is draining: it takes no new message, topic or channel."""

    def __init__(self) -> None:
        super().__init__("nsqd is draining")


class StandbyError(RefusedError):
    """Beyond Go: this nsqd is a replication standby; ``primary`` is the TCP address
    of its primary ("" while it knows none), ``primary_http`` its HTTP address."""

    def __init__(
        self, primary: str, epoch: int, primary_http: str = "", text: str = "", health: str = "", code: str = "STANDBY"
    ) -> None:
        self.code = code  # what HTTP answers: STANDBY (or a primary STARTING, DEPOSED)
        self.primary = primary
        self.primary_http = primary_http
        self.epoch = epoch
        where = f"primary {primary}" if primary else "no primary yet"
        super().__init__(text or f"this nsqd is a standby ({where}, epoch {epoch})")
        # what GET /ping says after "NOK - "
        self.health = health or f"standby of {primary or 'no primary yet'} (epoch {epoch})"


class Topic(MessageQueue):
    write_error = "TOPIC({name}) ERROR: failed to write message to backend - {err}"

    @property
    def save_name(self) -> str:
        return f"TOPIC({self.name})"

    def __init__(self, name: str, ctx: Context) -> None:
        super().__init__(name, name, ctx, is_ephemeral(name))
        self.channels: dict[str, Channel] = {}
        self.paused = False
        self.exiting = False
        self.started = False
        self._pump_scheduled = False

        self.message_count = 0
        self.message_bytes = 0
        self._bounded: list[MessageQueue] = []  # beyond Go: this topic and its channels with a bound
        self.retained: RetainedLog | None = None  # beyond Go: every message published, kept (retention)

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    # -- publishing ------------------------------------------------------

    def flowing(self) -> bool:
        return self.started and not self.paused and bool(self.channels) and not self.memory and not self.backend.depth()

    def put_message(self, msg: Message) -> None:
        self.put_messages([msg])

    def put_messages(self, msgs: list[Message]) -> None:
        self.put_items(as_items(msgs), sum(len(m.body) for m in msgs))

    def put_items(self, items: list[Item], body_bytes: int, skip: Collection[Channel] = ()) -> None:
        """Publish records (and deferred messages) holding ``body_bytes`` of bodies;
        ``skip``: channels that must not get them (a dead letter already past their
        TTL), when the topic hands them to its channels at once."""
        if self.exiting:
            raise TopicError("exiting")
        if self.retained is not None:
            self._put_retained(items, body_bytes, skip)
            return
        self._put(items, body_bytes, skip)

    def _put_retained(self, items: list[Item], body_bytes: int, skip: Collection[Channel]) -> None:
        """Publish with a retained log: written there first (so the disk budget
        makes room there before anything else is refused), taken back if the
        publish fails."""
        retained = self.retained
        assert retained is not None
        ctx = self.ctx
        records = items
        if not all(map(isinstance, items, BYTES)):
            records = [i if isinstance(i, bytes) else i.encode() for i in items]
        try:
            mark = retained.append(records, ctx.now_ns())  # type: ignore[arg-type]
        except Exception as e:
            ctx.set_health(e)
            ctx.log.error("TOPIC({name}) ERROR: failed to write to the retained log - {err}", name=self.name, err=e)
            raise
        if ctx.health_error is not None:
            ctx.set_health(None)  # a write works again (as a channel's disk write says)
        try:
            self._put(items, body_bytes, skip)
        except BaseException:
            retained.take_back(mark)
            raise
        limit = self.policy.retention_bytes
        if limit and retained.bytes > limit and not retained.mirror:  # a copy is trimmed as its primary says
            retained.trim(limit)

    def _put(self, items: list[Item], body_bytes: int, skip: Collection[Channel] = ()) -> None:
        if self._bounded:
            self._check_bounds(len(items), body_bytes)
        if self.flowing():
            self._deliver(items, skip=skip)
        else:
            self._keep(items)
            self._schedule_pump()
        self.message_count += len(items)
        self.message_bytes += body_bytes
        if self._bounded:
            self._trim()

    def _check_bounds(self, n: int, size: int) -> None:
        """``overflow: reject``: refuse the whole publish if it would pass a bound."""
        flowing = self.flowing()
        for queue in self._bounded:
            if queue is self and flowing:
                continue  # nothing stays in the topic
            reason = would_overflow(queue, n, size)
            if reason is not None:
                raise QueueFull(f"{queue.save_name} {reason} (overflow reject)")

    def _trim(self) -> None:
        for queue in self._bounded:
            trim(queue)

    def _keep(self, items: list[Item]) -> None:
        """Keep messages until they can flow: memory first, then one backend write.
        If the write fails, none of them is kept."""
        to_backend: list[Item] = []
        in_memory = 0
        memory, mem_size, mem_bytes = self.memory, self._mem_size, self._mem_bytes
        if not mem_bytes and all(map(isinstance, items, BYTES)):  # records only: in one go
            in_memory = self._hold_records(items)  # type: ignore[arg-type]
            to_backend = items[in_memory:]
        else:
            for item in items:  # _room_for and _hold, inlined: once per message published
                size = body_size(item)
                if len(memory) < mem_size and (not mem_bytes or self.memory_bytes + size <= mem_bytes):
                    memory.append(item)
                    self.memory_bytes += size
                    in_memory += 1
                else:
                    to_backend.append(item)
        if self.ephemeral:  # an ephemeral topic drops what memory can't hold, as in Go
            to_backend = []
        if to_backend:
            try:
                self._write(to_backend)
            except Exception:
                self._unhold(in_memory)
                raise

    def _deliver(self, items: list[Item], from_backlog: bool = False, skip: Collection[Channel] = ()) -> None:
        """Hand a publish to every channel: the records are shared (a deferred
        message is copied for each channel but the first).

        A publish is staged in every channel before any of it is delivered: if
        one channel cannot store it, it is taken back from the others and the
        error is raised, so a failed PUB or MPUB leaves nothing anywhere. A
        backlog (``from_backlog``) is never taken back: each channel keeps it.
        """
        channels = list(self.channels.values())
        if skip:
            channels = [c for c in channels if c not in skip]
        shared = all(map(isinstance, items, BYTES)) if len(channels) > 1 else True
        staged: list[Callable[[], None]] = []
        failure: Exception | None = None
        for n, channel in enumerate(channels):
            batch = items if n == 0 or shared else [i if isinstance(i, bytes) else i.copy() for i in items]
            try:
                staged.append(channel.stage(batch, from_backlog))
            except ChannelError as e:
                self.ctx.log.error(
                    "TOPIC({name}) ERROR: failed to put msgs to channel({channel}) - {err}",
                    name=self.name,
                    channel=channel.name,
                    err=e,
                )
            except Exception as e:
                failure = failure or e
                if not from_backlog:
                    break
        if failure is not None and not from_backlog:
            for take_back in reversed(staged):
                take_back()
            raise failure
        for channel in channels:
            channel.kick()

    def _schedule_pump(self) -> None:
        if self._pump_scheduled or not self.started or self.paused or not self.channels:
            return
        if not self.memory and not self.backend.depth():
            return
        self._pump_scheduled = True
        self.ctx.schedule(self._pump)

    def _pump(self) -> None:
        """Hand one batch of the backlog to the channels, records as they are held
        (decoded only for a deferred message, which needs its delay)."""
        self._pump_scheduled = False
        if self.exiting or self.paused or not self.channels:
            return
        batch: list[Item] = []
        refs: list[object] = []
        now_ns = self.ctx.now_ns()
        expire_before = now_ns - int(self.policy.max_age * 1e9) if self.policy.max_age else 0
        next_item = self._next_item
        taken = 0
        expired = False
        while taken < PUMP_BATCH:  # expired ones too: a backlog of them is dropped a batch a turn
            taken += 1
            item, ref, at = next_item()
            if item is None:
                break
            if ref is not None:
                refs.append(ref)  # durable mode: done once the channels hold it
            if not isinstance(item, bytes):  # a DPUB held in memory, or one put back
                if item.ref is not None:
                    refs.append(item.ref)
                    item.ref = None
                if not item.deferred:
                    item = item.encode()
            if expire_before and timestamp(item) < expire_before:
                self.expired_count += 1  # its ref, if any, is done below with the others
                expired = True
                continue
            if at is not None and at > now_ns:
                msg = Message.decode(item)  # type: ignore[arg-type]
                msg.deferred = (at - now_ns) / 1e9
                item = msg
            batch.append(item)
        if batch:
            self._deliver(batch, from_backlog=True)
        for ref in refs:
            self.backend.done(ref)
        if expired:
            release_if_empty(self)
        if self._bounded:
            self._trim()
        self._schedule_pump()

    # -- channels --------------------------------------------------------

    def aggregate_e2e(self, now: float) -> Quantile | None:
        """The channels' end-to-end latency merged (None if none tracks it)."""
        return self._aggregate([c.e2e for c in self.channels.values()], now)

    def aggregate_fin_latency(self, now: float) -> Quantile | None:
        """The channels' delivery-to-FIN latency merged (None if none tracks it)."""
        return self._aggregate([c.fin_latency for c in self.channels.values()], now)

    def _aggregate(self, quantiles: list[Quantile | None], now: float) -> Quantile | None:
        merged = None
        for q in quantiles:
            if q is None:
                continue
            if merged is None:
                merged = new_latency_quantile(self.ctx.opts, now)
            merged.merge(q, now)
        return merged

    def get_channel(self, name: str, *, while_draining: bool = False, replicated: bool = False) -> Channel:
        """The channel, created if it does not exist; while nsqd drains a new one
        is refused (:class:`DrainingError`) unless ``while_draining``; a standby
        creates one only from its primary (``replicated``)."""
        channel = self.channels.get(name)
        if channel is None:
            if not replicated:
                if self.ctx.standby is not None:
                    raise self.ctx.standby
                if self.ctx.draining and not while_draining:
                    raise DrainingError()
            channel = Channel(self.name, name, self.ctx)
            self.channels[name] = channel
            self.apply_policies()
            self.ctx.log.info("TOPIC({topic}): new channel({channel})", topic=self.name, channel=name)
            self.ctx.channel_created(channel)
            self._schedule_pump()
        return channel

    # -- settings (beyond Go) ----------------------------------------------------

    def update_settings(self, changes: Mapping[str, Any], channel: Channel | None = None) -> None:
        """Set (a value) or clear (None) own settings of this topic or of one of
        its channels; raises :class:`SettingsError` for a dead-letter loop."""
        target: MessageQueue = self if channel is None else channel
        own = merge_settings(target.own_settings, changes)
        if own.get("dead_letter_topic") == self.name:
            raise SettingsError("dead_letter_topic must not be the topic itself")
        for key in TOPIC_ONLY:
            if changes.get(key) is not None:
                if channel is not None:
                    raise SettingsError(f"{key} is a topic setting (a topic's retained log serves all its channels)")
                if self.ephemeral:
                    raise SettingsError(f"{key}: an ephemeral topic keeps nothing on disk")
        old, target.own_settings = target.own_settings, own
        try:
            self.apply_policies()
        except Exception:
            target.own_settings = old  # not applied: nothing of the change stays
            self.apply_policies()
            raise
        if not target.ephemeral:
            self.ctx.metadata_changed(self.name)
        if self.ctx.shipper is not None:
            self.ctx.shipper.control("settings", self, channel)

    def apply_policies(self) -> None:
        """What applies to this topic and its channels, after a change of settings."""
        defaults = self.ctx.settings_defaults
        self.set_policy(resolve(self.own_settings, defaults, keys=CHANNEL_KEYS if self.ephemeral else KEYS))
        for c in self.channels.values():
            c.set_policy(resolve(c.own_settings, self.own_settings, defaults, keys=CHANNEL_KEYS))
        # a standby keeps whatever its primary keeps: the primary's trims reach it as FINs
        queues = () if self.ctx.standby is not None else (self, *self.channels.values())
        self._bounded = [q for q in queues if q.policy.bounded]
        self.trims = False
        for c in self.channels.values():
            c.trims = False
        for q in self._bounded:
            q.trims = q.policy.overflow == "drop_oldest"
        if not self.ctx.loading:
            self.apply_retention()
            self.apply_bounds()

    def apply_bounds(self) -> None:
        """A bound set or lowered applies at once (``drop_oldest``; a full ``reject``
        queue refuses publishes until it is back under its bound)."""
        if self._bounded and not self.exiting:
            self._trim()

    def apply_retention(self) -> None:
        """Open, reconfigure or delete the retained log as the policy says."""
        if self.exiting:
            return
        if self.policy.retained:
            if self.retained is None:
                self.retained = self.ctx.retention.open_retained(self)
            else:
                self.ctx.retention.retention_changed(self)
        elif self.retained is not None:
            self.ctx.retention.drop_retained(self, "retention turned off")

    def get_existing_channel(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            raise TopicError("channel does not exist")
        return channel

    def delete_existing_channel(self, name: str) -> None:
        channel = self.channels.get(name)
        if channel is None:
            raise TopicError("channel does not exist")
        self.ctx.log.info("TOPIC({topic}): deleting channel {channel}", topic=self.name, channel=name)
        channel.delete()
        del self.channels[name]
        self.apply_policies()
        self.ctx.channel_deleted(channel)
        if not self.channels and self.ephemeral:
            self.ctx.topic_emptied(self)

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """Let messages flow to channels (after lookupd channels are created)."""
        self.started = True
        self._schedule_pump()
        if self.ctx.shipper is not None:
            self.ctx.shipper.control("topic_start", self)

    def pause(self) -> None:
        self.paused = True
        self.ctx.metadata_changed(self.name)
        if self.ctx.shipper is not None:
            self.ctx.shipper.control("topic_pause", self)

    def unpause(self) -> None:
        self.paused = False
        self.ctx.metadata_changed(self.name)
        self._schedule_pump()
        if self.ctx.shipper is not None:
            self.ctx.shipper.control("topic_unpause", self)

    def empty(self) -> None:
        if self.ctx.shipper is not None and not self.exiting:
            self.ctx.shipper.control("topic_empty", self)
        self._empty()

    def delete(self, keep_retained: bool = False) -> None:
        """Delete every channel and drop everything held (``keep_retained``: but
        close its retained log rather than delete it)."""
        self.exiting = True
        self.ctx.log.info("TOPIC({name}): deleting", name=self.name)
        for channel in list(self.channels.values()):
            channel.delete()
            self.ctx.channel_deleted(channel)
        self.channels.clear()
        self.empty()
        self.backend.delete()
        if self.retained is not None:
            if keep_retained:
                self.ctx.retention.keep_retained(self)
            else:
                self.ctx.retention.drop_retained(self, "topic deleted")

    def close(self, retire_empty: bool = False) -> None:
        """Close every channel and hand what is held to the backend;
        ``retire_empty``: see :meth:`Channel.close`."""
        retire = retire_empty and not self.depth()
        self.exiting = True
        self.ctx.log.info("TOPIC({name}): closing", name=self.name)
        for channel in self.channels.values():
            try:
                channel.close(retire_empty)
            except Exception as e:
                self.ctx.stores.could_not_close(f"channel {self.name}:{channel.name}", e)
        if self.memory:
            self.ctx.log.info(
                "TOPIC({name}): flushing {n} memory messages to backend", name=self.name, n=len(self.memory)
            )
            self._save(self._clear_memory(), [])
        self._release_backend(retire)
        if self.retained is not None:
            self.retained.close()
