"""A node of a replication pair: its persisted role and epoch, the link it dials
(a primary, to ``--replica``) or accepts (on nsqd's TCP port, magic ``"  R1"``),
who is primary on a link, and the status ``/replication`` and ``/stats`` show."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.application import service
from twisted.internet import endpoints, protocol
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.task import LoopingCall

from nsq_service.options import ConfigError, StartError, split_address
from nsq_wire.gofmt import join_host_port
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.core.replica import PRIMARY, STANDBY, ReplicaState, ReplicaStateError
from nsqd_tw.core.topic import StandbyError
from nsqd_tw.replication import wire
from nsqd_tw.replication.link import Link
from nsqd_tw.replication.primary import CATCHING_UP, DISCONNECTED, IN_SYNC, Primary, PrimaryEnd
from nsqd_tw.replication.standby import StandbySide

EndpointFactory = Callable[[str, int], IStreamClientEndpoint]
REDIAL_MIN, REDIAL_MAX = 0.1, 2.0  # seconds between a primary's attempts to reach its standby


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
    ``endpoint_factory(host, port)`` dials the peer.
    """

    name = "replication"

    def __init__(
        self,
        nsqd: NSQD,
        lookup: Any = None,
        tls: Any = None,
        endpoint_factory: EndpointFactory | None = None,
        secret: bytes | None = None,
    ) -> None:
        opts = nsqd.opts
        self.nsqd = nsqd
        self.lookup = lookup
        self.tls = tls
        self.secret = secret if secret is not None else read_secret(opts.replication_secret_file)
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
        self._dial_call: Any = None
        self._dialing = False
        self._redial = REDIAL_MIN
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
        self.primary.refresh()
        self.nsqd.observe_changes(self._changed)
        if self.state.role == STANDBY:
            self._serve_as_standby()
        else:
            self._serve_as_primary()
        self.log.info(
            "REPLICATION: {role} (epoch {epoch}), peer {peer}",
            role=self.state.role,
            epoch=self.state.epoch,
            peer=self.state.peer or "(none yet)",
        )
        if self.state.role == PRIMARY:
            self.log.warn(
                "REPLICATION: degraded until standby {peer} is in sync: {what}",
                peer=self.state.peer or "(none yet)",
                what="publishes are refused meanwhile (--replication-required)"
                if opts.replication_required
                else "what is acknowledged meanwhile is on this node only",
            )
        service.Service.startService(self)
        self._tick.start(self.timeout / 3, now=False)
        self._dial()

    def stopService(self) -> Any:
        service.Service.stopService(self)
        if self._tick.running:
            self._tick.stop()
        if self._dial_call is not None and self._dial_call.active():
            self._dial_call.cancel()
        self._dial_call = None
        for link in list(self.links):
            link.fail("nsqd is stopping")
        return None

    def _save(self) -> None:
        try:
            self.state.save(self.nsqd.data_path)
        except OSError as e:
            raise StartError(f"failed to persist replication state - {e}") from None

    # -- roles ---------------------------------------------------------------------------

    @property
    def peer_address(self) -> str:
        return self.state.peer

    def _serve_as_standby(self, primary_http: str = "") -> None:
        self.nsqd.shipper = None
        self.nsqd.set_standby(StandbyError(self.state.peer, self.state.epoch, primary_http))
        if self.lookup is not None:
            self.lookup.pause()

    def _serve_as_primary(self) -> None:
        self.nsqd.set_standby(None)
        self.nsqd.shipper = self.primary
        if self.lookup is not None:
            self.lookup.resume()

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
        self._serve_as_standby()

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
        }

    def accept(self, transport: Any, data: bytes) -> None:
        """A connection to nsqd's TCP port opened with the link's magic: it is a link."""
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
        """Both ends proved the secret: decide who is primary on this link."""
        peer = link.peer
        try:
            their_epoch, their_role = int(peer.get("epoch", 0)), str(peer.get("role", ""))
        except (TypeError, ValueError):
            link.fail("bad HELLO")
            return
        if peer.get("node") == self.state.node:
            link.fail("this is a link to the node itself (--replica names this nsqd)")
            return
        me = self.state
        if their_epoch > me.epoch and me.role == PRIMARY:
            self._demote(their_epoch, link.address, "a higher epoch")
        who = decide((me.epoch, me.role), (their_epoch, their_role))
        if who is None:
            why = (
                f"no primary on this link: {me.role} at epoch {me.epoch} here, "
                f"{their_role} at epoch {their_epoch} at {link.address}"
            )
            self.log.error("REPLICATION: {why}", why=why)
            link.fail(why)
            return
        old = self.link
        if old is not None and old is not link:
            old.fail("replaced by a new link")
        self.link = link
        self._redial = REDIAL_MIN
        if who == "me":
            if not self.nsqd.opts.replica:
                me.peer = link.address
                self.state.save(self.nsqd.data_path)
            self.log.info(
                "REPLICATION: standby {peer} linked{tls}, sending its snapshot",
                peer=link.address,
                tls=" (TLS)" if link.tls else "",
            )
            link.side = PrimaryEnd(self.primary, link)
            self.primary.attach(link)
        else:
            if their_epoch != me.epoch or me.peer != link.address:
                me.epoch, me.peer = their_epoch, link.address
                self.state.save(self.nsqd.data_path)
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
            return
        self.link = None
        if self.standby_side is not None and self.standby_side.link is link:
            self.standby_side = None
            self.log.warn("REPLICATION: link to primary {peer} lost - {why}", peer=link.address, why=why)
        if self.running:
            self._schedule_dial()

    def peer_refused(self, link: Link, why: str) -> None:
        self.log.error("REPLICATION: {peer} refused the link - {why}", peer=link.address, why=why)

    # -- the standby's snapshot -------------------------------------------------------------

    def snapshot_begins(self) -> None:
        self.state.synced = False
        self.state.save(self.nsqd.data_path)
        self.log.info("REPLICATION: receiving the snapshot of primary {peer}", peer=self.state.peer)

    def snapshot_ends(self) -> None:
        self.state.synced = True
        self.state.save(self.nsqd.data_path)
        self.log.info("REPLICATION: in sync with primary {peer}", peer=self.state.peer)

    def diverged(self) -> None:
        """An operation could not be applied: what is held here is not the
        primary's any more (not promotable until the next snapshot is whole)."""
        self.state.synced = False
        self.state.save(self.nsqd.data_path)

    # -- dialing (a primary reaches its standby) ---------------------------------------------

    def _endpoint(self, host: str, port: int) -> IStreamClientEndpoint:
        return endpoints.HostnameEndpoint(self.nsqd.reactor, host, port, timeout=self.timeout)

    def _schedule_dial(self) -> None:
        if self._dial_call is None and self.state.role == PRIMARY:
            self._dial_call = self.nsqd.reactor.callLater(self._redial, self._dial)
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
            if self.running:
                self._schedule_dial()

        d.addCallbacks(connected, failed)

    # -- heartbeats and timeouts -----------------------------------------------------------

    def tick(self) -> None:
        """Every third of --replication-timeout: the primary's PING; any link silent
        for the whole timeout is dropped."""
        try:
            now = self.now()
            for link in list(self.links):
                if now - link.heard_at > self.timeout:
                    self.log.error(
                        "REPLICATION: {peer} silent for {t}s, dropping the link", peer=link.address, t=self.timeout
                    )
                    link.abort(f"no frame in {self.timeout}s")
            if self.link is not None and self.primary.link is self.link:
                self.link.send(wire.frame(wire.PING))
        except Exception:
            self.log.failure("REPLICATION: tick failed")

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
        else:
            out["synced"] = self.state.synced
        return out
