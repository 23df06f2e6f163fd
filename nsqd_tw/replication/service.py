"""A node of a replication pair: its persisted role and epoch, the link it dials
(a primary, to ``--replica``) or accepts (on nsqd's TCP port, magic ``"  R1"``),
who is primary on a link, and the status ``/replication`` and ``/stats`` show."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

from twisted.application import service
from twisted.internet import defer, protocol
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.task import LoopingCall
from twisted.logger import LogLevel

from nsq_service.options import DURATION, ConfigError, StartError, split_address
from nsq_service.web import http_client
from nsq_wire.gofmt import join_host_port
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.core.replica import PRIMARY, STANDBY, STATE_FILE, SYNCED_FILE, ReplicaState, ReplicaStateError
from nsqd_tw.core.skips import compact
from nsqd_tw.core.topic import StandbyError
from nsqd_tw.replication import wire
from nsqd_tw.replication.admission import NEW, OK, Admission, check_peer
from nsqd_tw.replication.failover import Failover, PromoteError
from nsqd_tw.replication.lease import PrimaryLease, Takeover, WitnessClient, pair_id
from nsqd_tw.replication.link import Link
from nsqd_tw.replication.primary import CATCHING_UP, DISCONNECTED, IN_SYNC, Primary, PrimaryEnd
from nsqd_tw.replication.standby import StandbySide

EndpointFactory = Callable[[str, int], IStreamClientEndpoint]
REDIAL_MIN, REDIAL_MAX = 0.1, 2.0  # seconds between a primary's attempts to reach its standby


__all__ = ["PromoteError", "ReplicationService"]


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


def read_secret(path: str) -> bytes:
    """The shared secret in ``path`` (surrounding whitespace dropped)."""
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as e:
        raise ConfigError(f"failed to read --replication-secret-file - {e}") from None
    if not secret:
        raise ConfigError(f"--replication-secret-file {path} is empty")
    return secret


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

    def __init__(self, replication: ReplicationService) -> None:
        self.replication = replication

    def buildProtocol(self, addr: Any) -> Link:
        link = Link(self.replication, dialer=True)
        self.replication.links.add(link)
        return link


class ReplicationService(service.Service):
    """Beyond Go: this node's part in a replication pair (docs/replication.md).

    ``lookup`` (the LookupService) is paused while this node is a standby;
    ``tls`` is nsqd's server context (the link is TLS when it is set);
    ``endpoint_factory(host, port)`` dials the peer; ``mono()`` is the monotonic
    clock the leases are kept in.
    """

    name = "replication"

    def __init__(
        self,
        nsqd: NSQD,
        lookup: Any = None,
        tls: Any = None,
        endpoint_factory: EndpointFactory | None = None,
        secret: bytes | None = None,
        http_client: Any = None,
        mono: Callable[[], float] | None = None,
    ) -> None:
        opts = nsqd.opts
        self.nsqd = nsqd
        self.lookup = lookup
        self.tls = tls
        self.secret = secret if secret is not None else read_secret(opts.replication_secret_file)
        self.pair = pair_id(self.secret)
        self.mono = mono or time.monotonic
        self.endpoint_factory = endpoint_factory or self._endpoint
        self.log = nsqd.log_gate.logger("nsqd_tw.replication", self)
        self.timeout = opts.replication_timeout
        self.state = ReplicaState("", opts.replication_role, 0)
        self.primary = Primary(self)
        self.link: Link | None = None  # the established link
        self.links: set[Link] = set()  # every link open, established or not
        self.standby_side: StandbySide | None = None
        self._client_tls: Any = None
        self._tick = LoopingCall(self.tick)
        self._tick.clock = nsqd.reactor
        self._tick_interval = self.timeout / 3
        self._dial_call: Any = None
        self._dialing = False
        self._redial = REDIAL_MIN
        self._http = http_client
        self._settle_call: Any = None  # a primary starting: until its replica has answered
        self.unlinked_since = nsqd.now()  # since when no primary (standby) or standby (primary) is linked
        self.unlinked_mono = self.mono()
        self.peer_promote_after = 0.0  # the standby's --promote-after, as it said in its HELLO
        self.witness_client = WitnessClient(self._http_client, nsqd.reactor, self.timeout / 3)
        self.lease = PrimaryLease(self)  # a primary's right to acknowledge alone
        self.takeover = Takeover(self)  # a standby's side: the lease it granted, its claim
        self.failover = Failover(self)
        self.deposed_by: StandbyError | None = None  # a witness said another node took over
        nsqd.replication = self

    # -- time ---------------------------------------------------------------------------

    def now(self) -> float:
        return self.nsqd.now()

    # -- start and stop -------------------------------------------------------------------

    def startService(self) -> None:
        opts = self.nsqd.opts
        try:
            self.state = ReplicaState.load(self.nsqd.data_path, opts.replication_role)
        except ReplicaStateError as e:
            raise StartError(str(e)) from None
        if opts.replica:
            self.state.peer = opts.replica
        self._save()
        self._held(False)  # a standby's memory queues die with this process: synced after a restart if it stops cleanly
        self.nsqd.observe_closed(self._held)
        self.primary.refresh()
        self.nsqd.observe_changes(self._changed)
        observe = getattr(self.lookup, "observe_identified", None)
        if observe is not None:
            observe(self._lookupd_identified)
        if self.state.role == STANDBY:
            self._serve_as_standby()
        elif self.state.peer:
            # its replica may have been promoted meanwhile: hear from it first
            self.nsqd.set_standby(starting(self.state.peer, self.state.epoch))
            if self.lookup is not None:
                self.lookup.pause()
            self._settle_call = self.nsqd.reactor.callLater(self.timeout, self._settled, "no answer in time")
        else:
            self._serve_as_primary()
        self.log.info(
            "REPLICATION: {role} (epoch {epoch}), peer {peer}",
            role=self.state.role,
            epoch=self.state.epoch,
            peer=self.state.peer or "(none yet)",
        )
        self._warn_settings()
        if self.settling:
            self.log.info(
                "REPLICATION: waiting to reach replica {peer} before serving (its epoch may be higher)",
                peer=self.state.peer,
            )
        elif self.state.role == PRIMARY:
            self.log.warn(
                "REPLICATION: degraded until standby {peer} is in sync: {what}",
                peer=self.state.peer or "(none yet)",
                what="publishes are refused meanwhile (--replication-required)"
                if opts.replication_required
                else "what is acknowledged meanwhile is on this node only",
            )
        service.Service.startService(self)
        self._retick()
        if self.state.role == PRIMARY and not self.settling:
            self.lease.heartbeat()
        self._dial()

    def _warn_settings(self) -> None:
        """One line for each setting that weakens the pair (docs/replication.md, "Recommended settings")."""
        opts = self.nsqd.opts
        lease = DURATION.show(self.timeout)
        total = self.witness_total()
        if self.state.role == PRIMARY and not total:
            self.log.warn(
                "REPLICATION: no witness (--lookupd-tcp-address or --replication-witness): this primary acknowledges "
                "what its standby does not hold only while linked to it ({lease} lease), and the standby can be "
                "promoted only by POST /replication/promote",
                lease=lease,
            )
        elif total and total % 2 == 0:
            self.log.warn(
                "REPLICATION: {n} witnesses: a majority is {m} of them, so one down makes the pair depend on the other "
                "{rest}; an odd number tolerates as many failures with one fewer",
                n=total,
                m=total // 2 + 1,
                rest=total - 1,
            )
        if self.state.role == STANDBY and opts.promote_after:
            self.log.info(
                "REPLICATION: takes over once its primary is unreachable for {after}, the primary's lease (at least "
                "{lease}) has run out with 1s to spare, and a majority of its witnesses agree",
                after=DURATION.show(opts.promote_after),
                lease=lease,
            )

    def stopService(self) -> Any:
        service.Service.stopService(self)
        if self._tick.running:
            self._tick.stop()
        if self._dial_call is not None and self._dial_call.active():
            self._dial_call.cancel()
        self._dial_call = None
        if self._settle_call is not None and self._settle_call.active():
            self._settle_call.cancel()
        self._settle_call = None
        for link in list(self.links):
            link.fail("nsqd is stopping")
        self.admission.stop()
        return None

    def _held(self, held: bool) -> None:
        """Whether all a standby that is not durable holds is on disk (it stopped
        cleanly) or not (it runs): its synced marker says it for a restart."""
        if self.state.role == STANDBY and not self.nsqd.durable:
            try:
                self.state.mark_held(self.nsqd.data_path, held)
            except OSError as e:
                self.log.error("REPLICATION: cannot mark {path} - {err}", path=SYNCED_FILE, err=e)

    def _save(self) -> None:
        try:
            self.state.save_if_changed(self.nsqd.data_path)
        except OSError as e:
            raise StartError(f"failed to persist replication state - {e}") from None

    # -- roles ---------------------------------------------------------------------------

    @property
    def peer_address(self) -> str:
        return self.state.peer

    def _serve_as_standby(self, primary_http: str = "") -> None:
        self.nsqd.shipper = None
        self.nsqd.retention.set_mirroring(True)  # its retained logs are copies of its primary's
        self.nsqd.set_standby(StandbyError(self.state.peer, self.state.epoch, primary_http))
        if self.lookup is not None:
            self.lookup.pause()

    def _serve_as_primary(self) -> None:
        self.nsqd.set_standby(None)
        self.nsqd.shipper = self.primary
        self.nsqd.retention.promoted()  # its retained logs its own (a standby promoted: its rewinds go on)
        if self.lookup is not None:
            self.lookup.resume()

    @property
    def settling(self) -> bool:
        return self._settle_call is not None

    def _settled(self, why: str) -> None:
        """A primary starting has heard from its replica (or given up): it serves,
        unless that replica made it a standby."""
        if self._settle_call is None:
            return
        if self._settle_call.active():
            self._settle_call.cancel()
        self._settle_call = None
        if self.state.role == PRIMARY:
            self.log.info("REPLICATION: serving as primary (epoch {epoch}): {why}", epoch=self.state.epoch, why=why)
            self._serve_as_primary()
            if self.running:
                self.lease.heartbeat()
            if self.primary.state != IN_SYNC:
                self.log.warn(
                    "REPLICATION: degraded until standby {peer} is in sync",
                    peer=self.state.peer,
                )

    # -- promotion ------------------------------------------------------------------------

    def promote_request(self, force: bool = False) -> defer.Deferred[None]:
        """POST /replication/promote: see :class:`Failover` (fails with :class:`PromoteError`)."""
        d: defer.Deferred[None] = self.failover.request(force)
        return d

    def promote(self, force: bool = False, why: str = "POST /replication/promote", claimed: bool = False) -> None:
        """Make this standby the primary: a higher epoch, persisted before it
        serves; it registers with the lookupds, heartbeats its witnesses (which
        makes its claim theirs: the old primary is deposed there) and dials its
        old primary to be its standby. The checks are :class:`Failover`'s."""
        me = self.state
        if me.role == PRIMARY:
            raise PromoteError(409, "ALREADY_PRIMARY", "this nsqd is the primary already")
        old = me.peer
        me.role, me.epoch = PRIMARY, me.epoch + 1
        me.save(self.nsqd.data_path)
        self.log.warn(
            "REPLICATION: promoted to primary, epoch {epoch} ({why}); former primary {old}{forced}",
            epoch=me.epoch,
            why=why,
            old=old or "(none)",
            forced=", forced" if force else "",
        )
        if self.link is not None:
            self.link.fail(f"promoted to primary at epoch {me.epoch}")
        for topic in self.nsqd.topics.values():
            for channel in topic.channels.values():
                compact(channel)
            if not topic.started:
                topic.start()
        self.primary = Primary(self)
        self.primary.refresh()
        self.lease.reset()
        if claimed:  # the witnesses that granted the claim reserved the pair for this node: its first lease
            self.lease.witnessed(self.takeover.granted_by)
        self._serve_as_primary()
        self.unlinked_since = self.now()
        self.unlinked_mono = self.mono()
        self._redial = REDIAL_MIN
        self.lease.heartbeat()
        self._dial()

    def _demote(self, epoch: int, peer: str, why: str) -> None:
        """A peer at a higher epoch: this node is its standby from now on."""
        self.log.warn(
            "REPLICATION: demoted to standby of {peer} (epoch {theirs} > {mine}: {why}); everything held here is "
            "replaced by its snapshot",
            peer=peer,
            theirs=epoch,
            mine=self.state.epoch,
            why=why,
        )
        self.primary.detach("demoted")
        self.state.role, self.state.epoch, self.state.peer, self.state.synced = STANDBY, epoch, peer, False
        self.state.save(self.nsqd.data_path)
        self.deposed_by = None
        self.lease.reset()
        self._serve_as_standby()
        if self._settle_call is not None:
            self._settled("demoted")

    # -- links ---------------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        """What this node tells a peer about itself (HELLO, without its nonce)."""
        opts = self.nsqd.opts
        return {
            "version": wire.VERSION,
            "node": self.state.node,
            "role": self.state.role,
            "epoch": self.state.epoch,
            "address": join_host_port(opts.broadcast_address, str(opts.broadcast_tcp_port)),
            "http": join_host_port(opts.broadcast_address, str(opts.broadcast_http_port)),
            # a primary's lookupds, the witnesses of a standby's automatic promotion
            "lookupd": self._lookupds() if self.state.role == PRIMARY else [],
            "promote_after": opts.promote_after,
            "lease": self.timeout,  # a standby waits this out (and a margin) before taking over
        }

    def _lookupd_identified(self) -> None:
        """A lookupd answered IDENTIFY: a primary tells its standby at once."""
        if self.link is not None and self.primary.link is self.link:
            self.primary.tell_witnesses(self._lookupds(), self.witness_total())

    def _lookupds(self) -> list[str]:
        if self.nsqd.opts.replication_witnesses:
            return list(self.nsqd.opts.replication_witnesses)
        if self.lookup is None:
            return []
        addresses: list[str] = self.lookup.lookupd_http_addresses()
        return addresses

    @cached_property
    def admission(self) -> Admission:
        """What a link may do before it authenticates, and whom this node takes as its peer."""
        return Admission(self.nsqd.reactor, self.log)

    def accept(self, transport: Any, data: bytes) -> None:
        """A connection to nsqd's TCP port opened with the link's magic: it is a
        link, if fewer than a few accepted links are waiting to authenticate."""
        waiting = sum(1 for link in self.links if not link.dialer and not link.verified)
        if not self.admission.admit(transport, waiting):
            return
        link = Link(self, dialer=False)
        self.links.add(link)
        transport.protocol = link
        link.makeConnection(transport)
        if data:
            link.dataReceived(data)

    def client_tls(self) -> Any:
        if self._client_tls is None:
            from nsqd_tw.tls import ClientTLS

            self._client_tls = ClientTLS(self.nsqd.opts)
        return self._client_tls

    def established(self, link: Link) -> None:
        """The peer proved the secret: decide who is primary on this link, and
        whether the peer is of this node's pair (its node ID, see check_peer)."""
        peer = link.peer
        try:
            their_epoch, their_role = int(peer.get("epoch", 0)), str(peer.get("role", ""))
        except (TypeError, ValueError):
            link.fail("bad HELLO")
            return
        node = str(peer["node"]) if isinstance(peer.get("node"), str) else ""
        if node == self.state.node:
            link.fail("this is a link to the node itself (--replica names this nsqd)")
            return
        me = self.state
        mine = me.epoch
        if their_epoch > me.epoch and me.role == PRIMARY:
            self._demote(their_epoch, link.address, "a higher epoch")
        who = decide((me.epoch, me.role), (their_epoch, their_role))
        verdict, text = check_peer(
            me, mine, (node, their_role, their_epoch), link.address, who, link.dialer, bool(self.nsqd.opts.replica)
        )
        if verdict not in (OK, NEW):  # not of this pair: nothing of it is applied, the current link goes on
            self.admission.refused_peer(verdict, text)
        elif who is None:
            text = (
                f"no primary on this link: {me.role} at epoch {me.epoch} here, "
                f"{their_role} at epoch {their_epoch} at {link.address}"
            )
            self.log.error("REPLICATION: {why}", why=text)
        if who is None or verdict not in (OK, NEW):
            if their_epoch < mine:  # proven to a dialer at a lower epoch: it learns it is stale, serves no more
                link.prove()
            link.fail(text)
            return
        if verdict == NEW:
            self.log.warn("REPLICATION: {text}", text=text)
        if node and me.peer_node != node:
            me.peer_node = node
            if not self._saved(link):
                return
        link.prove()
        old = self.link
        if old is not None and old is not link:
            old.fail("replaced by a new link")
        self.link = link
        self._redial = REDIAL_MIN
        self.unlinked_since = self.now()
        if who == "me":
            self._settled(f"standby {link.address} answered")
            try:
                self.peer_promote_after = float(peer.get("promote_after") or 0.0)
            except (TypeError, ValueError):
                self.peer_promote_after = 0.0
            self._retick()
            if not self.nsqd.opts.replica:
                me.peer = link.address
                if not self._saved(link):
                    return
            self.log.info(
                "REPLICATION: standby {peer} linked{tls}, sending its snapshot",
                peer=link.address,
                tls=" (TLS)" if link.tls else "",
            )
            link.side = PrimaryEnd(self.primary, link)
            self.primary.attach(link)
            self.primary.tell_witnesses(self._lookupds(), self.witness_total())
        else:
            try:
                lease = min(3600.0, max(0.0, float(peer.get("lease") or 0.0)))
            except (TypeError, ValueError):
                lease = 0.0
            if their_epoch != me.epoch or me.peer != link.address or me.announced != link.address or me.lease != lease:
                me.epoch, me.peer, me.announced, me.lease = their_epoch, link.address, link.address, lease
                if not self._saved(link):
                    return
            self.takeover.granted()  # linked: as if its first PING had come
            self.witnesses([a for a in peer.get("lookupd") or [] if isinstance(a, str)])
            self.log.info(
                "REPLICATION: linked to primary {peer} (epoch {epoch}){tls}",
                peer=link.address,
                epoch=me.epoch,
                tls=" (TLS)" if link.tls else "",
            )
            self._serve_as_standby(str(peer.get("http", "")))
            self.standby_side = StandbySide(self, link)
            link.side = self.standby_side

    def link_lost(self, link: Link, why: str) -> None:
        self.links.discard(link)
        if link is not self.link:
            if link.dialer:  # refused or failed before it was established: try again later
                self._settled(f"no link to {link.address} - {why}")
                if self.running and self.link is None:
                    self._schedule_dial()
            return
        self.link = None
        self.unlinked_since = self.now()
        if self.standby_side is not None and self.standby_side.link is link:
            said = self.standby_side.failed  # it said why itself
            self.standby_side = None
            if not said:
                self.log.warn("REPLICATION: link to primary {peer} lost - {why}", peer=link.address, why=why)
        if self.running:
            self._schedule_dial()

    def peer_refused(self, link: Link, why: str) -> None:
        self.log.error("REPLICATION: {peer} refused the link - {why}", peer=link.address, why=why)

    # -- the standby's snapshot -------------------------------------------------------------

    def snapshot_begins(self) -> None:
        self.diverged()
        self.log.info("REPLICATION: receiving the snapshot of primary {peer}", peer=self.state.peer)

    def snapshot_ends(self) -> None:
        """Raises OSError if the snapshot cannot be recorded as whole (the
        standby then tells its primary it is not in sync)."""
        self.state.mark_synced(self.nsqd.data_path, marker=self.nsqd.durable)
        self.log.info("REPLICATION: in sync with primary {peer}", peer=self.state.peer)

    def witnesses(self, addresses: list[str], total: int = 0) -> None:
        """A standby: its primary's lookupds (HTTP), the witnesses of a takeover,
        and how many it has (``total``: those it has not reached count too)."""
        total = max(total, len(addresses))
        if addresses and (addresses != self.state.lookupd or total != self.state.witnesses):
            self.state.lookupd, self.state.witnesses = addresses, total
            try:
                self.state.save(self.nsqd.data_path)
            except OSError as e:  # kept in memory; written with the next save that works
                why = f"REPLICATION: cannot write {STATE_FILE} - {e} (the primary's witnesses are kept in memory)"
                self.nsqd.queue_events.emit(("replication", "witnesses"), LogLevel.error, lambda n: why)

    def _saved(self, link: Link) -> bool:
        """Persist the state before acting on a link; a disk that cannot take it
        (full) fails the link with one line, not a traceback."""
        try:
            self.state.save(self.nsqd.data_path)
            return True
        except OSError as e:
            why = f"REPLICATION: cannot write {STATE_FILE} - {e}: link to {link.address} dropped"
            self.nsqd.queue_events.emit(("replication", "save"), LogLevel.error, lambda n: why)
            try:
                self.state.mark_unsynced(self.nsqd.data_path)  # the marker goes first: not synced
            except OSError:
                pass  # said above
            link.fail(f"cannot save {STATE_FILE} - {e}")
            return False

    def diverged(self) -> None:
        """What is held here is not the primary's (a snapshot begins, an operation
        could not be applied): not promotable until the next snapshot is whole.
        Never raises: a full disk is said once a while, and the marker is gone."""
        try:
            self.state.mark_unsynced(self.nsqd.data_path)
        except OSError as e:
            why = f"REPLICATION: cannot write {STATE_FILE} - {e} ({SYNCED_FILE} is removed: not synced)"
            self.nsqd.queue_events.emit(("replication", "unsynced"), LogLevel.warn, lambda n: why)

    # -- dialing (a primary reaches its standby) ---------------------------------------------

    def _endpoint(self, host: str, port: int) -> IStreamClientEndpoint:
        from twisted.internet import endpoints  # with the first link: it loads pyOpenSSL

        return endpoints.HostnameEndpoint(self.nsqd.reactor, host, port, timeout=self.timeout)

    def _schedule_dial(self) -> None:
        if self._dial_call is None and self.state.role == PRIMARY:
            delay = max(self._redial, self.primary.hold_off())  # a standby that could not store: later
            self._dial_call = self.nsqd.reactor.callLater(delay, self._dial)
            self._redial = min(self._redial * 2, REDIAL_MAX)

    def _dial(self) -> None:
        self._dial_call = None
        if not self.running or self.state.role != PRIMARY or self.link is not None or self._dialing:
            return
        address = self.state.peer
        parsed = split_address(address) if address else None
        if parsed is None:
            return
        host, port = parsed
        self._dialing = True
        d = self.endpoint_factory(host or "localhost", port).connect(_LinkFactory(self))

        def connected(link: Link) -> None:
            self._dialing = False

        def failed(f: Any) -> None:
            self._dialing = False
            self.log.debug("REPLICATION: cannot reach {peer} - {err}", peer=address, err=f.getErrorMessage())
            self._settled(f"replica {address} unreachable - {f.getErrorMessage()}")
            if self.running:
                self._schedule_dial()

        d.addCallbacks(connected, failed)

    # -- heartbeats and timeouts -----------------------------------------------------------

    def _retick(self) -> None:
        """Tick three times per --replication-timeout, and often enough for a
        --promote-after (this standby's) or a fence (its standby's, D/2)."""
        shortest = min(t for t in (self.timeout, self.nsqd.opts.promote_after, self.peer_promote_after) if t > 0)
        interval = shortest / 3
        if self._tick.running:
            if self._tick.interval == interval:
                return
            self._tick.stop()
        self._tick_interval = interval
        if self.running:
            self._tick.start(interval, now=False)

    def tick(self) -> None:
        """Every third of --replication-timeout (or less): a primary's PING and its
        witnesses' heartbeat; any link silent for the whole timeout is dropped; a
        standby alone may take over (:class:`Failover`)."""
        try:
            now = self.now()
            for link in list(self.links):
                if now - link.heard_at > self.timeout:
                    self.log.error(
                        "REPLICATION: {peer} silent for {t}s, dropping the link", peer=link.address, t=self.timeout
                    )
                    link.abort(f"no frame in {self.timeout}s")
            if self.state.role == PRIMARY:
                if self.link is not None and self.primary.link is self.link:
                    self.link.send(wire.ping(self.lease.token()))
                    self.primary.tell_witnesses(self._lookupds(), self.witness_total())
                if self.running and not self.settling:
                    self.lease.heartbeat()
            elif self.link is None and self.running:
                self.failover.tick()
        except Exception:
            self.log.failure("REPLICATION: tick failed")

    # -- leases (nsqd_tw.replication.lease) ---------------------------------------------------

    def witness_addresses(self) -> list[str]:
        """The witnesses of this pair (HTTP): --replication-witness, else a
        primary's lookupds, a standby's as its primary last named them."""
        configured = self.nsqd.opts.replication_witnesses
        if configured:
            return list(configured)
        return self._lookupds() if self.state.role == PRIMARY else list(self.state.lookupd)

    def witness_total(self) -> int:
        """How many witnesses a majority is counted of: those configured (one not
        reached yet counts, and fails)."""
        opts = self.nsqd.opts
        if opts.replication_witnesses:
            return len(opts.replication_witnesses)
        if self.state.role == PRIMARY:
            return max(len(opts.lookupd_tcp_addresses), len(self._lookupds()))
        return max(self.state.witnesses, len(self.state.lookupd))

    def announced_address(self) -> str:
        opts = self.nsqd.opts
        return join_host_port(opts.broadcast_address, str(opts.broadcast_tcp_port))

    def primary_lease(self) -> float:
        """A standby: its primary's lease (as it said; this node's own timeout if longer)."""
        return max(self.state.lease, self.timeout)

    def lease_granted(self) -> None:
        """A standby received a PING: it granted its primary a lease from now."""
        self.takeover.granted()

    def deposed(self, witness: str, doc: dict[str, Any]) -> None:
        """A witness says another node took over: stop serving, and follow it."""
        try:
            epoch = int(doc.get("epoch", 0))
        except (TypeError, ValueError):
            return
        address = str(doc.get("address") or "")
        if self.state.role != PRIMARY or epoch < self.state.epoch:
            return
        if self.deposed_by is None:
            self.log.error(
                "REPLICATION: no longer the primary: witness {w} says {peer} took over at epoch {epoch} (this node is "
                "at {mine}): refusing clients, dialing it to become its standby",
                w=witness,
                peer=address or "(unknown)",
                epoch=epoch,
                mine=self.state.epoch,
            )
        self.deposed_by = deposed(address or self.state.peer, epoch, witness)
        self.nsqd.set_standby(self.deposed_by)
        if self.lookup is not None:
            self.lookup.pause()
        if address and address != self.state.peer and epoch > self.state.epoch:
            self.state.peer = address
            self.state.save(self.nsqd.data_path)
            if self.link is not None:
                self.link.fail(f"deposed: following {address}")
        if self.link is None:
            self._schedule_dial()

    def _http_client(self) -> Any:
        if self._http is None:
            self._http = http_client(self.nsqd.reactor, self.nsqd.opts.http_client_connect_timeout)
        return self._http

    # -- nsqd's changes ---------------------------------------------------------------------

    def _changed(self, what: str, obj: Any) -> None:
        if self.nsqd.shipper is self.primary:
            self.primary.changed(what, obj)

    # -- status -------------------------------------------------------------------------------

    @property
    def link_state(self) -> str:
        if self.state.role == PRIMARY:
            return self.primary.state
        side = self.standby_side
        if side is None:
            return DISCONNECTED
        return IN_SYNC if side.in_sync else CATCHING_UP

    def status(self) -> dict[str, Any]:
        """What ``GET /replication`` answers (and ``/stats`` shows as ``replication``)."""
        opts = self.nsqd.opts
        state = self.link_state
        out: dict[str, Any] = {
            "role": self.state.role,
            "epoch": self.state.epoch,
            "node": self.state.node,
            "peer": self.state.peer,
            "state": state,
            "degraded": state != IN_SYNC,  # the pair is not redundant now
            "mode": opts.replication_mode,
            "required": opts.replication_required,
        }
        if self.state.role == PRIMARY:
            out["lag"] = self.primary.lag()
            out.update(self.lease.status())
            if self.primary.standby_error:
                out["standby_error"] = self.primary.standby_error
            if self.settling:
                out["starting"] = True
            if self.deposed_by is not None:
                out["deposed"] = True
        else:
            out["synced"] = self.state.synced
            out["promote_after"] = DURATION.show(opts.promote_after) if opts.promote_after else ""
            out["lookupd"] = list(self.state.lookupd)  # its witnesses: the primary's lookupds
        return out
