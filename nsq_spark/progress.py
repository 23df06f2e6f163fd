"""What nsq-spark-archive tells its user while it runs: a live line in a terminal,
a line per micro-batch otherwise, and log records that do not garble the live line.

The archive job (:mod:`nsq_spark.archive`) makes a :class:`Progress`, registers its
``listener`` with Spark's streaming query manager and hands it to the
:class:`ClearingHandler` it logs through.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

# the job's logger: its lines say ``nsq_spark.archive`` wherever they are written from
log = logging.getLogger("nsq_spark.archive")


class Progress:
    """What the job tells its user while it runs.

    In a terminal, one live line redrawn every second: rows archived, rows/s,
    the backlog left on the nodes (the channel's depth from ``/stats``, where an
    HTTP address is known) and the time that leaves at this rate. Otherwise
    (a log file, cron) one plain line per micro-batch. ``quiet``: neither.
    Warnings and errors always show; in a terminal they clear the live line
    first, which is then drawn again below them.
    """

    def __init__(self, topic: str, mode: str, backlog: Any = None, stream: Any = None) -> None:
        import threading
        import time

        from pyspark.sql.streaming import StreamingQueryListener

        self.topic = topic
        self.mode = mode  # "live", "lines" or "quiet"
        self.backlog = backlog  # () -> int | None: messages left on the nodes
        self.stream = stream if stream is not None else sys.stderr
        self.total = 0
        self.last_batch = -1
        self.started = time.monotonic()
        self.left: int | None = None
        self._line = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._clock = time.monotonic
        outer = self

        class Listener(StreamingQueryListener):  # type: ignore[misc]
            def onQueryStarted(self, event: Any) -> None:
                outer.started = outer._clock()
                if outer.mode == "lines":
                    log.info("archiving %s: query %s started", topic, event.id)

            def onQueryProgress(self, event: Any) -> None:
                outer.batch(event.progress)

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass  # main() reports a failure, with its reason

        self.listener = Listener()
        if mode == "live":
            threading.Thread(target=self._redraw_every_second, name="nsq-archive-progress", daemon=True).start()

    def batch(self, p: Any) -> None:
        self.last_batch = max(self.last_batch, p.batchId)
        if not p.numInputRows:
            return
        self.total += p.numInputRows
        if self.mode == "lines":
            log.info(
                "batch %d: %d messages archived (%d this run, %.1f rows/s)",
                p.batchId,
                p.numInputRows,
                self.total,
                p.processedRowsPerSecond or 0.0,
            )
        elif self.mode == "live":
            self.draw()

    def elapsed(self) -> float:
        """Seconds since the query started."""
        return self._clock() - self.started

    def rate(self) -> float:
        elapsed = self.elapsed()
        return self.total / elapsed if elapsed > 0 else 0.0

    def status(self) -> str:
        rate = self.rate()
        text = f"archived {self.total:,} rows of {self.topic}, {rate:,.0f} rows/s"
        if self.left is not None:
            text += f", {self.left:,} left on the nodes"
            if rate > 0 and self.left:
                text += f", about {_eta(self.left / rate)} to go"
        return text

    def draw(self) -> None:
        with self._lock:
            line = self.status()
            pad = " " * max(0, len(self._line) - len(line))
            self.stream.write("\r" + line + pad)
            self.stream.flush()
            self._line = line

    def clear(self) -> None:
        """Take the live line off the screen (before another line is written)."""
        with self._lock:
            if self._line:
                self.stream.write("\r" + " " * len(self._line) + "\r")
                self.stream.flush()
                self._line = ""

    def _redraw_every_second(self) -> None:
        while not self._stop.wait(1.0):
            if self.backlog is not None:
                try:
                    self.left = self.backlog()
                except Exception:  # the planner logs what it cannot reach
                    self.left = None
            self.draw()

    def close(self) -> None:
        self._stop.set()
        if self.mode == "live":
            self.clear()

    def catch_up(self, query: Any, timeout: float = 10.0) -> None:
        """Wait until the listener has heard of the query's last batch: Spark
        delivers progress events asynchronously, possibly after the query ended."""
        import time

        last = query.lastProgress
        if not last:
            return
        deadline = time.monotonic() + timeout
        while self.last_batch < last["batchId"] and time.monotonic() < deadline:
            time.sleep(0.02)


class ClearingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A log handler that takes the live progress line away before a record and
    draws it again after."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.progress: Progress | None = None

    def emit(self, record: logging.LogRecord) -> None:
        progress = self.progress
        if progress is not None and progress.mode == "live" and progress._line:
            progress.clear()
            super().emit(record)
            progress.draw()
        else:
            super().emit(record)


def _eta(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
