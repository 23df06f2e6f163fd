"""The stream upgrades IDENTIFY negotiates, in Go's order.

IDENTIFY's JSON answer goes out in clear. With TLS, nsqd then waits for the
ClientHello on the same connection (5 s), starts TLS (the connection's own
layer, :mod:`nsqd_tw.tcp.tlslayer`) and sends OK over it; heartbeats due
meanwhile are held and follow the OK. Then snappy or deflate:
their OK is the first compressed frame, and bytes the client pipelined after
IDENTIFY are compressed already.

Without TLS, Go writes the answer and the compressed OK in two writes, and some
clients parse the answer from their first read (anything after it in that read
is taken for clear text). nsqd sends the answer at once, in a write of its own,
and the OK only after the reactor has slept (:data:`ANSWER_ALONE`): a client
woken by the answer gets to run and read it before the compressed bytes are
written. With TLS, the TLS OK and the compressed OK leave in one TLS record
(:meth:`Output.before_codec`), which pynsq 0.9.1 on tornado 6.1 expects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer, error

from nsq_wire.compression import CompressionError, DeflateCodec, SnappyCodec
from nsq_wire.errors import FatalClientError
from nsq_wire.frames import FRAME_TYPE_RESPONSE, OK
from nsq_wire.gofmt import join_host_port
from nsqd_tw.tcp.identify import Features
from nsqd_tw.tcp.output import cancel

if TYPE_CHECKING:
    from nsq_wire.parser import V2Parser
    from nsqd_tw.core.nsqd import NSQD
    from nsqd_tw.tcp.client import ClientV2
    from nsqd_tw.tcp.output import Output
    from nsqd_tw.tcp.responses import Responses
    from nsqd_tw.tcp.tlslayer import TLSLayer

TLS_HANDSHAKE_TIMEOUT = 5.0
# how long the compressed OK waits after IDENTIFY's answer without TLS: long
# enough for a real sleep of the reactor (epoll's resolution is 1 ms)
ANSWER_ALONE = 0.001
_NONE, _AWAIT_HELLO, _HANDSHAKE, _DONE, _ALONE = range(5)


def tls_error_text(e: BaseException) -> str:
    if isinstance(e, (error.ConnectionDone, error.ConnectionLost)):
        return "EOF"
    from nsqd_tw.tls import ssl_error  # pyOpenSSL: loaded when TLS is configured

    return ssl_error(e)


class Upgrading(Protocol):
    """What an upgrade needs of its connection (a CommandConnection)."""

    transport: Any
    server: Any  # its .tls context
    nsqd: NSQD
    client: ClientV2
    output: Output
    responses: Responses
    parser: V2Parser | None
    codec: SnappyCodec | DeflateCodec | None
    tls: TLSLayer | None
    log: Any
    closed: bool

    def dataReceived(self, data: bytes) -> None: ...
    def unreadable(self, e: CompressionError) -> None: ...
    def abort(self) -> None: ...


class Upgrade:
    def __init__(self, conn: Upgrading) -> None:
        self.conn = conn
        self._state = _NONE
        self._hello = b""
        self._timer: Any = None
        self._done: defer.Deferred[None] | None = None

    @property
    def awaiting_hello(self) -> bool:
        return self._state == _AWAIT_HELLO

    def start(self, features: Features) -> defer.Deferred[None]:
        """Send IDENTIFY's answer once the answers before it are out, then switch."""
        conn = self.conn

        def send_answer(_: Any) -> Any:
            conn.output.frame(FRAME_TYPE_RESPONSE, features.body)
            if features.tls_v1:
                conn.output.flush()
                return self._start_tls()
            conn.output.flush()  # on the wire now, in a write of its own
            return self._answer_alone()

        def compress(_: Any) -> None:
            if conn.closed:
                return
            if features.snappy:
                conn.log.info("PROTOCOL(V2): [{client}] upgrading connection to snappy", client=conn.client)
                self._set_codec(SnappyCodec())
                conn.client.snappy = True
            if features.deflate:
                conn.log.info(
                    "PROTOCOL(V2): [{client}] upgrading connection to deflate (level {deflate_level})",
                    client=conn.client,
                    deflate_level=features.deflate_level,
                )
                self._set_codec(DeflateCodec(features.deflate_level))
                conn.client.deflate = True

        d = conn.responses.drained()
        d.addCallback(send_answer)
        d.addCallback(compress)
        return d

    def _answer_alone(self) -> defer.Deferred[None]:
        """Fires once the reactor has slept after IDENTIFY's answer; what is due
        meanwhile (heartbeats) is held, to follow the compressed OK."""
        conn = self.conn
        d: defer.Deferred[None] = defer.Deferred()
        self._done = d
        self._state = _ALONE
        conn.output.held = True
        self._timer = conn.nsqd.reactor.callLater(ANSWER_ALONE, self._answered_alone)
        return d

    def _answered_alone(self) -> None:
        self._timer = None
        self._state = _NONE
        self.conn.output.held = False
        d, self._done = self._done, None
        if d is not None:
            d.callback(None)

    def _set_codec(self, codec: SnappyCodec | DeflateCodec) -> None:
        conn = self.conn
        output, parser = conn.output, conn.parser
        assert parser is not None
        if conn.tls is not None:
            # the TLS OK, and what the handshake held, go out as they are, ahead
            output.before_codec()
        output.codec = codec
        conn.codec = codec
        rest = parser.take_remainder()
        # the first compressed frame, before anything held meanwhile
        output.first(FRAME_TYPE_RESPONSE, OK)
        output.flush()
        if rest:  # bytes pipelined after IDENTIFY are compressed already
            try:
                for chunk in codec.decode(rest):
                    parser.feed(chunk)
            except CompressionError as e:
                conn.unreadable(e)

    # -- TLS --------------------------------------------------------------------

    def _start_tls(self) -> defer.Deferred[None]:
        conn = self.conn
        conn.log.info("PROTOCOL(V2): [{client}] upgrading connection to TLS", client=conn.client)
        d: defer.Deferred[None] = defer.Deferred()
        self._done = d
        self._state = _AWAIT_HELLO
        conn.output.held = True
        self._timer = conn.nsqd.reactor.callLater(TLS_HANDSHAKE_TIMEOUT, self._timed_out)
        assert conn.parser is not None
        rest = conn.parser.take_remainder()
        if rest:
            self.hello(rest)
        return d

    def hello(self, data: bytes) -> None:
        """The first bytes after IDENTIFY's answer: a TLS record, or garbage answered in plain text."""
        self._hello += data
        buf = self._hello
        if len(buf) < 3:
            return
        self._hello = b""
        if buf[0] != 0x16 or buf[1] != 0x03:
            self._failed("tls: first record does not look like a TLS handshake")
            return
        self._state = _HANDSHAKE
        from nsqd_tw.tcp.tlslayer import TLSLayer  # pyOpenSSL: loaded when TLS is configured

        conn = self.conn
        conn.tls = conn.output.tls = TLSLayer(conn.server.tls.getContext(), conn.transport, self.handshake_completed)
        conn.dataReceived(buf)

    def handshake_completed(self) -> None:
        """The TLS session is up: OK goes over it, before the heartbeats held
        meanwhile (and with the compressed OK, when a codec follows)."""
        self._cancel_timer()
        self._state = _DONE
        conn = self.conn
        conn.client.tls = True
        conn.output.held = False
        conn.output.first(FRAME_TYPE_RESPONSE, OK)
        d, self._done = self._done, None
        if d is not None:
            d.callback(None)
        if not conn.closed:
            conn.output.flush()

    def _failed(self, text: str) -> None:
        self._cancel_timer()
        self._state = _NONE
        self.conn.output.held = False
        self.conn.output.discard()
        d, self._done = self._done, None
        if d is not None:
            d.errback(FatalClientError("E_IDENTIFY_FAILED", f"IDENTIFY failed {text}"))

    def _timed_out(self) -> None:
        self._timer = None
        conn = self.conn
        host = conn.transport.getHost()
        local = join_host_port(getattr(host, "host", ""), getattr(host, "port", ""))
        text = f"read tcp {local}->{conn.client.remote_address}: i/o timeout"
        if self._state == _AWAIT_HELLO:
            # nothing TLS was said yet: the error goes back in plain text, as Go's
            self._failed(text)
            return
        self._state = _NONE
        err = FatalClientError("E_IDENTIFY_FAILED", f"IDENTIFY failed {text}")
        conn.log.error("[{client}] - {err}", client=conn.client, err=err)
        conn.abort()

    def connection_lost(self, reason: BaseException) -> None:
        """The connection went away: mid-upgrade, that is IDENTIFY failing."""
        if self._state == _ALONE:
            self._cancel_timer()
            self._state = _NONE
        if self._state in (_AWAIT_HELLO, _HANDSHAKE):
            self._cancel_timer()
            self._state = _NONE
            err = FatalClientError("E_IDENTIFY_FAILED", f"IDENTIFY failed {tls_error_text(reason)}")
            self.conn.log.error("[{client}] - {err}", client=self.conn.client, err=err)

    def _cancel_timer(self) -> None:
        cancel(self._timer)
        self._timer = None
