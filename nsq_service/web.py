"""HTTP plumbing shared by nsqd's and nsqlookupd's APIs: Go's responses on Klein.

- :func:`route` marks an API method as a route; :class:`Router`, built per API
  instance, serves them with httprouter's semantics: ``405
  METHOD_NOT_ALLOWED`` with ``Allow`` for a known path, ``OPTIONS`` answered
  with ``Allow``, ``404 NOT_FOUND``, a redirect for a trailing slash or the
  wrong case, and Go's answers to a path or Host header that is not UTF-8.
- :class:`GoHTTPAPI` renders Go's ``V1`` and ``PlainText`` responses:
  ``200`` with text, nothing or JSON; errors as ``{"message":"CODE"}``; every
  V1 response with ``X-NSQ-Content-Type: nsq; version=1.0``; ``/config`` by
  the options' kinds.
- :func:`parse_query` is Go's ``url.ParseQuery``.
- :class:`HTTPChannel` answers ``400`` at once to bytes that cannot start an
  HTTP request, and malformed requests with Go's ``400 Bad Request`` text; it
  keeps at most what the route reads of a body, in memory (a body over the
  route's limit is refused from its Content-Length, or as soon as that many
  bytes of a chunked body arrived), and gives every request a header deadline
  and a body deadline that bytes dripped one at a time do not extend.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import unquote_to_bytes

from klein import Klein
from twisted.internet import defer
from twisted.internet.protocol import connectionDone
from twisted.logger import LogLevel
from twisted.python.failure import Failure
from twisted.web import http, resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from werkzeug.exceptions import HTTPException, NotFound
from werkzeug.routing import RoutingException

from nsq_service.limits import RateLimitedLog
from nsq_service.log import LogGate, Logger
from nsq_service.memstats import GCPauses, mem_stats
from nsq_service.options import ConfigError, field_by_cfg_name
from nsq_wire import gojson
from nsq_wire.gofmt import join_host_port

BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
NSQ_CONTENT_TYPE = b"nsq; version=1.0"
JSON_TYPE = b"application/json; charset=utf-8"
TEXT_TYPE = b"text/plain; charset=utf-8"

# Deadlines of an HTTP request, in seconds (Go's net/http has none by default, and Go
# nsqd sets none). The request line and headers must arrive within HEADER_TIMEOUT of
# the connection (or of the first byte of a later request on a kept-alive one); the
# body within BODY_TIMEOUT of the headers: V2's deadline for a whole command is twice
# the default 30 s heartbeat, the same. A kept-alive connection with no request in
# progress is closed after IDLE_TIMEOUT (longer than Go's http.Transport keeps idle
# connections, 90 s, so Go clients close first).
HEADER_TIMEOUT = 10
BODY_TIMEOUT = 60
IDLE_TIMEOUT = 120
# A route that reads no body still reads and drops up to this much of one to keep the
# connection alive (Go's maxPostHandlerReadBytes); past it, the request is answered at
# once and the connection closed.
DISCARD_LIMIT = 256 << 10
# After answering a request whose body was not read, wait this long before closing
# (Go's rstAvoidanceDelay): closing with unread data sends a reset, which can destroy
# the answer before the client has read it.
LINGER = 0.5
MAX_CONTENT_LENGTH = (1 << 63) - 1  # Go: strconv.ParseUint(cl, 10, 63)

_GO_ERROR_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"


def go_error_response(status: bytes, text: bytes | None = None) -> bytes:
    """What Go's net/http writes before closing a connection it cannot serve."""
    return b"HTTP/1.1 " + status + _GO_ERROR_HEADERS + (status if text is None else text)


class HTTPError(Exception):
    """An error response: ``code`` and the ``message`` text."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class QueryError(Exception):
    pass


class JSONValue:
    """A value to answer as JSON even when it is a string (``/config``)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def parse_query(raw: bytes) -> dict[str, list[str]]:
    """Go's url.ParseQuery: strict %-escapes, ``+`` is a space, no ``;``."""
    values: dict[str, list[str]] = {}
    for part in raw.split(b"&"):
        if not part:
            continue
        if b";" in part:
            raise QueryError("invalid semicolon separator in query")
        key, _, value = part.partition(b"=")
        values.setdefault(_unescape(key), []).append(_unescape(value))
    return values


def _unescape(s: bytes) -> str:
    i = s.find(b"%")
    while i >= 0:
        hexpart = s[i + 1 : i + 3]
        if len(hexpart) < 2 or any(c not in b"0123456789abcdefABCDEF" for c in hexpart):
            raise QueryError('invalid URL escape "%s"' % s[i : i + 3].decode("latin-1"))
        i = s.find(b"%", i + 3)
    return unquote_to_bytes(s.replace(b"+", b" ")).decode("utf-8", "replace")


def go_parse_int(s: str) -> int:
    """strconv.ParseInt(s, 10, 64)."""
    digits = s[1:] if s[:1] in "+-" else s
    if not digits or not digits.isdigit() or not digits.isascii():
        raise ValueError(s)
    value = int(s)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(s)
    return value


def body(request: Request, limit: int | None = None) -> bytes:
    content = request.content
    if content is None:
        return b""
    return content.read() if limit is None else content.read(limit)


def content_length(request: Request) -> int:
    raw = request.getHeader(b"content-length")
    try:
        return int(raw) if raw is not None else -1
    except ValueError:
        return -1


def _raise(code: int, text: str) -> None:
    raise HTTPError(code, text)


class Route(NamedTuple):
    """A route of an API: see :func:`route`."""

    path: str
    methods: tuple[str, ...]
    style: str = "v1"
    access_log: bool = True
    body: Callable[[Any], int] | None = None


def route(
    path: str,
    *methods: str,
    style: str = "v1",
    access_log: bool = True,
    body: Callable[[Any], int] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark an API method as the handler of ``path`` for ``methods``; each API
    instance serves its marked methods with a :class:`Router` of its own.

    ``style``: ``v1`` (Go's V1 decorator), ``plain`` (PlainText) or ``raw``
    (the handler answers). ``body(api)``: the largest body the route accepts;
    the channel keeps one byte more, so that the handler sees a body is too big,
    and refuses a longer Content-Length at once. Without it, the route reads no
    body.
    """

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.route = Route(path, methods, style, access_log, body)  # type: ignore[attr-defined]
        return fn

    return mark


class Router:
    """One API instance's Klein app and the table of paths and methods it serves."""

    def __init__(self, api: GoHTTPAPI) -> None:
        self.api = api
        self.app = Klein()
        self.routes: dict[str, tuple[str, ...]] = {}
        self.bodies: dict[str, Callable[[Any], int]] = {}

        @self.app.handle_errors(NotFound)  # type: ignore[arg-type]
        def not_found(request: Request, failure: Any) -> bytes:
            return api.not_found(request)

    def handler(self, path: str, *methods: str, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn(api, request, **args)`` as :func:`route` describes."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(fn, Route(path, methods, **kw))
            return fn

        return register

    def add_marked(self, cls: type) -> None:
        """Register the methods of ``cls`` (and its bases) marked with :func:`route`."""
        for klass in reversed(cls.__mro__):
            for fn in vars(klass).values():
                spec = getattr(fn, "route", None)
                if isinstance(spec, Route):
                    self.add(fn, spec)

    def add(self, fn: Callable[..., Any], spec: Route) -> None:
        api = self.api
        self.routes[spec.path] = spec.methods
        if spec.body is not None:
            self.bodies[fn.__name__] = spec.body

        def serve(request: Request, **kw: Any) -> Any:
            early = api.refuse(request)
            if early is not None:
                return early
            method = request.method.decode("ascii", "replace")
            if method not in spec.methods:
                allow = ", ".join(sorted(spec.methods)) + ", OPTIONS"
                request.responseHeaders.setRawHeaders(b"allow", [allow.encode()])
                if method == "OPTIONS":
                    return api.finish(request, 200, b"", nsq=False)
                return api.respond(request, "v1", spec.access_log, lambda: _raise(405, "METHOD_NOT_ALLOWED"))
            return api.respond(request, spec.style, spec.access_log, lambda: fn(api, request, **kw))

        serve.__name__ = fn.__name__
        self.app.route(spec.path, methods=None, endpoint=fn.__name__)(serve)

    def body_limit(self, target: bytes) -> int | None:
        """The largest body the route of ``target`` accepts, None if it reads none.

        The path is decoded and matched as Klein will route it.
        """
        if not self.bodies:
            return None
        path = target.partition(b"?")[0]
        try:
            text = b"/".join(unquote_to_bytes(seg) for seg in path.split(b"/")).decode("utf-8")
            endpoint, _ = self.app.url_map.bind("localhost").match(text)
        except (UnicodeDecodeError, HTTPException, RoutingException):
            return None
        limit = self.bodies.get(endpoint)
        return None if limit is None else limit(self.api)


class _APIResource(resource.Resource):
    """The Klein app, behind Go's answers to what Klein cannot route: a Host
    header or a path that is not UTF-8 (Klein answers a bare 400 and logs a
    traceback; Go answers 400 to the Host, and routes raw bytes: 404)."""

    isLeaf = True

    def __init__(self, api: GoHTTPAPI) -> None:
        super().__init__()
        self.api = api
        self.klein = api.router.app.resource()

    def render(self, request: Any) -> Any:
        try:
            request.getRequestHostname().decode("utf-8")
        except UnicodeDecodeError:
            request.setResponseCode(400, b"Bad Request: malformed Host header")
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            request.setHeader(b"connection", b"close")
            return b"400 Bad Request: malformed Host header"
        try:
            b"/".join([*(request.prepath or ()), *(request.postpath or ())]).decode("utf-8")
        except UnicodeDecodeError:
            return self.api.not_found(request)
        return self.klein.render(request)


class GoHTTPAPI:
    """Base of the API classes: Go's response rendering, the routes marked with
    :func:`route` (a :class:`Router` per instance), ``/config``.

    ``log_gate``: the server's (its ``--log-level``); ``gc_pauses``: the GC
    pauses the memory stats report, if the server times them.
    """

    log_namespace = "nsq_service.web"
    # /config options a PUT may change (by --config key)
    settable_options: tuple[str, ...] = ("log_level",)

    def __init__(self, reactor: Any, log_gate: LogGate, gc_pauses: GCPauses | None = None) -> None:
        self.reactor = reactor
        self.log_gate = log_gate
        self.gc_pauses = gc_pauses
        self.profiling = False  # /debug/pprof/profile is running
        self.log = log_gate.logger(self.log_namespace, self)
        self.router = Router(self)
        self.add_routes(self.router)

    def add_routes(self, router: Router) -> None:
        router.add_marked(type(self))

    def resource(self) -> Any:
        return _APIResource(self)

    def body_limit(self, method: bytes, target: bytes) -> int | None:
        """The largest body the route of ``method target`` accepts (None: no body)."""
        return self.router.body_limit(target)

    def site(self) -> QuietSite:
        """The Site serving this API: Go's answers to bad requests, bounded
        bodies, header/body deadlines (on the API's reactor)."""
        logger = self.log_gate.logger("nsq_service.web")
        return QuietSite(self.resource(), logger, body_limit=self.body_limit, reactor=self.reactor)

    def query(self, request: Request) -> dict[str, list[str]]:
        """The request's query parameters, or ``400 INVALID_REQUEST``."""
        raw = request.uri.partition(b"?")[2]
        try:
            return parse_query(raw)
        except QueryError as e:
            self.log.error("failed to parse request params - {err}", err=e)
            raise HTTPError(400, "INVALID_REQUEST") from None

    def mem_stats(self) -> dict[str, int]:
        return mem_stats(self.gc_pauses)

    # -- /config/<opt> ---------------------------------------------------------------

    def get_option(self, opts: Any, name: str) -> JSONValue:
        """The option whose ``--config`` key is ``name``, as Go's JSON of it."""
        f = field_by_cfg_name(type(opts), name)
        if f is None:
            raise HTTPError(400, "INVALID_OPTION")
        return JSONValue(f.metadata["kind"].to_http(getattr(opts, f.name)))

    def parse_option(self, opts: Any, name: str, body: bytes) -> tuple[str, Any]:
        """The field and value a PUT of ``body`` to option ``name`` sets (by its kind)."""
        f = field_by_cfg_name(type(opts), name)
        if f is None or name not in self.settable_options:
            raise HTTPError(400, "INVALID_OPTION")
        try:
            return f.name, f.metadata["kind"].from_http(body)
        except ConfigError:
            raise HTTPError(400, "INVALID_VALUE") from None

    def set_option(self, opts: Any, field: str, value: Any) -> None:
        setattr(opts, field, value)
        if field == "log_level":
            self.log_gate.set_level(value)

    def refuse(self, request: Request) -> bytes | None:
        """A response for every request, before routing (nsqd: TLS required)."""
        return None

    def finish(
        self,
        request: Request,
        code: int,
        data: bytes,
        content_type: bytes | None = None,
        nsq: bool = True,
    ) -> bytes:
        request.setResponseCode(code)
        headers = request.responseHeaders
        headers.removeHeader(b"server")
        if content_type is not None:
            headers.setRawHeaders(b"content-type", [content_type])
        else:
            headers.removeHeader(b"content-type")
        if nsq:
            headers.setRawHeaders(b"x-nsq-content-type", [NSQ_CONTENT_TYPE])
        headers.setRawHeaders(b"content-length", [b"%d" % len(data)])
        return data

    def v1(self, request: Request, code: int, data: Any) -> bytes:
        """Go's RespondV1."""
        if code != 200:
            return self.finish(request, code, gojson.dumps({"message": data}), JSON_TYPE)
        if data is None:
            return self.finish(request, 200, b"")
        if isinstance(data, str):
            return self.finish(request, 200, data.encode(), TEXT_TYPE)
        if isinstance(data, bytes):
            return self.finish(request, 200, data, TEXT_TYPE if data else None)
        if isinstance(data, JSONValue):
            data = data.value
        return self.finish(request, 200, gojson.dumps(data), JSON_TYPE)

    def respond(self, request: Request, style: str, access_log: bool, call: Callable[[], Any]) -> Any:
        d = defer.maybeDeferred(call)

        def ok(data: Any) -> Any:
            if data is NOT_DONE_YET or style == "raw":
                return data
            if style == "plain":
                return self.finish(request, 200, data.encode() if isinstance(data, str) else data, TEXT_TYPE, False)
            return self.v1(request, 200, data)

        def failed(f: Any) -> Any:
            if f.check(defer.CancelledError):
                return f  # the client went away (Klein cancels): nothing to answer
            if f.check(HTTPError):
                code, text = f.value.code, f.value.text
            else:
                self.log.failure("panic in HTTP handler", f)
                code, text = 500, "INTERNAL_ERROR"
            if style == "plain":
                return self.finish(request, code, text.encode(), TEXT_TYPE, False)
            return self.v1(request, code, text)

        def logged(result: Any) -> Any:
            if access_log:
                self.log.info(
                    "{code} {method} {uri} ({addr})",
                    code=request.code,
                    method=request.method.decode(),
                    uri=request.uri.decode("utf-8", "replace"),
                    addr=_peer(request),
                )
            return result

        d.addCallbacks(ok, failed)
        d.addCallback(logged)
        return d

    def not_found(self, request: Request) -> bytes:
        early = self.refuse(request)
        if early is not None:
            return early
        path = request.path.decode("utf-8", "replace")
        target = fixed_path(path, self.router.routes)
        if target is not None:
            qs = request.uri.partition(b"?")[2]
            location = target + ("?" + qs.decode() if qs else "")
            code = 301 if request.method == b"GET" else 307
            request.responseHeaders.setRawHeaders(b"location", [location.encode()])
            text = b""
            if request.method == b"GET":
                text = b'<a href="%s">Moved Permanently</a>.\n\n' % location.encode()
            return self.finish(request, code, text, b"text/html; charset=utf-8", nsq=False)
        self.log.info("404 {method} {uri}", method=request.method.decode(), uri=request.uri.decode("utf-8", "replace"))
        return self.v1(request, 404, "NOT_FOUND")


def fixed_path(path: str, routes: dict[str, tuple[str, ...]]) -> str | None:
    """httprouter's redirects: a trailing slash added or removed, or the case fixed."""
    static = [r for r in routes if "<" not in r]
    candidates = [path[:-1]] if path.endswith("/") else [path + "/"]
    candidates.append(path.lower())
    candidates.append(path.lower().rstrip("/"))
    for cand in candidates:
        if cand in static and cand != path:
            return cand
    return None


def _peer(request: Request) -> str:
    peer = request.getClientAddress()
    host = getattr(peer, "host", "")
    port = getattr(peer, "port", "")
    return join_host_port(host, port) if host else str(peer)


class BoundedRequest(Request):
    """A request that keeps at most ``body_keep`` bytes of its body, in memory
    (twisted spools a body over 100 KB to a temporary file), and does not parse
    form bodies (nothing here reads ``request.args``)."""

    body_keep = 0
    body_received = 0

    _buffer: io.BytesIO

    def gotLength(self, length: int | None) -> None:
        self.content = self._buffer = io.BytesIO()

    def handleContentChunk(self, data: bytes) -> None:
        self.body_received += len(data)
        room = self.body_keep - self._buffer.tell()
        if room > 0:
            self._buffer.write(data if len(data) <= room else data[:room])


_HIGH_BYTES = re.compile(rb"[\x80-\xff]")
_CONTROL_BYTES = re.compile(rb"[\x00-\x1f\x7f]")


class HTTPChannel(http.HTTPChannel):
    """Twisted's HTTP/1.1 channel with Go's answers and bounds.

    - bytes that cannot start an HTTP request (like the V2 magic ``"  V2"``) get
      ``400`` at once instead of waiting for a request line;
    - malformed requests get Go's ``400 Bad Request`` text (logged);
    - a request target with raw bytes >= 0x80 is served as Go serves it (they are
      %-escaped for twisted, which refuses them);
    - a body is kept in memory up to one byte more than its route accepts
      (``site.body_limit``); past that, or with a longer Content-Length, the request
      is answered from what arrived, the rest is not read and the connection closes
      (after ``LINGER``);
    - the headers must arrive within ``site.header_timeout`` and the body within
      ``site.body_timeout``, however slowly they drip; ``timeOut`` (twisted's
      idle timeout, reset by every byte) is ``site.idle_timeout``.
    """

    site: Any
    transport: Any
    _first_bytes_pending = True
    _want_request_line = True
    _between_requests = False
    _refusing = False  # reading nothing more from this connection
    _linger_on_close = False
    _body_limit = 0
    _deadline: Any = None
    _linger: Any = None

    def connectionMade(self) -> None:
        self._first_bytes_pending = True
        self._want_request_line = True
        super().connectionMade()
        self._start_deadline(self.site.header_timeout, self._header_timed_out)

    def dataReceived(self, data: bytes) -> None:
        if self._refusing:
            return
        if self._between_requests and data:
            self._between_requests = False
            self._start_deadline(self.site.header_timeout, self._header_timed_out)
        if self._first_bytes_pending:
            stripped = data.lstrip(b"\r\n")
            if stripped:
                self._first_bytes_pending = False
                first = stripped[:1]
                if not (first.isalpha() or first in b"!#$%&'*+-.^_`|~0123456789"):
                    self._bad_request("not an HTTP request")
                    return
        super().dataReceived(data)

    def lineReceived(self, line: bytes) -> None:
        if self._want_request_line and line:
            self._want_request_line = False
            parts = line.split(b" ")
            if len(parts) == 3:
                if _CONTROL_BYTES.search(parts[1]):
                    self._bad_request("invalid control character in URL")
                    return
                if _HIGH_BYTES.search(parts[1]):
                    raw = parts[1]
                    parts[1] = _HIGH_BYTES.sub(lambda m: b"%%%02X" % m.group()[0], raw)
                    line = b" ".join(parts)
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        self.site.logger.info(
                            "HTTP: non-UTF-8 bytes in the request target from {addr}: {target}",
                            addr=self._peer(),
                            target=parts[1].decode("ascii"),
                        )
        super().lineReceived(line)

    def _maybeChooseTransferDecoder(self, header: bytes, data: bytes) -> bool:
        if header == b"Content-Length":
            value = data.strip(b" \t\r\n")
            if not value.isdigit() or int(value) > MAX_CONTENT_LENGTH:
                self._bad_request(f"bad Content-Length {data.decode('latin-1')!r}")
                self.length = None
                return False
            data = value
        elif header == b"Transfer-Encoding" and data.lower() != b"chunked":
            self.site.logger.info(
                "HTTP: 501 Not Implemented to {addr} - unsupported Transfer-Encoding {te!r}",
                addr=self._peer(),
                te=data.decode("latin-1"),
            )
            self._refuse(go_error_response(b"501 Not Implemented", b"Unsupported transfer encoding"), linger=False)
            self.length = None
            return False
        return bool(super()._maybeChooseTransferDecoder(header, data))

    def allHeadersReceived(self) -> None:
        self._cancel_deadline()
        request = self.requests[-1]
        limit = self.site.body_limit(self._command, self._path)
        # one byte more than a valid body may have, for the route to see it is too big
        request.body_keep = 0 if limit is None else limit + 1
        self._body_limit = DISCARD_LIMIT if limit is None else limit
        if self.length is not None and self.length > self._body_limit:
            # answer from the headers (the route refuses or ignores the body): no
            # 100 Continue, no reading
            request.parseCookies()
            request.gotLength(0)
            self._close_after_answer(request)
            self.length = 0  # so that twisted dispatches the request now
            return
        super().allHeadersReceived()
        if self.length != 0:
            self._start_deadline(self.site.body_timeout, self._body_timed_out)

    def rawDataReceived(self, data: bytes) -> None:
        if self._refusing:
            return
        super().rawDataReceived(data)
        if self._handlingRequest or self._refusing or self._transferDecoder is None:
            return
        request = self.requests[-1]
        if request.body_received > self._body_limit:
            # a chunked body reached what the route reads: answer from that
            self._close_after_answer(request)
            self.allContentReceived()

    def allContentReceived(self) -> None:
        self._cancel_deadline()
        self._first_bytes_pending = True
        self._want_request_line = True
        super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        if self.persistent and not self._refusing:
            self._between_requests = True
        super().requestDone(request)

    def loseConnection(self) -> Any:
        if self._linger_on_close:
            # let the client read the answer before unread data resets the connection
            self._linger_on_close = False
            self._networkProducer.pauseProducing()
            self._linger = self.callLater(self.site.linger, self._close_now)
            return None
        return super().loseConnection()

    def _close_now(self) -> None:
        self._linger = None
        self._abortingCall = self.callLater(self.abortTimeout, self.forceAbortClient)
        super().loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._cancel_deadline()
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self._linger = None
        super().connectionLost(reason)

    def _respondToBadRequestAndDisconnect(self) -> None:
        self._bad_request("malformed request")

    # -- helpers ----------------------------------------------------------------------

    def _peer(self) -> str:
        peer = self.transport.getPeer() if self.transport is not None else None
        host = getattr(peer, "host", "")
        return join_host_port(host, getattr(peer, "port", "")) if host else str(peer)

    def _bad_request(self, reason: str) -> None:
        self.site.logger.info("HTTP: 400 Bad Request to {addr} - {reason}", addr=self._peer(), reason=reason)
        self._refuse(go_error_response(b"400 Bad Request"), linger=False)

    def _refuse(self, answer: bytes, linger: bool) -> None:
        """Write ``answer`` and close, reading nothing more."""
        self._cancel_deadline()
        if self._refusing:
            return
        self._refusing = True
        self._linger_on_close = linger
        self.transport.write(answer)
        self.loseConnection()

    def _close_after_answer(self, request: Any) -> None:
        self._refusing = True
        self._linger_on_close = True
        self.persistent = False
        request.responseHeaders.setRawHeaders(b"connection", [b"close"])
        self._networkProducer.pauseProducing()

    def _start_deadline(self, seconds: float | None, expired: Callable[[], None]) -> None:
        self._cancel_deadline()
        if seconds:
            self._deadline = self.callLater(seconds, expired)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _header_timed_out(self) -> None:
        self._deadline = None
        timeout = self.site.header_timeout
        self.site.note_timeout(
            "headers",
            lambda c: f"HTTP: closed {c['n']} connection(s) that sent no complete request headers within {timeout:g}s",
        )
        self._refusing = True  # as Go: no answer, the request was never read
        self._close_now()

    def _body_timed_out(self) -> None:
        self._deadline = None
        timeout = self.site.body_timeout
        self.site.note_timeout(
            "body", lambda c: f"HTTP: answered 408 to {c['n']} request(s) whose body did not arrive within {timeout:g}s"
        )
        self._refuse(go_error_response(b"408 Request Timeout"), linger=True)


class QuietSite(Site):
    """A Site with our channel and requests and no access log line per request.

    ``body_limit(method, target)``: the largest body that request's route accepts
    (None: it reads none). ``logger``: the server's, for the channel's lines. The
    deadlines are attributes, in seconds.
    """

    noisy = False
    protocol = HTTPChannel  # type: ignore[assignment]
    requestFactory = BoundedRequest
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    linger: float = LINGER

    def __init__(
        self,
        resource: Any,
        logger: Logger,
        body_limit: Callable[[bytes, bytes], int | None] | None = None,
        reactor: Any = None,
    ) -> None:
        super().__init__(
            resource,
            requestFactory=BoundedRequest,
            parsePOSTFormSubmission=False,
            timeout=self.idle_timeout,
            reactor=reactor,
        )
        self.body_limit = body_limit or (lambda method, target: None)
        self.logger = logger
        self._timeouts = RateLimitedLog(self.reactor, self.logger, interval=10.0)

    def note_timeout(self, kind: str, text: Callable[[dict[str, int]], str]) -> None:
        self._timeouts.emit(kind, LogLevel.info, text, n=1)

    def stopFactory(self) -> None:
        self._timeouts.stop()
        super().stopFactory()

    def log(self, request: Any) -> None:
        pass
