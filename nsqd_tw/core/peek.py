"""Inspection (beyond Go): what a topic's or channel's queue holds, seen without taking it.

``/topic/peek`` and ``/channel/peek`` (:mod:`nsqd_tw.http.inspect`) show the next
messages of a queue through :meth:`MessageQueue.peek <nsqd_tw.core.queue.MessageQueue.peek>`,
which is :func:`peek`: memory and backend in the turns a delivery will take them,
a fresh copy of each, bounded in bytes so that an answer reads at most that much
of the backend whatever the backlog.
"""

from __future__ import annotations

import inspect
from collections import deque
from itertools import islice
from typing import Any, Protocol

from nsq_wire.message import MESSAGE_HEADER_LENGTH, decode_into
from nsqd_tw.core.message import Message
from nsqd_tw.storage.backend import CutRecord, IBackendQueue, take_bounded

Item = bytes | Message  # as nsqd_tw.core.queue.Item


class Queue(Protocol):
    """What a peek looks at (:class:`nsqd_tw.core.queue.MessageQueue`)."""

    memory: deque[Item]
    backend: IBackendQueue
    _take_backend: bool  # which of memory and backend the last take preferred


def peek(queue: Queue, n: int, max_bytes: int | None = None) -> list[Message]:
    """Up to ``n`` queued messages of ``queue`` in the order its ``_next`` would
    take them (memory and backend in turns), none taken. Fresh copies: changing one
    changes nothing queued. With ``max_bytes``, only those whose records
    total at most that many bytes, in order; the first, alone over it, comes
    as a :class:`CutMessage`, its body cut to fit (the backend reads no more
    than the bound)."""
    if max_bytes is not None:
        max_bytes = max(max_bytes, MESSAGE_HEADER_LENGTH)  # a cut record is still a message
    memory = list(islice(queue.memory, max(n, 0)))
    backend, stopped = _backend_peek(queue.backend, n, max_bytes)
    order: list[Item] = []
    m = b = 0
    take_backend = queue._take_backend
    while len(order) < n:
        take_backend = not take_backend
        if b < len(backend) and (take_backend or m == len(memory)):
            order.append(backend[b])
            b += 1
        elif stopped and b == len(backend) and (take_backend or m == len(memory)):
            break  # the backend's next record did not fit: nothing after it does
        elif m < len(memory):
            order.append(memory[m])
            m += 1
        else:
            break
    if max_bytes is not None:
        return _bounded(order, max_bytes)
    return [Message.decode(i if isinstance(i, bytes) else i.encode()) for i in order]


# IBackendQueue's peek came later than the rest: a backend written before it (an
# embedder's) shows nothing queued in it (as for head_timestamp: core/queue.py)


def _backend_peek(backend: IBackendQueue, n: int, max_bytes: int | None = None) -> tuple[list[bytes], bool]:
    """The backend's next ``n`` records, bounded by ``max_bytes`` as
    :func:`peek` says (by the backend itself when its ``peek`` takes
    the bound); and whether the bound stopped them short of what it holds."""
    peek = getattr(backend, "peek", None)
    if peek is None or n <= 0:
        return [], False
    if max_bytes is None:
        records: list[bytes] = peek(n)
    elif _takes_max_bytes(peek):
        records = peek(n, max_bytes=max_bytes)
    else:  # a backend written before the bound: what it read, bounded here
        records = take_bounded(peek(n), max_bytes)
    stopped = max_bytes is not None and len(records) < min(n, backend.depth())
    return [r for r in records if len(r) >= MESSAGE_HEADER_LENGTH], stopped  # what _next would skip


def _takes_max_bytes(peek: Any) -> bool:
    try:
        params = inspect.signature(peek).parameters
    except (TypeError, ValueError):
        return False
    return "max_bytes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class CutMessage(Message):
    """A peeked message whose body was cut to a byte bound; ``body_bytes``: its whole body's size."""

    __slots__ = ("body_bytes",)

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int = 0) -> None:
        super().__init__(id, body, timestamp, attempts)
        self.body_bytes = len(body)


def _bounded(items: list[Item], max_bytes: int) -> list[Message]:
    """``items`` as messages while their records total at most ``max_bytes``; the
    first, alone over it, as a CutMessage (a CutRecord from the backend, or cut here)."""
    out: list[Message] = []
    total = 0
    for item in items:
        if isinstance(item, bytes):
            size = item.size if isinstance(item, CutRecord) else len(item)
        else:
            size = MESSAGE_HEADER_LENGTH + len(item.body)
        total += size
        if total <= max_bytes:
            out.append(Message.decode(item) if isinstance(item, bytes) else _copy(item))
            continue
        if not out:
            if isinstance(item, bytes):
                cut = decode_into(CutMessage, item[:max_bytes])
            else:
                cut = CutMessage(item.id, item.body[: max_bytes - MESSAGE_HEADER_LENGTH], item.timestamp, item.attempts)
            cut.body_bytes = size - MESSAGE_HEADER_LENGTH
            out.append(cut)
        break
    return out


def _copy(msg: Message) -> Message:
    """A queued message as peek shows it: the fields a record has (the body is shared: bytes)."""
    return Message(msg.id, msg.body, msg.timestamp, msg.attempts)
