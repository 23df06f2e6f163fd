"""nsq-spark-archive as a user runs it: one command, Parquet by date and hour,
and a driver killed mid-run that loses nothing when it is run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from twisted.trial import unittest

from tests.nsq_spark.harness import publish, settled, shared_nsqd, spark, tcp


def archive_command() -> list[str]:
    script = Path(sys.executable).parent / "nsq-spark-archive"
    return [str(script)] if script.exists() else [sys.executable, "-m", "nsq_spark.archive"]


class ArchiveTests(unittest.TestCase):
    timeout = 400

    def setUp(self) -> None:
        self.nsqd = shared_nsqd()
        self.address = tcp(self.nsqd)
        self.dir = tempfile.mkdtemp(prefix="nsq-archive-")
        self.output = os.path.join(self.dir, "archive")

    def run_archive(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        argv = [*archive_command(), "--nsqd-tcp-address", self.address, "--output", self.output, *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        if done.returncode != 0:
            self.fail(f"nsq-spark-archive exited {done.returncode}: {done.stderr[-3000:]}")
        return done

    def archived_bodies(self) -> list[bytes]:
        df = spark().read.parquet(self.output)
        return [bytes(r.body) for r in df.select("body").collect()]

    def test_one_command_archives_every_message(self):
        expected = [f"archive-{i}".encode() for i in range(3000)]
        publish(self.address, "archive_all", expected)
        done = self.run_archive("--topic", "archive_all", "--max-messages-per-batch", "1000")
        self.assertEqual(sorted(self.archived_bodies()), sorted(expected))
        # partitioned by the messages' date and hour (UTC)
        partitions = sorted(p.relative_to(self.output).as_posix() for p in Path(self.output).glob("date=*/hour=*"))
        now = time.gmtime()
        self.assertIn(time.strftime("date=%Y-%m-%d/hour=%H", now), partitions)
        self.assertTrue(list(Path(self.output).glob("date=*/hour=*/*.parquet")))
        self.assertIn("batch 0: 1000 messages archived", done.stderr)
        self.assertIn("done: 3000 messages of archive_all archived", done.stderr)
        stats = settled(self.nsqd, "archive_all", "nsq_to_parquet")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0))
        # nothing new: a second run archives nothing and exits
        done = self.run_archive("--topic", "archive_all")
        self.assertIn("done: 0 messages", done.stderr)
        self.assertEqual(len(self.archived_bodies()), 3000)

    def test_driver_killed_mid_run_loses_nothing(self):
        expected = [f"kill-{i}".encode() for i in range(10000)]
        publish(self.address, "archive_kill", expected)
        argv = [
            *archive_command(),
            "--nsqd-tcp-address",
            self.address,
            "--output",
            self.output,
            "--topic",
            "archive_kill",
            "--trigger",
            "200ms",
            "--max-messages-per-batch",
            "500",
        ]
        log_path = os.path.join(self.dir, "first-run.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True)
        try:
            metadata = Path(self.output, "_spark_metadata")
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None:
                if metadata.is_dir() and len([p for p in metadata.iterdir() if p.name.isdigit()]) >= 3:
                    break
                time.sleep(0.1)
            else:
                self.fail(f"the first run committed no batches: {Path(log_path).read_text()[-3000:]}")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, mid-run
            proc.wait()
        first = len(self.archived_bodies())
        self.assertGreater(first, 0)
        self.assertLess(first, 10000)
        # run again from the checkpoint until the channel is drained
        self.run_archive("--topic", "archive_kill", "--max-messages-per-batch", "2000")
        got = self.archived_bodies()
        self.assertEqual(set(got), set(expected), "every message is archived")
        self.assertLess(len(got) - len(expected), 2000, "duplicates are bounded by what was in flight")
