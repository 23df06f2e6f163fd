"""A message as nsqd sends and stores it: ``[8-byte ns timestamp][2-byte attempts][16-byte ID][body]``.

The same bytes are a message frame's data and a disk-queue record, as in Go
nsqd. This module alone knows the layout: nsqd's Message takes its
``encode``/``frame`` methods from here, the clients decode with :func:`decode`,
the disk queue's recovery finds records with the offsets.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from nsq_wire.frames import FRAME_TYPE_MESSAGE

try:
    import cython
except ModuleNotFoundError:
    from nsq_wire import cython_shim as cython

MSG_ID_LENGTH = 16

T = TypeVar("T")


# the timestamp (8 bytes) and attempts (2) come first
ID_OFFSET = 10


MESSAGE_HEADER_LENGTH = ID_OFFSET + MSG_ID_LENGTH


# the timestamp alone, signed nanoseconds
TIMESTAMP = struct.Struct(">q")


_HEADER = struct.Struct(">qH16s")
# Go writes uint64/uint16: negative timestamps and attempts past 65535 wrap
_ENCODE_HEADER = struct.Struct(">QH")
# frame size, frame type, then the header up to the ID
_FRAME_HEADER = struct.Struct(">iiQH")
_U64 = 0xFFFF_FFFF_FFFF_FFFF


class Fields(Protocol):
    id: bytes
    body: bytes
    timestamp: int
    attempts: int


def encode(m: Fields) -> bytes:
    """The message frame's data, and the disk-queue record."""
    return _ENCODE_HEADER.pack(m.timestamp & _U64, m.attempts & 0xFFFF) + m.id + m.body


def records(ids: list[bytes], bodies: list[bytes], timestamp: int) -> list[bytes]:
    """The records of messages published together: one timestamp, no attempts yet."""
    header = _ENCODE_HEADER.pack(timestamp & _U64, 0)
    return [header + i + b for i, b in zip(ids, bodies, strict=True)]


def frame(m: Fields) -> bytes:
    """The whole message frame: size, type, then :func:`encode`'s bytes."""
    return (
        _FRAME_HEADER.pack(
            len(m.body) + MESSAGE_HEADER_LENGTH + 4, FRAME_TYPE_MESSAGE, m.timestamp & _U64, m.attempts & 0xFFFF
        )
        + m.id
        + m.body
    )


def frames(msgs: Sequence[Fields]) -> bytes:
    """The message frames of ``msgs`` back to back: a burst to one consumer, one buffer."""
    pack = _FRAME_HEADER.pack
    size = MESSAGE_HEADER_LENGTH + 4
    return b"".join(
        [
            pack(len(m.body) + size, FRAME_TYPE_MESSAGE, m.timestamp & _U64, m.attempts & 0xFFFF) + m.id + m.body
            for m in msgs
        ]
    )


def decode(data: bytes) -> tuple[bytes, bytes, int, int]:
    """``(id, body, timestamp, attempts)`` of a message frame's data or a record."""
    if len(data) < MESSAGE_HEADER_LENGTH:
        raise ValueError(f"invalid message buffer size ({len(data)})")
    timestamp, attempts, msg_id = _HEADER.unpack_from(data)
    return msg_id, data[MESSAGE_HEADER_LENGTH:], timestamp, attempts


@cython.locals(raw=bytes, p=cython.p_uchar, ts=cython.ulonglong, i=cython.int)
def decode_into(make: Callable[[bytes, bytes, int, int], T], data: bytes) -> T:
    """:func:`decode` straight into ``make(id, body, timestamp, attempts)`` (nsqd's Message)."""
    if len(data) < MESSAGE_HEADER_LENGTH:
        raise ValueError(f"invalid message buffer size ({len(data)})")
    if cython.compiled and type(data) is bytes:  # (not a subclass: CutRecord)
        # compiled (setup.py), a record's header is read in place: struct's tuple and the
        # objects in it cost more than the rest of the message (once per message delivered)
        raw = data
        p = raw
        ts = 0
        for i in range(8):
            ts = (ts << 8) | p[i]
        return make(
            raw[ID_OFFSET:MESSAGE_HEADER_LENGTH],
            raw[MESSAGE_HEADER_LENGTH:],
            cython.cast(cython.longlong, ts),
            (p[8] << 8) | p[9],
        )
    timestamp, attempts, msg_id = _HEADER.unpack_from(data)
    return make(msg_id, data[MESSAGE_HEADER_LENGTH:], timestamp, attempts)


def message_id(data: bytes) -> bytes:
    """The ID of a message frame's data, without decoding the rest."""
    return data[ID_OFFSET:MESSAGE_HEADER_LENGTH]
