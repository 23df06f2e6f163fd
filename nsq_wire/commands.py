"""Commands as a client sends them."""

from __future__ import annotations

import struct

_UINT32 = struct.Struct(">I")


def encode_command(name: bytes, *params: bytes | str, body: bytes | None = None) -> bytes:
    """Encode a command as a client sends it (used by the client and tests)."""
    parts = [name]
    for p in params:
        parts.append(p.encode() if isinstance(p, str) else p)
    line = b" ".join(parts) + b"\n"
    if body is None:
        return line
    return line + _UINT32.pack(len(body)) + body


def encode_mpub(topic: bytes | str, bodies: list[bytes]) -> bytes:
    """MPUB: the line, then size, count and each message as (size, body)."""
    pack = _UINT32.pack
    payload = [pack(len(bodies))]
    for b in bodies:
        payload.append(pack(len(b)))
        payload.append(b)
    body = b"".join(payload)
    return encode_command(b"MPUB", topic, body=body)
