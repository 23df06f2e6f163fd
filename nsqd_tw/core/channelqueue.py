"""A channel's queue: what Go's channel holds in its memory channel, its backend
and its deferred queue, and how a publish goes in and a burst comes out.

:class:`ChannelQueue` is the :class:`~nsqd_tw.core.queue.MessageQueue` a
:class:`~nsqd_tw.core.channel.Channel` is: a publish is staged (memory first,
then the backend in one write, a DPUB in the deferred queue) so that the topic
can take it back from every channel if one cannot store it; a message coming
back is put back, never dropped; and a consumer's burst is read from memory and
backend in :meth:`~nsqd_tw.core.queue.MessageQueue._next`'s turns in one pass.
The channel's consumers, what they hold in flight, and its lifecycle are
:class:`~nsqd_tw.core.channel.Channel`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nsq_wire.message import MESSAGE_HEADER_LENGTH
from nsqd_tw.core.message import Message
from nsqd_tw.core.pqueue import DeferredQueue
from nsqd_tw.core.queue import BYTES, Item, MessageQueue

try:
    import cython
except ModuleNotFoundError:
    from nsq_wire import cython_shim as cython


class ChannelError(Exception):
    """A refused channel operation; ``str()`` is Go's text."""


class ChannelQueue(MessageQueue):
    """A channel's memory, backend and deferred queue (see the module's docstring)."""

    # the channel's (core/channel.py): its deferred queue, whether it is closing or
    # being deleted (nothing is staged then), how many messages it was given
    deferred: DeferredQueue
    exiting: bool
    message_count: int

    def _spare_capacity(self) -> int:
        """How many messages the consumers could take at once (an ephemeral
        channel hands them what its memory cannot hold)."""
        raise NotImplementedError

    # -- in: a publish staged, a message put back ---------------------------------------

    def stage(self, items: Sequence[Item], keep_on_failure: bool = False) -> Callable[[], None]:
        """Queue what the topic publishes (records, and deferred messages by their
        delay) without delivering it, and return a function that takes it back.

        Memory first, then the backend, in one write for the batch. If that
        write fails the error is raised and nothing of the batch stays queued,
        unless ``keep_on_failure`` (they came from a backlog nobody else holds),
        when they stay in memory. A topic stages a publish in every channel
        before delivering it, so that a failure in one takes it back from all.
        """
        if self.exiting:
            raise ChannelError("exiting")
        to_backend: list[Item] = []
        in_memory = 0
        deferred_ids: list[bytes] = []
        now = None
        memory, mem_size, mem_bytes = self.memory, self._mem_size, self._mem_bytes
        # beyond Go: a retained topic's backlog kept as runs of its log takes every
        # publish until it is read (storage/spill.py)
        spilling = getattr(self.backend, "spilling", False)
        items_left: Sequence[Item] = items
        if not self.ephemeral and all(map(isinstance, items, BYTES)):  # records only (no DPUB)
            if not (spilling or mem_bytes):  # what memory has room for in one go, the rest to the backend
                in_memory = self._hold_records(items)  # type: ignore[arg-type]
                to_backend = list(items[in_memory:])
                items_left = ()
            elif spilling or len(memory) >= mem_size:  # memory is full: every record to the backend
                to_backend = list(items)
                items_left = ()
        for item in items_left:  # _room_for and _hold inlined below: once per message published
            if not isinstance(item, bytes):  # deferred
                if now is None:
                    now = self.ctx.now()
                if self.backend.acked:
                    to_backend.append(item)  # durable: on disk, with its deliver-at time
                elif item.id not in self.deferred:
                    self.deferred.push(item, now + item.deferred)
                    deferred_ids.append(item.id)
                continue
            size = len(item) - MESSAGE_HEADER_LENGTH
            if not spilling and (
                (len(memory) < mem_size and (not mem_bytes or self.memory_bytes + size <= mem_bytes))
                # Go hands an ephemeral message straight to a waiting consumer even
                # when its memory queue is full (or 0), and drops it otherwise
                or (self.ephemeral and len(memory) < self._spare_capacity())
            ):
                memory.append(item)
                self.memory_bytes += size
                in_memory += 1
            elif not self.ephemeral:
                to_backend.append(item)
        mark = None
        if to_backend:
            try:
                mark = self._write(to_backend)
            except Exception:
                if not keep_on_failure:
                    self._take_back(in_memory, deferred_ids, None, [])
                    raise
                for m in to_backend:
                    if not isinstance(m, bytes):
                        self.deferred.push(m, self.ctx.now() + m.deferred)
                    else:
                        self._hold(m)
                self.message_count += len(items)
                raise
        self.message_count += len(items)

        def take_back() -> None:
            self._take_back(in_memory, deferred_ids, mark, to_backend)
            self.message_count -= len(items)

        return take_back

    def _take_back(self, in_memory: int, deferred_ids: list[bytes], mark: object, written: list[Item]) -> None:
        self._unhold(in_memory)
        for msg_id in deferred_ids:
            self.deferred.remove(msg_id)
        if mark is not None:
            self._unwrite(mark, written)

    def _put(self, msg: Message) -> None:
        """Queue a message coming back (REQ, timeout, release): it is never dropped."""
        if (
            msg.ref is not None  # read in durable mode: still on disk, owned until done
            or self._room_for(msg)
            or (self.ephemeral and len(self.memory) < self._spare_capacity())
        ):
            self._hold(msg)
            return
        if self.ephemeral:
            return
        try:
            self._write([msg])
        except Exception:
            self._hold(msg)  # keep it rather than lose it; health tells the operator

    # -- out: a consumer's burst, or the next message -----------------------------------

    def take_next(self) -> Message | None:
        """The next queued message due now; one deferred (durable mode) waits its time."""
        msg, at = self._next()
        return msg if at is None else self._due(msg, at)

    def _due(self, msg: Message | None, at: int | None) -> Message | None:
        """``msg`` has a deliver-at time (ns; durable mode): it waits in the deferred
        queue if that is to come, and the next message due now is returned."""
        now_ns = self.ctx.now_ns()
        while at is not None and at > now_ns:
            assert msg is not None
            self.deferred.push(msg, at / 1e9)
            msg, at = self._next()
        return msg

    @cython.locals(msg=Message)
    def _take(self, n: int, client_id: int, now: float) -> list[Message]:
        """A burst: up to ``n`` queued messages due now, memory and backend in turns
        as :meth:`_next` takes them, as delivered to consumer ``client_id`` at
        ``now`` (an attempt more)."""
        burst: list[Message] = []
        backend = self.backend
        if not backend.depth():  # memory alone: once per message delivered
            burst = self._take_memory(n)
            if len(burst) & 1:  # as many turns as _next would have taken
                self._take_backend = not self._take_backend
        elif (read_many := getattr(backend, "read_views", None) or getattr(backend, "read_many", None)) is not None:
            self._take_both(burst, n, read_many)
        else:  # a backend without read_many (an embedder's): one at a time
            next_ = self._next
            while len(burst) < n:
                msg, at = next_()
                if at is not None:
                    msg = self._due(msg, at)
                if msg is None:
                    break
                burst.append(msg)
        for msg in burst:
            if msg.attempts < 65535:  # the wire's 16 bits stay full instead of wrapping to 0 (nsqio/nsq#1397)
                msg.attempts += 1
            msg.client_id = client_id
            msg.delivery_ts = now
        return burst

    def _take_memory(self, n: int) -> list[Message]:
        """Up to ``n`` messages from memory, decoded."""
        taken: list[Message] = []
        memory = self.memory
        decode = Message.decode
        size = 0
        while memory and len(taken) < n:
            held = memory.popleft()
            if isinstance(held, bytes):
                size += len(held) - MESSAGE_HEADER_LENGTH
                held = decode(held)
            else:
                size += len(held.body)
            taken.append(held)
        self.memory_bytes -= size
        return taken

    def _take_both(self, burst: list[Message], n: int, read_many: Callable[[int], list[tuple[bytes, object]]]) -> None:
        """:meth:`_take` with records in the backend, in :meth:`_next`'s turns: the
        ``i``-th call prefers the backend iff the flag toggled ``i + 1`` times is
        True, and takes the other source when the preferred one has nothing left;
        the flag is left as that many calls leave it. The backend's turns are read
        in runs; a record with a deliver-at time to come takes its turn and waits
        in the deferred queue."""
        while len(burst) < n:
            want = n - len(burst)
            backend_first = not self._take_backend  # the flag once toggled
            # the backend's turns of the next ``want``: every other one, the first included if backend_first
            from_backend = (want + backend_first) // 2 if self.memory else want
            from_disk, ended = self._read_turns(from_backend, read_many) if from_backend else ([], False)
            # memory's turns, and the backend's too once it has nothing left
            from_memory = self._take_memory(want - len(from_disk) if ended else want - from_backend)
            if len(from_memory) < want - from_backend and not ended:  # memory ran out: its turns go to the backend
                more, ended = self._read_turns(want - len(from_memory) - len(from_disk), read_many)
                from_disk += more
            turns = len(from_disk) + len(from_memory)
            if not turns:
                break
            first, second = (from_disk, from_memory) if backend_first else (from_memory, from_disk)
            k = min(len(first), len(second))
            taken: list[Any] = [None] * (2 * k)
            taken[0::2] = first[:k]
            taken[1::2] = second[:k]
            taken += first[k:]
            taken += second[k:]
            if turns & 1:  # toggled an odd number of times
                self._take_backend = backend_first
            burst += [m for m in taken if m is not None] if None in from_disk else taken
            if ended and not self.memory:
                break

    @cython.locals(msg=Message)
    def _read_turns(
        self, n: int, read_many: Callable[[int], list[tuple[bytes, object]]]
    ) -> tuple[list[Message | None], bool]:
        """The backend's next ``n`` turns: its messages, None for one whose deliver-at
        time is to come (moved to the deferred queue); and whether it ran out. A
        record that does not decode takes no turn, as in :meth:`_next`."""
        backend = self.backend
        take_deferred = backend.take_deferred
        decode = Message.decode
        out: list[Message | None] = []
        now_ns = None
        while len(out) < n:
            asked = n - len(out)
            records = read_many(asked)
            for data, ref in records:
                try:
                    msg = decode(data)
                except ValueError as e:
                    self.ctx.log.error("failed to decode message - {err}", err=e)
                    backend.done(ref)
                    continue
                msg.ref = ref
                at = take_deferred(msg.id)
                if at is not None:
                    if now_ns is None:
                        now_ns = self.ctx.now_ns()
                    if at > now_ns:
                        self.deferred.push(msg, at / 1e9)
                        out.append(None)
                        continue
                out.append(msg)
            if len(records) < asked:
                return out, True
        return out, False
