"""``/debug``: Python's equivalents of Go's pprof endpoints, registered on an API's
:class:`~nsq_service.web.Router` by :func:`add_debug_routes`."""

from __future__ import annotations

import gc
import io
import sys
import threading
import traceback
from typing import Any

from twisted.internet import defer
from twisted.web.server import Request

from nsq_service.web import TEXT_TYPE, GoHTTPAPI, HTTPError, Router, go_parse_int


def profile_seconds(raw: str) -> float:
    """Go's pprof.Profile: ``seconds`` is a base-10 int64, 30 when it is not one or is
    not positive; the duration is ``seconds * time.Second`` in int64 nanoseconds (it
    wraps, and a duration <= 0 ends at once)."""
    try:
        sec = go_parse_int(raw)
    except ValueError:
        sec = 30
    if sec <= 0:
        sec = 30
    ns = (sec * 1_000_000_000 + (1 << 63)) % (1 << 64) - (1 << 63)
    return max(ns, 0) / 1e9


def add_debug_routes(router: Router, index: str, nsqd_extras: bool = False) -> None:
    """Register the /debug/pprof routes (and nsqd's setblockrate and freememory)."""
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
        counts: dict[str, int] = {}
        for obj in gc.get_objects():
            name = type(obj).__qualname__
            counts[name] = counts.get(name, 0) + 1
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:50]
        out = io.StringIO()
        out.write(f"heap profile: {sum(counts.values())} gc-tracked objects\n")
        for k, v in api.mem_stats().items():
            out.write(f"# {k} = {v}\n")
        out.write("\n")
        for name, n in top:
            out.write(f"{n:>10} {name}\n")
        return api.finish(request, 200, out.getvalue().encode(), TEXT_TYPE, nsq=False)

    @router.handler("/debug/pprof/profile", "GET", style="raw")
    def pprof_profile(api: GoHTTPAPI, request: Request) -> Any:
        """cProfile the reactor thread for ?seconds=N (default 30); pstats text,
        or the binary pstats file with ?format=pstats (for snakeviz, pstats).

        ``seconds`` is read as Go's handler reads it; the profiler is turned off
        when the time is up, when the client goes away, or if answering fails.
        """
        params = api.query(request)
        request.responseHeaders.setRawHeaders(b"x-content-type-options", [b"nosniff"])
        seconds = profile_seconds(params.get("seconds", [""])[0])
        if api.profiling:
            request.responseHeaders.setRawHeaders(b"x-go-pprof", [b"1"])
            msg = b"Could not enable CPU profiling: cpu profiling already in use\n"
            return api.finish(request, 500, msg, TEXT_TYPE, nsq=False)
        import cProfile  # the profiler's modules only when asked for (they cost the start ~20 ms)
        import marshal
        import pstats

        profiler = cProfile.Profile()
        running = [True]

        def stop() -> None:
            if running[0]:
                running[0] = False
                profiler.disable()
                api.profiling = False

        def cancel(_: Any) -> None:
            if timer.active():
                timer.cancel()
            stop()

        done: defer.Deferred[None] = defer.Deferred(canceller=cancel)
        api.profiling = True
        profiler.enable()
        timer = api.reactor.callLater(seconds, done.callback, None)
        request.notifyFinish().addErrback(cancel)

        def answer(_: None) -> bytes:
            stop()
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

        def failed(f: Any) -> Any:
            stop()
            return f

        return done.addCallback(answer).addErrback(failed)

    if not nsqd_extras:
        return

    @router.handler("/debug/setblockrate", "PUT", style="plain")
    def setblockrate(api: GoHTTPAPI, request: Request) -> str:
        params = api.query(request)
        try:
            int(params.get("rate", [""])[0])
        except ValueError as e:
            raise HTTPError(400, f"invalid block rate : {e}") from None
        return ""

    @router.handler("/debug/freememory", "POST", style="plain")
    def freememory(api: GoHTTPAPI, request: Request) -> str:
        gc.collect()
        return ""
