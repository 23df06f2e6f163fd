"""Go's log line and level numbers, without Twisted (the options need them before any server exists)."""

from __future__ import annotations

import time

LEVEL_NUMBERS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}


def go_log_line(prefix: str, level_name: str, text: str, when: float | None = None) -> str:
    when = time.time() if when is None else when
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(when)) + ".%06d" % int((when % 1) * 1e6)
    return f"{prefix}{stamp} {level_name}: {text}\n"
