"""Listening services and the top service of nsqd and nsqlookupd."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.application import service
from twisted.internet import defer, main, tcp
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.python.failure import Failure
from zope.interface import implementer

from nsq_service.limits import listen_backlog, watch_accept_errors
from nsq_service.log import Logger
from nsq_service.options import exit_fatal, missing_port, split_address, start_error_text
from nsq_wire.gofmt import go_errno, join_host_port


@dataclass
class Bound:
    """The addresses a server's listeners bound (a port 0 made real), as (host, port)."""

    tcp: tuple[str, int] | None = None
    http: tuple[str, int] | None = None
    https: tuple[str, int] | None = None

    @staticmethod
    def of(host: Any) -> tuple[str, int]:
        return (getattr(host, "host", ""), getattr(host, "port", 0))


def address_text(host: Any) -> str:
    """A listening address as Go prints it: ``HOST:PORT``, or a unix socket's path."""
    if hasattr(host, "port"):
        return join_host_port(host.host, host.port)
    name = host.name
    return os.fsdecode(name) if isinstance(name, bytes) else str(name)


class _Connection(tcp.Server):
    """An accepted TCP connection that reads into its port's buffer.

    Twisted's ``recv(bufferSize)`` allocates ``bufferSize`` bytes for every read
    and shrinks them to what arrived. nsqd raises a V2 client's ``bufferSize`` to
    1 MiB (its unsent-output limit, which Twisted reads from the same attribute),
    and the shrunk reads, interleaved with longer-lived objects, grew the heap
    without bound under connection churn. Here a read fills one buffer the port
    keeps for all its connections (one reactor thread) and the bytes that
    arrived are copied out: an allocation of exactly their size.

    As in Go, every accepted connection has TCP_NODELAY: a small frame written
    while an earlier one is not yet acknowledged goes out at once instead of
    waiting for that ACK (Nagle's algorithm).
    """

    def __init__(
        self, sock: socket.socket, protocol: Any, client: Any, server: Any, sessionno: int, reactor: Any
    ) -> None:
        super().__init__(sock, protocol, client, server, sessionno, reactor)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # gone already: the first read says so

    def doRead(self) -> Any:
        port: Any = self.server  # a _Port
        size = self.bufferSize
        buf = port.read_buffer
        if len(buf) < size:
            buf = port.read_buffer = memoryview(bytearray(size))
        try:
            n = self.socket.recv_into(buf, size)
        except OSError as e:
            if e.errno == errno.EWOULDBLOCK:
                return None
            return main.CONNECTION_LOST
        return self._dataReceived(buf[:n].tobytes())


def write_through(transport: Any) -> None:
    """Put what was written to ``transport`` on the wire now, not when the reactor
    next finds the socket writable (an answer someone waits for, made outside the
    turn that read the request). The TCP transport under any wrappers (TLS) is
    written as the reactor would (``IWriteDescriptor.doWrite``); a write error is
    left for the reactor to find."""
    t = transport
    while t is not None and not hasattr(t, "doWrite"):
        t = getattr(t, "transport", None)
    if t is None or not getattr(t, "connected", False) or getattr(t, "disconnecting", True):
        return
    if t.doWrite() is not None:
        t.startWriting()  # the reactor's next turn calls doWrite again and handles its result


def _plain_tcp(transport: Any) -> bool:
    """A tcp.Connection, connected, not (or not yet) TLS."""
    return getattr(transport, "TLS", True) is False and transport.connected and not transport.disconnecting


def _nothing_unsent(transport: Any) -> bool:
    """Nothing of a TCP transport's waits unsent: a write from here overtakes nothing."""
    return not transport._tempDataBuffer and len(transport.dataBuffer) == transport.offset


def read_now(transport: Any) -> bytes | None:
    """What has arrived on a plain TCP ``transport``, read now rather than when
    the reactor next polls (an answer to take in before other work); None when
    nothing has, or the transport is not plain TCP. The end of the connection
    is left for the reactor's own next read to find (an error taken here reads
    as the end there)."""
    if not _plain_tcp(transport):
        return None
    try:
        return transport.socket.recv(transport.bufferSize) or None
    except OSError:
        return None


def write_now(transport: Any, data: bytes | memoryview) -> None:
    """Write ``data`` and put it on the wire now (see :func:`write_through`).
    ``data`` may be a view of a buffer its caller reuses: what waits in the
    transport is a copy.

    On a plain TCP connection with nothing unsent (the usual case: an answer
    someone waits for) the bytes go straight to the socket from here: no
    registering it with the reactor for one write and unregistering it after
    (two ``epoll_ctl`` calls each time). What the socket does not take, and any
    error, is left to the transport as a write is."""
    if _plain_tcp(transport) and _nothing_unsent(transport):
        try:
            sent = transport.socket.send(data)
        except OSError:
            sent = 0  # full (EAGAIN), or an error the reactor's write finds and reports
        if sent < len(data):
            transport.write(bytes(data[sent:]))
        return
    transport.write(bytes(data))  # (bytes itself, not a copy, for bytes)
    write_through(transport)


# the most pieces one ``sendmsg`` takes (Linux's IOV_MAX is 1024); more are joined
SENDMSG_PIECES = 64


def write_pieces_now(transport: Any, pieces: list[bytes]) -> None:
    """:func:`write_now` for ``pieces``, in one
    ``sendmsg`` from where they lie when nothing waits unsent on a plain TCP
    connection: not joined into one more copy first (nor, when the socket takes
    them, by Twisted before its ``send``). Only what the socket does not take
    waits in the transport."""
    if len(pieces) == 1:
        write_now(transport, pieces[0])
        return
    if len(pieces) > SENDMSG_PIECES or not (_plain_tcp(transport) and _nothing_unsent(transport)):
        write_now(transport, b"".join(pieces))
        return
    try:
        sent = transport.socket.sendmsg(pieces)
    except OSError:
        sent = 0  # as in write_now
    if sent >= sum(map(len, pieces)):
        return
    i = 0
    while sent >= len(pieces[i]):
        sent -= len(pieces[i])
        i += 1
    rest = pieces[i:]
    rest[0] = rest[0][sent:]
    transport.writeSequence(rest)


class _Port(tcp.Port):
    transport = _Connection
    read_buffer = memoryview(bytearray(0))


@implementer(IStreamServerEndpoint)
class TCPServerEndpoint:
    """TCP (v4 or v6, by the interface) with :class:`_Connection` reads and a
    backlog of the kernel's somaxconn; ``tls``: a server context (HTTPS)."""

    def __init__(
        self, reactor: Any, port: int, interface: str, tls: Any = None, prebound: socket.socket | None = None
    ) -> None:
        """``prebound``: a socket listening on this address already (see nsq_service.prebind)."""
        self.reactor = reactor
        self.port = port
        self.interface = interface
        self.tls = tls
        self.prebound = prebound

    def listen(self, factory: Any) -> defer.Deferred[Any]:
        return defer.execute(self._listen, factory)

    def _listen(self, factory: Any) -> _Port:
        if self.tls is not None:
            from twisted.protocols.tls import TLSMemoryBIOFactory

            factory = TLSMemoryBIOFactory(self.tls, False, factory)
        port = _Port(self.port, factory, listen_backlog(), self.interface, self.reactor)
        if self.prebound is not None:
            port._preexistingSocket, self.prebound = self.prebound, None
            port.startListening()
            port._shouldShutdown = True  # closed as a socket the port bound itself is
            return port
        port.startListening()
        return port


def server_endpoint(reactor: Any, address: str, tls: Any = None, prebound: socket.socket | None = None) -> Any:
    parsed = split_address(address)
    if parsed is None:
        # only then: twisted.internet.endpoints loads pyOpenSSL (see nsq_service.runtime.import_reactor)
        from twisted.internet import endpoints

        return endpoints.UNIXServerEndpoint(reactor, address, backlog=listen_backlog())
    host, port = parsed
    return TCPServerEndpoint(reactor, port, "::" if host == "" else host, tls, prebound)


class ListeningService(service.Service):
    """Listen on an address at start; log Go's ``NAME: listening on ADDR``."""

    def __init__(
        self,
        label: str,
        reactor: Any,
        address: str,
        factory: Any,
        bound: Callable[[Any], None] | None = None,
        tls: Any = None,
        unix: bool | None = None,
        *,
        log: Logger,
    ) -> None:
        """``unix``: whether an address without a port is a unix socket path (nsqd's TCP
        and HTTP listeners) or an error as for Go's ``net.Listen("tcp", ...)``; by
        default, a path is refused for TLS. ``log``: the server's."""
        self.log = log
        self.label = label
        self.tls = tls
        self.unix = tls is None if unix is None else unix
        self.reactor = reactor
        self.address = address
        self.factory = factory
        self.bound = bound
        self.port: IListeningPort | None = None
        self.shown = address
        self.prebound: socket.socket | None = None

    def adopt(self, sock: socket.socket | None) -> None:
        """Listen on ``sock`` at start, a socket already listening on this address
        (bound before Twisted was loaded: nsq_service.prebind), instead of binding."""
        self.prebound = sock

    def privilegedStartService(self) -> None:
        if not self.unix and split_address(self.address) is None:
            raise ListenError(missing_port(self.address))
        result: list[Any] = []
        prebound, self.prebound = self.prebound, None
        server_endpoint(self.reactor, self.address, self.tls, prebound).listen(self.factory).addBoth(result.append)
        if not result:
            raise RuntimeError(f"listen ({self.address}) did not complete")
        if isinstance(result[0], Failure):
            raise ListenError(f"listen ({self.address}) failed - {self._listen_error(result[0])}")
        self.port = result[0]
        watch_accept_errors(self.port, self.label, self.log)
        host: Any = self.port.getHost()
        self.shown = address_text(host)
        if self.bound is not None:
            self.bound(host)
        self.log.info("{label}: listening on {addr}", label=self.label, addr=self.shown)
        service.Service.privilegedStartService(self)

    def startService(self) -> None:
        if self.port is None:
            self.privilegedStartService()
        service.Service.startService(self)

    def stopService(self) -> Any:
        service.Service.stopService(self)
        if self.port is not None:
            port, self.port = self.port, None
            self.log.info("{label}: closing {addr}", label=self.label, addr=self.shown)
            return port.stopListening()
        return None

    def _listen_error(self, failure: Failure) -> str:
        """Go's net.Listen error: ``listen tcp 127.0.0.1:4150: bind: address already in use``."""
        cause = getattr(failure.value, "socketError", None)
        if not isinstance(cause, OSError):
            return str(failure.value)
        net = "tcp" if split_address(self.address) is not None else "unix"
        return f"listen {net} {self.address}: bind: {go_errno(cause)}"


class ListenError(Exception):
    pass


class ServerService(service.MultiService):
    """The top of nsqd's (or nsqlookupd's) service tree.

    A failed start raises and leaves everything as it was: nothing is stopped
    (stopping would flush and persist what this process never loaded), so the
    process can exit at once, as Go's does. Under twistd
    (``exit_on_start_failure``, set by the plugin) the failure is the same one
    FATAL line as the console command's, and exit status 1.
    """

    def __init__(self, instantiate_error: str, log_prefix: str) -> None:
        super().__init__()
        self.instantiate_error = instantiate_error
        self.log_prefix = log_prefix
        self.exit_on_start_failure = False
        # SIGTERM, if the server takes it itself (returns True; nsqd's drain mode)
        self.on_sigterm: Callable[[], bool] | None = None
        # the front end's stop of the process (nsq_service.serving.StopSignals.stop)
        self.stopper: Callable[[], None] | None = None

    def stop_process(self) -> None:
        """Stop as SIGTERM does: the whole process under ``nsqd`` or ``twistd nsqd``;
        embedded in another program (no front end), these services only."""
        if self.stopper is not None:
            self.stopper()
        elif self.running:
            self.stopService()

    @property
    def exit_code(self) -> int:
        """The status to exit with once stopped: a child's ``exit_code`` (the nsqd
        core's is 1 when its stop could not write everything), else 0."""
        return max((getattr(child, "exit_code", 0) for child in self), default=0)

    def stopService(self) -> Any:
        if not self.running:
            return None  # stopped already (stop_process without a front end, then its parent)
        return super().stopService()

    def privilegedStartService(self) -> None:
        self._guarded(super().privilegedStartService)

    def startService(self) -> None:
        self._guarded(super().startService)

    def _guarded(self, start: Callable[[], None]) -> None:
        try:
            start()
        except Exception as e:
            if not self.exit_on_start_failure:
                raise
            exit_fatal(self.log_prefix, start_error_text(e, self.instantiate_error))
