"""The process's memory and GC figures, in Go's memStats shape (``/stats``,
statsd, Prometheus, ``/debug/pprof/heap``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
import time
from typing import Any

from twisted.application import service


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo() -> _MallInfo2 | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn()


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``):
    what CPython frees between blocks still in use otherwise stays in the RSS of
    the process. False where there is no ``malloc_trim``."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    fn(0)
    return True


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except (OSError, ValueError, IndexError):
        return 0


class GCPauses(service.Service):
    """Times the cyclic GC's pauses (the last 256, as Go's PauseNs) while it runs:
    its gc callback is installed at start and removed at stop."""

    name = "gc-pauses"

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._start = 0.0

    def startService(self) -> None:
        service.Service.startService(self)
        gc.callbacks.append(self._callback)

    def stopService(self) -> None:
        service.Service.stopService(self)
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._start)
            if len(self.pauses) > 256:
                del self.pauses[:-256]


def _percentile(perc: float, arr: list[float]) -> float:
    if not arr:
        return 0.0
    i = int(perc / 100.0 * len(arr) + 0.5)
    return arr[min(i, len(arr) - 1)]


def mem_stats(gc_pauses: GCPauses | None = None) -> dict[str, int]:
    """Go's memStats keys, in the order /stats prints them, with CPython's nearest
    equivalents (docs/monitoring.md); the pauses are 0 without ``gc_pauses``."""
    info = _mallinfo()
    pauses = sorted(gc_pauses.pauses) if gc_pauses is not None else []
    threshold = gc.get_threshold()[0]
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": int(info.fordblks) if info else 0,
        "heap_in_use_bytes": _rss_bytes(),
        "heap_released_bytes": int(info.keepcost) if info else 0,
        "gc_pause_usec_100": int(_percentile(100.0, pauses) * 1e6),
        "gc_pause_usec_99": int(_percentile(99.0, pauses) * 1e6),
        "gc_pause_usec_95": int(_percentile(95.0, pauses) * 1e6),
        "next_gc_bytes": max(0, threshold - gc.get_count()[0]),
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()),
    }
