"""The driver JVM's class-data archive: written by a first run, mapped by the
next, keyed by what would make it unusable, and a damaged one removed rather
than a failed job."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from twisted.trial import unittest

from nsq_spark import archive
from nsq_spark.classcache import ClassCache, default_directory
from tests.nsq_spark.harness import publish, shared_nsqd, tcp
from tests.nsq_spark.test_archive import archive_command


class DirectoryTests(unittest.TestCase):
    def setUp(self) -> None:
        saved = {k: os.environ.get(k) for k in ("NSQ_SPARK_CLASS_CACHE", "XDG_CACHE_HOME", "HOME")}

        def restore() -> None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        self.addCleanup(restore)
        for k in saved:
            os.environ.pop(k, None)

    def test_default_is_the_users_cache(self):
        os.environ["HOME"] = "/home/someone"
        self.assertEqual(default_directory(), "/home/someone/.cache/nsq-spark")
        os.environ["XDG_CACHE_HOME"] = "/var/cache/jobs"
        self.assertEqual(default_directory(), "/var/cache/jobs/nsq-spark")
        os.environ["NSQ_SPARK_CLASS_CACHE"] = "/srv/cds"
        self.assertEqual(default_directory(), "/srv/cds")
        os.environ["NSQ_SPARK_CLASS_CACHE"] = "off"
        self.assertIsNone(default_directory())

    def test_flags(self):
        base = ["--nsqd-tcp-address", "127.0.0.1:4150", "--topic", "t", "--output", "/tmp/o"]
        args = archive.parse_args([*base, "--class-cache", "off", "--conf", "spark.ui.enabled=true"])
        self.assertIsNone(args.class_cache)
        self.assertEqual(args.confs, {"spark.ui.enabled": "true"})
        self.assertEqual(args.max_messages_per_batch, archive.BATCH_AVAILABLE_NOW)
        self.assertEqual(archive.parse_args([*base, "--trigger", "30s"]).max_messages_per_batch, archive.BATCH_INTERVAL)
        self.assertEqual(archive.parse_args([*base, "--max-messages-per-batch", "7"]).max_messages_per_batch, 7)
        with self.assertRaises(SystemExit):
            archive.parse_args([*base, "--conf", "no-equals-sign"])


class CacheFileTests(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="nsq-class-cache-")
        # as in a job's process before it starts its JVM, whether or not an
        # earlier test in this process started the suite's shared session
        from pyspark import SparkContext

        self.patch(SparkContext, "_gateway", None)

    def test_no_cache_when_the_jvm_is_started_by_someone_else(self):
        os.environ["PYSPARK_GATEWAY_PORT"] = "1"  # what spark-submit sets for the job's Python
        self.addCleanup(os.environ.pop, "PYSPARK_GATEWAY_PORT")
        self.assertIsNone(ClassCache.for_new_driver(self.dir, {}))

    def test_no_cache_in_a_directory_that_cannot_be_written(self):
        blocked = os.path.join(self.dir, "file")
        Path(blocked).write_text("not a directory")
        self.assertIsNone(ClassCache.for_new_driver(os.path.join(blocked, "cache"), {}))

    def test_the_key_follows_the_drivers_settings(self):
        plain = ClassCache.for_new_driver(self.dir, {})
        again = ClassCache.for_new_driver(self.dir, {"spark.executor.memory": "2g"})
        bigger = ClassCache.for_new_driver(self.dir, {"spark.driver.memory": "40g"})
        assert plain is not None and again is not None and bigger is not None
        self.assertEqual(plain.archive, again.archive)  # executors do not matter
        self.assertNotEqual(plain.archive, bigger.archive)
        self.assertIn("-XX:ArchiveClassesAtExit=", plain.java_options())

    def test_a_written_archive_is_kept_only_from_a_clean_exit(self):
        cache = ClassCache.for_new_driver(self.dir, {})
        assert cache is not None
        Path(cache.pending).write_bytes(b"x" * 100)
        cache.finish(1)
        self.assertFalse(os.path.exists(cache.pending))
        self.assertFalse(os.path.exists(cache.archive))
        Path(cache.pending).write_bytes(b"x" * 100)
        cache.finish(0)
        self.assertTrue(os.path.exists(cache.archive))
        later = ClassCache.for_new_driver(self.dir, {})
        assert later is not None
        self.assertTrue(later.java_options().startswith(f"-XX:SharedArchiveFile={cache.archive} "))
        later.discard()
        self.assertFalse(os.path.exists(cache.archive))

    def test_old_leftovers_of_killed_jvms_go(self):
        old = os.path.join(self.dir, "driver-0123456789abcdef.jsa.99.tmp")
        new = os.path.join(self.dir, "driver-0123456789abcdef.jsa.98.tmp")
        for path in (old, new):
            Path(path).write_bytes(b"x")
        day_ago = time.time() - 2 * 24 * 3600
        os.utime(old, (day_ago, day_ago))
        ClassCache.for_new_driver(self.dir, {})
        self.assertFalse(os.path.exists(old))
        self.assertTrue(os.path.exists(new))


class ArchiveRunTests(unittest.TestCase):
    """nsq-spark-archive three times on one cache directory."""

    timeout = 600

    def test_written_then_mapped_then_a_damaged_one_removed(self):
        nsqd = shared_nsqd()
        address = tcp(nsqd)
        work = tempfile.mkdtemp(prefix="nsq-class-cache-run-")
        cache = os.path.join(work, "cache")

        def run(topic: str, n: int) -> tuple[str, list[str]]:
            publish(address, topic, [f"{topic}-{i}".encode() for i in range(n)])
            output = os.path.join(work, topic)
            argv = [*archive_command(), "--nsqd-tcp-address", address, "--topic", topic, "--output", output]
            # stdout too: the JVM writes its own log lines there
            out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
            proc = subprocess.Popen([*argv, "--class-cache", cache], text=True, cwd=work, **out)
            assert proc.stdout is not None
            text, mapped = [], []
            for line in proc.stdout:
                text.append(line)
                if "query" in line and "started" in line:
                    mapped = _mapped_archives(proc.pid)  # the JVM is up and serving the query
            self.assertEqual(proc.wait(timeout=300), 0, "".join(text)[-3000:])
            self.assertEqual(pq.read_table(output, columns=["id"]).num_rows, n)
            return "".join(text), mapped

        # the first run writes the archive once its JVM has exited
        log, mapped = run("cds_first", 2000)
        self.assertEqual(mapped, [])
        self.assertIn("wrote the class-data archive", log)
        self.assertNotIn("[cds", log)  # the JVM's notes on what it skips stay out of the job's output
        archives = sorted(Path(cache).glob("driver-*.jsa"))
        self.assertEqual(len(archives), 1, os.listdir(cache))
        self.assertGreater(archives[0].stat().st_size, 10 << 20)
        self.assertEqual(list(Path(cache).glob("*.tmp")), [])

        # the next maps it
        log, mapped = run("cds_second", 2000)
        self.assertEqual(mapped, [str(archives[0])])
        self.assertNotIn("wrote the class-data archive", log)

        # a damaged one (cut short: the JVM dies mapping it) is removed and the run goes on
        data = archives[0].read_bytes()
        archives[0].chmod(0o644)
        archives[0].write_bytes(data[: len(data) // 3])
        log, mapped = run("cds_damaged", 2000)
        self.assertIn("did not start from its class-data archive", log)
        self.assertFalse(archives[0].exists())


def _mapped_archives(parent: int) -> list[str]:
    """The .jsa files mapped by the JVMs under ``parent``."""
    found: set[str] = set()
    for pid in _descendants(parent):
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        found.update(line.split(None, 5)[5] for line in maps.splitlines() if line.endswith(".jsa"))
    return sorted(p for p in found if "nsq-class-cache-run-" in p)


def _descendants(parent: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [parent]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out
