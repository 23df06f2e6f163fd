"""nsqd's side of discovery: register topics and channels with every nsqlookupd.

For each ``--lookupd-tcp-address`` a :class:`LookupPeer` keeps a connection
(reconnecting with backoff). On every connection it sends the V1 magic,
IDENTIFY (broadcast address, ports, version, hostname) and REGISTERs every
topic and channel, as Go's connect callback does; then REGISTER/UNREGISTER on
every change, and PING every 15 s. ``PUT /config/nsqlookupd_tcp_addresses``
adds and removes peers live. When a topic is created, nsqd asks the lookupds
(over HTTP) for the topic's channels and creates them before messages flow,
so what is published before consumers connect is not lost.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.application import service
from twisted.internet import defer, protocol
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.interfaces import IProtocolFactory, IStreamClientEndpoint
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure
from zope.interface import implementer

from nsq_service.httpget import QuickHTTPClient
from nsq_service.options import hostname
from nsq_wire import lookupd, v1
from nsq_wire.gofmt import join_host_port
from nsq_wire.names import is_ephemeral
from nsq_wire.version import VERSION

if TYPE_CHECKING:
    from nsqd_tw.core.channel import Channel
    from nsqd_tw.core.nsqd import NSQD
    from nsqd_tw.core.topic import Topic

PING_INTERVAL = 15.0
COMMAND_TIMEOUT = 5.0

EndpointFactory = Callable[[str, int], IStreamClientEndpoint]


class LookupdError(Exception):
    pass


def split_host_port(address: str) -> tuple[str, int]:
    """Go's net.SplitHostPort, then a numeric port in 1..65535 (what a peer can dial).

    Raises ValueError with Go's text (``address junk: missing port in address``).
    """

    def bad(why: str) -> ValueError:
        return ValueError(f"address {address}: {why}")

    i = address.rfind(":")
    if i < 0:
        raise bad("missing port in address")
    j = k = 0
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise bad("missing ']' in address")
        if end + 1 == len(address):
            raise bad("missing port in address")
        if end + 1 != i:
            raise bad("too many colons in address" if address[end + 1] == ":" else "missing port in address")
        host = address[1:end]
        j, k = 1, end + 1
    else:
        host = address[:i]
        if ":" in host:
            raise bad("too many colons in address")
    if "[" in address[j:]:
        raise bad("unexpected '[' in address")
    if "]" in address[k:]:
        raise bad("unexpected ']' in address")
    port = address[i + 1 :]
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise bad("invalid port")
    return host, int(port)


@implementer(IStreamClientEndpoint)
class AddressEndpoint:
    """A TCP connection to an IP address: what HostnameEndpoint makes of one,
    without importing twisted.internet.endpoints, which loads pyOpenSSL, tens of
    ms of a start with ``--lookupd-tcp-address`` (its peers connect at start)."""

    def __init__(self, reactor: Any, host: str, port: int, timeout: float) -> None:
        self.reactor = reactor
        self.host = host
        self.port = port
        self.timeout = timeout

    def connect(self, factory: IProtocolFactory) -> defer.Deferred[Any]:
        connector: list[Any] = []

        def cancel(d: defer.Deferred[Any]) -> None:
            d.errback(defer.CancelledError())  # before stopConnecting's own failure
            connector[0].stopConnecting()

        d: defer.Deferred[Any] = defer.Deferred(cancel)
        connector.append(self.reactor.connectTCP(self.host, self.port, _Connecting(factory, d), timeout=self.timeout))
        return d


class _Connecting(protocol.ClientFactory):
    """Builds ``factory``'s protocol and fires ``ready`` with it once connected."""

    noisy = False

    def __init__(self, factory: IProtocolFactory, ready: defer.Deferred[Any]) -> None:
        self.factory = factory
        self.ready = ready

    def buildProtocol(self, addr: Any) -> Any:
        inner = self.factory.buildProtocol(addr)
        if inner is None:
            self.ready.errback(LookupdError("connection refused by the protocol factory"))
            return None
        return _Connected(inner, self.ready)

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if not self.ready.called:
            self.ready.errback(reason)


class _Connected(protocol.Protocol):
    """The transport's protocol: hands everything to ``inner``."""

    def __init__(self, inner: Any, ready: defer.Deferred[Any]) -> None:
        self.inner = inner
        self.ready = ready

    def connectionMade(self) -> None:
        self.inner.makeConnection(self.transport)
        if not self.ready.called:
            self.ready.callback(self.inner)

    def dataReceived(self, data: bytes) -> None:
        self.inner.dataReceived(data)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.inner.connectionLost(reason)


class LookupPeerProtocol(protocol.Protocol):
    """One connection to an nsqlookupd; commands are answered in order."""

    transport: Any

    def __init__(self, peer: LookupPeer) -> None:
        self.peer = peer
        self._reader = v1.ResponseReader(peer.max_body_size)
        self._pending: deque[tuple[defer.Deferred[bytes], Any]] = deque()
        self.closed = False

    def connectionMade(self) -> None:
        self.transport.write(v1.MAGIC_V1)
        self.peer.connected(self)

    def command(self, data: bytes) -> defer.Deferred[bytes]:
        d: defer.Deferred[bytes] = defer.Deferred()
        if self.closed:
            d.errback(LookupdError("not connected"))
            return d
        timer = self.peer.reactor.callLater(COMMAND_TIMEOUT, self._timed_out)
        self._pending.append((d, timer))
        self.transport.write(data)
        return d

    def _timed_out(self) -> None:
        self.peer.log.error(
            "LOOKUPD({addr}): no response in {t}s, reconnecting", addr=self.peer.address, t=COMMAND_TIMEOUT
        )
        self.transport.abortConnection()

    def dataReceived(self, data: bytes) -> None:
        self._reader.feed(data)
        while True:
            try:
                payload = self._reader.next()
            except v1.ResponseTooLarge as e:
                self.peer.log.error(
                    "LOOKUPD({addr}): response body size ({size}) is greater than limit ({limit})",
                    addr=self.peer.address,
                    size=e.size,
                    limit=self.peer.max_body_size,
                )
                self.transport.abortConnection()
                return
            if payload is None:
                return
            if not self._pending:
                continue
            d, timer = self._pending.popleft()
            if timer.active():
                timer.cancel()
            d.callback(payload)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.closed = True
        pending, self._pending = self._pending, deque()
        for d, timer in pending:
            if timer.active():
                timer.cancel()
            d.errback(LookupdError(f"connection lost - {reason.getErrorMessage()}"))
        self.peer.disconnected(self)


class _PeerFactory(protocol.Factory):
    noisy = False

    def __init__(self, peer: LookupPeer) -> None:
        self.peer = peer

    def buildProtocol(self, addr: Any) -> LookupPeerProtocol:
        p = LookupPeerProtocol(self.peer)
        p.factory = self
        return p


class LookupPeer(service.Service):
    """A reconnecting connection to one nsqlookupd (Go's lookupPeer), through
    the endpoints ``endpoint_factory(host, port)`` makes."""

    def __init__(self, lookup: LookupService, address: str, endpoint_factory: EndpointFactory) -> None:
        self.lookup = lookup
        self.log = lookup.log
        self.nsqd = lookup.nsqd
        self.reactor = lookup.nsqd.reactor
        self.address = address
        self.max_body_size = lookup.nsqd.opts.max_body_size
        self.info: dict[str, Any] = {}
        self.proto: LookupPeerProtocol | None = None
        host, port = split_host_port(address)
        # an empty host is the local system, as for Go's Dial
        endpoint = endpoint_factory(host or "localhost", port)
        # imported with the first peer: twisted.application.internet costs a start ~30 ms
        from twisted.application.internet import ClientService, backoffPolicy

        self.client = ClientService(
            endpoint, _PeerFactory(self), retryPolicy=backoffPolicy(initialDelay=0.2, maxDelay=15.0), clock=self.reactor
        )
        self.setName(address)

    def __str__(self) -> str:
        return self.address

    def startService(self) -> None:
        service.Service.startService(self)
        self.log.info("LOOKUP({addr}): adding peer", addr=self.address)
        self.client.startService()

    def stopService(self) -> Any:
        service.Service.stopService(self)
        self.proto = None
        return self.client.stopService()

    @property
    def http_address(self) -> str | None:
        addr = self.info.get("broadcast_address")
        if not addr:
            return None
        return join_host_port(addr, str(self.info.get("http_port")))

    def connected(self, proto: LookupPeerProtocol) -> None:
        self.log.info("LOOKUP connected to {addr}", addr=self.address)
        self.proto = proto
        self._identify_and_register(proto)

    @defer.inlineCallbacks
    def _identify_and_register(self, proto: LookupPeerProtocol) -> Any:
        opts = self.nsqd.opts
        ci = {
            "broadcast_address": opts.broadcast_address,
            "hostname": hostname(),
            "http_port": opts.broadcast_http_port,
            "tcp_port": opts.broadcast_tcp_port,
            "version": VERSION,
        }
        cmd = v1.identify(json.dumps(ci, separators=(",", ":")).encode())
        try:
            resp = yield proto.command(cmd)
        except Exception as e:
            self.log.error("LOOKUPD({addr}): IDENTIFY - {err}", addr=self.address, err=e)
            return
        if resp.startswith(b"E_"):
            text = resp.decode("utf-8", "replace")
            self.log.info("LOOKUPD({addr}): lookupd returned {resp}", addr=self.address, resp=text)
            proto.transport.loseConnection()
            return
        try:
            info = json.loads(resp)
            if not isinstance(info, dict):
                raise ValueError("not an object")
        except ValueError:
            self.log.error("LOOKUPD({addr}): parsing response - {resp}", addr=self.address, resp=resp)
            proto.transport.loseConnection()
            return
        self.info = info
        self.log.info("LOOKUPD({addr}): peer info {info}", addr=self.address, info=go_peer_info(info))
        self.lookup.identified(self)
        if not info.get("broadcast_address"):
            self.log.error("LOOKUPD({addr}): no broadcast address", addr=self.address)
        commands = []
        for topic in self.nsqd.topics.values():
            if not topic.channels:
                commands.append(v1.register(topic.name))
            for channel in topic.channels.values():
                commands.append(v1.register(topic.name, channel.name))
        for cmd in commands:
            self.log.info("LOOKUPD({addr}): {cmd}", addr=self.address, cmd=cmd.decode().strip())
            try:
                yield proto.command(cmd)
            except Exception as e:
                self.log.error("LOOKUPD({addr}): {cmd} - {err}", addr=self.address, cmd=cmd.decode().strip(), err=e)
                return

    def disconnected(self, proto: LookupPeerProtocol) -> None:
        if self.proto is proto:
            self.proto = None

    def command(self, cmd: bytes) -> None:
        """Send a command if connected (a reconnection re-sends everything)."""
        proto = self.proto
        if proto is None:
            return
        d = proto.command(cmd)
        d.addErrback(
            lambda f: self.log.error(
                "LOOKUPD({addr}): {cmd} - {err}", addr=self.address, cmd=cmd.decode().strip(), err=f.value
            )
        )


class LookupService(service.MultiService):
    """Every lookupd peer, the change notifications and the 15 s PINGs.

    ``endpoint_factory(host, port)`` connects to the lookupds (HostnameEndpoints
    by default); ``http_client`` (treq's HTTPClient or alike) asks them for a
    new topic's channels (by default one on nsqd's reactor, with the
    ``--http-client-*`` timeouts).
    """

    name = "lookup"

    def __init__(self, nsqd: NSQD, endpoint_factory: EndpointFactory | None = None, http_client: Any = None) -> None:
        super().__init__()
        self.nsqd = nsqd
        self.log = nsqd.log_gate.logger("nsqd_tw.lookup", self)
        self.endpoint_factory = endpoint_factory or self._endpoint
        self._http = http_client
        self._ping = LoopingCall(self.ping)
        self._ping.clock = nsqd.reactor
        nsqd.observe_changes(self.changed)
        nsqd.observe_options(self.options_changed)
        nsqd.set_channel_source(self.topic_channels)
        self._queries: set[defer.Deferred[Any]] = set()
        self.paused = False  # beyond Go: a replication standby registers nowhere
        self._identified_observers: list[Callable[[], None]] = []

    @property
    def peers(self) -> list[LookupPeer]:
        return list(self)  # type: ignore[arg-type]

    def startService(self) -> None:
        self._sync_peers()
        super().startService()
        self._ping.start(PING_INTERVAL, now=False)

    def stopService(self) -> Any:
        if self._ping.running:
            self._ping.stop()
        for query in list(self._queries):
            query.cancel()
        self.log.info("LOOKUP: closing")
        return super().stopService()

    def _endpoint(self, host: str, port: int) -> IStreamClientEndpoint:
        if isIPAddress(host) or isIPv6Address(host):
            return AddressEndpoint(self.nsqd.reactor, host, port, timeout=1)
        from twisted.internet import endpoints  # a name to resolve: it loads pyOpenSSL (tens of ms)

        return endpoints.HostnameEndpoint(self.nsqd.reactor, host, port, timeout=1)

    def _http_client(self) -> Any:
        if self._http is None:
            self._http = QuickHTTPClient(self.nsqd.reactor, self.nsqd.opts.http_client_connect_timeout)
        return self._http

    def observe_identified(self, observer: Callable[[], None]) -> None:
        """Beyond Go: call ``observer()`` when a lookupd answers IDENTIFY (its HTTP
        address is known from then on: a replication primary tells its standby)."""
        self._identified_observers.append(observer)

    def identified(self, peer: LookupPeer) -> None:
        for observer in self._identified_observers:
            try:
                observer()
            except Exception:
                self.log.failure("lookupd observer failed for {addr}", addr=peer.address)

    def pause(self) -> None:
        """Beyond Go: leave every lookupd (a replication standby), which forgets this
        node's topics and channels at once, until :meth:`resume`."""
        self.paused = True
        for peer in self.peers:
            self.log.info("LOOKUP({addr}): removing peer (replication standby)", addr=peer.address)
            peer.disownServiceParent()

    def resume(self) -> None:
        """Register with the lookupds again (a replication standby promoted)."""
        if self.paused:
            self.paused = False
            if self.running:
                self._sync_peers()

    def _sync_peers(self) -> None:
        if self.paused:
            return
        wanted = list(self.nsqd.opts.lookupd_tcp_addresses)
        for peer in self.peers:
            if peer.address not in wanted:
                self.log.info("LOOKUP({addr}): removing peer", addr=peer.address)
                peer.disownServiceParent()
        have = {p.address for p in self.peers}
        for address in wanted:
            if address not in have:  # a repeated address is one peer, as in Go
                have.add(address)
                LookupPeer(self, address, self.endpoint_factory).setServiceParent(self)

    def options_changed(self, name: str) -> None:
        if name == "lookupd_tcp_addresses" and self.running:
            self._sync_peers()

    def ping(self) -> None:
        for peer in self.peers:
            self.log.debug("LOOKUPD({addr}): sending heartbeat", addr=peer.address)
            peer.command(v1.PING)

    def changed(self, what: str, obj: Topic | Channel) -> None:
        if what.startswith("topic"):
            verb = v1.unregister if what == "topic_deleted" else v1.register
            branch, cmd = "topic", verb(obj.name)
        else:
            channel: Any = obj
            branch = "channel"
            verb = v1.unregister if what == "channel_deleted" else v1.register
            cmd = verb(channel.topic_name, channel.name)
        for peer in self.peers:
            self.log.info("LOOKUPD({addr}): {branch} {cmd}", addr=peer.address, branch=branch, cmd=cmd.decode().strip())
            peer.command(cmd)

    def connected(self) -> bool:
        """Whether any lookupd is connected now (beyond Go: a replication primary's fence)."""
        return any(p.proto is not None and p.info for p in self.peers)

    def lookupd_http_addresses(self) -> list[str]:
        return [a for a in (p.http_address for p in self.peers) if a]

    def topic_channels(self, topic: str) -> defer.Deferred[list[str]] | None:
        """The topic's channels known to the lookupds (None: don't wait)."""
        addresses = self.lookupd_http_addresses()
        if not addresses:
            if self.nsqd.opts.lookupd_tcp_addresses and not self.paused:
                self.log.error(
                    "no available nsqlookupd to query for channels to pre-create for topic {topic}", topic=topic
                )
            return None
        d = self._query_channels(topic, addresses)
        self._queries.add(d)

        def done(result: Any) -> Any:
            self._queries.discard(d)
            return result

        return d.addBoth(done)

    @defer.inlineCallbacks
    def _query_channels(self, topic: str, addresses: list[str]) -> Any:
        client = self._http_client()
        timeout = self.nsqd.opts.http_client_request_timeout

        @defer.inlineCallbacks
        def one(address: str) -> Any:
            url = lookupd.channels_url(address, topic)
            self.log.info("CI: querying nsqlookupd {url}", url=url)
            headers = {b"Accept": [lookupd.ACCEPT.encode()]}
            resp = yield client.get(url, headers=headers, timeout=timeout, reactor=self.nsqd.reactor)
            body = yield resp.content()
            if resp.code != 200:
                raise LookupdError(f"got response {resp.code} {resp.phrase.decode()} {body!r}")
            return lookupd.channels(body)

        results = yield defer.DeferredList([one(a) for a in addresses], consumeErrors=True)
        channels: set[str] = set()
        errors = []
        for ok, value in results:
            if ok:
                channels.update(value)
            else:
                errors.append(value.getErrorMessage())
        if errors:
            prefix = "failed to query any nsqlookupd: " if len(errors) == len(addresses) else ""
            self.log.warn(
                "failed to query nsqlookupd for channels to pre-create for topic {topic} - {prefix}{err}",
                topic=topic,
                prefix=prefix,
                err="; ".join(errors),
            )
        return sorted(c for c in channels if not is_ephemeral(c))


def go_peer_info(info: dict[str, Any]) -> str:
    """nsqlookupd's IDENTIFY answer as Go's %+v prints nsqd's peerInfo struct."""

    def field(key: str, default: Any) -> Any:
        value = info.get(key, default)
        return default if value is None else value

    return (
        f"{{TCPPort:{field('tcp_port', 0)} HTTPPort:{field('http_port', 0)} "
        f"Version:{field('version', '')} BroadcastAddress:{field('broadcast_address', '')}}}"
    )
