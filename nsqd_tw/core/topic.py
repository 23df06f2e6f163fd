"""A topic: where producers publish; it copies each message to every channel.

While a topic has no channel, is paused or is not yet started, it holds what
is published (memory, then backend) and a pump hands the backlog to the
channels later, a batch per reactor turn. Otherwise messages go straight to
the channels.
"""

from __future__ import annotations

from collections.abc import Callable

from nsq_wire.names import is_ephemeral
from nsqd_tw.core.channel import Channel, ChannelError
from nsqd_tw.core.message import Message
from nsqd_tw.core.quantile import Quantile
from nsqd_tw.core.queue import Context, Item, MessageQueue, as_items, body_size

PUMP_BATCH = 512


class TopicError(Exception):
    """A refused topic operation; ``str()`` is Go's text."""


class DrainingError(TopicError):
    """nsqd is draining: it takes no new message, topic or channel."""

    def __init__(self) -> None:
        super().__init__("nsqd is draining")


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

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    # -- publishing ------------------------------------------------------

    def _flowing(self) -> bool:
        return self.started and not self.paused and bool(self.channels) and not self.memory and not self.backend.depth()

    def put_message(self, msg: Message) -> None:
        self.put_messages([msg])

    def put_messages(self, msgs: list[Message]) -> None:
        self.put_items(as_items(msgs), sum(len(m.body) for m in msgs))

    def put_items(self, items: list[Item], body_bytes: int) -> None:
        """Publish records (and deferred messages) holding ``body_bytes`` of bodies."""
        if self.exiting:
            raise TopicError("exiting")
        if self._flowing():
            self._deliver(items)
        else:
            self._keep(items)
            self._schedule_pump()
        self.message_count += len(items)
        self.message_bytes += body_bytes

    def _keep(self, items: list[Item]) -> None:
        """Keep messages until they can flow: memory first, then one backend write.
        If the write fails, none of them is kept."""
        to_backend: list[Item] = []
        in_memory = 0
        memory, mem_size, mem_bytes = self.memory, self._mem_size, self._mem_bytes
        for item in items:  # _room_for and _hold, inlined: once per message published
            size = body_size(item)
            if len(memory) < mem_size and (not mem_bytes or self.memory_bytes + size <= mem_bytes):
                memory.append(item)
                self.memory_bytes += size
                in_memory += 1
            elif not self.ephemeral:  # an ephemeral topic drops what memory can't hold, as in Go
                to_backend.append(item)
        if to_backend:
            try:
                self._write(to_backend)
            except Exception:
                self._unhold(in_memory)
                raise

    def _deliver(self, items: list[Item], from_backlog: bool = False) -> None:
        """Hand a publish to every channel: the records are shared (a deferred
        message is copied for each channel but the first).

        A publish is staged in every channel before any of it is delivered: if
        one channel cannot store it, it is taken back from the others and the
        error is raised, so a failed PUB or MPUB leaves nothing anywhere. A
        backlog (``from_backlog``) is never taken back: each channel keeps it.
        """
        channels = list(self.channels.values())
        shared = all(isinstance(i, bytes) for i in items) if len(channels) > 1 else True
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
        """Hand one batch of the backlog to the channels."""
        self._pump_scheduled = False
        if self.exiting or self.paused or not self.channels:
            return
        batch: list[Message] = []
        refs: list[object] = []
        now_ns = self.ctx.now_ns()
        while len(batch) < PUMP_BATCH:
            msg, at = self._next()
            if msg is None:
                break
            if msg.ref is not None:
                refs.append(msg.ref)  # durable mode: done once the channels hold it
                msg.ref = None
            if at is not None and at > now_ns:
                msg.deferred = (at - now_ns) / 1e9
            batch.append(msg)
        if batch:
            self._deliver(as_items(batch), from_backlog=True)
        for ref in refs:
            self.backend.done(ref)
        self._schedule_pump()

    # -- channels --------------------------------------------------------

    def aggregate_e2e(self, now: float) -> Quantile | None:
        """The channels' end-to-end latency merged (None if none tracks it)."""
        merged = None
        for c in self.channels.values():
            if c.e2e is None:
                continue
            if merged is None:
                opts = self.ctx.opts
                merged = Quantile(opts.e2e_processing_latency_window_time, opts.e2e_processing_latency_percentiles, now)
            merged.merge(c.e2e, now)
        return merged

    def get_channel(self, name: str, *, while_draining: bool = False) -> Channel:
        """The channel, created if it does not exist; while nsqd drains a new one
        is refused (:class:`DrainingError`) unless ``while_draining``."""
        channel = self.channels.get(name)
        if channel is None:
            if self.ctx.draining and not while_draining:
                raise DrainingError()
            channel = Channel(self.name, name, self.ctx)
            self.channels[name] = channel
            self.ctx.log.info("TOPIC({topic}): new channel({channel})", topic=self.name, channel=name)
            self.ctx.channel_created(channel)
            self._schedule_pump()
        return channel

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
        self.ctx.channel_deleted(channel)
        if not self.channels and self.ephemeral:
            self.ctx.topic_emptied(self)

    # -- lifecycle -------------------------------------------------------

    def start(self) -> None:
        """Let messages flow to channels (after lookupd channels are created)."""
        self.started = True
        self._schedule_pump()

    def pause(self) -> None:
        self.paused = True
        self.ctx.metadata_changed(self.name)

    def unpause(self) -> None:
        self.paused = False
        self.ctx.metadata_changed(self.name)
        self._schedule_pump()

    def empty(self) -> None:
        self._empty()

    def delete(self) -> None:
        """Delete every channel and drop everything held."""
        self.exiting = True
        self.ctx.log.info("TOPIC({name}): deleting", name=self.name)
        for channel in list(self.channels.values()):
            channel.delete()
            self.ctx.channel_deleted(channel)
        self.channels.clear()
        self.empty()
        self.backend.delete()

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
                self.ctx.could_not_close(f"channel {self.name}:{channel.name}", e)
        if self.memory:
            self.ctx.log.info(
                "TOPIC({name}): flushing {n} memory messages to backend", name=self.name, n=len(self.memory)
            )
            self._save(self._clear_memory(), [])
        self._release_backend(retire)
