"""The V1 protocol nsqd speaks to nsqlookupd: the magic, nsqd's commands, the answers.

After ``"  V1"`` nsqd sends newline-terminated commands (IDENTIFY also a
4-byte size and a JSON body); nsqlookupd answers each with a 4-byte
big-endian size and the bytes (``OK``, IDENTIFY's JSON, an error text).
"""

from __future__ import annotations

import struct

MAGIC_V1 = b"  V1"


PING = b"PING\n"


_SIZE = struct.Struct(">i")


def identify(body: bytes) -> bytes:
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


def register(topic: str, channel: str = "") -> bytes:
    return _topic_command(b"REGISTER", topic, channel)


def unregister(topic: str, channel: str = "") -> bytes:
    return _topic_command(b"UNREGISTER", topic, channel)


def _topic_command(verb: bytes, topic: str, channel: str) -> bytes:
    parts = [verb, topic.encode()]
    if channel:
        parts.append(channel.encode())
    return b" ".join(parts) + b"\n"


def pack_response(data: bytes) -> bytes:
    """An answer: a 4-byte big-endian size, then the bytes."""
    return _SIZE.pack(len(data)) + data


class ResponseTooLarge(ValueError):
    def __init__(self, size: int) -> None:
        super().__init__(f"response body size ({size}) is out of range")
        self.size = size


class ResponseReader:
    """nsqlookupd's answers in the bytes it sends; no I/O.

    :meth:`feed` bytes, then :meth:`next` until None. A size below 0 or above
    ``max_size`` raises :class:`ResponseTooLarge`.
    """

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = b""

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> bytes | None:
        buf = self._buf
        if len(buf) < 4:
            return None
        (size,) = _SIZE.unpack_from(buf)
        if size < 0 or size > self.max_size:
            raise ResponseTooLarge(size)
        if len(buf) < 4 + size:
            return None
        self._buf = buf[4 + size :]
        return buf[4 : 4 + size]
