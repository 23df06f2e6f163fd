"""Listening before Twisted is loaded (no Twisted here).

A console start spends most of its time importing Twisted and the server's
modules. A client that connects meanwhile would be refused; so ``run_server``
binds and listens on the server's TCP addresses first, with the standard
library, as Twisted would (the same family for the host, ``SO_REUSEADDR``,
non-blocking, the kernel's ``somaxconn`` backlog). Connections wait in the
backlog until the listener adopts its socket and the reactor accepts them.

Nothing is reported here: an address that cannot be bound now (in use, a unix
socket path, a name that does not resolve) is left to the listener, which binds
it at its usual time and fails with Go's text, in Go's order.
"""

from __future__ import annotations

import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable


def listen_backlog(path: str = "/proc/sys/net/core/somaxconn") -> int:
    """The listen backlog: ``somaxconn`` as the kernel says, as Go reads it, or
    ``SOMAXCONN`` where it cannot be read."""
    try:
        with open(path, "rb") as f:
            n = int(f.readline().split()[0])
    except (OSError, ValueError, IndexError):
        n = 0
    return n if n > 0 else socket.SOMAXCONN


def tcp_interface(address: str) -> tuple[str, int] | None:
    """The (interface, port) a listener binds for ``host:port`` (an empty host is
    ``::``, every interface, as the listeners bind it); None for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return ("::" if host == "" else host), int(port)


def _family(interface: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 literal (a scope allowed), else AF_INET: Twisted's choice."""
    try:
        socket.inet_pton(socket.AF_INET6, interface.split("%", 1)[0])
    except (OSError, ValueError):
        return socket.AF_INET
    return socket.AF_INET6


class Prebound:
    """Listening sockets bound ahead of the server, by the address they were asked for
    (one each: ``127.0.0.1:0`` for TCP and for HTTP are two ports, as the listeners
    would bind them)."""

    def __init__(self) -> None:
        self._sockets: dict[str, list[socket.socket]] = {}

    def listen(self, addresses: Iterable[str], backlog: int | None = None) -> None:
        """Bind and listen on each TCP address that can be; skip the others."""
        for address in addresses:
            where = tcp_interface(address) if address else None
            if where is None:
                continue
            sock = self._bind(*where, backlog if backlog is not None else listen_backlog())
            if sock is not None:
                self._sockets.setdefault(address, []).append(sock)

    @staticmethod
    def _bind(interface: str, port: int, backlog: int) -> socket.socket | None:
        family = _family(interface)
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            return None
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                where: tuple[object, ...] = socket.getaddrinfo(
                    interface, port, family, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST
                )[0][4]
            else:
                where = (interface, port)
            sock.bind(where)
            sock.listen(backlog)
        except OSError:
            sock.close()
            return None
        return sock

    def take(self, address: str) -> socket.socket | None:
        """A socket listening for ``address``, now the caller's; None if there is none."""
        sockets = self._sockets.get(address)
        if not sockets:
            return None
        return sockets.pop(0)

    def close(self) -> None:
        """Close what was not taken (a listener that was not configured after all)."""
        sockets, self._sockets = self._sockets, {}
        for each in sockets.values():
            for sock in each:
                sock.close()

    def __len__(self) -> int:
        return sum(len(each) for each in self._sockets.values())
