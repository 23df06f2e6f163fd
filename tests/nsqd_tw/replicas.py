"""A replication pair in memory: two NSQDs on one MemoryReactorClock, their links
over :class:`tests.helpers.MemoryNetwork` (the tests of nsqd_tw.replication)."""

from __future__ import annotations

import json
import tempfile
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.testing import StringTransport

from lookupd_tw.witness import Witness
from nsq_wire.message import MESSAGE_HEADER_LENGTH
from nsqd_tw.core.channel import Channel
from nsqd_tw.core.message import Message
from nsqd_tw.core.nsqd import NSQD, memory_backend_factory
from nsqd_tw.replication import wire
from nsqd_tw.replication.service import ReplicationService
from nsqd_tw.tcp.protocol import V2Factory
from tests.helpers import MemoryNetwork, make_nsqd

SECRET = b"pair secret"


class Node:
    """One nsqd of the pair: its core, its TCP side (for the link's magic), its
    replication service. ``address``: its TCP address as the peer dials it."""

    def __init__(
        self,
        pair: ReplicaPair,
        port: int,
        role: str,
        replica: str = "",
        data_path: str | None = None,
        secret: bytes = SECRET,
        **opts: Any,
    ) -> None:
        self.pair = pair
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.data_path = data_path or tempfile.mkdtemp(prefix="nsq-replica-")
        self.secret = secret
        self.opts = dict(
            data_path=self.data_path,
            replication_role=role,
            replica=replica,
            replication_secret_file="(given)",
            broadcast_address="127.0.0.1",
            broadcast_tcp_port=port,
            broadcast_http_port=port + 1,
            **opts,
        )
        self.up = False
        self.run_blocking: Any = None  # how its fsyncs run (inline unless a test holds them)
        self.lookup = FakeLookup()
        self.http_client: Any = None  # how it asks the lookupds (automatic promotion)
        self.nsqd: NSQD = None  # type: ignore[assignment]
        self.repl: ReplicationService = None  # type: ignore[assignment]
        self.v2: V2Factory = None  # type: ignore[assignment]

    def start(self) -> Node:
        """A new process on the same data path (the previous one stopped or killed)."""
        opts = dict(self.opts)
        backend = opts.pop("backend_factory", memory_backend_factory)
        self.nsqd = make_nsqd(backend, clock=self.pair.net.reactor, **opts)
        if self.run_blocking is not None:
            self.nsqd.syncer._run_blocking = self.run_blocking
        self.v2 = V2Factory(self.nsqd)
        reactor = self.pair.net.reactor
        self.repl = ReplicationService(
            self.nsqd,
            self.lookup,
            None,
            self.pair.endpoint,
            secret=self.secret,
            http_client=self.http_client or self.pair.witnesses,
            mono=reactor.seconds,
        )
        self.v2.magics[wire.MAGIC] = self.repl.accept
        self.nsqd.startService()
        self.repl.startService()
        self.up = True
        return self

    def stop(self) -> None:
        """A clean stop."""
        self.up = False
        self.repl.stopService()
        self.pair.net.settle()
        self.nsqd.stopService()

    def kill(self) -> None:
        """kill -9: its connections drop, nothing more runs."""
        self.up = False
        for link in list(self.repl.links):
            link.transport.loseConnection()
        if self.repl._tick.running:
            self.repl._tick.stop()
        self.repl.running = False
        self.pair.net.settle()
        self.nsqd.syncer.stopping = True
        self.nsqd.running = False
        self.nsqd.dirlock.unlock()  # the process is gone: so is its lock

    @property
    def state(self) -> str:
        return self.repl.link_state

    def acks(self) -> list[int]:
        """Every ACK count this primary has received (recorded from now on)."""
        got: list[int] = []
        primary = self.repl.primary
        acknowledged = primary.acknowledged

        def record(count: int) -> None:
            got.append(count)
            acknowledged(count)

        primary.acknowledged = record  # type: ignore[method-assign]
        return got

    def channel(self, topic: str, channel: str) -> Channel:
        return self.nsqd.topics[topic].channels[channel]


class FakeLookup:
    """What the replication service asks of nsqd's LookupService: whether it
    registers (paused while a standby), with which lookupds, connected or not."""

    def __init__(self) -> None:
        self.paused = False
        self.up = True  # connected to its lookupds
        self.addresses = ["127.0.0.1:4161"]
        self.peers = [object()]

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def connected(self) -> bool:
        return self.up

    def observe_identified(self, observer: Any) -> None:
        self.identified = observer

    def lookupd_http_addresses(self) -> list[str]:
        return list(self.addresses)


class HeldSyncs:
    """A node's fsyncs, run only when the test says (:meth:`release`)."""

    def __init__(self) -> None:
        from twisted.internet import defer

        self.defer = defer
        self.waiting: list[tuple[Any, Any]] = []

    def __call__(self, fn: Any) -> Any:
        d = self.defer.Deferred()
        self.waiting.append((fn, d))
        return d

    def release(self) -> int:
        """Run the fsyncs waiting (and those they start); how many ran."""
        n = 0
        while self.waiting:
            fn, d = self.waiting.pop(0)
            fn()
            d.callback(None)
            n += 1
        return n


class Witnesses:
    """nsq-tw nsqlookupds as the pair's witnesses (lookupd_tw.witness), in memory:
    what the nodes POST to ``/witness/...``, answered at once; ``down``: those
    that cannot be reached; ``calls``: every call, as (address, path)."""

    def __init__(self, reactor: Any, *addresses: str) -> None:
        self.reactor = reactor
        self.witnesses: dict[str, Witness] = {}
        self.down: set[str] = set()
        self.go: set[str] = set()  # Go's nsqlookupd there: 404 to /witness
        self.calls: list[tuple[str, str]] = []
        for address in addresses:
            self.add(address)

    def add(self, address: str, up_for: float = 3600.0) -> Witness:
        """A witness at ``address`` that started ``up_for`` seconds ago."""
        witness = self.witnesses[address] = Witness(self.reactor.seconds)
        witness.started -= up_for
        return witness

    def post(self, url: str, data: bytes = b"", **kw: Any) -> Any:
        from urllib.parse import parse_qs, urlsplit

        from twisted.internet import defer
        from twisted.internet.error import ConnectionRefusedError

        parts = urlsplit(url)
        address, path = parts.netloc, parts.path
        self.calls.append((address, path))
        if address in self.go:
            return defer.succeed(_Answer(b"404 page not found", 404))
        witness = self.witnesses.get(address)
        if witness is None or address in self.down:
            return defer.fail(ConnectionRefusedError(address))
        q = {k: v[0] for k, v in parse_qs(parts.query).items()}
        pair, node, epoch = q["pair"], q["node"], int(q["epoch"])
        lease = int(q.get("lease_ms", "1")) / 1000
        if path == "/witness/heartbeat":
            status, holder = witness.heartbeat(pair, node, epoch, q.get("address", ""), lease)
            doc = {"status": status, **holder.json(witness.clock())}
        elif path == "/witness/claim":
            status, found = witness.claim(pair, node, epoch, q.get("address", ""), lease)
            doc = {"status": status, **(found.json(witness.clock()) if found is not None and found.epoch >= 0 else {})}
        else:
            witness.release(pair, node, epoch)
            doc = {"status": "released"}
        return defer.succeed(_Answer(json.dumps(doc).encode()))


class _Answer:
    def __init__(self, body: bytes, code: int = 200) -> None:
        self.body = body
        self.code = code

    def content(self) -> Any:
        from twisted.internet import defer

        return defer.succeed(self.body)


class ReplicaPair:
    """``primary`` streams to ``standby``; both dial through :meth:`endpoint`; the
    witness at 127.0.0.1:4161 (each node's lookupd) answers both."""

    def __init__(self, primary_opts: dict[str, Any] | None = None, standby_opts: dict[str, Any] | None = None) -> None:
        self.net = MemoryNetwork()
        self.witnesses = Witnesses(self.net.reactor, "127.0.0.1:4161")
        self.nodes: dict[int, Node] = {}
        self.standby = self.add(Node(self, 4250, "standby", **(standby_opts or {})))
        self.primary = self.add(Node(self, 4150, "primary", replica=self.standby.address, **(primary_opts or {})))

    def add(self, node: Node) -> Node:
        self.nodes[node.port] = node
        return node

    def endpoint(self, host: str, port: int) -> IStreamClientEndpoint:
        node = self.nodes.get(port)
        return self.net.endpoint(node.v2 if node is not None and node.up else None)

    def start(self) -> ReplicaPair:
        self.standby.start()
        self.primary.start()
        self.settle()
        return self

    def settle(self) -> None:
        """Move every byte and run what is due now, until nothing moves."""
        self.net.settle()

    def advance(self, seconds: float) -> None:
        self.net.advance(seconds)


class RawLink:
    """A connection to a node's TCP port that speaks the link by hand: a peer
    that may never finish its handshake."""

    _port = 60000

    def __init__(self, node: Node) -> None:
        RawLink._port += 1
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", RawLink._port))
        self.proto = node.v2.buildProtocol(None)
        self.proto.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        """Bytes to the node (to its link once the magic has handed the connection over)."""
        getattr(self.transport, "protocol", self.proto).dataReceived(data)

    @property
    def link(self) -> Any:
        return getattr(self.transport, "protocol", None)

    def errors(self) -> list[str]:
        """The ``error`` of each ERROR frame the node has written."""
        reader = wire.FrameReader()
        reader.feed(self.transport.value())
        out = []
        while (item := reader.next()) is not None:
            if item[0] == wire.ERROR:
                out.append(str(wire.json_payload(item[1]).get("error")))
        return out

    @property
    def closed(self) -> bool:
        return bool(self.transport.disconnecting)


def held(channel: Channel) -> list[Message]:
    """Every message a channel holds (queued, in flight, deferred), as the order a
    standby keeps them in does not matter: sorted by ID, each copy once."""
    out = channel.queued()
    backend = channel.backend
    out += [Message.decode(r) for r in backend.peek(backend.depth()) if len(r) >= MESSAGE_HEADER_LENGTH]
    out += channel.in_flight.values()
    out += channel.deferred.values()
    return sorted(out, key=lambda m: m.id)


def live(channel: Channel) -> list[bytes]:
    """The IDs a channel holds, less the copies its skip counts will drop."""
    skips = dict(channel.skips)
    out = []
    for msg in held(channel):
        n = skips.get(msg.id, 0)
        if n:
            skips[msg.id] = n - 1
            continue
        out.append(msg.id)
    return out
