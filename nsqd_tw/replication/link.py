"""One replication connection, at either end: the handshake (HELLO, TLS when the
acceptor has a certificate, the dialer's AUTH, then the acceptor's once its node
keeps the link), then frames to the side the service gives it once both proofs
have verified (:mod:`.primary`, :mod:`.standby`).

Until the peer has authenticated, a link reads frames of at most
:data:`wire.MAX_HELLO` bytes (a bigger one is refused from its header) and the
handshake must end within ``--replication-timeout`` (:mod:`.admission`)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import protocol
from twisted.python.failure import Failure

from nsq_service.listen import read_now, write_now
from nsq_service.options import DURATION
from nsqd_tw.replication import wire

if TYPE_CHECKING:
    from nsqd_tw.core.nsqd import NSQD
    from nsqd_tw.replication.admission import Admission


class Node(Protocol):
    """What a link and the two ends of the stream need of their node (the
    :class:`~nsqd_tw.replication.service.ReplicationService`)."""

    nsqd: NSQD
    log: Any
    tls: Any
    secret: bytes
    lease: Any  # a primary's lease (nsqd_tw.replication.lease.PrimaryLease)
    timeout: float  # --replication-timeout: the handshake's deadline

    @property
    def admission(self) -> Admission: ...

    @property
    def peer_address(self) -> str: ...

    def now(self) -> float: ...
    def hello(self) -> dict[str, Any]: ...
    def client_tls(self) -> Any: ...
    def established(self, link: Link) -> None: ...
    def link_lost(self, link: Link, why: str) -> None: ...
    def peer_refused(self, link: Link, why: str) -> None: ...
    def snapshot_begins(self) -> None: ...
    def snapshot_ends(self) -> None: ...
    def diverged(self) -> None: ...
    def witnesses(self, addresses: list[str], total: int = 0) -> None: ...
    def lease_granted(self) -> None: ...


class Side(Protocol):
    """What an established link hands its frames to."""

    def frame(self, kind: int, payload: bytes) -> None: ...
    def read_done(self) -> None: ...
    def lost(self, why: str) -> None: ...


class Link(protocol.Protocol):
    """``dialer``: this node opened the connection (it sends the magic first)."""

    transport: Any

    def __init__(self, service: Node, dialer: bool) -> None:
        self.service = service
        self.dialer = dialer
        self.reader = wire.FrameReader(wire.MAX_HELLO)  # MAX_FRAME once the peer has authenticated
        self.nonce = os.urandom(16).hex()
        self.my_hello = b""
        self.peer_hello = b""
        self.peer: dict[str, Any] = {}
        self.tls = False
        self.verified = False  # the peer's AUTH checked out
        self.side: Side | None = None
        self.closed = False
        self._reported = False  # the node was told the link is over
        self.heard_at = service.now()
        self._deadline: Any = None  # the end of the time given to the handshake

    def __repr__(self) -> str:
        return f"<Link {'to' if self.dialer else 'from'} {self.address}>"

    @property
    def address(self) -> str:
        """The peer's TCP address as it announced it (or as connected)."""
        announced = self.peer.get("address")
        if isinstance(announced, str) and announced:
            return announced
        peer: Any = self.transport.getPeer() if self.transport is not None else None
        host = getattr(peer, "host", None)
        return f"{host}:{peer.port}" if host is not None else "?"

    # -- connection ---------------------------------------------------------------------

    def connectionMade(self) -> None:
        self.heard_at = self.service.now()
        self._deadline = self.service.nsqd.reactor.callLater(self.service.timeout, self._too_slow)
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:  # an ACK of a few bytes must not wait for Nagle's algorithm
            try:
                set_no_delay(True)
            except OSError:
                pass
        if self.dialer:
            self.my_hello = self._hello_bytes()
            self.transport.write(wire.MAGIC + wire.frame(wire.HELLO, self.my_hello))

    def _hello_bytes(self) -> bytes:
        doc = dict(self.service.hello())
        doc["nonce"] = self.nonce
        doc["tls"] = not self.dialer and self.service.tls is not None  # the acceptor: TLS follows
        return json.dumps(doc, separators=(",", ":")).encode()

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def send_now(self, data: bytes) -> None:
        """Send, on the wire now rather than at the reactor's next turn (a
        standby's ACK before the work of applying what it acknowledges, a publish
        its producer waits for)."""
        if not self.closed:
            write_now(self.transport, data)

    def poll(self) -> None:
        """Take in what the peer has sent, now rather than when the reactor next
        polls (a plain TCP link; over TLS, left to the reactor)."""
        if not self.closed:
            data = read_now(self.transport)
            if data:
                self.dataReceived(data)

    def dataReceived(self, data: bytes) -> None:
        if self.closed:
            return
        self.heard_at = self.service.now()
        self.reader.feed(data)
        try:
            while not self.closed:
                item = self.reader.next()
                if item is None:
                    break
                kind, payload = item
                if self.side is not None:
                    self.side.frame(kind, payload)
                else:
                    self._handshake(kind, payload)
        except wire.LinkError as e:
            if self.verified:
                self.fail(f"bad frame - {e}")
            else:
                self._refuse(f"bad frame - {e}", "too big" if isinstance(e, wire.FrameTooBig) else "bad frame")
            return
        except Exception as e:
            self.service.log.failure("REPLICATION: link {link} failed", link=self)
            self.fail(f"internal error - {e}")
            return
        if self.side is not None and not self.closed:
            self.side.read_done()

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._gone(reason.getErrorMessage())

    def _gone(self, why: str) -> None:
        """The link is over (closed by either end): tell the side and the node, once."""
        self.closed = True
        self._end_deadline()
        self.reader.release()
        if self._reported:
            return
        self._reported = True
        side, self.side = self.side, None
        if side is not None:
            side.lost(why)
        self.service.link_lost(self, why)

    def fail(self, why: str, tell: bool = True) -> None:
        """Close the link, telling the peer why (an ERROR frame) when it can be told."""
        if self.closed:
            return
        if tell:
            self.transport.write(wire.json_frame(wire.ERROR, {"error": why}))
        self.transport.loseConnection()
        self._gone(why)

    def abort(self, why: str) -> None:
        """Drop the link now (it went silent)."""
        if self.closed:
            return
        self.transport.abortConnection()
        self._gone(why)

    # -- the handshake ------------------------------------------------------------------

    def _end_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.closed or self.verified:
            return
        why = f"no handshake in {DURATION.show(self.service.timeout)}"
        if not self.tls:
            self._refuse(why, "deadline")
            return
        # TLS may not be up: an ERROR would wait for it, and the connection with it
        self.service.admission.refused(self.address, why, "deadline")
        self.abort(why)

    def _refuse(self, why: str, kind: str) -> None:
        """The handshake failed (``kind``, a few words, keys the log's rate limit):
        one log line, an ERROR to the peer, the link closed."""
        self.service.admission.refused(self.address, why, kind)
        self.fail(why)

    def _handshake(self, kind: int, payload: bytes) -> None:
        if kind == wire.ERROR:
            why = str(wire.json_payload(payload).get("error", ""))
            if self.dialer:
                self.service.peer_refused(self, why)
            else:  # a stranger may say anything: logged as the other refusals are
                self.service.admission.refused(self.address, f"the peer refused it - {why}", "peer")
            self.fail(f"refused by peer - {why}", tell=False)
            return
        if kind == wire.HELLO and not self.peer_hello:
            self._hello(payload)
        elif kind == wire.AUTH and self.peer_hello and not self.verified:
            self._auth(payload)
        else:
            raise wire.LinkError(f"unexpected frame {kind:#x} in the handshake")

    def _hello(self, payload: bytes) -> None:
        peer = wire.json_payload(payload)
        if peer.get("version") != wire.VERSION:
            self._refuse(
                f"protocol version {peer.get('version')!r} not supported (this node speaks {wire.VERSION})", "version"
            )
            return
        self.peer_hello, self.peer = payload, peer
        if not self.dialer:
            self.my_hello = self._hello_bytes()
            self.transport.write(wire.frame(wire.HELLO, self.my_hello))
            if self.service.tls is not None:
                self.tls = True
                self.transport.startTLS(self.service.tls)
        else:
            if peer.get("tls"):
                self.tls = True
                self.transport.startTLS(self.service.client_tls())
            self.transport.write(wire.frame(wire.AUTH, self._proof(True)))

    def _proof(self, dialer_side: bool) -> bytes:
        if self.dialer:
            dialer_hello, acceptor_hello = self.my_hello, self.peer_hello
        else:
            dialer_hello, acceptor_hello = self.peer_hello, self.my_hello
        label = b"dialer" if dialer_side else b"acceptor"
        return wire.proof(self.service.secret, label, dialer_hello, acceptor_hello)

    def _auth(self, payload: bytes) -> None:
        if not wire.verify(self._proof(not self.dialer), payload):
            self.service.admission.refused(
                self.address, "failed to authenticate (a different --replication-secret-file?)", "auth"
            )
            self.fail("authentication failed")
            return
        self.verified = True
        self._end_deadline()
        self.reader.max_frame = wire.MAX_FRAME
        self.service.established(self)

    def prove(self) -> None:
        """The acceptor's AUTH, which :meth:`Node.established` sends once the dialer
        has proved itself and the node keeps the link (before anything of the
        stream), or before it refuses a dialer at a lower epoch (which learns it
        is stale). Any other refused dialer gets an ERROR in its handshake, never
        a link, so it starts nothing it would undo."""
        if not self.dialer and not self.closed:
            self.transport.write(wire.frame(wire.AUTH, self._proof(False)))
