"""nsqlookupd's HTTP API as its clients use it: the URLs of /lookup, /channels
and /nodes, and what their answers list.

A lookupd is given as ``host:port`` (IPv6 hosts in brackets) or a URL.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

# what nsqd and the clients send as Accept
ACCEPT = "application/vnd.nsq; version=1.0"


def lookup_url(lookupd: str, topic: str) -> str:
    """The topic's producers (nsqd nodes) and channels."""
    return _url(lookupd, "lookup", topic)


def channels_url(lookupd: str, topic: str) -> str:
    return _url(lookupd, "channels", topic)


def nodes_url(lookupd: str) -> str:
    """Every nsqd registered."""
    return _url(lookupd, "nodes")


def _url(lookupd: str, path: str, topic: str | None = None) -> str:
    base = lookupd if "://" in lookupd else f"http://{lookupd}"
    url = f"{base.rstrip('/')}/{path}"
    return url if topic is None else f"{url}?topic={quote(topic, safe='')}"


def producers(body: bytes) -> list[tuple[str, int]]:
    """The ``(broadcast address, TCP port)`` of each nsqd a /lookup or /nodes answer lists."""
    return [(host, tcp) for host, tcp, _ in producer_ports(body)]


def producer_ports(body: bytes) -> list[tuple[str, int, int | None]]:
    """The ``(broadcast address, TCP port, HTTP port or None)`` of each nsqd listed."""
    found: list[tuple[str, int, int | None]] = []
    for p in _answer(body).get("producers") or []:
        if not isinstance(p, dict):
            continue
        host = p.get("broadcast_address") or p.get("address")  # older lookupds said "address"
        port = p.get("tcp_port")
        http = p.get("http_port")
        if isinstance(host, str) and host and isinstance(port, int) and port:
            found.append((host, port, http if isinstance(http, int) and http else None))
    return found


def channels(body: bytes) -> list[str]:
    """The channels a /channels or /lookup answer lists."""
    return [c for c in _answer(body).get("channels") or [] if isinstance(c, str)]


def _answer(body: bytes) -> dict[str, Any]:
    """The JSON object answered; ValueError if it is none."""
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("nsqlookupd's answer is not a JSON object")
    inner = data.get("data")
    if isinstance(inner, dict):  # lookupd before 1.0 wrapped its answers
        return inner
    return data
