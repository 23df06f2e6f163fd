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
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, endpoints, protocol
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from nsq_wire import commands, lookupd
from nsq_wire.compression import DeflateCodec, SnappyCodec
from nsq_wire.errors import NSQError
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, HEARTBEAT, MAGIC_V2, FrameReader
from nsq_wire.gofmt import join_host_port
from nsq_wire.message import decode
from nsq_wire.version import VERSION

log = Logger(namespace="nsq_client.twisted_client")

USER_AGENT = f"nsq-tw-client/{VERSION}"
# errors nsqd sends for FIN/REQ/TOUCH, which have no response of their own
_ASYNC_ERRORS = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")


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
        self._reader = FrameReader()
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
        reader = self._reader
        reader.feed(data)
        while (frame := reader.next()) is not None:
            self._frame(*frame)
            if self._switched:
                # what follows the OK of an upgrade is read the new way
                self._switched = False
                rest = reader.rest()
                if self._codec is None:  # TLS: the server's TLS records
                    if rest:
                        self.transport.protocol.dataReceived(rest)
                    return
                reader.feed(b"".join(self._codec.decode(rest)))

    def _frame(self, frame_type: int, data: bytes) -> None:
        if frame_type == FRAME_TYPE_MESSAGE:
            if self.on_message is not None:
                self.on_message(ReceivedMessage(self, *decode(data)))
        elif frame_type == FRAME_TYPE_RESPONSE:
            if data == HEARTBEAT:
                self.write(commands.NOP)
            elif self._pending:
                self._pending.popleft().callback(data)
        elif frame_type == FRAME_TYPE_ERROR:
            err = NSQError.from_frame(data)
            if not data.startswith(_ASYNC_ERRORS) and self._pending:
                self._pending.popleft().errback(err)
            elif self.on_error is not None:
                self.on_error(err)
            else:
                log.warn("nsqd error: {err}", err=err)

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
        d = self._request(commands.identify(data))

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
                    done.errback(NSQError.from_frame(b"E_IDENTIFY_FAILED unexpected " + ok))
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
        return self._request(commands.auth(secret))

    def sub(self, topic: str, channel: str) -> defer.Deferred[bytes]:
        return self._request(commands.sub(topic, channel))

    def pub(self, topic: str, body: bytes) -> defer.Deferred[bytes]:
        return self._request(commands.pub(topic, body))

    def mpub(self, topic: str, bodies: list[bytes]) -> defer.Deferred[bytes]:
        return self._request(commands.mpub(topic, bodies))

    def dpub(self, topic: str, delay_ms: int, body: bytes) -> defer.Deferred[bytes]:
        return self._request(commands.dpub(topic, delay_ms, body))

    def cls(self) -> defer.Deferred[bytes]:
        return self._request(commands.CLS)

    def rdy(self, count: int) -> None:
        self.write(commands.rdy(count))

    def fin(self, msg_id: bytes) -> None:
        self.write(commands.fin(msg_id))

    def req(self, msg_id: bytes, delay_ms: int = 0) -> None:
        self.write(commands.req(msg_id, delay_ms))

    def touch(self, msg_id: bytes) -> None:
        self.write(commands.touch(msg_id))

    def nop(self) -> None:
        self.write(commands.NOP)

    def write(self, data: bytes) -> None:
        if self._codec is not None:
            data = self._codec.encode(data)
        self.transport.write(data)

    def close(self) -> None:
        self.transport.loseConnection()


@defer.inlineCallbacks
def connect(
    reactor: Any,
    host: str,
    port: int,
    tls_options: Any = None,
    auth_secret: bytes | None = None,
    endpoint: IStreamClientEndpoint | None = None,
    **identify: Any,
) -> Any:
    """Connect and IDENTIFY; fires with the :class:`NSQClientProtocol`.

    ``identify`` are IDENTIFY's fields (``snappy=True``, ``deflate=True``,
    ``tls_v1=True``...); ``tls_options`` is a client connection creator
    (:func:`twisted.internet.ssl.optionsForClientTLS`) for the TLS upgrade;
    ``auth_secret`` is sent with AUTH once identified. ``endpoint`` connects
    instead of a HostnameEndpoint to ``host:port``.
    """
    factory = protocol.Factory.forProtocol(NSQClientProtocol)
    factory.noisy = False
    if endpoint is None:
        endpoint = endpoints.HostnameEndpoint(reactor, host, port, timeout=5)
    conn = yield endpoint.connect(factory)
    conn.tls_options = tls_options
    yield conn.identify(**{**commands.identify_defaults(USER_AGENT), **identify})
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
        endpoint: IStreamClientEndpoint | None = None,
        **identify: Any,
    ) -> Any:
        """Connect (as :func:`connect`), SUB and RDY; fires with the Consumer."""
        consumer = cls(topic, channel, handler, max_in_flight)
        consumer.reactor = reactor
        conn = yield connect(reactor, host, port, endpoint=endpoint, **identify)
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
    ``max_in_flight`` applies to each connection. ``http_client`` (treq's
    HTTPClient or alike) asks the lookupds, ``endpoint_factory(host, port)``
    connects to the nodes; both default to the reactor's network.
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
        http_client: Any = None,
        endpoint_factory: Callable[[str, int], IStreamClientEndpoint] | None = None,
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
        self.http = http_client if http_client is not None else _http_client(reactor)
        self.endpoint_factory = endpoint_factory
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
        nodes: set[tuple[str, int]] = set()
        for address in self.lookupds:
            url = lookupd.lookup_url(address, self.topic)
            try:
                resp = yield self.http.get(
                    url, headers={b"Accept": [lookupd.ACCEPT.encode()]}, timeout=5, reactor=self.reactor
                )
                body = yield resp.content()
                if resp.code != 200:
                    continue
                nodes.update(lookupd.producers(body))
            except Exception as e:
                log.warn("lookupd {url} failed - {err}", url=url, err=e)
        for node in nodes:
            if node not in self.consumers and node not in self._connecting:
                self._connect(node)

    def _connect(self, node: tuple[str, int]) -> None:
        self._connecting.add(node)
        host, port = node
        endpoint = self.endpoint_factory(host, port) if self.endpoint_factory is not None else None
        d = Consumer.connect(
            self.reactor,
            host,
            port,
            self.topic,
            self.channel,
            self.handler,
            self.max_in_flight,
            endpoint=endpoint,
            **self.identify,
        )

        def connected(consumer: Consumer) -> None:
            self._connecting.discard(node)
            self.consumers[node] = consumer
            assert consumer.conn is not None
            consumer.conn.closed_d.addCallback(lambda _: self.consumers.pop(node, None))

        def failed(f: Failure) -> None:
            self._connecting.discard(node)
            log.warn("could not subscribe on {node} - {err}", node=join_host_port(host, port), err=f.value)

        d.addCallbacks(connected, failed)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        if self._poll.running:
            self._poll.stop()
        for consumer in list(self.consumers.values()):
            yield consumer.close()


def _http_client(reactor: Any) -> Any:
    from treq.client import HTTPClient
    from twisted.web.client import Agent, HTTPConnectionPool

    return HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))
