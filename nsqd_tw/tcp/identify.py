"""IDENTIFY: its JSON body as Go decodes it, the settings it asks for, and the answer."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from nsq_wire.errors import FatalClientError
from nsq_wire.version import VERSION

if TYPE_CHECKING:
    from nsqd_tw.options import NSQDOptions
    from nsqd_tw.tcp.client import ClientV2

# IDENTIFY's JSON fields and the Go types they decode into
_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)
_IDENTIFY_FIELDS: dict[str, Any] = {
    "client_id": str,
    "hostname": str,
    "heartbeat_interval": _INT64,
    "output_buffer_size": _INT64,
    "output_buffer_timeout": _INT64,
    "feature_negotiation": bool,
    "tls_v1": bool,
    "deflate": bool,
    "deflate_level": _INT64,
    "snappy": bool,
    "sample_rate": _INT32,
    "user_agent": str,
    "msg_timeout": _INT64,
}


def decode_identify(body: bytes) -> dict[str, Any]:
    """Decode an IDENTIFY body the way Go's encoding/json fills identifyDataV2.

    Unknown keys are ignored, keys match case-insensitively, ``null`` leaves the
    zero value and a value of the wrong type is an error.
    """
    data = json.loads(body.decode("utf-8", "replace"))
    out: dict[str, Any] = {
        name: ("" if kind is str else False if kind is bool else 0) for name, kind in _IDENTIFY_FIELDS.items()
    }
    if data is None:
        return out
    if not isinstance(data, dict):
        raise ValueError(f"json: cannot unmarshal {type(data).__name__} into Go value of type nsqd.identifyDataV2")
    for key, value in data.items():
        name = key.lower()
        kind = _IDENTIFY_FIELDS.get(name)
        if kind is None or value is None:
            continue
        if kind is str:
            ok = isinstance(value, str)
        elif kind is bool:
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and kind[0] <= value <= kind[1]
        if not ok:
            raise ValueError(f"json: cannot unmarshal {value!r} into Go struct field identifyDataV2.{name}")
        out[name] = value
    return out


def apply_identify(client: ClientV2, data: dict[str, Any], opts: NSQDOptions) -> None:
    """Take the settings the client asks for, within nsqd's limits (Go's texts)."""
    client.client_id = data["client_id"]
    client.hostname = data["hostname"]
    client.user_agent = data["user_agent"]

    hb = data["heartbeat_interval"]
    if hb == -1:
        client.heartbeat_interval = 0.0
    elif hb == 0:
        pass
    elif 1000 <= hb <= int(opts.max_heartbeat_interval * 1000):
        client.heartbeat_interval = hb / 1000.0
    else:
        raise ValueError(f"heartbeat interval ({hb}) is invalid")

    timeout = data["output_buffer_timeout"]
    if timeout == -1:
        client.output_buffer_timeout = 0.0
    elif timeout == 0:
        pass
    elif int(opts.min_output_buffer_timeout * 1000) <= timeout <= int(opts.max_output_buffer_timeout * 1000):
        client.output_buffer_timeout = timeout / 1000.0
    else:
        raise ValueError(f"output buffer timeout ({timeout}) is invalid")

    size = data["output_buffer_size"]
    if size == -1:
        client.output_buffer_size = 1
        client.output_buffer_timeout = 0.0
    elif size == 0:
        pass
    elif 64 <= size <= opts.max_output_buffer_size:
        client.output_buffer_size = size
    else:
        raise ValueError(f"output buffer size ({size}) is invalid")

    rate = data["sample_rate"]
    if rate < 0 or rate > 99:
        raise ValueError(f"sample rate ({rate}) is invalid")
    client.sample_rate = rate

    msg_timeout = data["msg_timeout"]
    if msg_timeout == 0:
        pass
    elif 1000 <= msg_timeout <= int(opts.max_msg_timeout * 1000):
        client.msg_timeout = msg_timeout / 1000.0
    else:
        raise ValueError(f"msg timeout ({msg_timeout}) is invalid")


class Features(NamedTuple):
    """What feature negotiation agreed on, and the JSON answer that says so."""

    body: bytes
    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int


def negotiate(client: ClientV2, data: dict[str, Any], opts: NSQDOptions, tls_available: bool) -> Features:
    tls_v1 = tls_available and data["tls_v1"]
    deflate = opts.deflate and data["deflate"]
    deflate_level = 6
    if deflate and data["deflate_level"] > 0:
        deflate_level = data["deflate_level"]
    deflate_level = min(deflate_level, opts.max_deflate_level)
    snappy = opts.snappy and data["snappy"]
    if deflate and snappy:
        raise FatalClientError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
    answer = {
        "max_rdy_count": opts.max_rdy_count,
        "version": VERSION,
        "max_msg_timeout": round(opts.max_msg_timeout * 1000),
        "msg_timeout": round(client.msg_timeout * 1000),
        "tls_v1": tls_v1,
        "deflate": deflate,
        "deflate_level": deflate_level,
        "max_deflate_level": opts.max_deflate_level,
        "snappy": snappy,
        "sample_rate": client.sample_rate,
        "auth_required": bool(opts.auth_http_addresses),
        "output_buffer_size": client.output_buffer_size,
        "output_buffer_timeout": round(client.output_buffer_timeout * 1000),
    }
    body = json.dumps(answer, separators=(",", ":")).encode()
    return Features(body, tls_v1, snappy, deflate, deflate_level)
