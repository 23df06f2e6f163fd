"""Go-style log lines for the console commands.

``[nsqd] 2026/11/22 10:00:00.123456 INFO: TCP: listening on 127.0.0.1:4150``:
scripts and client test harnesses read the listening lines from stderr.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO

from twisted.logger import ILogObserver, LogLevel, formatEvent
from twisted.logger import Logger as _TwistedLogger
from zope.interface import implementer

from nsq_service.golog import LEVEL_NUMBERS, go_log_line

GO_LEVELS = {
    LogLevel.debug: (1, "DEBUG"),
    LogLevel.info: (2, "INFO"),
    LogLevel.warn: (3, "WARNING"),
    LogLevel.error: (4, "ERROR"),
    LogLevel.critical: (5, "FATAL"),
}
OUR_NAMESPACES = ("nsqd_tw", "lookupd_tw", "nsq_service", "nsq_client", "nsqd", "nsqlookupd")


@implementer(ILogObserver)
class GoLogObserver:
    """Write our events as Go nsqd does; other libraries' only from WARNING up."""

    def __init__(self, stream: IO[str], prefix: str, level: str = "info") -> None:
        self.stream = stream
        self.prefix = prefix
        self.threshold = LEVEL_NUMBERS[level]

    def __call__(self, event: dict) -> None:
        number, name = GO_LEVELS.get(event.get("log_level", LogLevel.info), (2, "INFO"))
        if number < self.threshold:
            return
        namespace = event.get("log_namespace", "")
        if number < 3 and not namespace.startswith(OUR_NAMESPACES):
            return
        text = formatEvent(event)
        failure = event.get("log_failure")
        if failure is not None:
            text = f"{text}\n{failure.getTraceback()}"
        try:
            self.stream.write(go_log_line(self.prefix, name, text, event.get("log_time")))
            self.stream.flush()
        except (OSError, ValueError):
            pass


class Throttle:
    """At most ``limit`` lines of one kind a second, the kind being the logger's
    namespace and the line's format (its text before the values go in).

    A client that makes nsqd log the same error in a loop would otherwise fill
    the disk with it. The first line dropped says so; the next line of that kind
    let through says how many were dropped meanwhile.
    """

    MAX_KINDS = 10_000

    def __init__(self, limit: int = 20, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self._kinds: dict[tuple[str, str], list[float | int]] = {}  # kind: [second, lines, dropped]

    def admit(self, kind: tuple[str, str]) -> tuple[bool, int]:
        """Whether to log a line of ``kind`` now, and how many were dropped before it
        (-1: this is the first line dropped, to be announced instead)."""
        now = self.clock()
        state = self._kinds.get(kind)
        if state is None:
            if len(self._kinds) >= self.MAX_KINDS:
                self._kinds.clear()
            self._kinds[kind] = [now, 1, 0]
            return True, 0
        if now - state[0] >= 1.0:
            dropped = int(state[2])
            state[0], state[1], state[2] = now, 1, 0
            return True, dropped
        state[1] += 1
        if state[1] <= self.limit:
            return True, 0
        state[2] += 1
        return False, -1 if state[2] == 1 else 0


class LogGate:
    """One server's ``--log-level`` and line rate limit, shared by its loggers.

    A server (NSQD, NSQLookupd) makes one from its options and hands loggers made
    by :meth:`logger` to what it creates, so that two servers in one process keep
    their own levels; ``PUT /config/log_level`` changes it with :meth:`set_level`.
    Events below the level are dropped before they are built or formatted.
    """

    def __init__(self, level: str = "info", throttle: Throttle | None = None) -> None:
        self.threshold = LEVEL_NUMBERS[level]
        self.throttle = throttle if throttle is not None else Throttle()

    def set_level(self, level: str) -> None:
        self.threshold = LEVEL_NUMBERS[level]

    def logger(self, namespace: str, source: object | None = None) -> Logger:
        return Logger(namespace, source, self)


class Logger(_TwistedLogger):
    """A twisted Logger that drops events below its gate's level, and lines of
    one kind past the gate's :class:`Throttle`; made by :meth:`LogGate.logger`."""

    def __init__(self, namespace: str, source: object | None, gate: LogGate) -> None:
        super().__init__(namespace, source)
        self.gate = gate

    def emit(self, level: LogLevel, format: str | None = None, **kwargs: object) -> None:
        gate = self.gate
        if GO_LEVELS.get(level, (2,))[0] < gate.threshold:
            return
        throttle = gate.throttle
        ok, dropped = throttle.admit((self.namespace, format or ""))
        if not ok:
            if dropped == -1:
                super().emit(
                    level,
                    "more than {limit} lines a second like {kind!r}: dropping them for now",
                    limit=throttle.limit,
                    kind=format,
                )
            return
        if dropped:
            super().emit(
                level, "{dropped} lines like {kind!r} were dropped (log rate limit)", dropped=dropped, kind=format
            )
        super().emit(level, format, **kwargs)
