"""The Python runtime tuned for a server holding millions of messages."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any, NamedTuple


def tune_gc() -> None:
    """Make the cyclic GC cheap for a process holding millions of messages.

    Messages hold no cycles, but every one is tracked, and collecting the
    youngest generation every 700 allocations (the default) cost a third of
    the consume path in the benchmarks: a burst of messages in flight set it
    off again and again. Collect it every 25,000 instead (the benchmarks do
    not tell 25,000 from 100,000 apart) and freeze what start-up created; the
    25% rule still bounds full collections. Not higher: what lives in a cycle
    (each HTTP request, while Klein's error handler held it) waits for that
    collection, and at 100,000 a steady HTTP load kept 13 MB of such garbage
    (2 MB at 25,000). No collection first: it took 25 ms of the start, to
    free some 40 objects.
    """
    gc.freeze()
    gc.set_threshold(25_000, 20, 10)


# Twisted's modules that load pyOpenSSL (and cryptography) when the reactor is imported:
# tcp's startTLS, the reactor's listenSSL/connectSSL. Each is optional in Twisted.
_TLS_MODULES = ("twisted.internet._newtls", "twisted.protocols.tls", "twisted.internet.ssl")


def import_reactor(tls: bool) -> Any:
    """The global reactor; with ``tls`` False, imported as Twisted is when pyOpenSSL
    is not installed.

    Importing the reactor loads pyOpenSSL and cryptography, a quarter of a
    server's start, for startTLS on TCP connections (nsqd's IDENTIFY tls_v1,
    which needs ``--tls-cert``) and the reactor's listenSSL/connectSSL (unused).
    Without TLS configured those imports are refused for the time of the
    reactor's import, which Twisted takes as pyOpenSSL being absent: its TCP
    connections have no startTLS (``TLS`` is False) and the reactor no
    IReactorSSL. Anything imported later (treq and twisted.internet.endpoints,
    for an ``https://`` auth server) loads pyOpenSSL and has TLS as usual: TLS
    over a connection is a protocol wrapper (TLSMemoryBIOFactory), not startTLS.
    """
    if tls or "twisted.internet.reactor" in sys.modules:
        from twisted.internet import reactor

        return reactor
    refused = [name for name in _TLS_MODULES if name not in sys.modules]
    for name in refused:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        from twisted.internet import reactor
    finally:
        for name in refused:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    return reactor


class KleinParts(NamedTuple):
    """What the HTTP APIs take of Klein and its werkzeug (see :func:`import_klein`)."""

    Klein: Any
    NotFound: type[Exception]
    HTTPException: type[Exception]
    RoutingException: type[Exception]


def import_klein() -> KleinParts:
    """Klein's app class (and werkzeug's routing errors), imported as lightly as a
    server's start allows.

    ``import klein`` runs Klein's package, which imports all of Klein (forms,
    sessions, templates) and werkzeug's package, which imports its development
    server and test client; Klein's app module takes ``serverFromString`` from
    ``twisted.internet.endpoints``, whose import loads pyOpenSSL and cryptography.
    The servers need the app and the router only: ``klein._app`` and
    ``werkzeug.routing``/``exceptions`` are imported under bare stand-ins of the
    two packages (their submodules found where they are, their ``__init__`` not
    run) and of ``endpoints`` (a ``serverFromString`` that imports the real module
    when called; Klein calls it only in ``Klein.run``). The stand-ins are gone once
    those modules are: a later ``import klein`` (or werkzeug, or endpoints) gets the
    real package, which reuses the submodules imported here.
    """
    if "klein._app" not in sys.modules:
        with _bare_package("klein"), _bare_package("werkzeug"), _stand_in_endpoints():
            import klein._app  # noqa: F401
            import werkzeug.exceptions
            import werkzeug.routing  # noqa: F401
    app = sys.modules["klein._app"]
    exceptions, routing = sys.modules["werkzeug.exceptions"], sys.modules["werkzeug.routing"]
    return KleinParts(app.Klein, exceptions.NotFound, exceptions.HTTPException, routing.RoutingException)


@contextlib.contextmanager
def _bare_package(name: str) -> Iterator[None]:
    """``name``'s submodules importable without its ``__init__`` (unless imported already)."""
    if name in sys.modules:
        yield
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        yield  # not a package here: imported as usual
        return
    bare = types.ModuleType(name)
    bare.__path__ = list(spec.submodule_search_locations)
    bare.__spec__ = spec
    bare.__package__ = name
    with _in_sys_modules(name, bare):
        yield


@contextlib.contextmanager
def _stand_in_endpoints() -> Iterator[None]:
    name = "twisted.internet.endpoints"
    if name in sys.modules:
        yield
        return
    stand_in = types.ModuleType(name)

    def serverFromString(*args: Any, **kw: Any) -> Any:
        from twisted.internet import endpoints

        return endpoints.serverFromString(*args, **kw)

    stand_in.serverFromString = serverFromString  # type: ignore[attr-defined]
    with _in_sys_modules(name, stand_in):
        yield


@contextlib.contextmanager
def _in_sys_modules(name: str, module: types.ModuleType) -> Iterator[None]:
    """``module`` imported as ``name`` for the block, unless the block replaced it."""
    sys.modules[name] = module
    try:
        yield
    finally:
        if sys.modules.get(name) is module:
            del sys.modules[name]
