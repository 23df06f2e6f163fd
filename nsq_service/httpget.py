"""A small HTTP GET client for a server's quick questions to another.

nsqd asks the lookupds for a new topic's channels while the command that
created the topic waits for them (as Go's GetTopic does). Through treq and
Agent that question cost nsqd about a millisecond of its one thread more than
the exchange itself (request and response objects, header machinery, a
connection pool); here it is one connection, one request written at once, and
the answer parsed when the server closes it. HTTP/1.0, so the answer is never
chunked: its length is its Content-Length, or everything up to the close.

``get(url, headers=..., timeout=...)`` answers what treq's does for the few
uses it has: a response with ``code``, ``phrase`` and ``content()``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from twisted.internet import defer, protocol
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.python.failure import Failure

MAX_RESPONSE = 16 << 20


class HTTPGetError(Exception):
    pass


class Response:
    def __init__(self, code: int, phrase: bytes, headers: dict[bytes, bytes], body: bytes) -> None:
        self.code = code
        self.phrase = phrase
        self.headers = headers
        self.body = body

    def content(self) -> defer.Deferred[bytes]:
        return defer.succeed(self.body)


def parse_response(data: bytes) -> Response:
    """A whole HTTP/1.x response (the server closed the connection after it)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        raise HTTPGetError("malformed HTTP response" if data else "EOF")
    lines = head.split(b"\r\n")
    version, _, status = lines[0].partition(b" ")
    code_text, _, phrase = status.partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(code_text) != 3 or not code_text.isdigit():
        raise HTTPGetError(f"malformed HTTP response {lines[0]!r}")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    length = headers.get(b"content-length")
    if length is not None:
        if not length.isdigit():
            raise HTTPGetError(f"bad Content-Length {length!r}")
        if len(rest) < int(length):
            raise HTTPGetError("unexpected EOF")
        rest = rest[: int(length)]
    return Response(int(code_text), phrase, headers, rest)


class _Get(protocol.Protocol):
    transport: Any

    def __init__(self, request: bytes, done: defer.Deferred[Response]) -> None:
        self.request = request
        self.done = done
        self.chunks: list[bytes] = []
        self.size = 0
        self.error: str | None = None

    def connectionMade(self) -> None:
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > MAX_RESPONSE:
            self.error = f"response larger than {MAX_RESPONSE} bytes"
            self.transport.abortConnection()
            return
        self.chunks.append(data)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        if self.done.called:
            return
        if self.error is not None:
            self.done.errback(HTTPGetError(self.error))
            return
        try:
            response = parse_response(b"".join(self.chunks))
        except HTTPGetError as e:
            self.done.errback(e)
            return
        self.done.callback(response)


class _GetFactory(protocol.ClientFactory):
    noisy = False

    def __init__(self, request: bytes, done: defer.Deferred[Response]) -> None:
        self.request = request
        self.done = done
        self.proto: _Get | None = None

    def buildProtocol(self, addr: Any) -> _Get:
        self.proto = _Get(self.request, self.done)
        return self.proto

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if not self.done.called:
            self.done.errback(reason)


class QuickHTTPClient:
    """GETs over plain HTTP on ``reactor``, each on its own connection."""

    def __init__(self, reactor: Any, connect_timeout: float) -> None:
        self.reactor = reactor
        self.connect_timeout = connect_timeout

    def get(
        self, url: str, headers: dict[bytes, list[bytes]] | None = None, timeout: float | None = None, **_: Any
    ) -> defer.Deferred[Response]:
        """The response to ``GET url``; fails on a refused or timed out connection,
        no answer within ``timeout`` seconds, or a malformed answer."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            return defer.fail(HTTPGetError(f"unsupported URL {url}"))
        host = parts.hostname
        port = parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"GET {target} HTTP/1.0", f"Host: {parts.netloc}"]
        for name, values in (headers or {}).items():
            lines += [f"{name.decode('latin-1')}: {v.decode('latin-1')}" for v in values]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        stops: list[Any] = []

        def cancel(d: defer.Deferred[Response]) -> None:
            d.errback(defer.CancelledError())  # before the hang-up's own failure
            for stop in stops:
                stop()

        done: defer.Deferred[Response] = defer.Deferred(cancel)
        factory = _GetFactory(request, done)
        stop: Any
        if isIPAddress(host) or isIPv6Address(host):
            connector = self.reactor.connectTCP(host, port, factory, timeout=self.connect_timeout)
            stop = connector.disconnect
        else:
            from twisted.internet import endpoints  # a name: resolved as Go's dialer does, both families

            endpoint = endpoints.HostnameEndpoint(self.reactor, host, port, timeout=self.connect_timeout)
            connecting = endpoint.connect(factory)
            connecting.addErrback(lambda f: None if done.called else done.errback(f))

            def stop() -> None:
                connecting.cancel()
                if factory.proto is not None and factory.proto.transport is not None:
                    factory.proto.transport.abortConnection()

        stops.append(stop)
        if timeout:
            timer = self.reactor.callLater(timeout, self._timed_out, done, stop, url, timeout)
            done.addBoth(lambda result: (timer.cancel() if timer.active() else None, result)[1])
        return done

    @staticmethod
    def _timed_out(done: defer.Deferred[Response], stop: Any, url: str, timeout: float) -> None:
        if not done.called:
            done.errback(HTTPGetError(f"Get {url}: no answer within {timeout:g}s"))
        stop()
