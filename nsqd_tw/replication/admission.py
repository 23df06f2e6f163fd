"""Who may use a replication link (docs/replication.md, "The handshake"): what a
connection may do before it has authenticated, and which authenticated peer a
node takes as its primary or its standby.

Before authentication a link holds a HELLO of at most :data:`wire.MAX_HELLO`
bytes (the link's reader refuses a bigger frame from its header) and must end
its handshake within ``--replication-timeout`` (:class:`~.link.Link`); a node
lets at most :data:`MAX_WAITING` links it accepted wait for authentication at
once (:class:`Admission`). After it, a node keeps to the peer of its pair, the
node ID recorded in ``replication.json`` (:func:`check_peer`).
"""

from __future__ import annotations

from typing import Any

from twisted.logger import LogLevel

from nsq_service.limits import RateLimitedLog
from nsqd_tw.core.replica import PRIMARY, STANDBY, ReplicaState
from nsqd_tw.replication import wire

MAX_WAITING = 4  # links accepted and not authenticated yet, at once
LOG_INTERVAL = 10.0  # seconds: one line per kind of refusal, then a count

# check_peer's verdicts
OK, NEW, NOT_ITS_PRIMARY, NOT_ITS_STANDBY = "ok", "new", "not its primary", "not its standby"


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

    def refused_peer(self, verdict: str, text: str) -> None:
        """An authenticated peer that is not of this node's pair (what
        :func:`check_peer` said)."""
        self._log.emit(
            ("peer", verdict),
            LogLevel.error,
            lambda c: (
                f"REPLICATION: {text}" if c["attempts"] == 1 else f"REPLICATION: {text} ({c['attempts']} attempts)"
            ),
            attempts=1,
        )

    def stop(self) -> None:
        self._log.stop()


def check_peer(
    state: ReplicaState,
    mine: int,
    peer: tuple[str, str, int],
    address: str,
    who: str | None,
    dialer: bool,
    configured: bool,
) -> tuple[str, str]:
    """Whether this node (``state``, at epoch ``mine`` before the link) keeps an
    authenticated link to ``peer`` (its node ID, role and epoch) at ``address``,
    on which ``who`` (:func:`.pairing.decide`: ``"me"``, ``"peer"`` or None)
    would be the primary: ``(verdict, text)``.

    - :data:`OK`: no peer recorded yet, the recorded one, or a node whose epoch is
      higher than ``mine`` (a new primary of the pair);
    - :data:`NOT_ITS_PRIMARY`, :data:`NOT_ITS_STANDBY` (``text``: why, for the peer
      and the log): a primary other than the one this standby follows (also one
      at a lower epoch, which decide() refuses anyway), or a dialer this primary
      would make its standby that is not its standby;
    - :data:`NEW` (``text``: the warning): this primary dialed its ``--replica``
      (``configured``) and found another node there, a replaced standby host.
    """
    node, role, epoch = peer
    recorded = state.peer_node
    if who is None and state.role == STANDBY and role == PRIMARY:
        who = "peer"  # a primary at a lower epoch: say that it is not this standby's
    if who is None or not recorded or node == recorded or epoch > mine:
        return OK, ""
    theirs = f"{address} (node {node or '?'}, epoch {epoch})"
    if who == "peer":
        return NOT_ITS_PRIMARY, (
            f"refusing primary {theirs}: this standby follows primary {state.peer} (node {recorded}, epoch "
            f"{mine}); to move it to another primary, stop it and remove replication.json"
        )
    if dialer and configured:
        return NEW, (
            f"replica {address} is another node than the standby this primary had (node {node or '?'}, was "
            f"{recorded}): taking it as its standby, with a full snapshot"
        )
    return NOT_ITS_STANDBY, (
        f"refusing standby {theirs}: the standby of this primary is {state.peer} (node {recorded}); to pair it "
        "with another, restart it with --replica naming that one"
    )
