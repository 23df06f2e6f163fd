"""HTTP plumbing shared by nsqd's and nsqlookupd's APIs: Go's responses on Klein.

- :class:`Router` registers routes with httprouter's semantics: ``405
  METHOD_NOT_ALLOWED`` with ``Allow`` for a known path, ``OPTIONS`` answered
  with ``Allow``, ``404 NOT_FOUND``, a redirect for a trailing slash or the
  wrong case.
- :class:`GoHTTPAPI` renders Go's ``V1`` and ``PlainText`` responses:
  ``200`` with text, nothing or JSON; errors as ``{"message":"CODE"}``; every
  V1 response with ``X-NSQ-Content-Type: nsq; version=1.0``.
- :func:`parse_query` is Go's ``url.ParseQuery``.
- :class:`HTTPChannel` answers ``400`` at once to bytes that cannot start an
  HTTP request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

from klein import Klein
from twisted.internet import defer
from twisted.web import http
from twisted.web.server import NOT_DONE_YET, Request, Site
from werkzeug.exceptions import NotFound

from nsqd_tw import gojson
from nsqd_tw.log import Logger

log = Logger(namespace="nsqd_tw.web")

BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
NSQ_CONTENT_TYPE = b"nsq; version=1.0"
JSON_TYPE = b"application/json; charset=utf-8"
TEXT_TYPE = b"text/plain; charset=utf-8"


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


def query(request: Request) -> dict[str, list[str]]:
    """The request's query parameters, or ``400 INVALID_REQUEST``."""
    raw = request.uri.partition(b"?")[2]
    try:
        return parse_query(raw)
    except QueryError as e:
        log.error("failed to parse request params - {err}", err=e)
        raise HTTPError(400, "INVALID_REQUEST") from None


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


class Router:
    """A Klein app plus the table of paths and methods it serves."""

    def __init__(self) -> None:
        self.app = Klein()
        self.routes: dict[str, tuple[str, ...]] = {}

        @self.app.handle_errors(NotFound)  # type: ignore[arg-type]
        def not_found(api: GoHTTPAPI, request: Request, failure: Any) -> bytes:
            return api.not_found(request, self.routes)

    def handler(
        self, path: str, *methods: str, style: str = "v1", access_log: bool = True
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``path`` for ``methods``. ``style``: ``v1`` (Go's V1
        decorator), ``plain`` (PlainText) or ``raw`` (the handler answers)."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.routes[path] = tuple(methods)

            def route(api: GoHTTPAPI, request: Request, **kw: Any) -> Any:
                early = api.refuse(request)
                if early is not None:
                    return early
                method = request.method.decode("ascii", "replace")
                if method not in methods:
                    allow = ", ".join(sorted(methods)) + ", OPTIONS"
                    request.responseHeaders.setRawHeaders(b"allow", [allow.encode()])
                    if method == "OPTIONS":
                        return api.finish(request, 200, b"", nsq=False)
                    return api.respond(request, "v1", access_log, lambda: _raise(405, "METHOD_NOT_ALLOWED"))
                return api.respond(request, style, access_log, lambda: fn(api, request, **kw))

            route.__name__ = fn.__name__
            self.app.route(path, methods=None, endpoint=fn.__name__)(route)
            return fn

        return register


class GoHTTPAPI:
    """Base of the API classes: Go's response rendering."""

    app: Klein
    log = log

    def resource(self) -> Any:
        return self.app.resource()

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

        def failed(f: Any) -> bytes:
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

    def not_found(self, request: Request, routes: dict[str, tuple[str, ...]]) -> bytes:
        early = self.refuse(request)
        if early is not None:
            return early
        path = request.path.decode("utf-8", "replace")
        target = fixed_path(path, routes)
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
    return f"{host}:{port}" if host else str(peer)


class HTTPChannel(http.HTTPChannel):
    """Answer 400 at once to bytes that cannot start an HTTP request (like the
    V2 magic ``"  V2"``), instead of waiting for a request line."""

    _first_bytes_pending = True
    transport: Any

    def connectionMade(self) -> None:
        self._first_bytes_pending = True
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        if self._first_bytes_pending:
            stripped = data.lstrip(b"\r\n")
            if stripped:
                self._first_bytes_pending = False
                first = stripped[:1]
                if not (first.isalpha() or first in b"!#$%&'*+-.^_`|~0123456789"):
                    self.transport.write(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                        b"Connection: close\r\n\r\n400 Bad Request"
                    )
                    self.transport.loseConnection()
                    return
        super().dataReceived(data)

    def allContentReceived(self) -> None:
        self._first_bytes_pending = True
        super().allContentReceived()


class QuietSite(Site):
    """A Site with our channel and no access log line per request."""

    noisy = False
    protocol = HTTPChannel  # type: ignore[assignment]

    def log(self, request: Any) -> None:
        pass


# -- /debug: Python's equivalents of Go's pprof endpoints ------------------------------


def add_debug_routes(router: Router, index: str, nsqd_extras: bool = False) -> None:
    """Register the /debug/pprof routes (and nsqd's setblockrate and freememory).

    The API object needs ``reactor`` and a ``profiling`` flag.
    """
    import cProfile
    import gc
    import io
    import marshal
    import pstats
    import sys
    import threading
    import traceback

    from twisted.internet import task

    html = b"text/html; charset=utf-8"

    @router.handler(index, "GET", style="raw")
    def pprof_index(api: GoHTTPAPI, request: Request) -> bytes:
        names = ["cmdline", "goroutine", "heap", "profile", "symbol", "threadcreate"]
        links = "".join(f'<a href="/debug/pprof/{n}?debug=1">{n}</a><br>\n' for n in names)
        head = "<html><head><title>/debug/pprof/</title></head><body>\n/debug/pprof/<br>\n<br>\n"
        return api.finish(request, 200, f"{head}{links}</body></html>\n".encode(), html, nsq=False)

    @router.handler("/debug/pprof/cmdline", "GET", style="raw")
    def pprof_cmdline(api: GoHTTPAPI, request: Request) -> bytes:
        return api.finish(request, 200, "\x00".join(sys.argv).encode(), TEXT_TYPE, nsq=False)

    @router.handler("/debug/pprof/symbol", "GET", "POST", style="raw")
    def pprof_symbol(api: GoHTTPAPI, request: Request) -> bytes:
        return api.finish(request, 200, b"num_symbols: 0\n", TEXT_TYPE, nsq=False)

    @router.handler("/debug/pprof/goroutine", "GET", style="raw")
    def pprof_goroutine(api: GoHTTPAPI, request: Request) -> bytes:
        """The stack of every thread (the reactor's included)."""
        names = {t.ident: t.name for t in threading.enumerate()}
        out = io.StringIO()
        frames = sys._current_frames()
        out.write(f"threads: {len(frames)}\n\n")
        for ident, frame in frames.items():
            out.write(f"thread {ident} [{names.get(ident, '?')}]:\n")
            out.write("".join(traceback.format_stack(frame)))
            out.write("\n")
        return api.finish(request, 200, out.getvalue().encode(), TEXT_TYPE, nsq=False)

    @router.handler("/debug/pprof/threadcreate", "GET", style="raw")
    def pprof_threadcreate(api: GoHTTPAPI, request: Request) -> bytes:
        threads = threading.enumerate()
        text = f"threadcreate profile: total {len(threads)}\n" + "".join(
            f"{t.ident} {t.name} daemon={t.daemon}\n" for t in threads
        )
        return api.finish(request, 200, text.encode(), TEXT_TYPE, nsq=False)

    @router.handler("/debug/pprof/heap", "GET", style="raw")
    def pprof_heap(api: GoHTTPAPI, request: Request) -> bytes:
        """Live objects by type (the most numerous first) and allocator totals."""
        from nsqd_tw.stats import mem_stats

        counts: dict[str, int] = {}
        for obj in gc.get_objects():
            name = type(obj).__qualname__
            counts[name] = counts.get(name, 0) + 1
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:50]
        out = io.StringIO()
        out.write(f"heap profile: {sum(counts.values())} gc-tracked objects\n")
        for k, v in mem_stats().items():
            out.write(f"# {k} = {v}\n")
        out.write("\n")
        for name, n in top:
            out.write(f"{n:>10} {name}\n")
        return api.finish(request, 200, out.getvalue().encode(), TEXT_TYPE, nsq=False)

    @router.handler("/debug/pprof/profile", "GET", style="raw")
    def pprof_profile(api: Any, request: Request) -> Any:
        """cProfile the reactor thread for ?seconds=N (default 30); pstats text,
        or the binary pstats file with ?format=pstats (for snakeviz, pstats)."""
        params = query(request)
        try:
            seconds = float(params.get("seconds", ["30"])[0] or "30")
        except ValueError:
            seconds = 30.0
        if seconds <= 0:
            seconds = 30.0
        if api.profiling:
            msg = b"Could not enable CPU profiling: cpu profiling already in use\n"
            return api.finish(request, 500, msg, TEXT_TYPE, nsq=False)
        api.profiling = True
        profiler = cProfile.Profile()
        profiler.enable()

        def done() -> bytes:
            profiler.disable()
            api.profiling = False
            if params.get("format", [""])[0] == "pstats":
                profiler.create_stats()
                data = marshal.dumps(profiler.stats)  # type: ignore[attr-defined]
                request.responseHeaders.setRawHeaders(
                    b"content-disposition", [b'attachment; filename="profile.pstats"']
                )
                return api.finish(request, 200, data, b"application/octet-stream", nsq=False)
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(60)
            return api.finish(request, 200, out.getvalue().encode(), TEXT_TYPE, nsq=False)

        return task.deferLater(api.reactor, seconds, done)

    if not nsqd_extras:
        return

    @router.handler("/debug/setblockrate", "PUT", style="plain")
    def setblockrate(api: GoHTTPAPI, request: Request) -> str:
        params = query(request)
        try:
            int(params.get("rate", [""])[0])
        except ValueError as e:
            raise HTTPError(400, f"invalid block rate : {e}") from None
        return ""

    @router.handler("/debug/freememory", "POST", style="plain")
    def freememory(api: GoHTTPAPI, request: Request) -> str:
        gc.collect()
        return ""
