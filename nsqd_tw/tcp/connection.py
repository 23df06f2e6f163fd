"""The command loop of a V2 connection: bytes in, commands to their handlers, answers out.

:class:`CommandConnection` is Go's IOLoop: it reads the magic, feeds the parser
(through the stream codec once negotiated), checks each command's line once,
hands complete commands to the handlers a subclass names, keeps answers in
command order, pauses while a handler waits (AUTH, an upgrade), stops reading
while the client's output is backed up, and closes on fatal errors, read
deadlines and write deadlines. :class:`~nsqd_tw.tcp.protocol.V2Protocol` adds
the 12 commands.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer, protocol
from twisted.protocols.policies import TimeoutMixin
from twisted.python.failure import Failure

from nsq_wire.compression import CompressionError, DeflateCodec, SnappyCodec
from nsq_wire.errors import ClientError, FatalClientError
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, MAGIC_V2, pack_frame
from nsq_wire.gofmt import join_host_port
from nsq_wire.parser import BODY_COMMANDS, Command, ProtocolViolation, V2Parser
from nsqd_tw.options import TLS_NOT_REQUIRED
from nsqd_tw.tcp.client import ClientV2
from nsqd_tw.tcp.output import Output
from nsqd_tw.tcp.responses import Responses
from nsqd_tw.tcp.upgrade import Upgrade

if TYPE_CHECKING:
    from nsqd_tw.auth import AuthClient
    from nsqd_tw.core.nsqd import NSQD
    from nsqd_tw.tcp.tlslayer import TLSLayer


class Server(Protocol):
    """What a connection shares with the others (the V2Factory)."""

    nsqd: NSQD
    tls: Any
    auth: AuthClient
    # beyond Go: other protocols on the port, by magic (the replication link)
    magics: dict[bytes, Callable[[Any, bytes], None]]

    def want_flush(self, output: Output) -> None: ...


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


def text(b: bytes) -> str:
    """Bytes from the wire as text for an error message (round-trips exactly)."""
    return b.decode("utf-8", "surrogateescape")


class CommandConnection(protocol.Protocol, TimeoutMixin):
    transport: Any

    def __init__(self, server: Server) -> None:
        self.server = server
        self.nsqd = nsqd = server.nsqd
        # The connection owns its parts; they point back at it weakly, so that a
        # closed connection is freed at once by reference counting instead of
        # waiting in garbage for a collection of the oldest generation (minutes,
        # and the memory freed that late stayed with the process).
        me = weakref.proxy(self)
        self.log = nsqd.log_gate.logger("nsqd_tw.tcp.protocol")
        self.client = ClientV2(me, nsqd.opts, server.auth, nsqd.now(), self.log)
        self.output: Output = None  # type: ignore[assignment]  # made with the transport
        self.responses = Responses(
            lambda ft, data: me.output.frame(ft, data),
            lambda err: me._fatal(err),
            lambda: me._close(),
            lambda: me.output.flush(),
        )
        self.upgrade = Upgrade(me)
        self.parser: V2Parser | None = None
        self.codec: SnappyCodec | DeflateCodec | None = None
        self.tls: TLSLayer | None = None  # once IDENTIFY's TLS upgrade starts
        self._magic = b""
        self.closed = False
        self._halted = False  # no more commands are read (a fatal error was decided)
        self._waiting = False  # a handler's Pause is outstanding
        self._read_holds = 0  # reasons not to read the socket now (AUTH, backed-up output)
        self._read_timeout: float | None = nsqd.opts.client_timeout
        self._kick = False  # the client may have gained capacity: its channel dispatches
        # a run of ``batch_verb`` commands held to be handled as one (V2: PUBs to one
        # topic); ended by :meth:`end_batch` before any other command and when the
        # loop stops, so answers and effects keep the commands' order
        self._batch: Any = None

    batch_verb = b""
    # filled by the subclass (functions, called with the connection: bound methods
    # kept per connection would be cycles): the checks of a body command's line, the handlers
    _headers: dict[bytes, Callable[[Any, Command], Pause | None]] = {}
    _handlers: dict[bytes, Callable[[Any, Command], Any]] = {}

    def fins_in_bulk(self) -> bool:
        """Whether the FIN lines of a read may be handled as one run (:meth:`finish_ids`)."""
        return False

    def finish_ids(self, ids: list[bytes]) -> None:
        """FIN each message of ``ids``, as FIN commands would (the subclass's)."""

    def client_error(self, e: ClientError) -> None:
        """A command refused without closing the connection: logged, answered."""
        self.log.error("[{client}] - {err}", client=self.client, err=e)
        self.responses.respond(FRAME_TYPE_ERROR, e.wire())

    def end_batch(self) -> None:
        """Handle the held run of commands and answer each (the subclass's)."""
        self._batch = None

    def _settle_batch(self) -> FatalClientError | None:
        """End the held run before an error is answered; its own fatal error wins."""
        try:
            self.end_batch()
        except FatalClientError as e:
            return e
        return None

    def callLater(self, period: float, func: Callable[[], Any]) -> Any:
        """TimeoutMixin's clock: the server's reactor."""
        return self.nsqd.reactor.callLater(period, func)

    def connectionMade(self) -> None:
        client = self.client
        client.id = self.nsqd.add_client(client)
        peer: Any = self.transport.getPeer()
        host = getattr(peer, "host", None)
        if host is not None:
            client.remote_address = join_host_port(host, peer.port)
            client.client_id = client.hostname = host
        else:
            client.remote_address = str(getattr(peer, "name", "") or "@")
        self.log.info("TCP: new client({addr})", addr=client.remote_address)
        self.output = client.output = Output(
            self.transport, weakref.proxy(client), self.nsqd.reactor, self.server.want_flush, weakref.proxy(self)
        )
        self.output.start()
        self.setTimeout(self._read_timeout)

    def dataReceived(self, data: bytes) -> None:
        if self.tls is not None:
            self._decrypted(self.tls.receive(data))
            return
        if self.parser is None:
            if self.closed:
                return
            self._magic += data
            if len(self._magic) < 4:
                return
            magic, data = self._magic[:4], self._magic[4:]
            self._magic = b""
            addr = self.client.remote_address
            self.log.info("CLIENT({addr}): desired protocol magic '{magic}'", addr=addr, magic=text(magic))
            handoff = self.server.magics.get(magic) if magic != MAGIC_V2 else None
            if handoff is not None:
                self._hand_off(handoff, data)
                return
            if magic != MAGIC_V2:
                self.log.error("client({addr}) bad protocol magic '{magic}'", addr=addr, magic=text(magic))
                self.transport.write(pack_frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL"))
                self._close()
                return
            opts = self.nsqd.opts
            self.parser = V2Parser(opts.max_msg_size, opts.max_body_size)
            self.output.heartbeat(self.client.heartbeat_interval)
            if not data:
                return
        if self.upgrade.awaiting_hello:
            self.upgrade.hello(data)
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Bytes of the command stream (decrypted), through the codec to the parser."""
        assert self.parser is not None
        if self.codec is None:
            self.parser.feed(data)
            self._process()
            return
        try:
            for chunk in self.codec.decode(data):
                self.parser.feed(chunk)
                self._process()
                if self.closed:
                    return
        except CompressionError as e:
            self.unreadable(e)

    def _decrypted(self, data: bytes) -> None:
        tls = self.tls
        assert tls is not None
        if tls.failure is not None:  # its alert is sent: the connection ends
            self.output.discard()
            self._close()  # (no close_notify after a failure)
            return
        if data:
            self._feed(data)
        if tls.peer_closed and not self.closed:  # close_notify: the end of the stream
            self._close()

    def _hand_off(self, handoff: Callable[[Any, bytes], None], data: bytes) -> None:
        """Another protocol on nsqd's port (beyond Go: a replication link): this
        connection is no client; ``handoff`` takes the transport and what follows the magic."""
        self.closed = self._halted = self.responses.closed = True
        self.setTimeout(None)
        self.transport.unregisterProducer()
        self.output.close()
        self.nsqd.remove_client(self.client.id)
        handoff(self.transport, data)

    def unreadable(self, e: CompressionError) -> None:
        """The compressed stream cannot be decoded: say so in a fatal error frame."""
        err = FatalClientError("E_BAD_BODY", f"failed to read command - {e}")
        self.log.error("[{client}] - {err}", client=self.client, err=err)
        self.responses.respond(FRAME_TYPE_ERROR, err.wire(), fatal=True)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.closed = self._halted = self.responses.closed = True
        self.setTimeout(None)
        self.output.close()
        failure = self.tls.failure if self.tls is not None else None
        self.upgrade.connection_lost(failure or reason.value or Exception())
        client = self.client
        if client.channel is not None:
            client.channel.remove_client(client.id)
        self.nsqd.remove_client(client.id)
        self.log.info("PROTOCOL(V2): [{client}] exiting ioloop", client=client)

    def timeoutConnection(self) -> None:
        self.log.error("client({client}) - failed to read command - i/o timeout", client=self.client)
        self.abort()

    def abort(self) -> None:
        """Drop the connection now, throwing away what it has not sent."""
        self.closed = self._halted = self.responses.closed = True
        self.output.discard()
        self.transport.abortConnection()

    def _close(self) -> None:
        """Close after what is buffered has been written."""
        self.closed = self._halted = self.responses.closed = True
        self.output.flush()
        self.output.closed = True
        if self.tls is not None:  # as Go's tls.Conn.Close
            notify = self.tls.close_notify()
            if notify:
                self.transport.write(notify)
        # a transport with a paused producer would wait for it forever
        self.transport.unregisterProducer()
        self.transport.loseConnection()

    def close(self) -> None:
        """Closed by the server (its channel was deleted or nsqd is stopping)."""
        if not self.closed:
            self._close()

    def shutdown(self) -> None:
        """nsqd is stopping: give in-flight messages back now, then close."""
        channel, self.client.channel = self.client.channel, None
        if channel is not None:
            channel.remove_client(self.client.id)
        self.close()

    def _process(self) -> None:
        if self._waiting:
            return
        parser = self.parser
        assert parser is not None
        client = self.client
        handlers = self._handlers
        tls_required = self.nsqd.opts.tls_required != TLS_NOT_REQUIRED
        batch_verb = self.batch_verb
        read_one = False  # a whole command was read: the read deadline moves on
        fins = self.fins_in_bulk()
        try:
            while not self._halted and not client.blocked:
                if fins and (ids := parser.take_fins()):
                    if self._batch is not None:
                        self.end_batch()
                    read_one = True
                    self.finish_ids(ids)
                    continue
                cmd = parser.next()
                if cmd is None:
                    break
                name = cmd.name
                if name != batch_verb and self._batch is not None:
                    self.end_batch()
                # checked once per command: at its line for one with a body
                if (
                    tls_required
                    and not client.tls
                    and name != b"IDENTIFY"
                    and (not cmd.complete or name not in BODY_COMMANDS)
                ):
                    raise FatalClientError("E_INVALID", f"cannot {text(name)} in current state (TLS required)")
                if not cmd.complete:  # a body command's line: Go checks it before reading on
                    wait = self._headers[name](self, cmd)
                    if wait is not None:
                        self._pause(wait, name)
                        break
                    continue
                read_one = True
                handler = handlers.get(name)
                if handler is None:
                    raise FatalClientError("E_INVALID", f"invalid command {text(name)}")
                try:
                    response = handler(self, cmd)
                except ClientError as e:
                    if e.fatal:
                        raise
                    self.client_error(e)
                    continue
                if response is None:
                    continue
                if isinstance(response, Pause):
                    self._pause(response, name)
                    break
                self._answer(response, name)
            if self._batch is not None:
                self.end_batch()
        except FatalClientError as e:
            e = self._settle_batch() or e
            self.log.error("[{client}] - {err}", client=client, err=e)
            self.responses.respond(FRAME_TYPE_ERROR, e.wire(), fatal=True)
        except ProtocolViolation as e:
            if (err := self._settle_batch()) is not None:
                self.log.error("[{client}] - {err}", client=client, err=err)
                self.responses.respond(FRAME_TYPE_ERROR, err.wire(), fatal=True)
            else:
                self.log.error("client({client}) - {err}", client=client, err=e)
                self._close()
        except Exception:
            self._settle_batch()
            self.log.failure("[{client}] - internal error, closing connection", client=client)
            self._close()
        if read_one and self._read_timeout is not None:
            # Go sets the read deadline before each command; the commands of one
            # read were all read now, so once per read is the same deadline
            self.resetTimeout()
        if self._kick:
            self._kick = False
            if client.channel is not None:
                client.channel.kick()

    def _answer(self, response: Any, name: bytes) -> None:
        if isinstance(response, defer.Deferred):
            self.responses.later(response, text(name))
        else:
            self.responses.respond(FRAME_TYPE_RESPONSE, response)

    def _fatal(self, err: FatalClientError | None) -> None:
        if err is not None:
            self.log.error("[{client}] - {err}", client=self.client, err=err)
        self._halted = True

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
            return not self.closed

        def done(response: Any) -> None:
            if resume():
                if isinstance(response, Pause):  # the handler waits again (AUTH, then a new topic)
                    self._pause(response, name)
                    return
                if response is not None:
                    self._answer(response, name)
                self._process()

        def failed(f: Failure) -> None:
            if not resume():
                return
            err = f.value
            if not isinstance(err, ClientError):
                self.log.failure("[{client}] - internal error, closing connection", f, client=self.client)
                self._close()
                return
            self.log.error("[{client}] - {err}", client=self.client, err=err)
            self.responses.respond(FRAME_TYPE_ERROR, err.wire(), fatal=err.fatal)
            if not err.fatal:
                self._process()

        pause.deferred.addCallbacks(done, failed)

    def _hold_reading(self) -> None:
        """Stop reading the socket (and its read deadline) until released."""
        self._read_holds += 1
        if self._read_holds == 1 and not self.closed:
            self.setTimeout(None)
            self.transport.pauseProducing()

    def _release_reading(self) -> None:
        self._read_holds -= 1
        if self._read_holds == 0 and not self.closed:
            self.transport.resumeProducing()
            self.setTimeout(self._read_timeout)

    def read_after(self, d: defer.Deferred[Any]) -> None:
        """Beyond Go: read nothing more from this client until ``d`` fires (a
        publish held back for a replication standby that is far behind)."""
        self._hold_reading()

        def release(result: Any) -> Any:
            self._release_reading()
            return result

        d.addBoth(release)

    def backed_up(self) -> None:
        if not self.closed:
            self._hold_reading()

    def drained(self) -> None:
        self._release_reading()
        if self.client.channel is not None:
            self.client.channel.kick()
        if self.parser is not None and not self._waiting:
            self._process()

    def write_timed_out(self) -> None:
        """Backed up for a whole heartbeat interval: drop the client, as Go's
        write deadline does (its in-flight messages go back to the channel)."""
        host = self.transport.getHost()
        self.log.error(
            "PROTOCOL(V2): [{client}] messagePump error - write tcp {local}->{remote}: i/o timeout",
            client=self.client,
            local=join_host_port(getattr(host, "host", ""), getattr(host, "port", "")),
            remote=self.client.remote_address,
        )
        self.abort()
