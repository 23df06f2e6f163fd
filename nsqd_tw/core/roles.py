"""Beyond Go: a replication role as the core sees it (docs/replication.md).

:mod:`nsqd_tw.replication` drives the roles; the core meets them at two
attributes of the NSQD, its seams: ``shipper``, a primary's :class:`Shipper`,
which topics and channels tell what changes (a publish, a FIN, a REQ, a pause),
and ``standby``, a standby's refusal, which producers and consumers are
answered with (:func:`set_standby` sets it). Both are None in an nsqd without
replication: then the core calls nothing here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer
from twisted.python.failure import Failure

from nsqd_tw.storage.diskqueue import DiskQueue

if TYPE_CHECKING:
    from nsqd_tw.core.channel import Channel
    from nsqd_tw.core.message import Message
    from nsqd_tw.core.queue import Item
    from nsqd_tw.core.topic import StandbyError, Topic


class Shipper(Protocol):
    """Beyond Go: what a replication primary ships to its standby
    (:mod:`nsqd_tw.replication`); the core calls it as things change."""

    @property
    def refusal(self) -> Exception | None:
        """Why publishes are refused now (--replication-required, no lease), or None."""

    def poll(self) -> None:
        """Before a publish: take in what the standby acknowledged meanwhile."""

    def confirm(self, result: Any) -> Any:
        """A publish on this node alone, about to be acknowledged: raises if it may
        not be (another node may have taken over); else returns ``result``."""

    def published(self, topic: Topic, items: list[Item]) -> defer.Deferred[None] | None:
        """Messages published (records; DPUB's as deferred Messages): a Deferred that
        fires once the standby holds them when the publisher must wait for that."""

    def gone(self, channel: Channel, ids: Any) -> None:
        """A copy of each of ``ids`` left ``channel`` for good (FIN, TTL, trim, dead letter)."""

    def requeued(self, channel: Channel, msg: Message, delay: float) -> None:
        """``msg`` came back to ``channel`` (REQ, timeout), queued again after ``delay``."""

    def fed(self, channel: Channel, records: list[bytes]) -> None:
        """A rewind queued copies of retained messages in ``channel``."""

    def control(self, op: str, topic: Topic | Channel, channel: Channel | None = None) -> None:
        """A topic or channel was paused, unpaused, emptied, started or given settings."""

    def replicate(self, doc: dict[str, Any]) -> None:
        """A change of a retained log or a rewind (``doc``: its op, topic, ...)."""


def both(a: defer.Deferred[None], b: defer.Deferred[None]) -> defer.Deferred[None]:
    """A Deferred that fires once ``a`` and ``b`` have, failing with the first
    failure; of ``b``'s class (a standby's :class:`~nsqd_tw.core.replica.Backpressure`)."""
    d: defer.Deferred[None] = type(b)()
    left = [2]

    def one(result: Any) -> None:
        if d.called:
            if isinstance(result, Failure):
                result.trap(Exception)  # the first failure was reported
            return
        if isinstance(result, Failure):
            d.errback(result)
            return
        left[0] -= 1
        if not left[0]:
            d.callback(None)

    a.addBoth(one)
    b.addBoth(one)
    return d


def refuse_unshipped(shipper: Shipper) -> None:
    """Before a publish on a primary: raises its refusal if publishes are refused now."""
    shipper.poll()  # first: what it takes in may be the link's end
    if shipper.refusal is not None:
        raise shipper.refusal


def shipped(
    shipper: Shipper, topic: Topic, items: list[Item], commit: Callable[[], defer.Deferred[None]] | None
) -> defer.Deferred[None] | None:
    """A publish stored on a primary, shipped to its standby: what its answer waits
    for (``commit``: the fsync of durable mode, else None), as ``NSQD.publish_to``."""
    acked = shipper.published(topic, items)
    if commit is not None:
        if acked is None:  # on this node alone: acknowledged after the fsync if the lease still holds
            return commit().addCallback(shipper.confirm)
        return both(commit(), acked)
    return acked


class RoleHost(Protocol):
    """What a role change needs of its nsqd (the NSQD)."""

    standby: StandbyError | None
    clients: dict[int, Any]
    topics: dict[str, Topic]
    stores: Any  # core/stores.py: the disk queues' --sync-every


def set_standby(nsqd: RoleHost, refusal: StandbyError | None) -> None:
    """Refuse producers and consumers as a replication standby (``refusal``
    names the primary; every client is disconnected), or serve (None)."""
    was, nsqd.standby = nsqd.standby, refusal
    if (was is None) == (refusal is None):
        return
    if refusal is not None:
        for client in list(nsqd.clients.values()):
            client.shutdown()
    sync_every = nsqd.stores.queue_sync_every()
    for topic in nsqd.topics.values():
        topic.apply_policies()  # a standby bounds nothing; a primary its bounded queues
        for queue in (topic, *topic.channels.values()):
            backend = getattr(queue.backend, "inner", queue.backend)  # a SpillQueue's disk queue
            if isinstance(backend, DiskQueue):
                backend.sync_every = sync_every
