"""Frames of the V2 protocol: the magic, frame types, packing, and a reader for clients."""

from __future__ import annotations

import struct

from nsq_wire.errors import NSQError

MAGIC_V2 = b"  V2"


FRAME_TYPE_RESPONSE = 0


FRAME_TYPE_ERROR = 1


FRAME_TYPE_MESSAGE = 2


OK = b"OK"


HEARTBEAT = b"_heartbeat_"


CLOSE_WAIT = b"CLOSE_WAIT"


_FRAME_HEADER = struct.Struct(">ii")


def pack_frame(frame_type: int, data: bytes) -> bytes:
    """A frame: 4-byte size (type + data), 4-byte type, data."""
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


class FrameReader:
    """The frames in the bytes nsqd sends, as ``(frame type, data)``; no I/O.

    :meth:`feed` bytes, then take the complete frames, one (:meth:`next`) or
    all (:meth:`frames`); a partial frame waits for more bytes. A size below 4
    raises :class:`NSQError`. After a frame that switches the stream (the
    ``OK`` before TLS or compression), :meth:`rest` hands back the bytes read
    past it, to be read the new way.
    """

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0  # where the next frame starts in _buf

    def feed(self, data: bytes) -> None:
        if self._pos:
            self._buf = self._buf[self._pos :] + data
            self._pos = 0
        elif self._buf:
            self._buf += data
        else:
            self._buf = data

    def next(self) -> tuple[int, bytes] | None:
        """The next complete frame, or None."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 8:
            return None
        size, frame_type = _FRAME_HEADER.unpack_from(buf, pos)
        if size < 4:
            raise NSQError(f"invalid frame size {size}")
        end = pos + 4 + size
        if len(buf) < end:
            return None
        self._pos = end
        return frame_type, buf[pos + 8 : end]

    def frames(self) -> list[tuple[int, bytes]]:
        """Every complete frame."""
        buf = self._buf
        pos = self._pos
        end = len(buf)
        unpack = _FRAME_HEADER.unpack_from
        frames = []
        while end - pos >= 8:
            size, frame_type = unpack(buf, pos)
            if size < 4:
                self._pos = pos
                raise NSQError(f"invalid frame size {size}")
            if end - pos - 4 < size:
                break
            frames.append((frame_type, buf[pos + 8 : pos + 4 + size]))
            pos += 4 + size
        self._buf = buf[pos:] if pos < end else b""
        self._pos = 0
        return frames

    def rest(self) -> bytes:
        """The bytes not read yet, taken out of the reader."""
        rest = self._buf[self._pos :]
        self._buf = b""
        self._pos = 0
        return rest
