"""Frames of the NSQ TCP protocols: magics, frame types, packing and splitting."""

from __future__ import annotations

import struct

MAGIC_V2 = b"  V2"


MAGIC_V1 = b"  V1"


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


def unpack_frames(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Split ``buf`` into complete frames; return them and the remainder."""
    frames = []
    pos = 0
    end = len(buf)
    while end - pos >= 8:
        size, frame_type = _FRAME_HEADER.unpack_from(buf, pos)
        if size < 4:
            raise ValueError(f"invalid frame size {size}")
        if end - pos - 4 < size:
            break
        frames.append((frame_type, buf[pos + 8 : pos + 4 + size]))
        pos += 4 + size
    return frames, buf[pos:]
