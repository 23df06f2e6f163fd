"""The driver JVM's compilers for a short archive run.

Under a local master the driver JVM runs the whole job, tasks included, and
an ``available-now`` run's JVM lives only as long as its backlog takes. Java
compiles hot code twice by default: quickly (C1), then again with the
optimising compiler (C2), whose threads on a 2-core machine take CPU the run
itself needs and whose code pays off only after a few million rows. Measured
with ``bench/bench_spark.py --archive --master 'local[2]' --backlog disk``
(medians in docs/spark.md): 400,000 rows of 100 bytes took ~12 s with both
compilers and ~9 s with C1 alone; 2,000,000 rows took 25.1 s with both and
26.8 s with C1 alone (the batches after the first: 137,000 rows/s against
100,000). The job therefore starts the JVM with C1 alone
(``-XX:TieredStopAtLevel=1``) when it knows the run is short: an
``available-now`` run, a local master, a JVM this process starts, and a
backlog the nodes report of at most :data:`SHORT_RUN_MESSAGES`. The user's own
``spark.driver.extraJavaOptions`` come after it, so a ``-XX:TieredStopAtLevel``
of theirs wins.
"""

from __future__ import annotations

from collections.abc import Mapping

from nsq_spark.classcache import JAVA_OPTIONS

SHORT_RUN_MESSAGES = 1_000_000
SHORT_RUN_OPTION = "-XX:TieredStopAtLevel=1"


def short_run(backlog: int | None) -> bool:
    """Whether a run with ``backlog`` messages (None: unknown) is short."""
    return backlog is not None and 0 <= backlog <= SHORT_RUN_MESSAGES


def with_short_run_option(confs: Mapping[str, str]) -> dict[str, str]:
    """``confs`` with C1 alone asked for ahead of the user's JVM options."""
    theirs = confs.get(JAVA_OPTIONS, "")
    return {**confs, JAVA_OPTIONS: f"{SHORT_RUN_OPTION} {theirs}".strip()}
