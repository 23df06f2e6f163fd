"""Process resources at start-up and under exhaustion, for nsqd and nsqlookupd.

- :func:`raise_fd_limit` lifts the soft ``RLIMIT_NOFILE`` to the hard limit, as Go
  (>= 1.19) does for every program at start: the distributions' soft default of 1024
  is far too low for a server holding a socket per client.
- :func:`watch_accept_errors` makes a listening port log, at ERROR and rate-limited,
  when ``accept()`` fails (``EMFILE``, ``ENFILE``...). Twisted recovers from ``EMFILE``
  by closing the pending connections unserved and says so only at INFO in its own
  namespace, which the Go-format log drops: without this, clients are reset and the
  log stays silent.
- :class:`RateLimitedLog`: one line per interval per key, with a count of the rest
  (the accept() lines, the HTTP channel's timeout lines).
- :func:`listen_backlog`: the kernel's ``somaxconn``, the backlog Go listens with
  (Twisted's default of 50 drops the SYNs of a connect storm: clients wait seconds
  for retransmits, or give up).
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.logger import ILogObserver, LogLevel
from zope.interface import implementer

from nsq_service.log import Logger
from nsq_service.prebind import listen_backlog

__all__ = ["RateLimitedLog", "listen_backlog", "raise_fd_limit", "watch_accept_errors"]

# accept() failures that mean the process or the system is out of a resource
_EXHAUSTION = {"EMFILE", "ENFILE", "ENOBUFS", "ENOMEM"}


def raise_fd_limit(log: Logger) -> tuple[int, int] | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return (old, new) if changed.

    An infinite hard limit is left alone (the kernel refuses it as a soft limit on
    Linux); a refusal is logged, never fatal.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as e:
        log.warn("could not raise the open files limit from {soft} to {hard} - {err}", soft=soft, hard=hard, err=e)
        return None
    log.debug("raised the open files limit (RLIMIT_NOFILE) from {soft} to {hard}", soft=soft, hard=hard)
    return soft, hard


@dataclass
class _Window:
    until: float
    counts: dict[str, int] = field(default_factory=dict)
    flush: Any = None


class RateLimitedLog:
    """At most one line per ``interval`` seconds per key.

    The first event of a key is logged at once; the counts of those that follow
    within the interval are summed and logged in one line when it ends.
    """

    def __init__(self, reactor: Any, logger: Logger, interval: float = 10.0) -> None:
        self.reactor = reactor
        self.logger = logger
        self.interval = interval
        self._windows: dict[Any, _Window] = {}

    def emit(self, key: Any, level: LogLevel, text: Callable[[dict[str, int]], str], **counts: int) -> None:
        """Log ``text(counts)`` now, or add ``counts`` to the line at the end of the window."""
        now = self.reactor.seconds()
        window = self._windows.get(key)
        if window is None or now >= window.until:
            if window is not None and window.flush is not None and window.flush.active():
                window.flush.cancel()
                self._flush(key, level, text, window)
            self._windows[key] = _Window(until=now + self.interval)
            self.logger.emit(level, "{text}", text=text(dict(counts)))
            return
        for name, value in counts.items():
            window.counts[name] = window.counts.get(name, 0) + value
        if window.flush is None:
            window.flush = self.reactor.callLater(window.until - now, self._flush, key, level, text, window)

    def _flush(self, key: Any, level: LogLevel, text: Callable[[dict[str, int]], str], window: _Window) -> None:
        window.flush = None
        if window.counts:
            counts, window.counts = window.counts, {}
            self.logger.emit(level, "{text}", text=f"{text(counts)} in the last {self.interval:g}s")

    def stop(self) -> None:
        """Cancel the pending summaries (their counts are dropped)."""
        for window in self._windows.values():
            if window.flush is not None and window.flush.active():
                window.flush.cancel()
        self._windows.clear()


def _soft_nofile() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


@implementer(ILogObserver)
class _AcceptObserver:
    """Receives the accept loop's log events of one port (see twisted's tcp._accept).

    The events of one accept loop arrive together; they are summed up on the next
    reactor turn, so a line says how many connections that failure cost.
    """

    def __init__(self, label: str, limiter: RateLimitedLog) -> None:
        self.label = label
        self.limiter = limiter
        self._failures: dict[str, int] = {}
        self._closed = 0
        self._report_call: Any = None

    def __call__(self, event: dict[str, Any]) -> None:
        fmt = event.get("log_format") or ""
        if fmt.startswith("EMFILE encountered"):
            name = "EMFILE"
        elif "acceptError" in event:
            name = str(event["acceptError"])
        elif fmt.startswith("EMFILE recovery: Closed"):
            self._closed += 1
            return
        else:
            return
        self._failures[name] = self._failures.get(name, 0) + 1
        if self._report_call is None:
            self._report_call = self.limiter.reactor.callLater(0, self._report)

    def _report(self) -> None:
        self._report_call = None
        failures, self._failures = self._failures, {}
        closed, self._closed = self._closed, 0
        for name, n in failures.items():
            level = LogLevel.error if name in _EXHAUSTION else LogLevel.warn
            counts = {"failures": n, "closed": closed if name == "EMFILE" else 0}
            self.limiter.emit((self.label, name), level, self._text(name), **counts)

    def _text(self, name: str) -> Callable[[dict[str, int]], str]:
        code = getattr(errno, name, None)
        reason = os.strerror(code).lower() if isinstance(code, int) else name
        label = self.label

        def text(counts: dict[str, int]) -> str:
            n = counts.get("failures", 1)
            line = f"{label}: accept() failed{'' if n == 1 else f' {n} times'} - {name} ({reason})"
            if name in ("EMFILE", "ENFILE"):
                line += f", open files limit (soft RLIMIT_NOFILE) {_soft_nofile()}"
            if counts.get("closed"):
                line += f"; {counts['closed']} connection(s) closed unserved"
            return line

        return text


def watch_accept_errors(port: Any, label: str, log: Logger, interval: float = 10.0) -> RateLimitedLog | None:
    """Log ``port``'s accept() failures as ``LABEL: accept() failed - ...``.

    Twisted's listening ports (TCP, TLS and UNIX alike) send these events to their
    ``_logger``; this gives the port its own, feeding a rate-limited observer.
    Ports of other kinds (a test's MemoryReactor) are left alone: None.
    """
    from twisted.internet import tcp
    from twisted.logger import Logger as _TwistedLogger

    if not isinstance(port, tcp.Port):
        return None
    limiter = RateLimitedLog(port.reactor, log, interval)
    port._logger = _TwistedLogger(namespace="nsq_service.limits.accept", observer=_AcceptObserver(label, limiter))
    return limiter
