"""A node of a replication pair: its persisted role and epoch, the links it
accepts (on nsqd's TCP port, magic ``"  R1"``) and what they and the two ends of
the stream ask of their node (:class:`~.link.Node`), its ticks, and the status
``/replication`` and ``/stats`` show.

Its collaborators, each a module: :mod:`.roles` (role and epoch changes),
:mod:`.pairing` (the link a primary dials, who is primary on a link, a link lost),
:mod:`.admission`, :mod:`.lease` and :mod:`.failover`."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.internet.task import LoopingCall
from twisted.logger import LogLevel

from nsq_service.options import DURATION, ConfigError, StartError
from nsq_service.web import http_client
from nsq_wire.gofmt import join_host_port
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.core.replica import PRIMARY, STANDBY, STATE_FILE, SYNCED_FILE, ReplicaState, ReplicaStateError
from nsqd_tw.core.topic import StandbyError
from nsqd_tw.replication import wire
from nsqd_tw.replication.admission import Admission
from nsqd_tw.replication.failover import Failover, PromoteError
from nsqd_tw.replication.lease import PrimaryLease, Takeover, WitnessClient, pair_id
from nsqd_tw.replication.link import Link
from nsqd_tw.replication.pairing import EndpointFactory, Pairing
from nsqd_tw.replication.primary import CATCHING_UP, DISCONNECTED, IN_SYNC, Primary
from nsqd_tw.replication.roles import Roles
from nsqd_tw.replication.standby import StandbySide

__all__ = ["PromoteError", "ReplicationService"]


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
        self._http = http_client
        self.unlinked_since = nsqd.now()  # since when no primary (standby) or standby (primary) is linked
        self.unlinked_mono = self.mono()
        self.peer_promote_after = 0.0  # the standby's --promote-after, as it said in its HELLO
        self.witness_client = WitnessClient(self._http_client, nsqd.reactor, self.timeout / 3)
        self.lease = PrimaryLease(self)  # a primary's right to acknowledge alone
        self.takeover = Takeover(self)  # a standby's side: the lease it granted, its claim
        self.failover = Failover(self)
        self.roles = Roles(self)  # role and epoch changes
        self.pairing = Pairing(self, endpoint_factory)  # its links: dialed, established, lost
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
        self.roles.start()
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
        self.retick()
        if self.state.role == PRIMARY and not self.settling:
            self.lease.heartbeat()
        self.pairing.dial()

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
        self.pairing.stop()
        self.roles.stop()
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

    # -- roles (nsqd_tw.replication.roles) ----------------------------------------------------

    @property
    def peer_address(self) -> str:
        return self.state.peer

    @property
    def settling(self) -> bool:
        """A primary starting, waiting to hear from its replica (:class:`Roles`)."""
        return self.roles.settling

    def promote_request(self, force: bool = False) -> defer.Deferred[None]:
        """POST /replication/promote: see :class:`Failover` (fails with :class:`PromoteError`)."""
        d: defer.Deferred[None] = self.failover.request(force)
        return d

    def promote(self, force: bool = False, why: str = "POST /replication/promote", claimed: bool = False) -> None:
        """Make this standby the primary now: see :meth:`Roles.promote`."""
        self.roles.promote(force, why, claimed)

    # -- links (nsqd_tw.replication.pairing) ---------------------------------------------------

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
            "lookupd": self.lookupds() if self.state.role == PRIMARY else [],
            "promote_after": opts.promote_after,
            "lease": self.timeout,  # a standby waits this out (and a margin) before taking over
        }

    def _lookupd_identified(self) -> None:
        """A lookupd answered IDENTIFY: a primary tells its standby at once."""
        if self.link is not None and self.primary.link is self.link:
            self.primary.tell_witnesses(self.lookupds(), self.witness_total())

    def lookupds(self) -> list[str]:
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
        self.pairing.established(link)

    def link_lost(self, link: Link, why: str) -> None:
        self.pairing.link_lost(link, why)

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

    def diverged(self) -> None:
        """What is held here is not the primary's (a snapshot begins, an operation
        could not be applied): not promotable until the next snapshot is whole.
        Never raises: a full disk is said once a while, and the marker is gone."""
        try:
            self.state.mark_unsynced(self.nsqd.data_path)
        except OSError as e:
            why = f"REPLICATION: cannot write {STATE_FILE} - {e} ({SYNCED_FILE} is removed: not synced)"
            self.nsqd.queue_events.emit(("replication", "unsynced"), LogLevel.warn, lambda n: why)

    # -- heartbeats and timeouts -----------------------------------------------------------

    def retick(self) -> None:
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
                    self.primary.tell_witnesses(self.lookupds(), self.witness_total())
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
        return self.lookupds() if self.state.role == PRIMARY else list(self.state.lookupd)

    def witness_total(self) -> int:
        """How many witnesses a majority is counted of: those configured (one not
        reached yet counts, and fails)."""
        opts = self.nsqd.opts
        if opts.replication_witnesses:
            return len(opts.replication_witnesses)
        if self.state.role == PRIMARY:
            return max(len(opts.lookupd_tcp_addresses), len(self.lookupds()))
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
        """A witness says another node took over: see :meth:`Roles.deposed`."""
        self.roles.deposed(witness, doc)

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
