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
from twisted.internet.task import LoopingCall
from twisted.protocols.policies import TimeoutMixin
from twisted.python.failure import Failure

from nsqd_tw.channel import Channel, ChannelError
from nsqd_tw.log import Logger
from nsqd_tw.message import Message
from nsqd_tw.nsqd import NSQD
from nsqd_tw.options import TLS_NOT_REQUIRED, VERSION
from nsqd_tw.wire import (
    CLOSE_WAIT,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    MSG_ID_LENGTH,
    OK,
    ClientError,
    Command,
    FatalClientError,
    ProtocolViolation,
    V2Parser,
    go_quote,
    is_valid_channel_name,
    is_valid_topic_name,
    ms_to_duration_ns,
    pack_frame,
    parse_base10,
    to_int64,
)

STATE_INIT = 0
STATE_DISCONNECTED = 1
STATE_CONNECTED = 2
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

DEFAULT_BUFFER_SIZE = 16 * 1024


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


class V2Protocol(protocol.Protocol, TimeoutMixin):
    log = Logger(namespace="nsqd_tw.protocol_v2")
    transport: Any

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
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
        self.auth_state: Any = None

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
            self.remote_address = f"[{host}]:{peer.port}" if ":" in host else f"{host}:{peer.port}"
            self.client_id = self.hostname = host
        else:
            self.remote_address = str(getattr(peer, "name", "") or "@")
        self.log.info("TCP: new client({addr})", addr=self.remote_address)
        self.setTimeout(self.nsqd.opts.client_timeout)

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
        self.resetTimeout()
        parser = self._parser
        assert parser is not None
        parser.feed(data)
        self._process(parser)

    def _start(self) -> None:
        opts = self.nsqd.opts
        self._parser = V2Parser(opts.max_msg_size, opts.max_body_size, self._check_header)
        self._set_heartbeat(self.heartbeat_interval)

    def _process(self, parser: V2Parser) -> None:
        handlers = self._handlers
        tls_required = self.nsqd.opts.tls_required != TLS_NOT_REQUIRED
        try:
            while not self._halted:
                cmd = parser.next()
                if cmd is None:
                    break
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
                if isinstance(response, defer.Deferred):
                    self._respond_later(response, name)
                else:
                    self._respond(FRAME_TYPE_RESPONSE, response)
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

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._closed = True
        self._halted = True
        self.setTimeout(None)
        self._set_heartbeat(0)
        self._wbuf = []
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
            self.nsqd.want_flush(self)

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
            self.nsqd.want_flush(self)

    def flush(self) -> None:
        self._flush_pending = False
        if self._wbuf:
            self.transport.writeSequence(self._wbuf)
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
        return {}

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
            self.check_auth("MPUB", topic_name, "")
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

    def check_auth(self, cmd: str, topic: str, channel: str) -> None:
        """Authorisation seam: with no --auth-http-address everything is allowed."""
        if self.nsqd.opts.auth_http_addresses:
            raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")

    def _message_id(self, params: list[bytes]) -> bytes:
        msg_id = params[1]
        if len(msg_id) != MSG_ID_LENGTH:
            raise FatalClientError("E_INVALID", "invalid message ID")
        return msg_id

    # -- commands --------------------------------------------------------------

    def IDENTIFY(self, cmd: Command) -> bytes | None:
        assert cmd.body is not None
        try:
            data = decode_identify(cmd.body)
        except ValueError:
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
        self.setTimeout(self.heartbeat_interval * 2 if self.heartbeat_interval > 0 else None)

        if not data["feature_negotiation"]:
            return OK

        opts = self.nsqd.opts
        tls_v1 = False  # TLS upgrades arrive with the security issue
        deflate = False  # compression is negotiated off until it is implemented
        deflate_level = 6
        if deflate and data["deflate_level"] > 0:
            deflate_level = data["deflate_level"]
        deflate_level = min(deflate_level, opts.max_deflate_level)
        snappy = False
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
        return json.dumps(resp, separators=(",", ":")).encode()

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

    def AUTH(self, cmd: Command) -> bytes | None:
        if not self.nsqd.opts.auth_http_addresses:
            raise FatalClientError("E_AUTH_DISABLED", "AUTH disabled")
        raise FatalClientError("E_AUTH_FAILED", "AUTH failed")

    def SUB(self, cmd: Command) -> bytes | None:
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
        self.check_auth("SUB", topic_name, channel_name)
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

    def PUB(self, cmd: Command) -> bytes | defer.Deferred[None] | None:
        assert cmd.body is not None
        topic_name = cmd.params[1].decode("ascii")
        self.check_auth("PUB", topic_name, "")
        return self._publish("PUB", topic_name, [cmd.body])

    def MPUB(self, cmd: Command) -> bytes | defer.Deferred[None] | None:
        assert cmd.bodies is not None
        return self._publish("MPUB", cmd.params[1].decode("ascii"), cmd.bodies)

    def DPUB(self, cmd: Command) -> bytes | defer.Deferred[None] | None:
        assert cmd.body is not None
        topic_name = cmd.params[1].decode("ascii")
        delay = self._dpub_delay(cmd.params[2])
        self.check_auth("DPUB", topic_name, "")
        return self._publish("DPUB", topic_name, [cmd.body], delay)


class V2Factory(protocol.ServerFactory):
    noisy = False

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd

    def buildProtocol(self, addr: Any) -> V2Protocol:
        p = V2Protocol(self.nsqd)
        p.factory = self
        return p
