"""Why a publish or a promotion of a replication pair is refused: the errors the HTTP
and TCP sides answer, in a module of their own so that they import none of the link."""

from __future__ import annotations


class ReplicaLost(Exception):
    """A publish waited for a standby that went away (--replication-required)."""


class NotInSync(Exception):
    """Publishes refused while the standby is not in sync (--replication-required)."""


class NoLease(Exception):
    """A publish the standby does not hold, refused or not acknowledged: this
    node holds no lease (docs/replication.md, "Failover"), so another may have
    taken over."""


class PromoteError(Exception):
    """A promotion refused: ``code`` (HTTP status) and ``message`` (what /replication/promote answers)."""

    def __init__(self, code: int, message: str, why: str) -> None:
        super().__init__(why)
        self.code = code
        self.message = message
