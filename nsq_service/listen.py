"""Listening services and the top service of nsqd and nsqlookupd."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.application import service
from twisted.internet import endpoints
from twisted.internet.interfaces import IListeningPort
from twisted.python.failure import Failure

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


def server_endpoint(reactor: Any, address: str, tls: Any = None) -> Any:
    backlog = listen_backlog()
    parsed = split_address(address)
    if parsed is None:
        return endpoints.UNIXServerEndpoint(reactor, address, backlog=backlog)
    host, port = parsed
    if host == "":
        host = "::"
    if tls is not None:
        return endpoints.SSL4ServerEndpoint(reactor, port, tls, backlog=backlog, interface=host)
    if ":" in host:
        return endpoints.TCP6ServerEndpoint(reactor, port, backlog=backlog, interface=host)
    return endpoints.TCP4ServerEndpoint(reactor, port, backlog=backlog, interface=host)


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

    def privilegedStartService(self) -> None:
        if not self.unix and split_address(self.address) is None:
            raise ListenError(missing_port(self.address))
        result: list[Any] = []
        server_endpoint(self.reactor, self.address, self.tls).listen(self.factory).addBoth(result.append)
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
