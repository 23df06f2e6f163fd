"""Messages and their encodings.

A message travels as ``[8-byte ns timestamp][2-byte attempts][16-byte ID][body]``
both inside a message frame and as a disk-queue record, as in Go nsqd.
"""

from __future__ import annotations

import struct

from nsq_wire.frames import FRAME_TYPE_MESSAGE
from nsq_wire.message import MESSAGE_HEADER_LENGTH, MSG_ID_LENGTH

_HEADER = struct.Struct(">QH")
# frame size, frame type, timestamp, attempts: the bytes before the ID
_FRAME_HEADER = struct.Struct(">iiQH")


class Message:
    """A message as one channel (or a topic) holds it.

    ``deferred`` is the DPUB delay in seconds. ``client_id``, ``delivery_ts``,
    ``pri`` and ``seq`` belong to the in-flight and deferred bookkeeping;
    ``ref`` is the backend's token for the record it was read from (durable mode).
    """

    __slots__ = (
        "attempts",
        "body",
        "client_id",
        "deferred",
        "delivery_ts",
        "id",
        "pri",
        "ref",
        "seq",
        "timestamp",
    )

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int = 0) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.deferred = 0.0
        self.client_id = 0
        self.delivery_ts = 0.0
        self.pri = 0.0
        self.seq = 0
        self.ref: object | None = None

    def copy(self) -> Message:
        """A fresh copy for another channel: same ID, body, timestamp, delay."""
        m = Message(self.id, self.body, self.timestamp)
        m.deferred = self.deferred
        return m

    def encode(self) -> bytes:
        """The disk-queue record (and message-frame payload)."""
        return _HEADER.pack(self.timestamp & 0xFFFFFFFFFFFFFFFF, self.attempts & 0xFFFF) + self.id + self.body

    def frame(self) -> bytes:
        """The complete message frame sent to a consumer."""
        return (
            _FRAME_HEADER.pack(
                len(self.body) + MESSAGE_HEADER_LENGTH + 4,
                FRAME_TYPE_MESSAGE,
                self.timestamp & 0xFFFFFFFFFFFFFFFF,
                self.attempts & 0xFFFF,
            )
            + self.id
            + self.body
        )

    @classmethod
    def decode(cls, data: bytes) -> Message:
        if len(data) < MESSAGE_HEADER_LENGTH:
            raise ValueError(f"invalid message buffer size ({len(data)})")
        timestamp, attempts = _HEADER.unpack_from(data)
        if timestamp >= 1 << 63:
            timestamp -= 1 << 64
        return cls(data[10 : 10 + MSG_ID_LENGTH], data[MESSAGE_HEADER_LENGTH:], timestamp, attempts)

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, attempts={self.attempts}, body={self.body[:32]!r})"
