"""nsqd's Message; its bytes are :mod:`nsq_wire.message`'s."""

from __future__ import annotations

from functools import partial

from nsq_wire import message as layout
from nsq_wire.message import MessageFields

try:
    import cython
except ModuleNotFoundError:
    from nsq_wire import cython_shim as cython

_decode_into = layout.decode_into
_decode_fields = layout.decode_fields


class Message(MessageFields):
    """A message as one channel (or a topic) holds it.

    ``deferred`` is the DPUB delay in seconds. ``client_id``, ``delivery_ts``,
    ``pri`` and ``bucket`` belong to the in-flight and deferred bookkeeping;
    ``ref`` is the backend's token for the record it was read from (durable mode).
    """

    __slots__ = ("bucket", "client_id", "deferred", "delivery_ts", "pri", "ref")

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int = 0) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.deferred = 0.0
        self.client_id = 0
        self.delivery_ts = 0.0
        self.pri = 0.0
        self.bucket: dict[bytes, Message] | None = None
        self.ref: object | None = None

    def copy(self) -> Message:
        """A fresh copy for another channel: same ID, body, timestamp, delay."""
        m = Message(self.id, self.body, self.timestamp)
        m.deferred = self.deferred
        return m

    @staticmethod
    def decode(data: bytes) -> Message:
        """A record, or a message frame's data, as a Message (once per message delivered)."""
        # compiled: made without __init__'s call and filled in place (a record in exact bytes)
        m = cython.cast(Message, Message.__new__(Message))
        if not _decode_fields(m, data):
            return _decode_into(Message, data)
        # (compiled, the times and the owner are C numbers, zero as made)
        return m

    # the layout's functions as methods: no call in between on the hot paths
    encode = layout.encode  # the disk-queue record (and message-frame data)
    frame = layout.frame  # the complete message frame sent to a consumer

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, attempts={self.attempts}, body={self.body[:32]!r})"


if not cython.compiled:
    # uncompiled, no Python call between ``Message.decode(data)`` and the layout's decoder
    # (compiled, Message is an extension type, whose attributes are set once: message.pxd)
    Message.decode = staticmethod(partial(layout.decode_into, Message))  # type: ignore[method-assign]
