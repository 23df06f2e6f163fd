"""Small helpers shared by the tests (Go's mustStartNSQD/readValidate spirit)."""

from __future__ import annotations

import json
import struct
from typing import Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IProtocolFactory, IStreamClientEndpoint
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.test import iosim
from zope.interface import implementer

from nsq_wire.commands import encode_command, mpub
from nsq_wire.frames import FRAME_TYPE_MESSAGE, MAGIC_V2, FrameReader
from nsq_wire.gofmt import join_host_port
from nsqd_tw.core.message import Message
from nsqd_tw.core.nsqd import NSQD, memory_backend_factory
from nsqd_tw.options import NSQDOptions
from nsqd_tw.tcp.protocol import V2Factory

START_TIME = 1_700_000_000.0


def make_nsqd(backend_factory: Any = memory_backend_factory, clock: Any = None, **kwargs: Any) -> NSQD:
    """An NSQD on a Clock (or ``clock``) at a realistic time, with memory
    backends unless told otherwise (``backend_factory=None`` for disk queues,
    with ``data_path`` set; fsyncs then run inline)."""
    kwargs.setdefault("node_id", 1)
    if clock is None:
        clock = Clock()
    if clock.seconds() < START_TIME:
        clock.advance(START_TIME - clock.seconds())
    nsqd = NSQD(NSQDOptions(**kwargs), clock, backend_factory, run_blocking=run_inline)
    # a TTL sweep's slice stops at a count, never because the machine is busy
    # (its time bound has tests of its own)
    nsqd.expiry.stopwatch = standing_still
    return nsqd


def standing_still() -> float:
    """A stopwatch that never runs (see :attr:`ExpirySweep.stopwatch`)."""
    return 0.0


def run_inline(fn: Any) -> Any:
    return defer.maybeDeferred(fn)


class MemoryNetwork:
    """TCP connections in memory (:mod:`twisted.test.iosim`) on a
    MemoryReactorClock, for code that takes an endpoint: :meth:`endpoint`
    connects to a server factory; :meth:`settle` moves the bytes and runs what
    is due until nothing moves; :meth:`advance` lets time pass."""

    def __init__(self, reactor: Any = None) -> None:
        if reactor is None:  # else the tests' reactor, pumped by :meth:`settle` on a LoopingCall
            reactor = MemoryReactorClock()
            reactor.advance(START_TIME)
        self.reactor = reactor
        self.pumps: list[iosim.IOPump] = []
        self._port = 40000

    def endpoint(self, server_factory: IProtocolFactory | None) -> IStreamClientEndpoint:
        """Connects to ``server_factory``; None refuses the connection."""
        return _MemoryEndpoint(self, server_factory)

    def connect(self, server_factory: IProtocolFactory | None, client_factory: IProtocolFactory) -> Any:
        if server_factory is None:
            raise ConnectionRefusedError()
        self._port += 1
        server_addr = IPv4Address("TCP", "127.0.0.1", 4150)
        client_addr = IPv4Address("TCP", "127.0.0.1", self._port)
        server = server_factory.buildProtocol(client_addr)
        client = client_factory.buildProtocol(server_addr)
        assert server is not None and client is not None
        server_io = iosim.FakeTransport(server, isServer=True, hostAddress=server_addr, peerAddress=client_addr)
        client_io = iosim.FakeTransport(client, isServer=False, hostAddress=client_addr, peerAddress=server_addr)
        self.pumps.append(iosim.connect(server, server_io, client, client_io, greet=False, clock=self.reactor))
        return client

    def settle(self) -> None:
        clock = isinstance(self.reactor, MemoryReactorClock)
        for _ in range(1000):
            if clock:
                self.reactor.advance(0)
            if not any([pump.flush(advanceClock=False) for pump in self.pumps]):
                return
        raise AssertionError("the network never settled")

    def advance(self, seconds: float, step: float = 0.05) -> None:
        """Let ``seconds`` pass in ``step``s, settling after each."""
        end = self.reactor.seconds() + seconds
        while self.reactor.seconds() < end:
            self.reactor.advance(min(step, end - self.reactor.seconds()))
            self.settle()


@implementer(IStreamClientEndpoint)
class _MemoryEndpoint:
    def __init__(self, network: MemoryNetwork, server_factory: IProtocolFactory | None) -> None:
        self.network = network
        self.server_factory = server_factory

    def connect(self, factory: IProtocolFactory) -> defer.Deferred[Any]:
        return defer.maybeDeferred(self.network.connect, self.server_factory, factory)


class FakeClient:
    """A V2Protocol on a StringTransport, driven like a real client would."""

    _port = 50000

    def __init__(self, nsqd: NSQD, magic: bool = True) -> None:
        FakeClient._port += 1
        self.nsqd = nsqd
        self.clock: Clock = nsqd.reactor
        self.proto = V2Factory(nsqd).buildProtocol(None)
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", FakeClient._port))
        self.proto.makeConnection(self.transport)
        self._reader = FrameReader()
        if magic:
            self.send(MAGIC_V2)

    def send(self, data: bytes) -> None:
        self.proto.dataReceived(data)

    def command(self, name: bytes, *params: bytes | str, body: bytes | None = None) -> None:
        self.send(encode_command(name, *params, body=body))

    def frames(self) -> list[tuple[int, bytes]]:
        """Every frame written since the last call (after the end-of-turn flush)."""
        self.clock.advance(0)
        self._reader.feed(self.transport.value())
        self.transport.clear()
        return self._reader.frames()

    def frame(self) -> tuple[int, bytes]:
        frames = self.frames()
        assert len(frames) == 1, frames
        return frames[0]

    def messages(self) -> list[Message]:
        return [Message.decode(data) for ft, data in self.frames() if ft == FRAME_TYPE_MESSAGE]

    @property
    def disconnected(self) -> bool:
        return bool(self.transport.disconnecting)

    def lose(self) -> None:
        from twisted.internet.error import ConnectionDone
        from twisted.python.failure import Failure

        self.proto.connectionLost(Failure(ConnectionDone()))

    # a few whole exchanges
    def identify(self, **data: Any) -> tuple[int, bytes]:
        self.command(b"IDENTIFY", body=json.dumps(data).encode())
        return self.frame()

    def sub(self, topic: str, channel: str, rdy: int | None = None) -> tuple[int, bytes]:
        self.command(b"SUB", topic, channel)
        frame = self.frame()
        if rdy is not None:
            self.command(b"RDY", str(rdy))
        return frame

    def pub(self, topic: str, body: bytes) -> tuple[int, bytes]:
        self.command(b"PUB", topic, body=body)
        return self.frame()

    def mpub(self, topic: str, bodies: list[bytes]) -> tuple[int, bytes]:
        self.send(mpub(topic, bodies))
        return self.frame()

    def fin(self, msg_id: bytes) -> None:
        self.send(b"FIN " + msg_id + b"\n")


def size_prefixed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


class InProcessNSQD:
    """The real service hierarchy on 127.0.0.1:0, in the test's reactor."""

    def __init__(self, **kwargs: Any) -> None:
        import tempfile

        kwargs.setdefault("tcp_address", "127.0.0.1:0")
        kwargs.setdefault("http_address", "127.0.0.1:0")
        kwargs.setdefault("https_address", "127.0.0.1:0")  # listened on once a --tls-cert is given
        kwargs.setdefault("node_id", 1)
        if "data_path" not in kwargs:
            kwargs["data_path"] = tempfile.mkdtemp(prefix="nsqd-test-")
        self.opts = NSQDOptions(**kwargs)

    def start(self) -> InProcessNSQD:
        from twisted.internet import reactor

        from nsqd_tw.tap import makeService

        self.service = makeService(self.opts, reactor)
        self.service.privilegedStartService()
        self.service.startService()
        self.nsqd: NSQD = self.service.nsqd  # type: ignore[attr-defined]
        from tests.integration.procs import unsafe_listener

        bound = self.service.bound  # type: ignore[attr-defined]
        for kind, address in (("TCP", bound.tcp), ("HTTP", bound.http), ("HTTPS", bound.https)):
            why = address and unsafe_listener(join_host_port(*address))
            if why:
                self.service.stopService()
                raise AssertionError(f"in-process nsqd {kind} {why}")
        return self

    @property
    def tcp_port(self) -> int:
        assert self.service.bound.tcp is not None  # type: ignore[attr-defined]
        return int(self.service.bound.tcp[1])  # type: ignore[attr-defined]

    @property
    def http_port(self) -> int:
        assert self.service.bound.http is not None  # type: ignore[attr-defined]
        return int(self.service.bound.http[1])  # type: ignore[attr-defined]

    def stop(self) -> Any:
        return self.service.stopService()
