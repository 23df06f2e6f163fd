"""The Python runtime tuned for a server holding millions of messages."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any


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


def import_klein() -> Any:
    """Klein's app class, imported without loading pyOpenSSL.

    Klein's module takes ``serverFromString`` from ``twisted.internet.endpoints``
    (for ``Klein.run``, which nsq-tw never calls), and importing that module loads
    pyOpenSSL and cryptography. While Klein is imported, a stand-in module answers
    that import with a ``serverFromString`` that imports the real module when
    called; the stand-in is gone once Klein is, so every other import of
    ``twisted.internet.endpoints`` (treq, for an ``https://`` auth server) gets the
    real module, with TLS, when it first needs it.
    """
    name = "twisted.internet.endpoints"
    if "klein" in sys.modules or name in sys.modules:
        from klein import Klein

        return Klein
    stand_in = types.ModuleType(name)

    def serverFromString(*args: Any, **kw: Any) -> Any:
        from twisted.internet import endpoints

        return endpoints.serverFromString(*args, **kw)

    stand_in.serverFromString = serverFromString  # type: ignore[attr-defined]
    sys.modules[name] = stand_in
    try:
        from klein import Klein
    finally:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
    return Klein
