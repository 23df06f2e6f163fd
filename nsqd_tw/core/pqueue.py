"""The in-flight and deferred queues: messages by ID, released when due.

Messages are grouped in buckets of ``resolution`` seconds of due time (a
timing wheel): a bucket is a dict, so FIN, REQ and TOUCH remove a message in
O(1) with no stale entries left behind, and pushing one is two dict inserts.
A queued message points at its bucket; every way out of the queue drops that
pointer, so no reference cycle outlives the queueing.
A heap holds the keys of the buckets, not the messages. :meth:`pop_due`
empties every bucket wholly due and takes from the bucket holding ``now``
only what is due, so messages come out exactly when they are due (give or
take the scan interval), never before.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from nsqd_tw.core.message import Message

try:
    import cython
except ModuleNotFoundError:
    from nsq_wire import cython_shim as cython


class TimeoutQueue:
    def __init__(self, resolution: float = 0.1) -> None:
        self.resolution = resolution
        self._index: dict[bytes, Message] = {}
        self._buckets: dict[int, dict[bytes, Message]] = {}
        self._keys: list[int] = []
        # the bucket of the last due time pushed: a dispatch pushes many at one time
        self._last_due: float | None = None
        self._last_bucket: dict[bytes, Message] = {}

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, msg_id: bytes) -> bool:
        return msg_id in self._index

    def get(self, msg_id: bytes) -> Message | None:
        return self._index.get(msg_id)

    def values(self) -> list[Message]:
        return list(self._index.values())

    def _bucket(self, due: float) -> dict[bytes, Message]:
        if due == self._last_due:
            return self._last_bucket
        key = int(due // self.resolution)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = {}
            heapq.heappush(self._keys, key)
        self._last_due, self._last_bucket = due, bucket
        return bucket

    def push(self, msg: Message, due: float) -> None:
        """Queue ``msg`` until ``due``; the caller checks the ID is not queued."""
        msg.pri = due
        bucket = self._bucket(due)
        bucket[msg.id] = msg
        msg.bucket = bucket  # so removal needs no search
        self._index[msg.id] = msg

    @cython.locals(msg=Message)
    def push_many(self, msgs: list[Message], due: float) -> None:
        """:meth:`push` for messages sent together (a burst to one consumer)."""
        bucket = self._bucket(due)
        index = self._index
        for msg in msgs:
            msg.pri = due
            msg.bucket = bucket
            bucket[msg.id] = index[msg.id] = msg

    def remove(self, msg_id: bytes) -> Message | None:
        msg = self._index.pop(msg_id, None)
        if msg is not None:
            bucket = msg.bucket
            if bucket is not None:
                bucket.pop(msg_id, None)  # (a bucket already released is not looked at again)
                if not bucket:
                    bucket.clear()  # see take_owned
                msg.bucket = None
        return msg

    @cython.locals(msg=Message)
    def take_owned(self, owner: int, ids: list[bytes]) -> tuple[list[Message], list[tuple[bytes, str]]]:
        """Remove the messages of ``ids`` held by ``owner`` (their ``client_id``): those
        removed, and the IDs refused with why (not queued, or another owner's: it stays)."""
        index = self._index
        taken: list[Message] = []
        refused: list[tuple[bytes, str]] = []
        for msg_id in ids:
            msg = index.pop(msg_id, None)
            if msg is None:
                refused.append((msg_id, "ID not in flight"))
            elif msg.client_id != owner:
                index[msg_id] = msg  # still in its bucket: nothing else changed
                refused.append((msg_id, "client does not own message"))
            else:
                bucket = msg.bucket
                if bucket is not None:
                    bucket.pop(msg_id, None)
                    if not bucket:
                        # a dict keeps the table it grew to when emptied, and the bucket stays
                        # until its time comes (the message timeout): clear() frees the table
                        bucket.clear()
                    msg.bucket = None
                taken.append(msg)
        return taken, refused

    def pop_due(self, now: float) -> Iterator[Message]:
        """Remove and yield every message due at or before ``now``."""
        keys = self._keys
        buckets = self._buckets
        index = self._index
        limit = int(now // self.resolution)
        due: list[Message] = []
        if keys and keys[0] <= limit:
            self._last_due = None  # that bucket may be released
        while keys and keys[0] <= limit:
            key = keys[0]
            bucket = buckets[key]
            if key < limit:
                heapq.heappop(keys)
                del buckets[key]
                due.extend(bucket.values())
                continue
            ready = [m for m in bucket.values() if m.pri <= now]
            for m in ready:
                del bucket[m.id]
            due.extend(ready)
            if not bucket:
                heapq.heappop(keys)
                del buckets[key]
            break
        for m in due:
            del index[m.id]
            m.bucket = None
        return iter(due)

    def next_due(self) -> float | None:
        for key in sorted(self._keys):
            bucket = self._buckets.get(key)
            if bucket:
                return min(m.pri for m in bucket.values())
        return None

    def clear(self) -> list[Message]:
        msgs = list(self._index.values())
        for m in msgs:
            m.bucket = None
        self._index.clear()
        self._buckets.clear()
        self._last_due = None
        self._keys.clear()
        return msgs


class DeferredQueue(TimeoutQueue):
    """A channel's deferred messages: a :class:`TimeoutQueue` that also counts
    their bodies' bytes, which a ``max_bytes`` bound counts (beyond Go)."""

    def __init__(self, resolution: float = 0.1) -> None:
        super().__init__(resolution)
        self.bytes = 0

    def push(self, msg: Message, due: float) -> None:
        super().push(msg, due)
        self.bytes += len(msg.body)

    def push_many(self, msgs: list[Message], due: float) -> None:
        super().push_many(msgs, due)
        self.bytes += sum(len(m.body) for m in msgs)

    def remove(self, msg_id: bytes) -> Message | None:
        msg = super().remove(msg_id)
        if msg is not None:
            self.bytes -= len(msg.body)
        return msg

    def pop_due(self, now: float) -> Iterator[Message]:
        due = list(super().pop_due(now))
        if due:
            self.bytes -= sum(len(m.body) for m in due)
        return iter(due)

    def clear(self) -> list[Message]:
        self.bytes = 0
        return super().clear()
