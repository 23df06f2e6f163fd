"""The V2 TCP protocol: one :class:`V2Protocol` per client connection.

Commands are parsed by :class:`nsqd_tw.wire.V2Parser` and dispatched to the
method named after the verb. Errors are Go's codes and texts; fatal ones
close the connection after the error frame. Frames to the client are
buffered and written once per reactor turn (or when the negotiated output
buffer size fills), which is what Go's output buffering achieves.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.interfaces import IHandshakeListener, IPushProducer
from twisted.internet.task import LoopingCall
from twisted.protocols.policies import TimeoutMixin
from twisted.python.failure import Failure
from zope.interface import implementer

from nsq_service.log import Logger
from nsq_wire import gojson
from nsq_wire.compression import CompressionError, DeflateCodec, SnappyCodec
from nsq_wire.errors import ClientError, FatalClientError
from nsq_wire.frames import CLOSE_WAIT, FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, HEARTBEAT, MAGIC_V2, OK, pack_frame
from nsq_wire.gofmt import go_quote, join_host_port, ms_to_duration_ns, parse_base10, to_int64
from nsq_wire.message import MSG_ID_LENGTH
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name
from nsq_wire.parser import Command, ProtocolViolation, V2Parser
from nsq_wire.version import VERSION
from nsqd_tw.auth import AuthClient, AuthState
from nsqd_tw.core.channel import Channel, ChannelError
from nsqd_tw.core.message import Message
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.options import TLS_NOT_REQUIRED

STATE_INIT = 0
STATE_DISCONNECTED = 1
STATE_CONNECTED = 2
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

DEFAULT_BUFFER_SIZE = 16 * 1024

# Unsent bytes a connection may hold in its transport before it counts as backed
# up: then it gets no more messages and is not read from until it drains, and
# if it stays backed up past its heartbeat interval (Go's write deadline) it is
# dropped and its in-flight messages are requeued.
UNSENT_LIMIT = 1 << 20

# the TLS upgrade after IDENTIFY: waiting for the ClientHello, then handshaking
TLS_HANDSHAKE_TIMEOUT = 5.0
_TLS_NONE, _TLS_AWAIT_HELLO, _TLS_HANDSHAKE, _TLS_DONE = range(4)

# crypto/tls names nsqd 1.3 reports in /stats; other suites are "Unknown <id>"
_GO_CIPHER_NAMES = {
    "RC4-SHA": (0x0005, "TLS_RSA_WITH_RC4_128_SHA"),
    "DES-CBC3-SHA": (0x000A, "TLS_RSA_WITH_3DES_EDE_CBC_SHA"),
    "AES128-SHA": (0x002F, "TLS_RSA_WITH_AES_128_CBC_SHA"),
    "AES256-SHA": (0x0035, "TLS_RSA_WITH_AES_256_CBC_SHA"),
    "ECDHE-ECDSA-RC4-SHA": (0xC007, "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA"),
    "ECDHE-ECDSA-AES128-SHA": (0xC009, "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"),
    "ECDHE-ECDSA-AES256-SHA": (0xC00A, "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"),
    "ECDHE-RSA-RC4-SHA": (0xC011, "TLS_ECDHE_RSA_WITH_RC4_128_SHA"),
    "ECDHE-RSA-DES-CBC3-SHA": (0xC012, "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"),
    "ECDHE-RSA-AES128-SHA": (0xC013, "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"),
    "ECDHE-RSA-AES256-SHA": (0xC014, "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"),
    "ECDHE-RSA-AES128-GCM-SHA256": (0xC02F, "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
    "ECDHE-ECDSA-AES128-GCM-SHA256": (0xC02B, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
}
_CIPHER_IDS = {
    "TLS_AES_128_GCM_SHA256": 0x1301,
    "TLS_AES_256_GCM_SHA384": 0x1302,
    "TLS_CHACHA20_POLY1305_SHA256": 0x1303,
    "AES128-GCM-SHA256": 0x009C,
    "AES256-GCM-SHA384": 0x009D,
    "DHE-RSA-AES128-GCM-SHA256": 0x009E,
    "DHE-RSA-AES256-GCM-SHA384": 0x009F,
    "ECDHE-ECDSA-AES256-GCM-SHA384": 0xC02C,
    "ECDHE-RSA-AES256-GCM-SHA384": 0xC030,
    "ECDHE-RSA-AES128-SHA256": 0xC027,
    "ECDHE-RSA-AES256-SHA384": 0xC028,
    "ECDHE-ECDSA-AES128-SHA256": 0xC023,
    "ECDHE-ECDSA-AES256-SHA384": 0xC024,
    "ECDHE-RSA-CHACHA20-POLY1305": 0xCCA8,
    "ECDHE-ECDSA-CHACHA20-POLY1305": 0xCCA9,
    "DHE-RSA-CHACHA20-POLY1305": 0xCCAA,
}


def go_cipher_suite(openssl_name: str) -> str:
    """The ``tls_cipher_suite`` Go's nsqd would report for a negotiated suite."""
    known = _GO_CIPHER_NAMES.get(openssl_name)
    if known is not None:
        return known[1]
    suite_id = _CIPHER_IDS.get(openssl_name)
    return f"Unknown {suite_id}" if suite_id is not None else f"Unknown {openssl_name}"


def go_tls_version(openssl_version: str) -> str:
    return {"TLSv1": "TLS1.0", "TLSv1.1": "TLS1.1", "TLSv1.2": "TLS1.2", "TLSv1.3": "TLS1.3"}.get(
        openssl_version, f"Unknown {openssl_version}"
    )


def _tls_error(e: BaseException) -> str:
    from twisted.internet import error

    from nsqd_tw.tls import ssl_error

    if isinstance(e, (error.ConnectionDone, error.ConnectionLost)):
        return "EOF"
    return ssl_error(e)


@implementer(IPushProducer)
class _Backlog:
    """Registered with the transport as the producer of our output, so that the
    transport tells us when what we wrote is backed up past its buffer
    (``pauseProducing``) and when it has drained (``resumeProducing``)."""

    __slots__ = ("proto",)

    def __init__(self, proto: V2Protocol) -> None:
        self.proto = proto

    def pauseProducing(self) -> None:
        self.proto.output_backed_up()

    def resumeProducing(self) -> None:
        self.proto.output_drained()

    def stopProducing(self) -> None:
        pass


class Pause:
    """A handler's answer that is not ready yet: no further command is read
    until ``deferred`` fires with the response (bytes, a Deferred, or None).

    ``pause_reading`` also stops reading the socket meanwhile (AUTH waits for
    the auth server); a TLS upgrade must keep reading to handshake.
    """

    __slots__ = ("deferred", "pause_reading")

    def __init__(self, deferred: defer.Deferred[Any], pause_reading: bool) -> None:
        self.deferred = deferred
        self.pause_reading = pause_reading


def _cancel(call: Any) -> None:
    """Cancel a pending DelayedCall (None, or one already run, is fine)."""
    if call is not None and call.active():
        call.cancel()


def _s(b: bytes) -> str:
    """Bytes from the wire as text for an error message (round-trips exactly)."""
    return b.decode("utf-8", "surrogateescape")


# IDENTIFY's JSON fields and the Go types they decode into
_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)
_IDENTIFY_FIELDS: dict[str, Any] = {
    "client_id": str,
    "hostname": str,
    "heartbeat_interval": _INT64,
    "output_buffer_size": _INT64,
    "output_buffer_timeout": _INT64,
    "feature_negotiation": bool,
    "tls_v1": bool,
    "deflate": bool,
    "deflate_level": _INT64,
    "snappy": bool,
    "sample_rate": _INT32,
    "user_agent": str,
    "msg_timeout": _INT64,
}


def decode_identify(body: bytes) -> dict[str, Any]:
    """Decode an IDENTIFY body the way Go's encoding/json fills identifyDataV2.

    Unknown keys are ignored, keys match case-insensitively, ``null`` leaves the
    zero value and a value of the wrong type is an error.
    """
    data = json.loads(body.decode("utf-8", "replace"))
    out: dict[str, Any] = {
        name: ("" if kind is str else False if kind is bool else 0) for name, kind in _IDENTIFY_FIELDS.items()
    }
    if data is None:
        return out
    if not isinstance(data, dict):
        raise ValueError(f"json: cannot unmarshal {type(data).__name__} into Go value of type nsqd.identifyDataV2")
    for key, value in data.items():
        name = key.lower()
        kind = _IDENTIFY_FIELDS.get(name)
        if kind is None or value is None:
            continue
        if kind is str:
            ok = isinstance(value, str)
        elif kind is bool:
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and kind[0] <= value <= kind[1]
        if not ok:
            raise ValueError(f"json: cannot unmarshal {value!r} into Go struct field identifyDataV2.{name}")
        out[name] = value
    return out


@implementer(IHandshakeListener)
class V2Protocol(protocol.Protocol, TimeoutMixin):
    log = Logger(namespace="nsqd_tw.tcp.protocol")
    transport: Any

    def __init__(self, server: V2Factory) -> None:
        self.server = server
        self.nsqd = nsqd = server.nsqd
        opts = nsqd.opts
        self.id = 0
        self.state = STATE_INIT
        self.channel: Channel | None = None

        self.ready_count = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}

        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.remote_address = ""
        self.connect_time = nsqd.now()

        self.heartbeat_interval = opts.client_timeout / 2
        self.output_buffer_size = DEFAULT_BUFFER_SIZE
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.msg_timeout = opts.msg_timeout
        self.sample_rate = 0

        self.tls = False
        self.snappy = False
        self.deflate = False
        self.auth_state: AuthState | None = None
        self.auth_secret = b""

        self._magic = b""
        self._parser: V2Parser | None = None
        self._closed = False
        self._halted = False  # no more commands are read (a fatal error was found)
        self._pending: deque[list[Any]] = deque()
        self._kick = False
        self._identified = False
        self._wbuf: list[bytes] = []
        self._wlen = 0
        self._flush_pending = False
        self._heartbeat: LoopingCall | None = None
        self._codec: SnappyCodec | DeflateCodec | None = None
        self._waiting = False  # a handler's Pause is outstanding
        self._read_holds = 0  # reasons not to read the socket now (AUTH, backed-up output)
        self._read_timeout: float | None = opts.client_timeout
        self.blocked = False  # output backed up: no messages for it, its commands wait
        self._backlog = _Backlog(self)
        self._write_deadline: Any = None
        self._drain_waiters: list[defer.Deferred[None]] = []
        self._hold_writes = False  # during the TLS handshake
        self._tls_state = _TLS_NONE
        self._tls_buf = b""
        self._tls_timer: Any = None
        self._tls_done: defer.Deferred[None] | None = None
        self._handlers: dict[bytes, Callable[[Command], Any]] = {
            b"FIN": self.FIN,
            b"RDY": self.RDY,
            b"REQ": self.REQ,
            b"PUB": self.PUB,
            b"MPUB": self.MPUB,
            b"DPUB": self.DPUB,
            b"NOP": self.NOP,
            b"TOUCH": self.TOUCH,
            b"SUB": self.SUB,
            b"CLS": self.CLS,
            b"AUTH": self.AUTH,
            b"IDENTIFY": self.IDENTIFY,
        }

    def __str__(self) -> str:
        return self.remote_address

    def callLater(self, period: float, func: Callable[[], Any]) -> Any:
        return self.nsqd.reactor.callLater(period, func)

    # -- connection ---------------------------------------------------------

    def connectionMade(self) -> None:
        self.id = self.nsqd.add_client(self)
        peer: Any = self.transport.getPeer()
        host = getattr(peer, "host", None)
        if host is not None:
            self.remote_address = join_host_port(host, peer.port)
            self.client_id = self.hostname = host
        else:
            self.remote_address = str(getattr(peer, "name", "") or "@")
        self.log.info("TCP: new client({addr})", addr=self.remote_address)
        if hasattr(self.transport, "bufferSize"):
            self.transport.bufferSize = UNSENT_LIMIT
        self.transport.registerProducer(self._backlog, True)
        self.setTimeout(self._read_timeout)

    def dataReceived(self, data: bytes) -> None:
        if self._parser is None:
            if self._closed:
                return
            self._magic += data
            if len(self._magic) < 4:
                return
            magic, data = self._magic[:4], self._magic[4:]
            self._magic = b""
            self.log.info("CLIENT({addr}): desired protocol magic '{magic}'", addr=self.remote_address, magic=_s(magic))
            if magic != MAGIC_V2:
                self.log.error("client({addr}) bad protocol magic '{magic}'", addr=self.remote_address, magic=_s(magic))
                self.transport.write(pack_frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL"))
                self._close()
                return
            self._start()
            if not data:
                return
        if self._tls_state == _TLS_AWAIT_HELLO:
            self._tls_hello(data)
            return
        parser = self._parser
        assert parser is not None
        codec = self._codec
        if codec is None:
            parser.feed(data)
            self._process(parser)
            return
        try:
            for chunk in codec.decode(data):
                parser.feed(chunk)
                self._process(parser)
                if self._closed:
                    return
        except CompressionError as e:
            self._unreadable(e)

    def _unreadable(self, e: CompressionError) -> None:
        """The compressed stream cannot be decoded: say so in a fatal error frame."""
        err = FatalClientError("E_BAD_BODY", f"failed to read command - {e}")
        self.log.error("[{client}] - {err}", client=self, err=err)
        self._respond(FRAME_TYPE_ERROR, err.wire(), fatal=True)

    def _start(self) -> None:
        opts = self.nsqd.opts
        self._parser = V2Parser(opts.max_msg_size, opts.max_body_size, self._check_header)
        self._set_heartbeat(self.heartbeat_interval)

    def _process(self, parser: V2Parser) -> None:
        if self._waiting:
            return
        handlers = self._handlers
        tls_required = self.nsqd.opts.tls_required != TLS_NOT_REQUIRED
        try:
            while not self._halted and not self.blocked:
                cmd = parser.next()
                if cmd is None:
                    break
                # Go sets the read deadline once per command: the next one starts now
                if self._read_timeout is not None:
                    self.resetTimeout()
                name = cmd.name
                if tls_required and not self.tls and name != b"IDENTIFY":
                    self._enforce_tls(name)
                handler = handlers.get(name)
                if handler is None:
                    raise FatalClientError("E_INVALID", f"invalid command {_s(name)}")
                try:
                    response = handler(cmd)
                except ClientError as e:
                    if e.fatal:
                        raise
                    self.log.error("[{client}] - {err}", client=self, err=e)
                    self._respond(FRAME_TYPE_ERROR, e.wire())
                    continue
                if response is None:
                    continue
                if isinstance(response, Pause):
                    self._pause(response, name)
                    break
                self._deliver(response, name)
        except FatalClientError as e:
            self.log.error("[{client}] - {err}", client=self, err=e)
            self._respond(FRAME_TYPE_ERROR, e.wire(), fatal=True)
        except ProtocolViolation as e:
            self.log.error("client({client}) - {err}", client=self, err=e)
            self._close()
        except Exception:
            self.log.failure("[{client}] - internal error, closing connection", client=self)
            self._close()
        if self._kick:
            self._kick = False
            if self.channel is not None:
                self.channel.kick()

    def _deliver(self, response: Any, name: bytes) -> None:
        if isinstance(response, defer.Deferred):
            self._respond_later(response, name)
        else:
            self._respond(FRAME_TYPE_RESPONSE, response)

    def _pause(self, pause: Pause, name: bytes) -> None:
        """Stop reading commands until the paused handler has its answer."""
        self._waiting = True
        held = pause.pause_reading
        if held:
            self._hold_reading()

        def resume() -> bool:
            self._waiting = False
            if held:
                self._release_reading()
            return not self._closed

        def done(response: Any) -> None:
            if not resume():
                return
            if response is not None:
                self._deliver(response, name)
            assert self._parser is not None
            self._process(self._parser)

        def failed(f: Failure) -> None:
            if not resume():
                return
            err = f.value
            if not isinstance(err, ClientError):
                self.log.failure("[{client}] - internal error, closing connection", f, client=self)
                self._close()
                return
            self.log.error("[{client}] - {err}", client=self, err=err)
            self._respond(FRAME_TYPE_ERROR, err.wire(), fatal=err.fatal)
            if not err.fatal:
                assert self._parser is not None
                self._process(self._parser)

        pause.deferred.addCallbacks(done, failed)

    def _hold_reading(self) -> None:
        """Stop reading the socket (and its read deadline) until released."""
        self._read_holds += 1
        if self._read_holds == 1 and not self._closed:
            self.setTimeout(None)
            self.transport.pauseProducing()

    def _release_reading(self) -> None:
        self._read_holds -= 1
        if self._read_holds == 0 and not self._closed:
            self.transport.resumeProducing()
            self.setTimeout(self._read_timeout)

    # -- backed-up output (the transport's producer calls) -----------------------

    def output_backed_up(self) -> None:
        if self.blocked or self._closed:
            return
        self.blocked = True
        self._hold_reading()
        if self.heartbeat_interval > 0:
            self._write_deadline = self.callLater(self.heartbeat_interval, self._write_timed_out)

    def output_drained(self) -> None:
        if not self.blocked:
            return
        self.blocked = False
        self._cancel_write_deadline()
        if self._closed:
            return
        self._release_reading()
        if self.channel is not None:
            self.channel.kick()
        if self._parser is not None and not self._waiting:
            self._process(self._parser)

    def _cancel_write_deadline(self) -> None:
        _cancel(self._write_deadline)
        self._write_deadline = None

    def _write_timed_out(self) -> None:
        """Backed up for a whole heartbeat interval: drop the client, as Go's
        write deadline does (its in-flight messages go back to the channel)."""
        self._write_deadline = None
        host = self.transport.getHost()
        local = join_host_port(getattr(host, "host", ""), getattr(host, "port", ""))
        self.log.error(
            "PROTOCOL(V2): [{client}] messagePump error - write tcp {local}->{remote}: i/o timeout",
            client=self,
            local=local,
            remote=self.remote_address,
        )
        self._closed = True
        self._halted = True
        self._wbuf = []
        self.transport.abortConnection()

    def _drained(self) -> defer.Deferred[None]:
        """Fires when every response held back so far has been sent."""
        if not self._pending:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._drain_waiters.append(d)
        return d

    # Responses and errors keep the order of the commands. One that waits (a
    # durable publish waiting for its fsync) holds back those behind it, while
    # commands go on being read, so publishes share fsyncs (group commit).
    # Message frames and heartbeats are not responses and are not held.

    def _respond(self, frame_type: int, data: bytes, fatal: bool = False) -> None:
        if fatal:
            self._halted = True
        if self._pending:
            self._pending.append([frame_type, data, fatal, True])
            return
        self._send_frame(frame_type, data)
        if fatal:
            self._close()

    def _respond_later(self, d: defer.Deferred[Any], name: bytes) -> None:
        slot: list[Any] = [FRAME_TYPE_RESPONSE, OK, False, False]
        self._pending.append(slot)

        def ok(_: Any) -> None:
            slot[3] = True
            self._drain()

        def failed(f: Failure) -> None:
            verb = _s(name)
            err = FatalClientError(f"E_{verb}_FAILED", f"{verb} failed {f.value}")
            self.log.error("[{client}] - {err}", client=self, err=err)
            slot[:] = [FRAME_TYPE_ERROR, err.wire(), True, True]
            self._halted = True
            self._drain()

        d.addCallbacks(ok, failed)

    def _drain(self) -> None:
        pending = self._pending
        while pending and pending[0][3]:
            frame_type, data, fatal, _ = pending.popleft()
            if self._closed:
                continue
            self._send_frame(frame_type, data)
            if fatal:
                pending.clear()
                self._close()
        if not pending and self._drain_waiters and not self._closed:
            waiters, self._drain_waiters = self._drain_waiters, []
            for w in waiters:
                w.callback(None)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._closed = True
        self._halted = True
        self.setTimeout(None)
        self._cancel_write_deadline()
        self._set_heartbeat(0)
        self._wbuf = []
        if self._tls_state in (_TLS_AWAIT_HELLO, _TLS_HANDSHAKE):
            self._cancel_tls_timer()
            self._tls_state = _TLS_NONE
            err = FatalClientError("E_IDENTIFY_FAILED", f"IDENTIFY failed {_tls_error(reason.value or Exception())}")
            self.log.error("[{client}] - {err}", client=self, err=err)
        if self.channel is not None:
            self.channel.remove_client(self.id)
        self.nsqd.remove_client(self.id)
        self.log.info("PROTOCOL(V2): [{client}] exiting ioloop", client=self)

    def timeoutConnection(self) -> None:
        self.log.error("client({client}) - failed to read command - i/o timeout", client=self)
        self._closed = True
        self._halted = True
        self.transport.abortConnection()

    def _close(self) -> None:
        """Close after what is buffered has been written."""
        self._closed = True
        self._halted = True
        self.flush()
        # a transport with a paused producer would wait for it forever
        self.transport.unregisterProducer()
        self.transport.loseConnection()

    def close(self) -> None:
        """Closed by the server (its channel was deleted or nsqd is stopping)."""
        if not self._closed:
            self._close()

    def shutdown(self) -> None:
        """nsqd is stopping: give in-flight messages back now, then close."""
        if self.channel is not None:
            channel, self.channel = self.channel, None
            channel.remove_client(self.id)
        self.close()

    # -- writing --------------------------------------------------------------

    def _send_frame(self, frame_type: int, data: bytes) -> None:
        frame = pack_frame(frame_type, data)
        self._wbuf.append(frame)
        self._wlen += len(frame)
        if not self._flush_pending:
            self._flush_pending = True
            self.server.want_flush(self)

    def send_message(self, msg: Message) -> None:
        """Called by the channel: the message is now in flight to us."""
        self.in_flight_count += 1
        self.message_count += 1
        frame = msg.frame()
        self._wbuf.append(frame)
        self._wlen += len(frame)
        if self._wlen >= self.output_buffer_size:
            self.flush()
        elif not self._flush_pending:
            self._flush_pending = True
            self.server.want_flush(self)

    def flush(self) -> None:
        self._flush_pending = False
        if self._wbuf and not self._hold_writes:
            if self._codec is None:
                self.transport.writeSequence(self._wbuf)
            else:
                self.transport.write(self._codec.encode(b"".join(self._wbuf)))
            self._wbuf = []
            self._wlen = 0

    def _set_heartbeat(self, interval: float) -> None:
        if self._heartbeat is not None:
            if self._heartbeat.running:
                self._heartbeat.stop()
            self._heartbeat = None
        if interval > 0 and not self._closed:
            self._heartbeat = LoopingCall(self._send_frame, FRAME_TYPE_RESPONSE, HEARTBEAT)
            self._heartbeat.clock = self.nsqd.reactor
            self._heartbeat.start(interval, now=False)

    def tls_info(self) -> dict[str, Any]:
        """Cipher suite, version and ALPN of the TLS session (for /stats)."""
        if not self.tls:
            return {}
        conn = self.transport.getHandle()
        return {
            "cipher_suite": go_cipher_suite(conn.get_cipher_name() or ""),
            "version": go_tls_version(conn.get_protocol_version_name() or ""),
            "negotiated_protocol": (conn.get_alpn_proto_negotiated() or b"").decode("ascii", "replace"),
            # crypto/tls: "Deprecated: this value is always true"
            "negotiated_protocol_is_mutual": True,
        }

    def peer_common_name(self) -> str:
        """The subject common name of the client's TLS certificate, if any."""
        if not self.tls:
            return ""
        cert = self.transport.getPeerCertificate()
        if cert is None:
            return ""
        return cert.get_subject().commonName or ""

    # -- upgrades after IDENTIFY ---------------------------------------------

    def _upgrade(
        self, response: bytes, tls_v1: bool, snappy: bool, deflate: bool, deflate_level: int
    ) -> defer.Deferred[None]:
        """Send IDENTIFY's response, then switch the stream as Go does: TLS
        first (the OK after the handshake goes over TLS), then snappy or
        deflate (their OK is the first compressed frame)."""

        def send_response(_: Any) -> Any:
            self._send_frame(FRAME_TYPE_RESPONSE, response)
            self.flush()
            if tls_v1:
                return self._start_tls()
            return None

        def compress(_: Any) -> None:
            if snappy:
                self.log.info("PROTOCOL(V2): [{client}] upgrading connection to snappy", client=self)
                self._set_codec(SnappyCodec())
                self.snappy = True
            if deflate:
                self.log.info(
                    "PROTOCOL(V2): [{client}] upgrading connection to deflate (level {deflate_level})",
                    client=self,
                    deflate_level=deflate_level,
                )
                self._set_codec(DeflateCodec(deflate_level))
                self.deflate = True

        d = self._drained()
        d.addCallback(send_response)
        d.addCallback(compress)
        return d

    def _set_codec(self, codec: SnappyCodec | DeflateCodec) -> None:
        self.flush()
        self._codec = codec
        assert self._parser is not None
        rest = self._parser.take_remainder()
        self._send_frame(FRAME_TYPE_RESPONSE, OK)
        self.flush()
        if rest:  # bytes pipelined after IDENTIFY are compressed already
            try:
                for chunk in codec.decode(rest):
                    self._parser.feed(chunk)
            except CompressionError as e:
                self._unreadable(e)

    def _start_tls(self) -> defer.Deferred[None]:
        self.log.info("PROTOCOL(V2): [{client}] upgrading connection to TLS", client=self)
        self._tls_done = defer.Deferred()
        self._tls_state = _TLS_AWAIT_HELLO
        self._hold_writes = True
        self._tls_timer = self.callLater(TLS_HANDSHAKE_TIMEOUT, self._tls_timed_out)
        assert self._parser is not None
        rest = self._parser.take_remainder()
        d = self._tls_done
        if rest:
            self._tls_hello(rest)
        return d

    def _tls_hello(self, data: bytes) -> None:
        """Look at the first bytes: a TLS record, or garbage answered in plain text."""
        self._tls_buf += data
        buf = self._tls_buf
        if len(buf) < 3:
            return
        self._tls_buf = b""
        if buf[0] != 0x16 or buf[1] != 0x03:
            self._tls_failed("tls: first record does not look like a TLS handshake")
            return
        self._tls_state = _TLS_HANDSHAKE
        # our producer moves to the TLS layer, which registers it with the socket
        self.transport.unregisterProducer()
        self.transport.startTLS(self.server.tls)
        self.transport.registerProducer(self._backlog, True)
        self.transport.protocol.dataReceived(buf)

    def handshakeCompleted(self) -> None:
        """IHandshakeListener: the TLS session is up; OK goes over it."""
        self._cancel_tls_timer()
        self._tls_state = _TLS_DONE
        self.tls = True
        self._hold_writes = False
        # heartbeats held during the handshake go after the OK, as Go's write lock orders them
        frame = pack_frame(FRAME_TYPE_RESPONSE, OK)
        self._wbuf.insert(0, frame)
        self._wlen += len(frame)
        self.flush()
        d, self._tls_done = self._tls_done, None
        if d is not None:
            d.callback(None)

    def _tls_failed(self, text: str) -> None:
        self._cancel_tls_timer()
        self._tls_state = _TLS_NONE
        self._hold_writes = False
        self._wbuf = []
        self._wlen = 0
        d, self._tls_done = self._tls_done, None
        if d is not None:
            d.errback(FatalClientError("E_IDENTIFY_FAILED", f"IDENTIFY failed {text}"))

    def _tls_timed_out(self) -> None:
        self._tls_timer = None
        host = self.transport.getHost()
        local = join_host_port(getattr(host, "host", ""), getattr(host, "port", ""))
        text = f"read tcp {local}->{self.remote_address}: i/o timeout"
        if self._tls_state == _TLS_AWAIT_HELLO:
            # nothing TLS was said yet: the error goes back in plain text, as Go's
            self._tls_failed(text)
            return
        self._tls_state = _TLS_NONE
        err = FatalClientError("E_IDENTIFY_FAILED", f"IDENTIFY failed {text}")
        self.log.error("[{client}] - {err}", client=self, err=err)
        self._closed = True
        self._halted = True
        self.transport.abortConnection()

    def _cancel_tls_timer(self) -> None:
        _cancel(self._tls_timer)
        self._tls_timer = None

    # -- what the channel calls ----------------------------------------------

    def timed_out_message(self) -> None:
        self.in_flight_count -= 1

    def empty(self) -> None:
        self.in_flight_count = 0

    # -- checks ----------------------------------------------------------------

    def _enforce_tls(self, name: bytes) -> None:
        if self.nsqd.opts.tls_required != TLS_NOT_REQUIRED and not self.tls:
            raise FatalClientError("E_INVALID", f"cannot {_s(name)} in current state (TLS required)")

    def _check_header(self, name: bytes, params: list[bytes]) -> None:
        """Go's checks for a command with a body, made before its size is read."""
        if name == b"IDENTIFY":
            if self.state != STATE_INIT:
                raise FatalClientError("E_INVALID", "cannot IDENTIFY in current state")
            return
        self._enforce_tls(name)
        if name == b"PUB":
            if len(params) < 2:
                raise FatalClientError("E_INVALID", "PUB insufficient number of parameters")
            self._topic_name(b"PUB", params[1])
        elif name == b"MPUB":
            if len(params) < 2:
                raise FatalClientError("E_INVALID", "MPUB insufficient number of parameters")
            topic_name = self._topic_name(b"MPUB", params[1])
            if self._check_auth_early("MPUB", topic_name):
                self.nsqd.get_topic(topic_name)
        elif name == b"DPUB":
            if len(params) < 3:
                raise FatalClientError("E_INVALID", "DPUB insufficient number of parameters")
            self._topic_name(b"DPUB", params[1])
            self._dpub_delay(params[2])
        elif name == b"AUTH":
            if self.state != STATE_INIT:
                raise FatalClientError("E_INVALID", "cannot AUTH in current state")
            if len(params) != 1:
                raise FatalClientError("E_INVALID", "AUTH invalid number of parameters")

    def _topic_name(self, verb: bytes, raw: bytes) -> str:
        if not is_valid_topic_name(raw):
            text = f"{_s(verb)} topic name {go_quote(raw)} is not valid"
            if verb == b"MPUB":
                # Go's MPUB repeats the code in its text
                text = "E_BAD_TOPIC " + text
            raise FatalClientError("E_BAD_TOPIC", text)
        return raw.decode("ascii")

    def _dpub_delay(self, raw: bytes) -> float:
        try:
            timeout_ms = parse_base10(raw)
        except ValueError:
            raise FatalClientError("E_INVALID", f"DPUB could not parse timeout {_s(raw)}") from None
        duration_ns = ms_to_duration_ns(timeout_ms)
        max_ns = round(self.nsqd.opts.max_req_timeout * 1e9)
        if duration_ns < 0 or duration_ns > max_ns:
            raise FatalClientError("E_INVALID", f"DPUB timeout {timeout_ms} out of range 0-{max_ns // 1_000_000}")
        return duration_ns / 1e9

    # -- authorisation ----------------------------------------------------------

    def has_authorizations(self) -> bool:
        return self.auth_state is not None and bool(self.auth_state.authorizations)

    def check_auth(self, cmd: str, topic: str, channel: str) -> defer.Deferred[None] | None:
        """Go's CheckAuth: raises the refusal, or returns a Deferred while an
        expired authorisation is fetched again (the command waits for it)."""
        if not self.nsqd.opts.auth_http_addresses:
            return None
        state = self.auth_state
        if state is None or not state.authorizations:
            raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if not state.is_expired(self.nsqd.now()):
            self._authorize(state, cmd, topic, channel)
            return None

        def refreshed(new_state: AuthState) -> None:
            self.auth_state = new_state
            self._authorize(new_state, cmd, topic, channel)

        d: defer.Deferred[Any] = self._query_auth()
        d.addErrback(self._auth_failed)
        d.addCallback(refreshed)
        return d

    def _check_auth_early(self, cmd: str, topic: str) -> bool:
        """MPUB's check before its body is read: False when the authorisation
        has expired and must be fetched again first (the handler does it)."""
        if not self.nsqd.opts.auth_http_addresses:
            return True
        state = self.auth_state
        if state is None or not state.authorizations:
            raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if state.is_expired(self.nsqd.now()):
            return False
        self._authorize(state, cmd, topic, "")
        return True

    @staticmethod
    def _authorize(state: AuthState, cmd: str, topic: str, channel: str) -> None:
        if not state.is_allowed(topic, channel):
            raise FatalClientError(
                "E_UNAUTHORIZED", f"AUTH failed for {cmd} on {go_quote(topic.encode())} {go_quote(channel.encode())}"
            )

    def _query_auth(self) -> defer.Deferred[AuthState]:
        peer = self.transport.getPeer()
        remote_ip = getattr(peer, "host", "") if getattr(peer, "type", "") in ("TCP", "TCP6") else ""
        return self.server.auth.query_any(remote_ip, self.tls, self.peer_common_name(), self.auth_secret)

    def _auth_failed(self, f: Failure) -> None:
        # the auth server's errors are logged, never shown to an untrusted client
        self.log.warn("PROTOCOL(V2): [{client}] AUTH failed {err}", client=self, err=f.getErrorMessage())
        raise FatalClientError("E_AUTH_FAILED", "AUTH failed")

    def _message_id(self, params: list[bytes]) -> bytes:
        msg_id = params[1]
        if len(msg_id) != MSG_ID_LENGTH:
            raise FatalClientError("E_INVALID", "invalid message ID")
        return msg_id

    # -- commands --------------------------------------------------------------

    def IDENTIFY(self, cmd: Command) -> bytes | Pause | None:
        assert cmd.body is not None
        try:
            data = decode_identify(cmd.body)
        except (ValueError, RecursionError):
            raise FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        self.log.info("[{client}] IDENTIFY: {data}", client=self, data=data)
        try:
            self._identify(data)
        except ValueError as e:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY {e}") from None

        if not self._identified:
            # as Go's message pump, only the first IDENTIFY retunes the timers
            self._identified = True
            self._set_heartbeat(self.heartbeat_interval)
        self._read_timeout = self.heartbeat_interval * 2 if self.heartbeat_interval > 0 else None
        if not self._read_holds:
            self.setTimeout(self._read_timeout)

        if not data["feature_negotiation"]:
            return OK

        opts = self.nsqd.opts
        tls_v1 = self.server.tls is not None and data["tls_v1"]
        deflate = opts.deflate and data["deflate"]
        deflate_level = 6
        if deflate and data["deflate_level"] > 0:
            deflate_level = data["deflate_level"]
        deflate_level = min(deflate_level, opts.max_deflate_level)
        snappy = opts.snappy and data["snappy"]
        if deflate and snappy:
            raise FatalClientError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        resp = {
            "max_rdy_count": opts.max_rdy_count,
            "version": VERSION,
            "max_msg_timeout": round(opts.max_msg_timeout * 1000),
            "msg_timeout": round(self.msg_timeout * 1000),
            "tls_v1": tls_v1,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": bool(opts.auth_http_addresses),
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": round(self.output_buffer_timeout * 1000),
        }
        body = json.dumps(resp, separators=(",", ":")).encode()
        if not (tls_v1 or snappy or deflate):
            return body
        return Pause(self._upgrade(body, tls_v1, snappy, deflate, deflate_level), pause_reading=False)

    def _identify(self, data: dict[str, Any]) -> None:
        opts = self.nsqd.opts
        self.client_id = data["client_id"]
        self.hostname = data["hostname"]
        self.user_agent = data["user_agent"]

        hb = data["heartbeat_interval"]
        if hb == -1:
            self.heartbeat_interval = 0.0
        elif hb == 0:
            pass
        elif 1000 <= hb <= int(opts.max_heartbeat_interval * 1000):
            self.heartbeat_interval = hb / 1000.0
        else:
            raise ValueError(f"heartbeat interval ({hb}) is invalid")

        timeout = data["output_buffer_timeout"]
        if timeout == -1:
            self.output_buffer_timeout = 0.0
        elif timeout == 0:
            pass
        elif int(opts.min_output_buffer_timeout * 1000) <= timeout <= int(opts.max_output_buffer_timeout * 1000):
            self.output_buffer_timeout = timeout / 1000.0
        else:
            raise ValueError(f"output buffer timeout ({timeout}) is invalid")

        size = data["output_buffer_size"]
        if size == -1:
            self.output_buffer_size = 1
            self.output_buffer_timeout = 0.0
        elif size == 0:
            pass
        elif 64 <= size <= opts.max_output_buffer_size:
            self.output_buffer_size = size
        else:
            raise ValueError(f"output buffer size ({size}) is invalid")

        rate = data["sample_rate"]
        if rate < 0 or rate > 99:
            raise ValueError(f"sample rate ({rate}) is invalid")
        self.sample_rate = rate

        msg_timeout = data["msg_timeout"]
        if msg_timeout == 0:
            pass
        elif 1000 <= msg_timeout <= int(opts.max_msg_timeout * 1000):
            self.msg_timeout = msg_timeout / 1000.0
        else:
            raise ValueError(f"msg timeout ({msg_timeout}) is invalid")

    def AUTH(self, cmd: Command) -> Pause:
        assert cmd.body is not None
        if self.has_authorizations():
            raise FatalClientError("E_INVALID", "AUTH already set")
        if not self.nsqd.opts.auth_http_addresses:
            raise FatalClientError("E_AUTH_DISABLED", "AUTH disabled")
        self.auth_secret = cmd.body

        def authorized(state: AuthState) -> bytes:
            self.auth_state = state
            if not state.authorizations:
                raise FatalClientError("E_UNAUTHORIZED", "AUTH no authorizations found")
            return gojson.dumps(
                {
                    "identity": state.identity,
                    "identity_url": state.identity_url,
                    "permission_count": len(state.authorizations),
                }
            )

        d = self._query_auth()
        d.addErrback(self._auth_failed)
        d.addCallback(authorized)
        return Pause(d, pause_reading=True)

    def SUB(self, cmd: Command) -> bytes | Pause | None:
        if self.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise FatalClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        params = cmd.params
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "SUB insufficient number of parameters")
        if not is_valid_topic_name(params[1]):
            raise FatalClientError("E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid")
        if not is_valid_channel_name(params[2]):
            raise FatalClientError("E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid")
        topic_name = params[1].decode("ascii")
        channel_name = params[2].decode("ascii")
        wait = self.check_auth("SUB", topic_name, channel_name)
        if wait is not None:
            wait.addCallback(lambda _: self._subscribe(topic_name, channel_name))
            return Pause(wait, pause_reading=True)
        return self._subscribe(topic_name, channel_name)

    def _subscribe(self, topic_name: str, channel_name: str) -> bytes:
        channel = self.nsqd.get_topic(topic_name).get_channel(channel_name)
        try:
            channel.add_client(self)
        except ChannelError as e:
            raise FatalClientError("E_SUB_FAILED", f"SUB failed {e}") from None
        self.state = STATE_SUBSCRIBED
        self.channel = channel
        return OK

    def RDY(self, cmd: Command) -> bytes | None:
        if self.state == STATE_CLOSING:
            self.log.info("PROTOCOL(V2): [{client}] ignoring RDY after CLS in state ClientStateV2Closing", client=self)
            return None
        if self.state != STATE_SUBSCRIBED:
            raise FatalClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(cmd.params) > 1:
            try:
                count = to_int64(parse_base10(cmd.params[1]))
            except ValueError:
                raise FatalClientError("E_INVALID", f"RDY could not parse count {_s(cmd.params[1])}") from None
        max_rdy = self.nsqd.opts.max_rdy_count
        if count < 0 or count > max_rdy:
            raise FatalClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        if count != self.ready_count:
            self.ready_count = count
            self._kick = True
        return None

    def FIN(self, cmd: Command) -> bytes | None:
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise FatalClientError("E_INVALID", "cannot FIN in current state")
        params = cmd.params
        if len(params) < 2:
            raise FatalClientError("E_INVALID", "FIN insufficient number of params")
        msg_id = self._message_id(params)
        assert self.channel is not None
        try:
            self.channel.finish_message(self.id, msg_id)
        except ChannelError as e:
            raise ClientError("E_FIN_FAILED", f"FIN {_s(msg_id)} failed {e}") from None
        self.finish_count += 1
        self.in_flight_count -= 1
        self._kick = True
        return None

    def REQ(self, cmd: Command) -> bytes | None:
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise FatalClientError("E_INVALID", "cannot REQ in current state")
        params = cmd.params
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "REQ insufficient number of params")
        msg_id = self._message_id(params)
        try:
            timeout_ms = parse_base10(params[2])
        except ValueError:
            raise FatalClientError("E_INVALID", f"REQ could not parse timeout {_s(params[2])}") from None
        duration_ns = ms_to_duration_ns(timeout_ms)
        max_ns = round(self.nsqd.opts.max_req_timeout * 1e9)
        clamped = min(max(duration_ns, 0), max_ns)
        if clamped != duration_ns:
            self.log.info(
                "PROTOCOL(V2): [{client}] REQ timeout {t} out of range 0-{max}. Setting to {c}",
                client=self,
                t=duration_ns,
                max=max_ns,
                c=clamped,
            )
        assert self.channel is not None
        try:
            self.channel.requeue_message(self.id, msg_id, clamped / 1e9)
        except ChannelError as e:
            raise ClientError("E_REQ_FAILED", f"REQ {_s(msg_id)} failed {e}") from None
        self.requeue_count += 1
        self.in_flight_count -= 1
        self._kick = True
        return None

    def TOUCH(self, cmd: Command) -> bytes | None:
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise FatalClientError("E_INVALID", "cannot TOUCH in current state")
        params = cmd.params
        if len(params) < 2:
            raise FatalClientError("E_INVALID", "TOUCH insufficient number of params")
        msg_id = self._message_id(params)
        assert self.channel is not None
        try:
            self.channel.touch_message(self.id, msg_id, self.msg_timeout)
        except ChannelError as e:
            raise ClientError("E_TOUCH_FAILED", f"TOUCH {_s(msg_id)} failed {e}") from None
        return None

    def CLS(self, cmd: Command) -> bytes | None:
        if self.state != STATE_SUBSCRIBED:
            raise FatalClientError("E_INVALID", "cannot CLS in current state")
        self.ready_count = 0
        self.state = STATE_CLOSING
        return CLOSE_WAIT

    def NOP(self, cmd: Command) -> bytes | None:
        return None

    def _publish(
        self, verb: str, topic_name: str, bodies: list[bytes], delay: float = 0.0
    ) -> bytes | defer.Deferred[None]:
        try:
            committed = self.nsqd.publish(topic_name, bodies, delay)
        except Exception as e:
            raise FatalClientError(f"E_{verb}_FAILED", f"{verb} failed {e}") from None
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + len(bodies)
        return OK if committed is None else committed

    def _authorized_publish(
        self, verb: str, topic_name: str, bodies: list[bytes], delay: float = 0.0
    ) -> bytes | defer.Deferred[None] | Pause:
        wait = self.check_auth(verb, topic_name, "")
        if wait is not None:
            wait.addCallback(lambda _: self._publish(verb, topic_name, bodies, delay))
            return Pause(wait, pause_reading=True)
        return self._publish(verb, topic_name, bodies, delay)

    def PUB(self, cmd: Command) -> bytes | defer.Deferred[None] | Pause:
        assert cmd.body is not None
        return self._authorized_publish("PUB", cmd.params[1].decode("ascii"), [cmd.body])

    def MPUB(self, cmd: Command) -> bytes | defer.Deferred[None] | Pause:
        assert cmd.bodies is not None
        return self._authorized_publish("MPUB", cmd.params[1].decode("ascii"), cmd.bodies)

    def DPUB(self, cmd: Command) -> bytes | defer.Deferred[None] | Pause:
        assert cmd.body is not None
        delay = self._dpub_delay(cmd.params[2])
        return self._authorized_publish("DPUB", cmd.params[1].decode("ascii"), [cmd.body], delay)


class V2Factory(protocol.ServerFactory):
    """nsqd's TCP side: what its connections share besides the core.

    ``tls`` (a server TLS context) lets clients upgrade after IDENTIFY; ``auth``
    asks --auth-http-address servers about AUTH secrets. Frames buffered by the
    connections are written once per reactor turn (:meth:`want_flush`).
    """

    noisy = False

    def __init__(self, nsqd: NSQD, tls: Any = None, auth: AuthClient | None = None) -> None:
        self.nsqd = nsqd
        self.tls = tls
        self.auth = auth if auth is not None else AuthClient(nsqd)
        self._flush_queue: list[V2Protocol] = []
        self._flush_call: Any = None

    def buildProtocol(self, addr: Any) -> V2Protocol:
        p = V2Protocol(self)
        p.factory = self
        return p

    def want_flush(self, client: V2Protocol) -> None:
        """Flush ``client``'s buffered frames at the end of this reactor turn."""
        self._flush_queue.append(client)
        if self._flush_call is None:
            self._flush_call = self.nsqd.reactor.callLater(0, self._flush_clients)

    def _flush_clients(self) -> None:
        self._flush_call = None
        queue, self._flush_queue = self._flush_queue, []
        for client in queue:
            client.flush()
