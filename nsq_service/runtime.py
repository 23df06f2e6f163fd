"""The Python runtime tuned for a server holding millions of messages."""

from __future__ import annotations

import gc


def tune_gc() -> None:
    """Make the cyclic GC cheap for a process holding millions of messages.

    Messages hold no cycles, but every one is tracked, and collecting the
    youngest generation every 700 allocations (the default) cost a third of
    the consume path in the benchmarks: a burst of messages in flight set it
    off again and again. Collect it every 25,000 instead (the benchmarks do
    not tell 25,000 from 100,000 apart) and freeze what start-up created; the
    25% rule still bounds full collections. Not higher: what lives in a cycle
    (each HTTP request, held by Klein's error handler) waits for that
    collection, and at 100,000 a steady HTTP load kept 13 MB of such garbage
    (2 MB at 25,000). No collection first: it took 25 ms of the start, to
    free some 40 objects.
    """
    gc.freeze()
    gc.set_threshold(25_000, 20, 10)
