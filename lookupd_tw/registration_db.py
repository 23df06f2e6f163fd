"""nsqlookupd's registration DB: who (which nsqd) has which topics and channels.

Keys are :class:`Registration` ``(category, key, subkey)``: ``("client", "", "")``
for every identified nsqd, ``("topic", T, "")`` and ``("channel", T, C)``. Each
maps peer IDs (the nsqd connection's remote address) to a :class:`Producer`.
As in Go, a key stays when its last producer leaves (``/topics`` keeps listing
it) unless it is removed explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# Go reports time.Time{}.UnixNano() for a producer never tombstoned
GO_ZERO_TIME_NS = -6795364578871345152


class Registration(NamedTuple):
    category: str
    key: str
    subkey: str

    def is_match(self, category: str, key: str, subkey: str) -> bool:
        return (
            category == self.category and (key == "*" or self.key == key) and (subkey == "*" or self.subkey == subkey)
        )


@dataclass
class PeerInfo:
    id: str
    remote_address: str = ""
    hostname: str = ""
    broadcast_address: str = ""
    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
    last_update: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }


class Producer:
    __slots__ = ("peer_info", "tombstoned", "tombstoned_at")

    def __init__(self, peer_info: PeerInfo) -> None:
        self.peer_info = peer_info
        self.tombstoned = False
        self.tombstoned_at = 0.0

    def tombstone(self, now: float) -> None:
        self.tombstoned = True
        self.tombstoned_at = now

    def is_tombstoned(self, lifetime: float, now: float) -> bool:
        return self.tombstoned and now - self.tombstoned_at < lifetime

    def __repr__(self) -> str:
        p = self.peer_info
        return f"{p.broadcast_address} [{p.tcp_port}, {p.http_port}]"


class RegistrationDB:
    def __init__(self) -> None:
        self.registrations: dict[Registration, dict[str, Producer]] = {}

    def add_registration(self, k: Registration) -> None:
        self.registrations.setdefault(k, {})

    def add_producer(self, k: Registration, p: Producer) -> bool:
        """Add ``p`` under ``k``; False if that peer was there already."""
        producers = self.registrations.setdefault(k, {})
        if p.peer_info.id in producers:
            return False
        producers[p.peer_info.id] = p
        return True

    def remove_producer(self, k: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove a peer from ``k``: (was it there, how many are left)."""
        producers = self.registrations.get(k)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        return removed, len(producers)

    def remove_registration(self, k: Registration) -> None:
        self.registrations.pop(k, None)

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        if key != "*" and subkey != "*":
            k = Registration(category, key, subkey)
            return [k] if k in self.registrations else []
        return [k for k in self.registrations if k.is_match(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        if key != "*" and subkey != "*":
            return list(self.registrations.get(Registration(category, key, subkey), {}).values())
        seen: dict[str, Producer] = {}
        for k, producers in self.registrations.items():
            if k.is_match(category, key, subkey):
                for peer_id, p in producers.items():
                    seen.setdefault(peer_id, p)
        return list(seen.values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        return [k for k, producers in self.registrations.items() if peer_id in producers]


def filter_by_active(
    producers: list[Producer], inactivity: float, tombstone_lifetime: float, now: float
) -> list[Producer]:
    """Producers that pinged within ``inactivity`` and are not tombstoned."""
    return [
        p
        for p in producers
        if now - p.peer_info.last_update <= inactivity and not p.is_tombstoned(tombstone_lifetime, now)
    ]
