"""The in-flight and deferred queues: messages by ID, ordered by due time.

A binary heap of ``(due, seq, message)`` with lazy deletion: removing a
message by ID only drops it from the index, and its heap entry is skipped when
it surfaces (its ``seq`` no longer matches). The heap is rebuilt from the live
messages when stale entries outnumber them, so memory stays proportional to
what is really queued and every operation is O(log n) amortised.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from nsqd_tw.message import Message

_seq = itertools.count(1)
# stale entries tolerated before a rebuild: large enough that rebuilding the
# live entries is rare, small enough that stale ones pin little memory
_COMPACT_MIN = 16384


class TimeoutQueue:
    def __init__(self) -> None:
        self._index: dict[bytes, Message] = {}
        self._heap: list[tuple[float, int, Message]] = []

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, msg_id: bytes) -> bool:
        return msg_id in self._index

    def get(self, msg_id: bytes) -> Message | None:
        return self._index.get(msg_id)

    def values(self) -> list[Message]:
        return list(self._index.values())

    def push(self, msg: Message, due: float) -> None:
        """Queue ``msg`` until ``due``; the caller checks the ID is not queued."""
        msg.pri = due
        seq = msg.seq = next(_seq)
        self._index[msg.id] = msg
        heapq.heappush(self._heap, (due, seq, msg))

    def remove(self, msg_id: bytes) -> Message | None:
        msg = self._index.pop(msg_id, None)
        if msg is not None and len(self._heap) > 2 * len(self._index) + _COMPACT_MIN:
            self._compact()
        return msg

    def pop_due(self, now: float) -> Iterator[Message]:
        """Remove and yield every message due at or before ``now``."""
        heap = self._heap
        index = self._index
        while heap and heap[0][0] <= now:
            _, seq, msg = heapq.heappop(heap)
            if msg.seq == seq and index.get(msg.id) is msg:
                del index[msg.id]
                yield msg

    def next_due(self) -> float | None:
        heap = self._heap
        index = self._index
        while heap:
            _, seq, msg = heap[0]
            if msg.seq == seq and index.get(msg.id) is msg:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def clear(self) -> list[Message]:
        msgs = list(self._index.values())
        self._index.clear()
        self._heap.clear()
        return msgs

    def _compact(self) -> None:
        self._heap = [(m.pri, m.seq, m) for m in self._index.values()]
        heapq.heapify(self._heap)
