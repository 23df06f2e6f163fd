"""A class-data sharing archive for the driver JVM that nsq-spark-archive starts.

Spark's driver JVM loads and verifies some 20,000 classes before and during a
run's first batch: seconds of a short cron run. Java (13 and later) can write
the classes a run loaded to an archive when the JVM exits
(``-XX:ArchiveClassesAtExit``) and map them at the next start
(``-XX:SharedArchiveFile``). The job keeps that archive in a cache directory:
the first run writes ``driver-<key>.jsa`` (about 200 MB, some seconds after
the last batch), later runs start from it. ``<key>`` covers what makes an
archive unusable (the java binary, the Spark install, the driver's class path,
memory and JVM options), so an upgrade writes a new one beside it.

An archive is written under a temporary name and renamed into place only once
the JVM that wrote it has exited cleanly; a JVM that fails to start from one
(a damaged file) makes the job remove it and start without.

Only the driver's JVM, and only when this process starts it: under
spark-submit the JVM is running before the job's Python is.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("nsq_spark.archive")

JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# the driver's settings an archive depends on (its class path, its heap's
# size: compressed pointers or not, its JVM options)
_KEYED = ("spark.driver.extraClassPath", "spark.driver.memory", JAVA_OPTIONS, "spark.driver.extraLibraryPath")
_STALE_AFTER = 24 * 3600.0  # a temporary archive this old was left by a killed JVM


def default_directory() -> str | None:
    """``$NSQ_SPARK_CLASS_CACHE``, else ``$XDG_CACHE_HOME/nsq-spark``, else
    ``~/.cache/nsq-spark``; None when set to ``off``."""
    chosen = os.environ.get("NSQ_SPARK_CLASS_CACHE")
    if chosen is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(base, "nsq-spark")
    return None if chosen.strip().lower() in ("", "off") else chosen


class ClassCache:
    """The archive for one driver JVM: read from ``archive`` if it is there,
    else written to ``pending`` at the JVM's exit and renamed by :meth:`finish`."""

    def __init__(self, directory: str, key: str) -> None:
        self.archive = os.path.join(directory, f"driver-{key}.jsa")
        self.pending = f"{self.archive}.{os.getpid()}.tmp"
        self.reading = os.path.isfile(self.archive) and os.path.getsize(self.archive) > 0

    @classmethod
    def for_new_driver(cls, directory: str | None, conf: Mapping[str, str]) -> ClassCache | None:
        """The cache for the JVM this process is about to start with the Spark
        settings ``conf``, or None: no directory, no java found, a JVM already up."""
        if not directory or "PYSPARK_GATEWAY_PORT" in os.environ:
            return None
        from pyspark import SparkContext

        if SparkContext._gateway is not None:
            return None
        java = _java()
        if java is None:
            return None
        try:
            os.makedirs(directory, exist_ok=True)
            probe = os.path.join(directory, f".probe-{os.getpid()}")
            with open(probe, "w"):
                pass
            os.unlink(probe)
        except OSError as e:
            log.info("no class-data cache (%s): %s", directory, e)
            return None
        _remove_stale(directory)
        return cls(directory, _key(java, conf))

    def java_options(self) -> str:
        # the JVM's own notes on the archive (a class it skips, one it cannot
        # map) would land in the job's output, hundreds of lines at a dump
        quiet = "-Xlog:cds*=off"
        if self.reading:
            return f"-XX:SharedArchiveFile={self.archive} {quiet}"
        return f"-XX:ArchiveClassesAtExit={self.pending} {quiet}"

    def configure(self, builder: Any, conf: Mapping[str, str]) -> Any:
        """``builder`` with the archive's option before the user's own JVM options."""
        theirs = conf.get(JAVA_OPTIONS, "")
        return builder.config(JAVA_OPTIONS, f"{self.java_options()} {theirs}".strip())

    def discard(self) -> None:
        """The JVM failed to start from the archive: remove it."""
        log.warning("the driver JVM did not start from its class-data archive %s: removed", self.archive)
        _unlink(self.archive)
        self.reading = False

    def finish(self, exit_code: int | None) -> None:
        """After the JVM has exited: keep an archive it wrote whole."""
        if self.reading or not os.path.exists(self.pending):
            return
        if exit_code == 0 and os.path.getsize(self.pending) > 0:
            os.replace(self.pending, self.archive)
            log.info("wrote the class-data archive %s for the next runs", self.archive)
        else:
            _unlink(self.pending)


def stop_driver_jvm(timeout: float = 120.0) -> int | None:
    """After ``spark.stop()``: end the driver JVM this process started and wait
    for it (it writes a class-data archive on its way out); its exit code, or
    None when there is no such JVM."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return None
    try:
        gateway.shutdown()
    except Exception as e:  # the JVM may be gone already
        log.debug("closing the gateway: %s", e)
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc.stdin is not None:
        proc.stdin.close()  # the JVM exits when its stdin ends
    try:
        return int(proc.wait(timeout))
    except Exception:
        proc.kill()
        return None


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def _key(java: str, conf: Mapping[str, str]) -> str:
    import pyspark

    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    stat = os.stat(java)
    parts = {
        "java": [java, stat.st_size, int(stat.st_mtime)],
        "spark": [pyspark.__version__, os.path.realpath(spark_home)],
        "conf": {k: conf.get(k, "") for k in _KEYED},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _remove_stale(directory: str) -> None:
    now = time.time()
    for path in glob.glob(os.path.join(directory, "driver-*.jsa.*.tmp")):
        try:
            if now - os.path.getmtime(path) > _STALE_AFTER:
                os.unlink(path)
        except OSError:
            pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
