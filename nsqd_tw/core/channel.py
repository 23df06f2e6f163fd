"""A channel: one copy of a topic's stream, shared by its subscribers.

The channel owns its queued messages (memory, then backend), the messages in
flight to its consumers and the deferred ones. It hands a message to a
consumer as soon as one has RDY capacity, spreading messages round-robin
across consumers. It never touches sockets or the reactor: time and
scheduling come from the ``ctx`` (the NSQD) it was made with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from nsq_wire.names import is_ephemeral
from nsqd_tw.core.bounds import trim
from nsqd_tw.core.channelqueue import ChannelError, ChannelQueue
from nsqd_tw.core.deadletters import dead_at_return, expired_to_dead_letter
from nsqd_tw.core.expiry import deliver_one
from nsqd_tw.core.message import Message
from nsqd_tw.core.pqueue import DeferredQueue, TimeoutQueue
from nsqd_tw.core.quantile import Quantile, new_latency_quantile
from nsqd_tw.core.queue import Context, as_items
from nsqd_tw.core.skips import unskipped

if TYPE_CHECKING:
    from nsqd_tw.core.rewind import Copies, Rewind

# the most bytes of bodies one burst to a consumer carries
BURST_BYTES = 1 << 20


class Consumer(Protocol):
    """What a channel needs of a subscribed client (the TCP side's ClientV2)."""

    id: int
    ready_count: int
    in_flight_count: int
    msg_timeout: float
    sample_rate: int
    blocked: bool  # its connection is backed up: send it nothing for now

    def send_messages(self, msgs: list[Message]) -> None: ...
    def timed_out_message(self) -> None: ...
    def empty(self) -> None: ...
    def close(self) -> None: ...


class Channel(ChannelQueue):
    write_error = "CHANNEL({name}): failed to write message to backend - {err}"

    @property
    def save_name(self) -> str:
        return f"CHANNEL({self.topic_name}:{self.name})"

    def __init__(self, topic_name: str, name: str, ctx: Context) -> None:
        # with --mem-queue-size=0 every message goes through the backend, as
        # in Go; ephemeral channels have no backend, so they use memory
        ephemeral = is_ephemeral(name)
        in_memory = ctx.opts.mem_queue_size > 0 or ephemeral
        super().__init__(name, f"{topic_name}:{name}", ctx, ephemeral, in_memory)
        self.topic_name = topic_name
        self.paused = False
        self.exiting = False
        opts = ctx.opts
        self.in_flight = TimeoutQueue()
        self.deferred = DeferredQueue()

        self.clients: dict[int, Consumer] = {}
        self._consumers: list[Consumer] = []
        self._rr = 0
        self.more_scheduled = False  # a delivery that stepped over many expired goes on next turn
        self.rewind: Rewind | None = None  # beyond Go: retained messages it is getting again
        # a rewind's copies may meet the messages they copy: no ID is in flight twice (core/rewind.py)
        self.copies: Copies | None = None

        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.dead_letter_count = 0
        self.finish_count = 0
        self.duplicate_count = 0  # beyond Go: copies not delivered, their message in flight (rewinds)
        # beyond Go, a replication standby's channel: how many copies of each message ID
        # its primary finished or superseded that are still queued here (core/skips.py)
        self.skips: dict[bytes, int] = {}
        # --e2e-processing-latency-percentile: publish to FIN (Go's), and (beyond Go)
        # delivery to FIN, the consumer's own time; both or neither
        self.e2e: Quantile | None = None
        self.fin_latency: Quantile | None = None
        if opts.e2e_processing_latency_percentiles:
            self.e2e = new_latency_quantile(opts, ctx.now())
            self.fin_latency = new_latency_quantile(opts, ctx.now())

    def __repr__(self) -> str:
        return f"<Channel {self.topic_name}:{self.name}>"

    # -- queueing --------------------------------------------------------

    def put_message(self, msg: Message) -> None:
        self.put_messages((msg,))

    def put_messages(self, msgs: Sequence[Message], keep_on_failure: bool = False) -> None:
        """Queue messages and deliver what consumers have room for."""
        self.stage(as_items(msgs), keep_on_failure)
        self._dispatch()

    def _back(self, msg: Message, delay: float = 0.0) -> None:
        """A message delivered comes back (REQ, timeout, its consumer gone): queued
        again, or deferred for ``delay`` seconds, or past ``max_attempts`` moved to
        the dead-letter topic."""
        shipper = self.ctx.shipper
        if dead_at_return(self, msg):
            if shipper is not None:
                shipper.gone(self, (msg.id,))
            return
        if not delay:
            self._put(msg)
        elif msg.id in self.deferred:
            return
        else:
            due = self.ctx.now() + delay
            self.deferred.push(msg, due)
            if msg.ref is not None:
                self.backend.set_deferred(msg.id, int(due * 1e9))  # survives a crash too
        if shipper is not None:
            shipper.requeued(self, msg, delay)
        if self.trims:
            trim(self)

    def expired(self, msg: Message) -> None:
        if not expired_to_dead_letter(self, msg):
            super().expired(msg)

    def waiting(self) -> tuple[int, int]:
        """What a bound counts: queued and deferred messages (not those in flight)."""
        return self.depth() + len(self.deferred), self.queued_bytes() + self.deferred.bytes

    def discard(self, msg: Message) -> None:
        super().discard(msg)
        if self.ctx.shipper is not None:  # expired or trimmed: gone on the standby too
            self.ctx.shipper.gone(self, (msg.id,))

    def _spare_capacity(self) -> int:
        if self.paused:
            return 0
        return sum(max(0, c.ready_count - c.in_flight_count) for c in self._consumers if not c.blocked)

    def _dispatch(self) -> None:
        """Send queued messages to consumers with RDY capacity, round-robin: each
        gets a burst (its fair share of what is queued, as far as its RDY allows)
        as one buffer, then the next one's turn."""
        consumers = self._consumers
        if self.paused or not consumers:
            return
        queued = len(self.memory) + self.backend.depth()
        if not queued:
            if self.copies is not None:
                self.copies.gone(self)
            if self.skips and not self.in_flight and not self.deferred:
                self.skips.clear()  # (a promoted standby's) counts of copies it never had
            return
        ready = 0
        for c in consumers:
            if c.in_flight_count < c.ready_count and not c.blocked:
                ready += 1
        if not ready:
            return
        share = -(-queued // ready)  # 6 queued, 2 consumers ready: 3 each
        # a burst of at most BURST_BYTES, so that a consumer whose connection backs up
        # (``blocked``) is sent no more than that past it, as it was one message at a time
        queued_bytes = self.memory_bytes + getattr(self.backend, "queued_bytes", 0)
        most = max(1, BURST_BYTES * queued // queued_bytes) if queued_bytes else share
        if most < share:
            share = most
        n = len(consumers)
        i = self._rr
        misses = 0
        now = self.ctx.now()
        max_age = self.policy.max_age
        expire_before = int((now - max_age) * 1e9) if max_age else 0
        push_many = self.in_flight.push_many
        take = self._take
        while misses < n:
            c = consumers[i % n]
            i += 1
            room = c.ready_count - c.in_flight_count
            if room <= 0 or c.blocked:
                misses += 1
                continue
            misses = 0
            if expire_before or c.sample_rate:
                if not deliver_one(self, c, now, expire_before):
                    break
                continue
            want = room if room < share else share
            burst = take(want, c.id, now)
            taken = len(burst)
            if burst:
                if self.skips:
                    burst = unskipped(self, burst)
                if self.copies is not None:
                    burst = self.copies.unique(self, burst)
                push_many(burst, now + c.msg_timeout)
                c.send_messages(burst)
            if taken < want:
                break  # nothing more queued (due now)
            queued -= want
            if want == room and ready > 1:  # it is full: the others share what it could not take
                ready -= 1
                share = min(most, max(1, -(-queued // ready)))
        self._rr = i % n

    def kick(self) -> None:
        """A consumer may have gained capacity (RDY, FIN, REQ, unpause)."""
        if self.memory or self.backend.depth():
            self._dispatch()
        elif self.copies is not None:
            self.copies.gone(self)
        if self.rewind is not None:
            self.rewind.poke()

    # -- consumers -------------------------------------------------------

    def add_client(self, client: Consumer) -> None:
        if self.exiting:
            raise ChannelError("exiting")
        if self.ctx.standby is not None:
            raise ChannelError(str(self.ctx.standby))
        if client.id in self.clients:
            return
        limit = self.ctx.opts.max_channel_consumers
        if limit and len(self.clients) >= limit:
            raise ChannelError(f"consumers for {self.topic_name}:{self.name} exceeds limit of {limit}")
        self.clients[client.id] = client
        self._consumers.append(client)

    def remove_client(self, client_id: int) -> None:
        if self.exiting:
            return
        client = self.clients.pop(client_id, None)
        if client is None:
            return
        self._consumers.remove(client)
        # Beyond Go: what this consumer held comes back now, not at its timeout.
        mine = [m for m in self.in_flight.values() if m.client_id == client_id]
        for msg in mine:
            self.in_flight.remove(msg.id)
            self.requeue_count += 1
            self._back(msg)
        if not self.clients and self.ephemeral:
            self.ctx.channel_emptied(self)
        elif mine:
            self._dispatch()

    # -- in-flight and deferred -----------------------------------------

    def _pop_in_flight(self, client_id: int, msg_id: bytes) -> Message:
        msg = self.in_flight.remove(msg_id)
        if msg is None or msg.client_id != client_id:
            raise self._refusal(msg)
        return msg

    def _refusal(self, msg: Message | None) -> ChannelError:
        """Why a FIN, REQ or TOUCH of ``msg`` (None: not in flight) is refused."""
        if msg is None:
            return ChannelError("ID not in flight")
        self.in_flight.push(msg, msg.pri)  # not this client's: it stays in flight as it was
        return ChannelError("client does not own message")

    def finish_message(self, client_id: int, msg_id: bytes) -> Message:
        msg = self.in_flight.remove(msg_id)  # _pop_in_flight inline: once per message
        if msg is None or msg.client_id != client_id:
            raise self._refusal(msg)
        if msg.ref is not None:
            self.backend.done(msg.ref)
        self.finish_count += 1
        if self.e2e is not None:
            self._finished_latencies(msg)
        if self.ctx.shipper is not None:
            self.ctx.shipper.gone(self, (msg_id,))
        return msg

    def finish_messages(self, client_id: int, ids: list[bytes]) -> tuple[int, list[tuple[bytes, ChannelError]]]:
        """:meth:`finish_message` of each of ``ids`` (the FINs of one read): how
        many were finished, and the IDs refused with why."""
        done, refused = self.in_flight.take_owned(client_id, ids)
        backend = self.backend
        for msg in done:
            if msg.ref is not None:
                backend.done(msg.ref)
        self.finish_count += len(done)
        if self.e2e is not None:
            for msg in done:
                self._finished_latencies(msg)
        if done and self.ctx.shipper is not None:
            self.ctx.shipper.gone(self, [msg.id for msg in done])
        return len(done), [(msg_id, ChannelError(why)) for msg_id, why in refused]

    def _finished_latencies(self, msg: Message) -> None:
        assert self.e2e is not None and self.fin_latency is not None
        now = self.ctx.now()
        self.e2e.insert(self.ctx.now_ns() - msg.timestamp, now)
        self.fin_latency.insert((now - msg.delivery_ts) * 1e9, now)

    def requeue_message(self, client_id: int, msg_id: bytes, delay: float) -> None:
        """REQ: back to the queue now, or after ``delay`` seconds."""
        msg = self._pop_in_flight(client_id, msg_id)
        self.requeue_count += 1
        if delay <= 0:
            if self.exiting:
                raise ChannelError("exiting")
            delay = 0.0
        self._back(msg, delay)

    def touch_message(self, client_id: int, msg_id: bytes, timeout: float) -> None:
        msg = self._pop_in_flight(client_id, msg_id)
        due = self.ctx.now() + timeout
        max_timeout = self.ctx.opts.max_msg_timeout
        if due - msg.delivery_ts >= max_timeout:
            due = msg.delivery_ts + max_timeout
        self.in_flight.push(msg, due)

    def process_in_flight(self, now: float) -> bool:
        """Requeue messages whose consumer did not answer in time."""
        if self.exiting:
            return False
        dirty = False
        for msg in self.in_flight.pop_due(now):
            dirty = True
            self.timeout_count += 1
            client = self.clients.get(msg.client_id)
            if client is not None:
                client.timed_out_message()
            self._back(msg)
        return dirty

    def process_deferred(self, now: float) -> bool:
        """Queue deferred messages whose time has come."""
        if self.exiting:
            return False
        dirty = False
        for msg in self.deferred.pop_due(now):
            dirty = True
            msg.deferred = 0.0
            self._put(msg)
        if dirty and self.trims:
            trim(self)
        return dirty

    def process_queues(self, now: float) -> bool:
        """One queue-scan visit; True if there was work (the channel is dirty)."""
        dirty = self.process_in_flight(now)
        if self.process_deferred(now):
            dirty = True
        if dirty:
            self._dispatch()
        return dirty

    # -- lifecycle -------------------------------------------------------

    def pause(self) -> None:
        self.paused = True
        self.ctx.metadata_changed(self.topic_name)
        if self.ctx.shipper is not None:
            self.ctx.shipper.control("channel_pause", self)

    def unpause(self) -> None:
        self.paused = False
        self.ctx.metadata_changed(self.topic_name)
        self._dispatch()
        if self.rewind is not None:
            self.rewind.poke()
        if self.ctx.shipper is not None:
            self.ctx.shipper.control("channel_unpause", self)

    def empty(self) -> None:
        """Drop every queued, in-flight and deferred message (and a rewind's rest)."""
        if self.ctx.shipper is not None and not self.exiting:
            self.ctx.shipper.control("channel_empty", self)
        if self.rewind is not None:
            self.rewind.cancel("channel emptied")
        self.in_flight.clear()
        self.deferred.clear()
        for client in self._consumers:
            client.empty()
        self._empty()
        self.skips.clear()

    def delete(self) -> None:
        """Close consumers, drop everything, delete the backend."""
        self.exiting = True
        self.ctx.log.info("CHANNEL({name}): deleting", name=self.name)
        if self.rewind is not None:
            self.rewind.cancel("channel deleted")
        self._close_clients()
        self.empty()
        self.backend.delete()

    def is_empty(self) -> bool:
        """Nothing queued, in flight or deferred (every copy a rewind queued is finished)."""
        return not self.in_flight and not self.deferred and not self.depth()

    def rewind_state(self) -> dict[str, Any] | None:
        """What nsqd.dat keeps of its rewind (beyond Go: :meth:`Copies.state`)."""
        return self.copies.state(self) if self.copies is not None else None

    def close(self, retire_empty: bool = False) -> None:
        """Close consumers and hand everything still held to the backend.
        ``retire_empty`` (a drained nsqd): a channel that holds nothing deletes
        its backend's files instead of keeping them for the next start."""
        retire = retire_empty and self.is_empty()
        self.exiting = True
        self.ctx.log.info("CHANNEL({name}): closing", name=self.name)
        if self.copies is not None:
            self.copies.close(self)  # before its memory is saved below
        self._close_clients()
        self._flush()
        self._release_backend(retire)

    def _close_clients(self) -> None:
        for client in list(self._consumers):
            client.close()

    def _flush(self) -> None:
        """Write what is held in memory to the backend, deferred ones with their
        deliver-at time. In durable mode the records these were read from are
        then done, so a clean restart reads each message once."""
        n_mem, n_inf, n_def = len(self.memory), len(self.in_flight), len(self.deferred)
        if n_mem or n_inf or n_def:
            self.ctx.log.info(
                "CHANNEL({name}): flushing {m} memory {i} in-flight {d} deferred messages to backend",
                name=self.name,
                m=n_mem,
                i=n_inf,
                d=n_def,
            )
        msgs = self._clear_memory() + self.in_flight.clear()
        self._save(msgs, self.deferred.clear())
