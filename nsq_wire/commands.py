"""The V2 commands as a client sends them, and IDENTIFY's usual fields."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_UINT32 = struct.Struct(">I")


NOP = b"NOP\n"


CLS = b"CLS\n"


def encode_command(name: bytes, *params: bytes | str, body: bytes | None = None) -> bytes:
    """Any command: the name and parameters on a line, then the body with its size."""
    parts = [name]
    for p in params:
        parts.append(p.encode() if isinstance(p, str) else p)
    line = b" ".join(parts) + b"\n"
    if body is None:
        return line
    return line + _UINT32.pack(len(body)) + body


def identify_defaults(user_agent: str, client_id: str = "") -> dict[str, Any]:
    """What a client says of itself: ``client_id`` (the short host name unless
    given), ``hostname``, ``user_agent``, and that it negotiates features."""
    hostname = socket.gethostname()
    return {
        "client_id": client_id or hostname.split(".")[0],
        "hostname": hostname,
        "user_agent": user_agent,
        "feature_negotiation": True,
    }


def identify(fields: dict[str, Any]) -> bytes:
    return encode_command(b"IDENTIFY", body=json.dumps(fields).encode())


def auth(secret: bytes) -> bytes:
    return encode_command(b"AUTH", body=secret)


def sub(topic: str, channel: str) -> bytes:
    return encode_command(b"SUB", topic, channel)


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def req(msg_id: bytes, delay_ms: int = 0) -> bytes:
    return b"REQ " + msg_id + b" %d\n" % delay_ms


def touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def pub(topic: str, body: bytes) -> bytes:
    return encode_command(b"PUB", topic, body=body)


def dpub(topic: str, delay_ms: int, body: bytes) -> bytes:
    return encode_command(b"DPUB", topic, str(delay_ms), body=body)


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    """MPUB: the line, then size, count and each message as (size, body)."""
    pack = _UINT32.pack
    payload = [pack(len(bodies))]
    for b in bodies:
        payload.append(pack(len(b)))
        payload.append(b)
    return encode_command(b"MPUB", topic, body=b"".join(payload))
