"""A node's links (beyond Go; docs/replication.md, "The link"): the one a primary
dials to its ``--replica`` (again, a growing wait apart, until it is established),
who is primary on a link once its peer has authenticated (:func:`decide`) and
whether that peer is of the pair (:func:`.admission.check_peer`), the end of the
stream the node then takes (:class:`~.primary.PrimaryEnd` or
:class:`~.standby.StandbySide`), and a link lost.

A link reports to its node (:class:`~.link.Node`, the ReplicationService), which
hands these to :class:`Pairing`; what they change of the node's role is
:mod:`.roles`'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import protocol
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import LogLevel

from nsq_service.options import split_address
from nsqd_tw.core.replica import PRIMARY, STANDBY, STATE_FILE
from nsqd_tw.replication.admission import NEW, OK, check_peer
from nsqd_tw.replication.link import Link
from nsqd_tw.replication.primary import PrimaryEnd
from nsqd_tw.replication.standby import StandbySide

EndpointFactory = Callable[[str, int], IStreamClientEndpoint]
REDIAL_MIN, REDIAL_MAX = 0.1, 2.0  # seconds between a primary's attempts to reach its standby


def decide(mine: tuple[int, str], theirs: tuple[int, str]) -> str | None:
    """Who is the primary on a link between a node at ``mine`` (epoch, role) and
    one at ``theirs``: ``"me"``, ``"peer"`` or None (no one: the link is refused).
    The higher epoch wins if it is a primary's; at equal epochs a primary facing
    a standby."""
    (my_epoch, my_role), (their_epoch, their_role) = mine, theirs
    if my_epoch > their_epoch:
        return "me" if my_role == PRIMARY else None
    if their_epoch > my_epoch:
        return "peer" if their_role == PRIMARY else None
    if my_role == PRIMARY and their_role == STANDBY:
        return "me"
    if their_role == PRIMARY and my_role == STANDBY:
        return "peer"
    return None


class _LinkFactory(protocol.Factory):
    noisy = False

    def __init__(self, replication: Any) -> None:
        self.replication = replication

    def buildProtocol(self, addr: Any) -> Link:
        link = Link(self.replication, dialer=True)
        self.replication.links.add(link)
        return link


class Pairing:
    """What a node does with its links (``service``: the ReplicationService, whose
    ``link`` is the established one and ``links`` every one open);
    ``endpoint_factory(host, port)`` dials the peer."""

    def __init__(self, service: Any, endpoint_factory: EndpointFactory | None = None) -> None:
        self.service = service
        self.endpoint_factory = endpoint_factory or self._endpoint
        self.redial = REDIAL_MIN
        self._dial_call: Any = None
        self._dialing = False

    # -- dialing (a primary reaches its standby) ---------------------------------------------

    def _endpoint(self, host: str, port: int) -> IStreamClientEndpoint:
        from twisted.internet import endpoints  # with the first link: it loads pyOpenSSL

        service = self.service
        return endpoints.HostnameEndpoint(service.nsqd.reactor, host, port, timeout=service.timeout)

    def schedule_dial(self) -> None:
        service = self.service
        if self._dial_call is None and service.state.role == PRIMARY:
            delay = max(self.redial, service.primary.hold_off())  # a standby that could not store: later
            self._dial_call = service.nsqd.reactor.callLater(delay, self.dial)
            self.redial = min(self.redial * 2, REDIAL_MAX)

    def dial(self) -> None:
        self._dial_call = None
        service = self.service
        if not service.running or service.state.role != PRIMARY or service.link is not None or self._dialing:
            return
        address = service.state.peer
        parsed = split_address(address) if address else None
        if parsed is None:
            return
        host, port = parsed
        self._dialing = True
        d = self.endpoint_factory(host or "localhost", port).connect(_LinkFactory(service))

        def connected(link: Link) -> None:
            self._dialing = False

        def failed(f: Any) -> None:
            self._dialing = False
            service.log.debug("REPLICATION: cannot reach {peer} - {err}", peer=address, err=f.getErrorMessage())
            service.roles.settled(f"replica {address} unreachable - {f.getErrorMessage()}")
            if service.running:
                self.schedule_dial()

        d.addCallbacks(connected, failed)

    def stop(self) -> None:
        if self._dial_call is not None and self._dial_call.active():
            self._dial_call.cancel()
        self._dial_call = None

    # -- links ---------------------------------------------------------------------------

    def established(self, link: Link) -> None:
        """The peer proved the secret: decide who is primary on this link, and
        whether the peer is of this node's pair (its node ID, see check_peer)."""
        service = self.service
        peer = link.peer
        try:
            their_epoch, their_role = int(peer.get("epoch", 0)), str(peer.get("role", ""))
        except (TypeError, ValueError):
            link.fail("bad HELLO")
            return
        node = str(peer["node"]) if isinstance(peer.get("node"), str) else ""
        if node == service.state.node:
            link.fail("this is a link to the node itself (--replica names this nsqd)")
            return
        me = service.state
        mine = me.epoch
        if their_epoch > me.epoch and me.role == PRIMARY:
            service.roles.demote(their_epoch, link.address, "a higher epoch")
        who = decide((me.epoch, me.role), (their_epoch, their_role))
        verdict, text = check_peer(
            me, mine, (node, their_role, their_epoch), link.address, who, link.dialer, bool(service.nsqd.opts.replica)
        )
        if verdict not in (OK, NEW):  # not of this pair: nothing of it is applied, the current link goes on
            service.admission.refused_peer(verdict, text)
        elif who is None:
            text = (
                f"no primary on this link: {me.role} at epoch {me.epoch} here, "
                f"{their_role} at epoch {their_epoch} at {link.address}"
            )
            service.log.error("REPLICATION: {why}", why=text)
        if who is None or verdict not in (OK, NEW):
            if their_epoch < mine:  # proven to a dialer at a lower epoch: it learns it is stale, serves no more
                link.prove()
            link.fail(text)
            return
        if verdict == NEW:
            service.log.warn("REPLICATION: {text}", text=text)
        if node and me.peer_node != node:
            me.peer_node = node
            if not self._saved(link):
                return
        link.prove()
        old = service.link
        if old is not None and old is not link:
            old.fail("replaced by a new link")
        service.link = link
        self.redial = REDIAL_MIN
        service.unlinked_since = service.now()
        if who == "me":
            service.roles.settled(f"standby {link.address} answered")
            try:
                service.peer_promote_after = float(peer.get("promote_after") or 0.0)
            except (TypeError, ValueError):
                service.peer_promote_after = 0.0
            service.retick()
            if not service.nsqd.opts.replica:
                me.peer = link.address
                if not self._saved(link):
                    return
            service.log.info(
                "REPLICATION: standby {peer} linked{tls}, sending its snapshot",
                peer=link.address,
                tls=" (TLS)" if link.tls else "",
            )
            link.side = PrimaryEnd(service.primary, link)
            service.primary.attach(link)
            service.primary.tell_witnesses(service.lookupds(), service.witness_total())
        else:
            try:
                lease = min(3600.0, max(0.0, float(peer.get("lease") or 0.0)))
            except (TypeError, ValueError):
                lease = 0.0
            if their_epoch != me.epoch or me.peer != link.address or me.announced != link.address or me.lease != lease:
                me.epoch, me.peer, me.announced, me.lease = their_epoch, link.address, link.address, lease
                if not self._saved(link):
                    return
            service.takeover.granted()  # linked: as if its first PING had come
            service.witnesses([a for a in peer.get("lookupd") or [] if isinstance(a, str)])
            service.log.info(
                "REPLICATION: linked to primary {peer} (epoch {epoch}){tls}",
                peer=link.address,
                epoch=me.epoch,
                tls=" (TLS)" if link.tls else "",
            )
            service.roles.serve_as_standby(str(peer.get("http", "")))
            service.standby_side = StandbySide(service, link)
            link.side = service.standby_side

    def link_lost(self, link: Link, why: str) -> None:
        service = self.service
        service.links.discard(link)
        if link is not service.link:
            if link.dialer:  # refused or failed before it was established: try again later
                service.roles.settled(f"no link to {link.address} - {why}")
                if service.running and service.link is None:
                    self.schedule_dial()
            return
        service.link = None
        service.unlinked_since = service.now()
        side = service.standby_side
        if side is not None and side.link is link:
            said = side.failed  # it said why itself
            service.standby_side = None
            if not said:
                service.log.warn("REPLICATION: link to primary {peer} lost - {why}", peer=link.address, why=why)
        if service.running:
            self.schedule_dial()

    def _saved(self, link: Link) -> bool:
        """Persist the state before acting on a link; a disk that cannot take it
        (full) fails the link with one line, not a traceback."""
        service = self.service
        try:
            service.state.save(service.nsqd.data_path)
            return True
        except OSError as e:
            why = f"REPLICATION: cannot write {STATE_FILE} - {e}: link to {link.address} dropped"
            service.nsqd.queue_events.emit(("replication", "save"), LogLevel.error, lambda n: why)
            try:
                service.state.mark_unsynced(service.nsqd.data_path)  # the marker goes first: not synced
            except OSError:
                pass  # said above
            link.fail(f"cannot save {STATE_FILE} - {e}")
            return False
