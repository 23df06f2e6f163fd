"""The V2 TCP protocol: bytes in, the 12 command handlers, frames out.

One :class:`V2Protocol` per connection (Go's protocolV2 and its IOLoop); what it
knows of its client is a :class:`~nsqd_tw.tcp.client.ClientV2`, what it writes
goes through an :class:`~nsqd_tw.tcp.output.Output`, answers keep command order
through :class:`~nsqd_tw.tcp.responses.Responses`, and IDENTIFY's stream
upgrades are an :class:`~nsqd_tw.tcp.upgrade.Upgrade`. Commands are parsed by
:class:`nsq_wire.parser.V2Parser`; a command with a body is checked once, when
its line has been read, as Go does before reading the body. Errors are Go's
codes and texts; fatal ones close the connection after the error frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer, protocol

from nsq_wire import gojson
from nsq_wire.errors import ClientError, FatalClientError
from nsq_wire.frames import CLOSE_WAIT, FRAME_TYPE_RESPONSE, OK
from nsq_wire.gofmt import go_quote, ms_to_duration_ns, parse_base10, to_int64
from nsq_wire.message import MSG_ID_LENGTH
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name
from nsq_wire.parser import Command
from nsqd_tw.auth import AuthClient, AuthState
from nsqd_tw.core.channel import ChannelError
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.core.replica import Backpressure
from nsqd_tw.core.topic import RefusedError
from nsqd_tw.options import TLS_NOT_REQUIRED
from nsqd_tw.tcp.client import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED
from nsqd_tw.tcp.connection import CommandConnection, Pause, text
from nsqd_tw.tcp.identify import apply_identify, decode_identify, negotiate
from nsqd_tw.tcp.output import Output


class V2Protocol(CommandConnection):
    """The 12 commands of the V2 protocol, on the command loop."""

    def __init__(self, server: V2Factory) -> None:
        super().__init__(server)
        self._identified = False
        self._topic = ""  # what a body command's line said, for its handler
        self._delay = 0.0

    # -- the lines of commands with a body ----------------------------------------

    def _identify_line(self, cmd: Command) -> None:
        if self.client.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot IDENTIFY in current state")

    def _auth_line(self, cmd: Command) -> None:
        if self.client.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot AUTH in current state")
        if len(cmd.params) != 1:
            raise FatalClientError("E_INVALID", "AUTH invalid number of parameters")

    def _pub_line(self, cmd: Command) -> None:
        if len(cmd.params) < 2:
            raise FatalClientError("E_INVALID", "PUB insufficient number of parameters")
        self._topic = self._topic_name(b"PUB", cmd.params[1])

    def _dpub_line(self, cmd: Command) -> None:
        if len(cmd.params) < 3:
            raise FatalClientError("E_INVALID", "DPUB insufficient number of parameters")
        self._topic = self._topic_name(b"DPUB", cmd.params[1])
        self._delay = self._dpub_delay(cmd.params[2])

    def _mpub_line(self, cmd: Command) -> Pause | None:
        """Go checks MPUB's authorisation and creates its topic before reading its body."""
        if len(cmd.params) < 2:
            raise FatalClientError("E_INVALID", "MPUB insufficient number of parameters")
        topic = self._topic = self._topic_name(b"MPUB", cmd.params[1])
        wait = self.client.check_auth("MPUB", topic, "", self.nsqd.now())
        if wait is None:
            self._mpub_topic(topic)
            return None
        return Pause(wait.addCallback(lambda _: self._mpub_topic(topic)), pause_reading=True)

    def _mpub_topic(self, topic: str) -> Pause | None:
        nsqd = self.nsqd
        if not nsqd.draining and nsqd.standby is None:  # else the body's publish is refused (E_MPUB_FAILED)
            started = nsqd.topic_ready(topic)
            if started is not None:  # Go's GetTopic returns once the lookupds' channels exist
                return Pause(started, pause_reading=True)
        return None

    def _topic_name(self, verb: bytes, raw: bytes) -> str:
        if not is_valid_topic_name(raw):
            message = f"{text(verb)} topic name {go_quote(raw)} is not valid"
            if verb == b"MPUB":
                message = "E_BAD_TOPIC " + message  # Go's MPUB repeats the code in its text
            raise FatalClientError("E_BAD_TOPIC", message)
        return raw.decode("ascii")

    def _dpub_delay(self, raw: bytes) -> float:
        try:
            timeout_ms = parse_base10(raw)
        except ValueError:
            raise FatalClientError("E_INVALID", f"DPUB could not parse timeout {text(raw)}") from None
        duration_ns = ms_to_duration_ns(timeout_ms)
        max_ns = round(self.nsqd.opts.max_req_timeout * 1e9)
        if duration_ns < 0 or duration_ns > max_ns:
            raise FatalClientError("E_INVALID", f"DPUB timeout {timeout_ms} out of range 0-{max_ns // 1_000_000}")
        return duration_ns / 1e9

    def _consuming(self, verb: str, params: list[bytes], need: int) -> bytes:
        """FIN, REQ and TOUCH: a subscribed (or closing) client, enough params, a valid ID."""
        state = self.client.state
        if state != STATE_SUBSCRIBED and state != STATE_CLOSING:
            raise FatalClientError("E_INVALID", f"cannot {verb} in current state")
        if len(params) < need:
            raise FatalClientError("E_INVALID", f"{verb} insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != MSG_ID_LENGTH:
            raise FatalClientError("E_INVALID", "invalid message ID")
        return msg_id

    # -- the commands ------------------------------------------------------------------

    def IDENTIFY(self, cmd: Command) -> bytes | Pause:
        assert cmd.body is not None
        try:
            data = decode_identify(cmd.body)
        except (ValueError, RecursionError):
            raise FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        client = self.client
        self.log.info("[{client}] IDENTIFY: {data}", client=client, data=data)
        try:
            apply_identify(client, data, self.nsqd.opts)
        except ValueError as e:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY {e}") from None
        if not self._identified:
            # as Go's message pump, only the first IDENTIFY retunes the timers
            self._identified = True
            self.output.heartbeat(client.heartbeat_interval)
        self._read_timeout = client.heartbeat_interval * 2 if client.heartbeat_interval > 0 else None
        if not self._read_holds:
            self.setTimeout(self._read_timeout)
        if not data["feature_negotiation"]:
            return OK
        features = negotiate(client, data, self.nsqd.opts, self.server.tls is not None)
        if not (features.tls_v1 or features.snappy or features.deflate):
            return features.body
        return Pause(self.upgrade.start(features), pause_reading=False)

    def AUTH(self, cmd: Command) -> Pause:
        assert cmd.body is not None
        client = self.client
        if client.has_authorizations():
            raise FatalClientError("E_INVALID", "AUTH already set")
        if not self.nsqd.opts.auth_http_addresses:
            raise FatalClientError("E_AUTH_DISABLED", "AUTH disabled")
        client.auth_secret = cmd.body

        def authorized(state: AuthState) -> bytes:
            client.auth_state = state
            if not state.authorizations:
                raise FatalClientError("E_UNAUTHORIZED", "AUTH no authorizations found")
            answer = {"identity": state.identity, "identity_url": state.identity_url}
            return gojson.dumps({**answer, "permission_count": len(state.authorizations)})

        return Pause(client.query_auth().addCallback(authorized), pause_reading=True)

    def SUB(self, cmd: Command) -> bytes | Pause:
        client = self.client
        if client.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot SUB in current state")
        if client.heartbeat_interval <= 0:
            raise FatalClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        params = cmd.params
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "SUB insufficient number of parameters")
        if not is_valid_topic_name(params[1]):
            raise FatalClientError("E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid")
        if not is_valid_channel_name(params[2]):
            raise FatalClientError("E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid")
        topic, channel = params[1].decode("ascii"), params[2].decode("ascii")
        wait = client.check_auth("SUB", topic, channel, self.nsqd.now())
        if wait is None:
            return self._subscribe(topic, channel)
        return Pause(wait.addCallback(lambda _: self._subscribe(topic, channel)), pause_reading=True)

    def _subscribe(self, topic_name: str, channel_name: str) -> bytes | Pause:
        try:
            started = self.nsqd.topic_ready(topic_name)
        except RefusedError as e:
            raise FatalClientError("E_SUB_FAILED", f"SUB failed {e}") from None
        if started is not None:
            # a topic this SUB created: joined once the lookupds' channels exist, as
            # Go's GetTopic returns only then; nothing more is read meanwhile
            return Pause(started.addCallback(lambda _: self._join(topic_name, channel_name)), pause_reading=True)
        return self._join(topic_name, channel_name)

    def _join(self, topic_name: str, channel_name: str) -> bytes:
        try:
            channel = self.nsqd.get_topic(topic_name).get_channel(channel_name)
            channel.add_client(self.client)
        except (ChannelError, RefusedError) as e:
            raise FatalClientError("E_SUB_FAILED", f"SUB failed {e}") from None
        self.client.state = STATE_SUBSCRIBED
        self.client.channel = channel
        return OK

    def RDY(self, cmd: Command) -> None:
        client = self.client
        if client.state == STATE_CLOSING:
            self.log.info(
                "PROTOCOL(V2): [{client}] ignoring RDY after CLS in state ClientStateV2Closing", client=client
            )
            return
        if client.state != STATE_SUBSCRIBED:
            raise FatalClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(cmd.params) > 1:
            try:
                count = to_int64(parse_base10(cmd.params[1]))
            except ValueError:
                raise FatalClientError("E_INVALID", f"RDY could not parse count {text(cmd.params[1])}") from None
        max_rdy = self.nsqd.opts.max_rdy_count
        if count < 0 or count > max_rdy:
            raise FatalClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        if count != client.ready_count:
            client.ready_count = count
            self._kick = True

    def FIN(self, cmd: Command) -> None:
        params = cmd.params
        client = self.client
        state = client.state
        if (state != STATE_SUBSCRIBED and state != STATE_CLOSING) or len(params) < 2 or len(params[1]) != MSG_ID_LENGTH:
            self._consuming("FIN", params, 2)  # raises the error (the checks inline: once per message)
        msg_id = params[1]
        assert client.channel is not None
        try:
            client.channel.finish_message(client.id, msg_id)
        except ChannelError as e:
            raise ClientError("E_FIN_FAILED", f"FIN {text(msg_id)} failed {e}") from None
        client.finished()
        self._kick = True

    def fins_in_bulk(self) -> bool:
        # the state FIN needs, and no TLS the command loop would insist on first
        state = self.client.state
        return (state == STATE_SUBSCRIBED or state == STATE_CLOSING) and (
            self.client.tls or self.nsqd.opts.tls_required == TLS_NOT_REQUIRED
        )

    def finish_ids(self, ids: list[bytes]) -> None:
        """The FIN lines of one read, each as :meth:`FIN` does it (a FIN that
        succeeds writes nothing, so the refusals answered after them keep their order)."""
        client = self.client
        assert client.channel is not None
        finished, refused = client.channel.finish_messages(client.id, ids)
        client.finished(finished)
        for msg_id, e in refused:
            self.client_error(ClientError("E_FIN_FAILED", f"FIN {text(msg_id)} failed {e}"))
        self._kick = True

    def REQ(self, cmd: Command) -> None:
        msg_id = self._consuming("REQ", cmd.params, 3)
        try:
            timeout_ms = parse_base10(cmd.params[2])
        except ValueError:
            raise FatalClientError("E_INVALID", f"REQ could not parse timeout {text(cmd.params[2])}") from None
        duration_ns = ms_to_duration_ns(timeout_ms)
        max_ns = round(self.nsqd.opts.max_req_timeout * 1e9)
        clamped = min(max(duration_ns, 0), max_ns)
        client = self.client
        if clamped != duration_ns:
            self.log.info(
                "PROTOCOL(V2): [{client}] REQ timeout {t} out of range 0-{max}. Setting to {c}",
                client=client,
                t=duration_ns,
                max=max_ns,
                c=clamped,
            )
        assert client.channel is not None
        try:
            client.channel.requeue_message(client.id, msg_id, clamped / 1e9)
        except ChannelError as e:
            raise ClientError("E_REQ_FAILED", f"REQ {text(msg_id)} failed {e}") from None
        client.requeued()
        self._kick = True

    def TOUCH(self, cmd: Command) -> None:
        msg_id = self._consuming("TOUCH", cmd.params, 2)
        client = self.client
        assert client.channel is not None
        try:
            client.channel.touch_message(client.id, msg_id, client.msg_timeout)
        except ChannelError as e:
            raise ClientError("E_TOUCH_FAILED", f"TOUCH {text(msg_id)} failed {e}") from None

    def CLS(self, cmd: Command) -> bytes:
        if self.client.state != STATE_SUBSCRIBED:
            raise FatalClientError("E_INVALID", "cannot CLS in current state")
        self.client.ready_count = 0
        self.client.state = STATE_CLOSING
        return CLOSE_WAIT

    def NOP(self, cmd: Command) -> None:
        return None

    # Consecutive PUBs to one topic (a client's pipelined publishes, read together)
    # are stored as one batch, as MPUB is, and each gets its OK in turn: one pass
    # through the topic and its channels, one backend write for what overflows.
    batch_verb = b"PUB"

    def PUB(self, cmd: Command) -> bytes | defer.Deferred[None] | Pause | None:
        body = cmd.body
        assert body is not None
        topic = self._topic
        batch: _PubBatch | None = self._batch
        if batch is not None and batch.topic != topic:
            self.end_batch()
            batch = None
        wait = self.client.check_auth("PUB", topic, "", self.nsqd.now())
        if wait is not None:
            self.end_batch()
            bodies = [body]
            return Pause(wait.addCallback(lambda _: self._put("PUB", topic, bodies, 0.0)), pause_reading=True)
        if batch is None:
            self._batch = batch = _PubBatch(topic)
        batch.bodies.append(body)
        return None  # answered by end_batch

    def end_batch(self) -> None:
        batch: _PubBatch | None = self._batch
        if batch is None:
            return
        self._batch = None
        topic, bodies = batch.topic, batch.bodies
        if len(bodies) == 1:
            self._answer(self._put("PUB", topic, bodies, 0.0), b"PUB")
            return
        try:
            started = self.nsqd.topic_ready(topic)
            committed = self.nsqd.publish_to(self.nsqd.get_topic(topic), bodies, 0.0)
        except Exception:
            # refused whole (a batch is all or nothing): one by one, so that each
            # PUB before the one refused is stored and answered OK, as Go would
            for body in bodies:
                self._answer(self._put("PUB", topic, [body], 0.0), b"PUB")
            return
        self.client.published(topic, len(bodies))
        if committed is None and started is None:
            respond = self.responses.respond
            for _ in bodies:
                respond(FRAME_TYPE_RESPONSE, OK)
        else:
            if isinstance(committed, Backpressure):
                self.read_after(committed)
            self.responses.later(_both(started, committed), "PUB", len(bodies))

    def MPUB(self, cmd: Command) -> bytes | defer.Deferred[None] | Pause:
        assert cmd.bodies is not None
        return self._publish("MPUB", self._topic, cmd.bodies, 0.0, authorized=True)

    def DPUB(self, cmd: Command) -> bytes | defer.Deferred[None] | Pause:
        assert cmd.body is not None
        return self._publish("DPUB", self._topic, [cmd.body], self._delay, authorized=False)

    def _publish(
        self, verb: str, topic: str, bodies: list[bytes], delay: float, authorized: bool
    ) -> bytes | defer.Deferred[None] | Pause:
        """Store the messages (after Go's CheckAuth, which MPUB did before its body);
        the answer is OK, or in durable mode a Deferred that fires once they are fsynced."""
        if not authorized:
            wait = self.client.check_auth(verb, topic, "", self.nsqd.now())
            if wait is not None:
                return Pause(wait.addCallback(lambda _: self._put(verb, topic, bodies, delay)), pause_reading=True)
        return self._put(verb, topic, bodies, delay)

    def _put(self, verb: str, topic: str, bodies: list[bytes], delay: float) -> bytes | defer.Deferred[None]:
        try:
            started = self.nsqd.topic_ready(topic)
            committed = self.nsqd.publish_to(self.nsqd.get_topic(topic), bodies, delay)
        except Exception as e:
            raise FatalClientError(f"E_{verb}_FAILED", f"{verb} failed {e}") from None
        self.client.published(topic, len(bodies))
        if committed is None and started is None:
            return OK
        if isinstance(committed, Backpressure):
            self.read_after(committed)
        return _both(started, committed)


def _both(started: defer.Deferred[None] | None, committed: defer.Deferred[None] | None) -> defer.Deferred[None]:
    """A publish's answer: once the topic it created has started (as Go's GetTopic
    returns then) and its messages are stored (durable mode)."""
    if started is None:
        assert committed is not None
        return committed
    if committed is None:
        return started
    return started.addCallback(lambda _: committed)


V2Protocol._headers = {
    b"IDENTIFY": V2Protocol._identify_line,
    b"AUTH": V2Protocol._auth_line,
    b"PUB": V2Protocol._pub_line,
    b"MPUB": V2Protocol._mpub_line,
    b"DPUB": V2Protocol._dpub_line,
}
V2Protocol._handlers = {
    b"FIN": V2Protocol.FIN,
    b"RDY": V2Protocol.RDY,
    b"REQ": V2Protocol.REQ,
    b"PUB": V2Protocol.PUB,
    b"MPUB": V2Protocol.MPUB,
    b"DPUB": V2Protocol.DPUB,
    b"NOP": V2Protocol.NOP,
    b"TOUCH": V2Protocol.TOUCH,
    b"SUB": V2Protocol.SUB,
    b"CLS": V2Protocol.CLS,
    b"AUTH": V2Protocol.AUTH,
    b"IDENTIFY": V2Protocol.IDENTIFY,
}


class _PubBatch:
    __slots__ = ("bodies", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.bodies: list[bytes] = []


class V2Factory(protocol.ServerFactory):
    """nsqd's TCP side: what its connections share besides the core.

    ``tls`` (a server TLS context) lets clients upgrade after IDENTIFY; ``auth``
    asks --auth-http-address servers about AUTH secrets. The connections'
    buffered frames are written once per reactor turn (:meth:`want_flush`).
    """

    noisy = False

    def __init__(self, nsqd: NSQD, tls: Any = None, auth: AuthClient | None = None) -> None:
        self.nsqd = nsqd
        self.tls = tls
        self.auth = auth if auth is not None else AuthClient(nsqd)
        # beyond Go: magic -> what takes a connection opened with it (the replication link)
        self.magics: dict[bytes, Callable[[Any, bytes], None]] = {}
        self._flush_queue: list[Output] = []
        self._flush_call: Any = None

    def buildProtocol(self, addr: Any) -> V2Protocol:
        p = V2Protocol(self)
        p.factory = self
        return p

    def want_flush(self, output: Output) -> None:
        """Flush ``output`` at the end of this reactor turn, onto the wire from there
        (:func:`nsq_service.listen.write_now`): not at the reactor's next poll for
        writable sockets, behind whatever else that poll brings (a lookupd's answer
        to a REGISTER came between a consumer's RDY and its first message)."""
        self._flush_queue.append(output)
        if self._flush_call is None:
            self._flush_call = self.nsqd.reactor.callLater(0, self._flush_all)

    def _flush_all(self) -> None:
        self._flush_call = None
        queue, self._flush_queue = self._flush_queue, []
        for output in queue:
            output.flush()
