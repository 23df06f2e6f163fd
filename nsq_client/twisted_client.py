"""A small Twisted NSQ client: a producer and a consumer.

Used by the tests, the bench tools and the docs' examples::

    conn = yield connect(reactor, "127.0.0.1", 4150)
    yield conn.pub("events", b"hello")

    def handle(msg):
        print(msg.body)           # returning normally FINs the message

    consumer = yield Consumer.connect(reactor, "127.0.0.1", 4150, "events", "archive", handle)
"""

from __future__ import annotations

import json
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, endpoints, protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from nsq_wire.commands import encode_command, encode_mpub
from nsq_wire.compression import DeflateCodec, SnappyCodec
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, HEARTBEAT, MAGIC_V2
from nsq_wire.version import VERSION

log = Logger(namespace="nsq_client.twisted_client")

_FRAME_HEADER = struct.Struct(">ii")
_MSG_HEADER = struct.Struct(">qH")
# errors nsqd sends for FIN/REQ/TOUCH, which have no response of their own
_ASYNC_ERRORS = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")


class NSQError(Exception):
    """An error frame from nsqd: ``code`` (``E_INVALID``...) and its text."""

    def __init__(self, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        code, _, rest = text.partition(" ")
        super().__init__(text)
        self.code = code
        self.text = rest


class ReceivedMessage:
    """A message delivered to a consumer, answerable once."""

    def __init__(self, conn: NSQClientProtocol, msg_id: bytes, body: bytes, timestamp: int, attempts: int) -> None:
        self.conn = conn
        self.id = msg_id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.responded = False
        self.auto_respond = True

    def finish(self) -> None:
        if not self.responded:
            self.responded = True
            self.conn.fin(self.id)

    def requeue(self, delay_ms: int = 0) -> None:
        if not self.responded:
            self.responded = True
            self.conn.req(self.id, delay_ms)

    def touch(self) -> None:
        if not self.responded:
            self.conn.touch(self.id)


class NSQClientProtocol(protocol.Protocol):
    """One V2 connection. Commands with a response return a Deferred."""

    transport: Any

    def __init__(self) -> None:
        self._buf = b""
        self._codec: SnappyCodec | DeflateCodec | None = None
        self._switched = False  # the stream changed (TLS or compression) mid-buffer
        self.tls_options: Any = None  # a client TLS connection creator, for tls_v1
        self._pending: deque[defer.Deferred[bytes]] = deque()
        self.on_message: Callable[[ReceivedMessage], Any] | None = None
        self.on_error: Callable[[NSQError], Any] | None = None
        self.identify_response: dict[str, Any] | None = None
        self.connected_d: defer.Deferred[NSQClientProtocol] = defer.Deferred()
        self.closed_d: defer.Deferred[None] = defer.Deferred()
        self.closed = False

    # -- transport -------------------------------------------------------------

    def connectionMade(self) -> None:
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        self.transport.write(MAGIC_V2)
        self.connected_d.callback(self)

    def dataReceived(self, data: bytes) -> None:
        if self._codec is not None:
            data = b"".join(self._codec.decode(data))
        buf = self._buf + data if self._buf else data
        self._buf = b""
        while buf:
            buf = self._frames(buf)

    def _frames(self, buf: bytes) -> bytes:
        """Handle the complete frames; returns bytes to parse again after a
        switch to compression, else keeps the partial frame for later."""
        pos = 0
        end = len(buf)
        unpack = _FRAME_HEADER.unpack_from
        while end - pos >= 8:
            size, frame_type = unpack(buf, pos)
            if end - pos - 4 < size:
                break
            payload = buf[pos + 8 : pos + 4 + size]
            pos += 4 + size
            if frame_type == FRAME_TYPE_MESSAGE:
                self._message(payload)
            elif frame_type == FRAME_TYPE_RESPONSE:
                if payload == HEARTBEAT:
                    self.write(b"NOP\n")
                elif self._pending:
                    self._pending.popleft().callback(payload)
            elif frame_type == FRAME_TYPE_ERROR:
                err = NSQError(payload)
                if not payload.startswith(_ASYNC_ERRORS) and self._pending:
                    self._pending.popleft().errback(err)
                elif self.on_error is not None:
                    self.on_error(err)
                else:
                    log.warn("nsqd error: {err}", err=err)
            if self._switched:
                self._switched = False
                rest = buf[pos:]
                if self._codec is None:  # TLS: what follows is the server's TLS records
                    if rest:
                        self.transport.protocol.dataReceived(rest)
                    return b""
                return b"".join(self._codec.decode(rest))
        self._buf = buf[pos:]
        return b""

    def _message(self, payload: bytes) -> None:
        timestamp, attempts = _MSG_HEADER.unpack_from(payload)
        msg = ReceivedMessage(self, payload[10:26], payload[26:], timestamp, attempts)
        if self.on_message is not None:
            self.on_message(msg)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.closed = True
        pending, self._pending = self._pending, deque()
        for d in pending:
            d.errback(reason)
        self.closed_d.callback(None)

    # -- commands -----------------------------------------------------------------

    def _request(self, data: bytes) -> defer.Deferred[bytes]:
        d: defer.Deferred[bytes] = defer.Deferred()
        if self.closed:
            d.errback(ConnectionError("connection closed"))
            return d
        self._pending.append(d)
        self.write(data)
        return d

    def identify(self, **data: Any) -> defer.Deferred[bytes]:
        """IDENTIFY, then the upgrades nsqd agreed to (TLS, snappy, deflate);
        fires with nsqd's JSON answer once the stream has switched."""
        body = json.dumps(data).encode()
        d = self._request(encode_command(b"IDENTIFY", body=body))

        def parsed(resp: bytes) -> Any:
            if not resp.startswith(b"{"):
                return resp
            self.identify_response = info = json.loads(resp)
            steps = []
            if info.get("tls_v1"):
                steps.append(self._start_tls)
            if info.get("snappy"):
                steps.append(lambda: self._set_codec(SnappyCodec()))
            if info.get("deflate"):
                steps.append(lambda: self._set_codec(DeflateCodec(info.get("deflate_level", 6))))
            if not steps:
                return resp
            done: defer.Deferred[bytes] = defer.Deferred()

            def step(ok: bytes | None) -> None:
                if ok is not None and ok != b"OK":
                    done.errback(NSQError(b"E_IDENTIFY_FAILED unexpected " + ok))
                    return
                if not steps:
                    done.callback(resp)
                    return
                steps.pop(0)()
                # the OK for this upgrade arrives over the new stream
                waiter: defer.Deferred[bytes] = defer.Deferred()
                waiter.addCallbacks(step, done.errback)
                self._pending.appendleft(waiter)

            step(None)
            return done

        return d.addCallback(parsed)

    def _start_tls(self) -> None:
        if self.tls_options is None:
            raise ValueError("nsqd offered TLS but no tls_options were given")
        self.transport.startTLS(self.tls_options)
        self._switched = True

    def _set_codec(self, codec: SnappyCodec | DeflateCodec) -> None:
        self._codec = codec
        self._switched = True

    def auth(self, secret: bytes) -> defer.Deferred[bytes]:
        return self._request(encode_command(b"AUTH", body=secret))

    def sub(self, topic: str, channel: str) -> defer.Deferred[bytes]:
        return self._request(encode_command(b"SUB", topic, channel))

    def pub(self, topic: str, body: bytes) -> defer.Deferred[bytes]:
        return self._request(encode_command(b"PUB", topic, body=body))

    def mpub(self, topic: str, bodies: list[bytes]) -> defer.Deferred[bytes]:
        return self._request(encode_mpub(topic, bodies))

    def dpub(self, topic: str, delay_ms: int, body: bytes) -> defer.Deferred[bytes]:
        return self._request(encode_command(b"DPUB", topic, str(delay_ms), body=body))

    def cls(self) -> defer.Deferred[bytes]:
        return self._request(b"CLS\n")

    def rdy(self, count: int) -> None:
        self.write(b"RDY %d\n" % count)

    def fin(self, msg_id: bytes) -> None:
        self.write(b"FIN " + msg_id + b"\n")

    def req(self, msg_id: bytes, delay_ms: int = 0) -> None:
        self.write(b"REQ " + msg_id + b" %d\n" % delay_ms)

    def touch(self, msg_id: bytes) -> None:
        self.write(b"TOUCH " + msg_id + b"\n")

    def nop(self) -> None:
        self.write(b"NOP\n")

    def write(self, data: bytes) -> None:
        if self._codec is not None:
            data = self._codec.encode(data)
        self.transport.write(data)

    def close(self) -> None:
        self.transport.loseConnection()


def _client_endpoint(reactor: Any, host: str, port: int) -> Any:
    return endpoints.HostnameEndpoint(reactor, host, port, timeout=5)


@defer.inlineCallbacks
def connect(
    reactor: Any, host: str, port: int, tls_options: Any = None, auth_secret: bytes | None = None, **identify: Any
) -> Any:
    """Connect and IDENTIFY; fires with the :class:`NSQClientProtocol`.

    ``identify`` are IDENTIFY's fields (``snappy=True``, ``deflate=True``,
    ``tls_v1=True``...); ``tls_options`` is a client connection creator
    (:func:`twisted.internet.ssl.optionsForClientTLS`) for the TLS upgrade;
    ``auth_secret`` is sent with AUTH once identified.
    """
    factory = protocol.Factory.forProtocol(NSQClientProtocol)
    factory.noisy = False
    conn = yield _client_endpoint(reactor, host, port).connect(factory)
    conn.tls_options = tls_options
    data = {
        "client_id": socket.gethostname().split(".")[0],
        "hostname": socket.gethostname(),
        "user_agent": f"nsq-tw-client/{VERSION}",
        "feature_negotiation": True,
    }
    data.update(identify)
    yield conn.identify(**data)
    if auth_secret is not None:
        yield conn.auth(auth_secret)
    return conn


class Consumer:
    """Subscribe on one nsqd and hand each message to ``handler``.

    The handler may return a Deferred. A message is FINed when the handler
    succeeds and REQueued when it fails, unless the handler answered it or
    cleared ``msg.auto_respond``. RDY is kept at ``max_in_flight``.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Callable[[ReceivedMessage], Any],
        max_in_flight: int = 1,
        requeue_delay_ms: int = 0,
    ) -> None:
        self.topic = topic
        self.channel = channel
        self.handler = handler
        self.max_in_flight = max_in_flight
        self.requeue_delay_ms = requeue_delay_ms
        self.conn: NSQClientProtocol | None = None
        self.reactor: Any = None
        self._running = 0  # handlers called and not yet done
        self._idle: list[defer.Deferred[None]] = []
        self._closing: defer.Deferred[None] | None = None
        self._shutdown_trigger: Any = None

    @classmethod
    @defer.inlineCallbacks
    def connect(
        cls,
        reactor: Any,
        host: str,
        port: int,
        topic: str,
        channel: str,
        handler: Callable[[ReceivedMessage], Any],
        max_in_flight: int = 1,
        **identify: Any,
    ) -> Any:
        consumer = cls(topic, channel, handler, max_in_flight)
        consumer.reactor = reactor
        conn = yield connect(reactor, host, port, **identify)
        consumer.conn = conn
        conn.on_message = consumer._handle
        yield conn.sub(topic, channel)
        conn.rdy(max_in_flight)
        # a program that stops the reactor without close() (task.react once
        # main() returns) still gets the FINs of the handlers that returned
        consumer._shutdown_trigger = reactor.addSystemEventTrigger("before", "shutdown", consumer.close)
        return consumer

    def _handle(self, msg: ReceivedMessage) -> None:
        self._running += 1
        d = defer.maybeDeferred(self.handler, msg)

        def ok(_: Any) -> None:
            if msg.auto_respond:
                msg.finish()

        def failed(f: Failure) -> None:
            log.failure("handler failed for message {id}", f, id=msg.id)
            if msg.auto_respond:
                msg.requeue(self.requeue_delay_ms)

        d.addCallbacks(ok, failed)
        d.addBoth(self._handled)

    def _handled(self, _: Any) -> None:
        self._running -= 1
        if not self._running:
            idle, self._idle = self._idle, []
            for waiter in idle:
                waiter.callback(None)

    def _handlers_done(self) -> defer.Deferred[None]:
        d: defer.Deferred[None] = defer.Deferred()
        if self._running:
            self._idle.append(d)
        else:
            d.callback(None)
        return d

    def close(self, timeout: float = 10.0) -> defer.Deferred[None]:
        """Stop: CLS (nsqd sends nothing more), let the handlers still running
        finish and answer their messages, then close the connection, which
        sends their FINs first. After ``timeout`` seconds it closes anyway."""
        if self._closing is None:
            self._closing = self._close(timeout)
        d: defer.Deferred[None] = defer.Deferred()

        def closed(result: Any) -> Any:
            d.callback(None)
            return result

        self._closing.addBoth(closed)
        return d

    @defer.inlineCallbacks
    def _close(self, timeout: float) -> Any:
        if self._shutdown_trigger is not None:
            try:
                self.reactor.removeSystemEventTrigger(self._shutdown_trigger)
            except (ValueError, KeyError):
                pass  # already fired: we are the trigger
            self._shutdown_trigger = None
        conn = self.conn
        if conn is None or conn.closed:
            return
        waits: list[defer.Deferred[Any]] = [conn.cls(), self._handlers_done()]
        ready: defer.Deferred[Any] = defer.DeferredList(waits, consumeErrors=True)
        if self.reactor is not None:
            ready.addTimeout(timeout, self.reactor)
        try:
            yield ready
        except defer.TimeoutError:
            log.warn(
                "closing the consumer of {topic}/{channel}: gave up waiting after {t}s",
                topic=self.topic,
                channel=self.channel,
                t=timeout,
            )
        conn.close()
        yield conn.closed_d


class LookupdConsumer:
    """A consumer that finds nsqd nodes through nsqlookupd.

    Every ``poll_interval`` it asks each lookupd's ``/lookup?topic=`` for the
    topic's producers and subscribes to the ones it is not connected to yet;
    a node that goes away is dropped and picked up again when it is listed.
    ``max_in_flight`` applies to each connection.
    """

    def __init__(
        self,
        reactor: Any,
        lookupd_http_addresses: list[str],
        topic: str,
        channel: str,
        handler: Callable[[ReceivedMessage], Any],
        max_in_flight: int = 1,
        poll_interval: float = 60.0,
        **identify: Any,
    ) -> None:
        self.reactor = reactor
        self.lookupds = lookupd_http_addresses
        self.topic = topic
        self.channel = channel
        self.handler = handler
        self.max_in_flight = max_in_flight
        self.identify = identify
        self.consumers: dict[tuple[str, int], Consumer] = {}
        self._connecting: set[tuple[str, int]] = set()
        from twisted.internet.task import LoopingCall

        self._poll = LoopingCall(self.poll)
        self._poll.clock = reactor
        self.poll_interval = poll_interval

    def start(self) -> Any:
        """Start polling; fires after the first poll."""
        self._poll.start(self.poll_interval, now=False)
        return self.poll()

    @defer.inlineCallbacks
    def poll(self) -> Any:
        """One look at the lookupds (a failure is logged, never raised)."""
        import treq

        nodes: set[tuple[str, int]] = set()
        for address in self.lookupds:
            url = f"http://{address}/lookup?topic={self.topic}"
            try:
                resp = yield treq.get(url, persistent=False, timeout=5)
                body = yield resp.content()
            except Exception as e:
                log.warn("lookupd {url} failed - {err}", url=url, err=e)
                continue
            if resp.code != 200:
                continue
            data = json.loads(body)
            for p in data.get("producers") or []:
                nodes.add((p["broadcast_address"], int(p["tcp_port"])))
        for node in nodes:
            if node not in self.consumers and node not in self._connecting:
                self._connect(node)

    def _connect(self, node: tuple[str, int]) -> None:
        self._connecting.add(node)
        host, port = node
        d = Consumer.connect(
            self.reactor, host, port, self.topic, self.channel, self.handler, self.max_in_flight, **self.identify
        )

        def connected(consumer: Consumer) -> None:
            self._connecting.discard(node)
            self.consumers[node] = consumer
            assert consumer.conn is not None
            consumer.conn.closed_d.addCallback(lambda _: self.consumers.pop(node, None))

        def failed(f: Failure) -> None:
            self._connecting.discard(node)
            log.warn("could not subscribe on {node} - {err}", node=node, err=f.value)

        d.addCallbacks(connected, failed)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        if self._poll.running:
            self._poll.stop()
        for consumer in list(self.consumers.values()):
            yield consumer.close()
