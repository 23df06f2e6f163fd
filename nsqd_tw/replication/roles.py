"""A node's role and epoch changing (beyond Go; docs/replication.md, "Roles, epochs,
states"): the role it starts in (a primary that names its replica first waits to
hear from it: *settling*), serving as primary or as standby, a promotion (a higher
epoch, persisted before it serves), a demotion (a peer at a higher epoch), and a
primary deposed by a witness (another node took over).

What decides them is elsewhere: who is primary on a link (:mod:`.pairing`), when
a standby takes over (:mod:`.failover`), what the witnesses answer (:mod:`.lease`).
"""

from __future__ import annotations

from typing import Any

from nsqd_tw.core.replica import PRIMARY, STANDBY
from nsqd_tw.core.skips import compact
from nsqd_tw.core.topic import StandbyError
from nsqd_tw.replication.errors import PromoteError
from nsqd_tw.replication.pairing import REDIAL_MIN
from nsqd_tw.replication.primary import IN_SYNC, Primary


def starting(peer: str, epoch: int) -> StandbyError:
    """The refusal of a node that starts as primary: it waits to hear from its
    replica first, whose epoch may say it is no longer the primary."""
    return StandbyError(
        peer,
        epoch,
        text=f"this nsqd is starting: waiting to reach its replica {peer} before serving (epoch {epoch})",
        health=f"starting, waiting to reach replica {peer} (epoch {epoch})",
        code="STARTING",
    )


def deposed(peer: str, epoch: int, by: str) -> StandbyError:
    """The refusal of a primary that a witness says was replaced."""
    return StandbyError(
        peer,
        epoch,
        text=f"this nsqd is no longer the primary: {peer} took over at epoch {epoch} (witness {by})",
        health=f"replaced by {peer} (epoch {epoch}, witness {by})",
        code="DEPOSED",
    )


class Roles:
    """This node's role changes (``service``: the ReplicationService, whose
    ``state`` they persist and whose NSQD they make serve, or refuse)."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self._settle_call: Any = None  # a primary starting: until its replica has answered

    # -- start and stop -------------------------------------------------------------------

    def start(self) -> None:
        """Serve in the role the state says, or, a primary that names its replica,
        refuse clients until it has heard from it."""
        service = self.service
        state = service.state
        if state.role == STANDBY:
            self.serve_as_standby()
        elif state.peer:
            # its replica may have been promoted meanwhile: hear from it first
            service.nsqd.set_standby(starting(state.peer, state.epoch))
            if service.lookup is not None:
                service.lookup.pause()
            self._settle_call = service.nsqd.reactor.callLater(service.timeout, self.settled, "no answer in time")
        else:
            self.serve_as_primary()

    def stop(self) -> None:
        if self._settle_call is not None and self._settle_call.active():
            self._settle_call.cancel()
        self._settle_call = None

    # -- serving ----------------------------------------------------------------------------

    def serve_as_standby(self, primary_http: str = "") -> None:
        service = self.service
        nsqd = service.nsqd
        nsqd.shipper = None
        nsqd.retention.set_mirroring(True)  # its retained logs are copies of its primary's
        nsqd.set_standby(StandbyError(service.state.peer, service.state.epoch, primary_http))
        if service.lookup is not None:
            service.lookup.pause()

    def serve_as_primary(self) -> None:
        service = self.service
        nsqd = service.nsqd
        nsqd.set_standby(None)
        nsqd.shipper = service.primary
        nsqd.retention.promoted()  # its retained logs its own (a standby promoted: its rewinds go on)
        if service.lookup is not None:
            service.lookup.resume()

    @property
    def settling(self) -> bool:
        return self._settle_call is not None

    def settled(self, why: str) -> None:
        """A primary starting has heard from its replica (or given up): it serves,
        unless that replica made it a standby."""
        if self._settle_call is None:
            return
        if self._settle_call.active():
            self._settle_call.cancel()
        self._settle_call = None
        service = self.service
        if service.state.role == PRIMARY:
            service.log.info(
                "REPLICATION: serving as primary (epoch {epoch}): {why}", epoch=service.state.epoch, why=why
            )
            self.serve_as_primary()
            if service.running:
                service.lease.heartbeat()
            if service.primary.state != IN_SYNC:
                service.log.warn(
                    "REPLICATION: degraded until standby {peer} is in sync",
                    peer=service.state.peer,
                )

    # -- promotion and demotion -------------------------------------------------------------

    def promote(self, force: bool = False, why: str = "POST /replication/promote", claimed: bool = False) -> None:
        """Make this standby the primary: a higher epoch, persisted before it
        serves; it registers with the lookupds, heartbeats its witnesses (which
        makes its claim theirs: the old primary is deposed there) and dials its
        old primary to be its standby. The checks are :class:`~.failover.Failover`'s."""
        service = self.service
        me = service.state
        if me.role == PRIMARY:
            raise PromoteError(409, "ALREADY_PRIMARY", "this nsqd is the primary already")
        old = me.peer
        me.role, me.epoch = PRIMARY, me.epoch + 1
        me.save(service.nsqd.data_path)
        service.log.warn(
            "REPLICATION: promoted to primary, epoch {epoch} ({why}); former primary {old}{forced}",
            epoch=me.epoch,
            why=why,
            old=old or "(none)",
            forced=", forced" if force else "",
        )
        if service.link is not None:
            service.link.fail(f"promoted to primary at epoch {me.epoch}")
        for topic in service.nsqd.topics.values():
            for channel in topic.channels.values():
                compact(channel)
            if not topic.started:
                topic.start()
        service.primary = Primary(service)
        service.primary.refresh()
        service.lease.reset()
        if claimed:  # the witnesses that granted the claim reserved the pair for this node: its first lease
            service.lease.witnessed(service.takeover.granted_by)
        self.serve_as_primary()
        service.unlinked_since = service.now()
        service.unlinked_mono = service.mono()
        service.pairing.redial = REDIAL_MIN
        service.lease.heartbeat()
        service.pairing.dial()

    def demote(self, epoch: int, peer: str, why: str) -> None:
        """A peer at a higher epoch: this node is its standby from now on."""
        service = self.service
        state = service.state
        service.log.warn(
            "REPLICATION: demoted to standby of {peer} (epoch {theirs} > {mine}: {why}); everything held here is "
            "replaced by its snapshot",
            peer=peer,
            theirs=epoch,
            mine=state.epoch,
            why=why,
        )
        service.primary.detach("demoted")
        state.role, state.epoch, state.peer, state.synced = STANDBY, epoch, peer, False
        state.save(service.nsqd.data_path)
        service.deposed_by = None
        service.lease.reset()
        self.serve_as_standby()
        if self._settle_call is not None:
            self.settled("demoted")

    def deposed(self, witness: str, doc: dict[str, Any]) -> None:
        """A witness says another node took over: stop serving, and follow it."""
        try:
            epoch = int(doc.get("epoch", 0))
        except (TypeError, ValueError):
            return
        service = self.service
        state = service.state
        address = str(doc.get("address") or "")
        if state.role != PRIMARY or epoch < state.epoch:
            return
        if service.deposed_by is None:
            service.log.error(
                "REPLICATION: no longer the primary: witness {w} says {peer} took over at epoch {epoch} (this node is "
                "at {mine}): refusing clients, dialing it to become its standby",
                w=witness,
                peer=address or "(unknown)",
                epoch=epoch,
                mine=state.epoch,
            )
        service.deposed_by = deposed(address or state.peer, epoch, witness)
        service.nsqd.set_standby(service.deposed_by)
        if service.lookup is not None:
            service.lookup.pause()
        if address and address != state.peer and epoch > state.epoch:
            state.peer = address
            state.save(service.nsqd.data_path)
            if service.link is not None:
                service.link.fail(f"deposed: following {address}")
        if service.link is None:
            service.pairing.schedule_dial()
