"""Latency quantiles over a moving window (DDSketch): end to end, and delivery to FIN."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nsqd_tw.options import NSQDOptions


def new_sketch() -> Any:
    # imported when --e2e-processing-latency-percentiles is set, not at every start
    from ddsketch import DDSketch

    return DDSketch()


class Quantile:
    def __init__(self, window: float, percentiles: list[float], now: float) -> None:
        self.move_window = window / 2
        self.percentiles = percentiles
        self._streams = [new_sketch(), new_sketch()]
        self._current = 0
        self._last_move = now

    def _advance(self, now: float) -> None:
        while now > self._last_move + self.move_window:
            self._current ^= 1
            self._streams[self._current] = new_sketch()
            self._last_move += self.move_window

    def insert(self, value_ns: float, now: float) -> None:
        self._advance(now)
        self._streams[self._current].add(max(value_ns, 1.0))

    def merge(self, other: Quantile, now: float) -> None:
        self._advance(now)
        other._advance(now)
        self._streams[self._current].merge(other._streams[other._current])
        self._streams[self._current ^ 1].merge(other._streams[other._current ^ 1])

    def result(self, now: float) -> dict[str, Any]:
        self._advance(now)
        merged = new_sketch()
        for s in self._streams:
            if s.count:
                merged.merge(s)
        count = int(merged.count)
        percentiles = []
        for p in self.percentiles:
            value = merged.get_quantile_value(p) if count else None
            percentiles.append({"quantile": p, "value": float(round(value)) if value else 0.0})
        return {"count": count, "percentiles": percentiles}


def new_latency_quantile(opts: NSQDOptions, now: float) -> Quantile:
    """A latency quantile per --e2e-processing-latency-percentile and -window-time."""
    return Quantile(opts.e2e_processing_latency_window_time, opts.e2e_processing_latency_percentiles, now)


EMPTY_RESULT: dict[str, Any] = {"count": 0, "percentiles": None}
