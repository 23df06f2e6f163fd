"""nsqlookupd's registration DB: who (which nsqd) has which topics and channels.

Keys are :class:`Registration` ``(category, key, subkey)``: ``("client", "", "")``
for every identified nsqd, ``("topic", T, "")`` and ``("channel", T, C)``. Each
maps peer IDs (the nsqd connection's remote address) to a :class:`Producer`.
As in Go, a key stays when its last producer leaves (``/topics`` keeps listing
it) unless it is removed explicitly.

A peer that disconnects is *retired* at once (:meth:`RegistrationDB.retire`):
from then on no query sees it, as if all its registrations were gone, while
its entries are removed in batches (:meth:`RegistrationDB.remove_retired`)
so that a peer with many registrations never holds the reactor for long.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    # disconnected: invisible, its entries wait for removal
    gone: bool = field(default=False, repr=False, compare=False)

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
        # each connected peer's registrations, so that finding them does not scan the DB
        self._by_peer: dict[str, dict[Registration, None]] = {}

    def add_registration(self, k: Registration) -> None:
        self.registrations.setdefault(k, {})

    def add_producer(self, k: Registration, p: Producer) -> bool:
        """Add ``p`` under ``k``; False if that peer was there already."""
        peer_id = p.peer_info.id
        producers = self.registrations.setdefault(k, {})
        old = producers.get(peer_id)
        if old is not None and not old.peer_info.gone:
            return False
        # a retired peer's entry with the same ID (a reconnection) is replaced
        producers[peer_id] = p
        self._by_peer.setdefault(peer_id, {})[k] = None
        return True

    def remove_producer(self, k: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove a connected peer from ``k``: (was it there, how many are left)."""
        producers = self.registrations.get(k)
        if producers is None:
            return False, 0
        p = producers.get(peer_id)
        removed = p is not None and not p.peer_info.gone
        if removed:
            del producers[peer_id]
            self._by_peer.get(peer_id, {}).pop(k, None)
        return removed, sum(1 for p in producers.values() if not p.peer_info.gone)

    def remove_registration(self, k: Registration) -> None:
        for peer_id, p in self.registrations.pop(k, {}).items():
            if not p.peer_info.gone:
                self._by_peer.get(peer_id, {}).pop(k, None)

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        if key != "*" and subkey != "*":
            k = Registration(category, key, subkey)
            return [k] if k in self.registrations else []
        return [k for k in self.registrations if k.is_match(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        if key != "*" and subkey != "*":
            producers = self.registrations.get(Registration(category, key, subkey), {})
            return [p for p in producers.values() if not p.peer_info.gone]
        seen: dict[str, Producer] = {}
        for k, producers in self.registrations.items():
            if k.is_match(category, key, subkey):
                for peer_id, p in producers.items():
                    if not p.peer_info.gone:
                        seen.setdefault(peer_id, p)
        return list(seen.values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """A connected peer's registrations."""
        return list(self._by_peer.get(peer_id, ()))

    def retire(self, info: PeerInfo) -> list[Registration]:
        """Hide a disconnected peer from every query now; its registrations, to remove."""
        info.gone = True
        return list(self._by_peer.pop(info.id, ()))

    def remove_retired(self, k: Registration, info: PeerInfo) -> bool:
        """Remove retired ``info`` from ``k``; False if it was not there (or was replaced)."""
        producers = self.registrations.get(k)
        if producers is None:
            return False
        p = producers.get(info.id)
        if p is None or p.peer_info is not info:
            return False
        del producers[info.id]
        return True


def filter_by_active(
    producers: list[Producer], inactivity: float, tombstone_lifetime: float, now: float
) -> list[Producer]:
    """Producers that pinged within ``inactivity`` and are not tombstoned."""
    return [
        p
        for p in producers
        if now - p.peer_info.last_update <= inactivity and not p.is_tombstoned(tombstone_lifetime, now)
    ]
