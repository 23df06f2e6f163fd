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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import unquote_to_bytes

from twisted.internet import defer
from twisted.web import resource
from twisted.web.server import NOT_DONE_YET, Request

from nsq_service.http_channel import QuietSite, peer_address
from nsq_service.log import LogGate
from nsq_service.memstats import GCPauses, mem_stats
from nsq_service.options import ConfigError, field_by_cfg_name
from nsq_service.runtime import import_klein
from nsq_wire import gojson

BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
NSQ_CONTENT_TYPE = b"nsq; version=1.0"
JSON_TYPE = b"application/json; charset=utf-8"
TEXT_TYPE = b"text/plain; charset=utf-8"


class HTTPError(Exception):
    """An error response: ``code`` and the ``message`` text; ``extra``: keys a
    JSON answer has after ``message`` (beyond Go, for what a program reads)."""

    def __init__(self, code: int, text: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.extra = extra


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


def body(request: Request, limit: int | None = None, whole: bool = True) -> bytes:
    """The request's body, at most ``limit`` bytes.

    A body the client cut short (it shut its side down first:
    ``BoundedRequest.cut_short``) is Go's failed ``io.ReadAll``, ``500
    INTERNAL_ERROR``, when the read reaches where it ended; ``whole=False``
    returns what arrived instead, for a reader that stops where its data does
    (readMPUB: see :func:`read_to_cut`)."""
    content = request.content
    if content is None:
        return b""
    data = content.read() if limit is None else content.read(limit)
    if whole and getattr(request, "body_cut", False) and (limit is None or len(data) < limit):
        read_to_cut(request)
        raise HTTPError(500, "INTERNAL_ERROR")
    return data


def read_to_cut(request: Request) -> None:
    """The route read up to where a body cut short ended (as Go's reader would)."""
    if getattr(request, "body_cut", False):
        request.read_to_cut()  # type: ignore[attr-defined]


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
        self.klein = import_klein()  # without pyOpenSSL, Klein's forms or werkzeug's server (nsq_service.runtime)
        self.app = self.klein.Klein()
        self.routes: dict[str, tuple[str, ...]] = {}
        self.bodies: dict[str, Callable[[Any], int]] = {}

        @self.app.handle_errors(self.klein.NotFound)  # type: ignore[arg-type]
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
        except (UnicodeDecodeError, self.klein.HTTPException, self.klein.RoutingException):
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
        path = request.path.decode("utf-8", "replace")
        if "//" in path or "/." in path:  # httprouter redirects to its CleanPath (Klein would route //ping)
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
        """The request's query parameters (Go's ``url.ParseQuery``: the body is not
        read), or ``400 INVALID_REQUEST``."""
        raw = request.uri.partition(b"?")[2]
        try:
            return parse_query(raw)
        except QueryError as e:
            self.log.error("failed to parse request params - {err}", err=e)
            raise HTTPError(400, "INVALID_REQUEST") from None

    def req_params(self, request: Request) -> dict[str, list[str]]:
        """Go's ``http_api.NewReqParams``: the query (as :meth:`query`), then the
        whole body read and dropped. Go's routes that take it fail that read on a
        body the client cut short: ``400 INVALID_REQUEST``."""
        params = self.query(request)
        if getattr(request, "body_cut", False):
            read_to_cut(request)
            self.log.error("failed to parse request params - {err}", err="unexpected EOF")
            raise HTTPError(400, "INVALID_REQUEST")
        return params

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

    def v1(self, request: Request, code: int, data: Any, extra: dict[str, Any] | None = None) -> bytes:
        """Go's RespondV1 (``extra``: keys after an error's ``message``)."""
        if code != 200:
            return self.finish(request, code, gojson.dumps({"message": data, **(extra or {})}), JSON_TYPE)
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
                return f  # the client went away (_APIResource cancels): nothing to answer
            extra = None
            if f.check(HTTPError):
                code, text, extra = f.value.code, f.value.text, f.value.extra
            else:
                self.log.failure("panic in HTTP handler", f)
                code, text = 500, "INTERNAL_ERROR"
            if style == "plain":
                return self.finish(request, code, text.encode(), TEXT_TYPE, False)
            return self.v1(request, code, text, extra)

        def logged(result: Any) -> Any:
            if access_log:
                self.log.info(
                    "{code} {method} {uri} ({addr})",
                    code=request.code,
                    method=request.method.decode(),
                    uri=request.uri.decode("utf-8", "replace"),
                    addr=peer_address(request),
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


def clean_path(path: str) -> str:
    """Go's httprouter.CleanPath: repeated slashes merged, ``.`` and ``..`` resolved."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    clean = "/" + "/".join(parts)
    if path.endswith(("/", "/.", "/..")) and clean != "/":
        clean += "/"
    return clean


def fixed_path(path: str, routes: dict[str, tuple[str, ...]]) -> str | None:
    """httprouter's redirects: a trailing slash added or removed, the path cleaned
    (``//ping``), or the case fixed."""
    static = [r for r in routes if "<" not in r]
    candidates = [path[:-1]] if path.endswith("/") else [path + "/"]
    clean = clean_path(path)
    candidates += [clean, clean.rstrip("/"), clean + "/"]
    candidates.append(path.lower())
    candidates.append(path.lower().rstrip("/"))
    candidates.append(clean.lower())
    for cand in candidates:
        if cand in static and cand != path:
            return cand
    return None


def http_client(reactor: Any, connect_timeout: float) -> Any:
    """A treq client for a server's own calls to another's HTTP API (nsqd to
    nsqlookupd): the server's reactor, its connect timeout, no persistent
    connections."""
    from treq.client import HTTPClient
    from twisted.web.client import Agent, HTTPConnectionPool

    agent = Agent(reactor, connectTimeout=connect_timeout, pool=HTTPConnectionPool(reactor, persistent=False))
    return HTTPClient(agent)
