"""Who may use a replication link (docs/replication.md, "The handshake"): what a
connection may do before it has authenticated.

Before authentication a link holds a HELLO of at most :data:`wire.MAX_HELLO`
bytes (the link's reader refuses a bigger frame from its header) and must end
its handshake within ``--replication-timeout`` (:class:`~.link.Link`); a node
lets at most :data:`MAX_WAITING` links it accepted wait for authentication at
once (:class:`Admission`).
"""

from __future__ import annotations

from typing import Any

from twisted.logger import LogLevel

from nsq_service.limits import RateLimitedLog
from nsqd_tw.replication import wire

MAX_WAITING = 4  # links accepted and not authenticated yet, at once
LOG_INTERVAL = 10.0  # seconds: one line per kind of refusal, then a count


def _links(counts: dict[str, int]) -> str:
    n = counts.get("links", 1)
    return "a link" if n == 1 else f"{n} links"


class Admission:
    """A node's refusals of links that have not authenticated: at most
    ``limit`` waiting at once, and the log lines of every refusal, one per
    kind per :data:`LOG_INTERVAL` (a stranger may open connections in a loop)."""

    def __init__(self, reactor: Any, log: Any, limit: int = MAX_WAITING) -> None:
        self.limit = limit
        self._log = RateLimitedLog(reactor, log, LOG_INTERVAL)

    def admit(self, transport: Any, waiting: int) -> bool:
        """A connection opened with the link's magic while ``waiting`` accepted
        links have not authenticated: True if it may become a link; else it is
        answered with an ERROR frame and closed."""
        if waiting < self.limit:
            return True
        why = f"too many links awaiting authentication (at most {self.limit} at once)"
        transport.write(wire.json_frame(wire.ERROR, {"error": why}))
        transport.loseConnection()
        peer: Any = transport.getPeer()
        address = f"{peer.host}:{peer.port}" if hasattr(peer, "host") else "?"
        self._log.emit(
            "full",
            LogLevel.warn,
            lambda c: f"REPLICATION: refused {_links(c)} (the last from {address}): {why}",
            links=1,
        )
        return False

    def refused(self, address: str, why: str, kind: str) -> None:
        """A link failed before it authenticated (``kind``: a few words naming the
        failure, the key of the rate limit)."""
        self._log.emit(
            ("handshake", kind),
            LogLevel.error,
            lambda c: f"REPLICATION: refused {_links(c)} before authentication (the last from {address}) - {why}",
            links=1,
        )

    def stop(self) -> None:
        self._log.stop()
