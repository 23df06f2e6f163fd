"""Go-style log lines for the console commands.

``[nsqd] 2026/11/22 10:00:00.123456 INFO: TCP: listening on 127.0.0.1:4150``:
scripts and client test harnesses read the listening lines from stderr.
"""

from __future__ import annotations

import time
from typing import IO

from twisted.logger import ILogObserver, LogLevel, formatEvent
from twisted.logger import Logger as _TwistedLogger
from zope.interface import implementer

GO_LEVELS = {
    LogLevel.debug: (1, "DEBUG"),
    LogLevel.info: (2, "INFO"),
    LogLevel.warn: (3, "WARNING"),
    LogLevel.error: (4, "ERROR"),
    LogLevel.critical: (5, "FATAL"),
}
LEVEL_NUMBERS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}
OUR_NAMESPACES = ("nsqd_tw", "lookupd_tw", "nsqd", "nsqlookupd")


def go_log_line(prefix: str, level_name: str, text: str, when: float | None = None) -> str:
    when = time.time() if when is None else when
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(when)) + ".%06d" % int((when % 1) * 1e6)
    return f"{prefix}{stamp} {level_name}: {text}\n"


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


# The --log-level threshold for our own loggers, so that debug events are not
# even formatted unless asked for, under twistd and the console command alike.
_threshold = [LEVEL_NUMBERS["info"]]


def set_log_level(level: str) -> None:
    _threshold[0] = LEVEL_NUMBERS[level]


class Logger(_TwistedLogger):
    """A twisted Logger that drops events below the configured --log-level."""

    def emit(self, level: LogLevel, format: str | None = None, **kwargs: object) -> None:
        if GO_LEVELS.get(level, (2,))[0] < _threshold[0]:
            return
        super().emit(level, format, **kwargs)
