"""nsq-spark-archive as a user runs it: one command, Parquet by date and hour,
and a job SIGKILLed mid-run three times that, run again, holds every message
exactly once for any Parquet reader."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from twisted.trial import unittest

from tests.nsq_spark.harness import publish, settled, shared_nsqd, tcp


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
        """What a plain Parquet reader (pyarrow) finds in the output."""
        return pq.read_table(self.output, columns=["body"]).column("body").to_pylist()

    def test_one_command_archives_every_message(self):
        expected = [f"archive-{i}".encode() for i in range(3000)]
        before = time.time()
        publish(self.address, "archive_all", expected)
        after = time.time()
        done = self.run_archive("--topic", "archive_all", "--max-messages-per-batch", "1000")
        self.assertEqual(sorted(self.archived_bodies()), sorted(expected))
        # partitioned by the messages' date and hour (UTC): the hours of the publishing
        # (two when it crossed an hour), not the hour the check runs in
        partitions = sorted(p.relative_to(self.output).as_posix() for p in Path(self.output).glob("date=*/hour=*"))
        hours = {time.strftime("date=%Y-%m-%d/hour=%H", time.gmtime(t)) for t in (before, after)}
        self.assertTrue(partitions)
        self.assertLessEqual(set(partitions), hours)
        names = [p.name for p in Path(self.output).glob("date=*/hour=*/*.parquet")]
        self.assertTrue(names)
        pattern = r"part-[0-9a-f]{12}-b\d{10}-\d{5}\.parquet"  # query id, batch, file
        self.assertTrue(all(re.fullmatch(pattern, n) for n in names), names)
        self.assertEqual(list(Path(self.output, "_incoming").iterdir()), [])  # nothing left aside
        self.assertIn("batch 0: 1000 messages archived", done.stderr)
        self.assertIn("done: 3000 messages of archive_all archived", done.stderr)
        # not a terminal: plain lines, no live line and no Spark progress bar
        self.assertNotIn("\r", done.stderr)
        self.assertNotIn("[Stage", done.stderr)
        stats = settled(self.nsqd, "archive_all", "nsq_to_parquet")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0))
        # nothing new: a second run archives nothing and exits
        done = self.run_archive("--topic", "archive_all")
        self.assertIn("done: 0 messages", done.stderr)
        self.assertEqual(len(self.archived_bodies()), 3000)
        # published since: the next run (cron's) archives them
        more = [f"archive-more-{i}".encode() for i in range(500)]
        publish(self.address, "archive_all", more)
        done = self.run_archive("--topic", "archive_all", "--quiet")
        self.assertIn("done: 500 messages", done.stderr)
        self.assertNotIn("batch ", done.stderr)  # --quiet: the summary only
        self.assertEqual(sorted(self.archived_bodies()), sorted(expected + more))

    def test_a_terminal_gets_one_live_line(self):
        import pty

        expected = [f"live-{i}".encode() for i in range(20_000)]
        publish(self.address, "archive_live", expected)
        http = f"127.0.0.1:{self.nsqd.port('HTTP')}"
        argv = [*archive_command(), "--nsqd-http-address", http, "--output", self.output, "--topic", "archive_live"]
        argv += ["--max-messages-per-batch", "2000"]
        primary, secondary = pty.openpty()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary, cwd=self.dir)
        os.close(secondary)
        seen = bytearray()
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal closed: every process that held it exited
                break
            if not chunk:
                break
            seen += chunk
        os.close(primary)
        self.assertEqual(proc.wait(timeout=240), 0, seen[-3000:].decode(errors="replace"))
        text = seen.decode(errors="replace")
        self.assertIn("\r", text)  # the live line, redrawn in place
        self.assertRegex(text, r"archived [\d,]+ rows of archive_live, [\d,]+ rows/s, [\d,]+ left on the nodes")
        self.assertNotIn("batch 0:", text)  # no line per batch in a terminal
        self.assertNotIn("[Stage", text)
        self.assertIn("done: 20000 messages of archive_live", text)
        self.assertEqual(len(self.archived_bodies()), 20_000)

    def test_a_checkpoint_with_sparks_deduplication_state_carries_on(self):
        """An archive whose checkpoint was made when the job dropped copies with
        Spark's dropDuplicatesWithinWatermark (its state in the checkpoint) is
        carried on by the job, which keeps that operator for it: Spark fails a
        query that lacks a stateful operator its checkpoint has."""
        from nsq_spark import register
        from nsq_spark.archive import SOURCE_SCHEMA, parse_args, source_options
        from nsq_spark.batch_files import BatchFiles
        from tests.nsq_spark.harness import spark

        first = [f"legacy-{i}".encode() for i in range(2000)]
        publish(self.address, "archive_legacy", first)
        args = parse_args(["--nsqd-tcp-address", self.address, "--topic", "archive_legacy", "--output", self.output])
        session = spark()
        register(session)
        reader = session.readStream.format("nsq").schema(SOURCE_SCHEMA)
        for key, value in source_options(args).items():
            reader = reader.option(key, value)
        from pyspark.sql import functions as F

        rows = (
            reader.load()
            .withWatermark("received", "10 minutes")
            .dropDuplicatesWithinWatermark(["nsqd_address", "id"])
            .withColumn("date", F.date_format("timestamp", "yyyy-MM-dd"))
            .withColumn("hour", F.date_format("timestamp", "HH"))
        )
        checkpoint = os.path.join(self.output, "_checkpoint")
        query = (
            rows.writeStream.foreachBatch(BatchFiles(self.output, checkpoint, "snappy"))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        self.assertTrue(os.path.isdir(os.path.join(checkpoint, "state")))
        self.assertEqual(len(self.archived_bodies()), 2000)
        more = [f"legacy-more-{i}".encode() for i in range(1000)]
        publish(self.address, "archive_legacy", more)
        done = self.run_archive("--topic", "archive_legacy")
        self.assertIn("done: 1000 messages", done.stderr)
        self.assertIn("Spark's deduplication state", done.stderr)
        self.assertEqual(sorted(self.archived_bodies()), sorted(first + more))

    def test_killed_three_times_then_exactly_once(self):
        """The job and every process it started (JVM, Python workers) SIGKILLed
        at random moments three times, then run to completion: a plain
        Parquet reader sees every message exactly once. Given nsqd's TCP
        address only, the job cannot tell whether nsqd restarted and looks up
        every row."""
        self.killed_three_times("archive_kill", ["--nsqd-tcp-address", self.address])

    def test_killed_three_times_given_http_then_exactly_once(self):
        """The same given nsqd's HTTP address: the job knows nsqd did not
        restart and looks up only the rows nsqd delivered again."""
        self.killed_three_times("archive_kill_http", ["--nsqd-http-address", f"127.0.0.1:{self.nsqd.port('HTTP')}"])

    def killed_three_times(self, topic: str, node: list[str]) -> None:
        expected = [f"kill-{i}".encode() for i in range(20000)]
        publish(self.address, topic, expected)
        seed = random.randrange(1 << 30)
        rng = random.Random(seed)
        argv = [
            *archive_command(),
            *node,
            "--output",
            self.output,
            "--topic",
            topic,
            "--max-messages-per-batch",
            "1000",
        ]
        offsets = Path(self.output, "_checkpoint", "offsets")
        for run in range(3):
            log_path = os.path.join(self.dir, f"run-{run}.log")
            with open(log_path, "w") as log:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
            try:
                # once the query is planning batches, a random moment
                deadline = time.monotonic() + 180
                while proc.poll() is None and not (offsets.is_dir() and any(offsets.iterdir())):
                    if time.monotonic() > deadline:
                        self.fail(f"run {run} planned no batch: {Path(log_path).read_text()[-3000:]}")
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 6.0))
            finally:
                kill_tree(proc.pid)
                proc.wait()
        done = subprocess.run([*argv, "--quiet"], capture_output=True, text=True, timeout=240, cwd=self.dir)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        table = pq.read_table(self.output)
        got = table.column("body").to_pylist()
        detail = f"seed {seed}: {len(got)} rows, {len(set(got))} distinct"
        self.assertEqual(len(got), len(expected), detail)
        self.assertEqual(set(got), set(expected), detail)
        stats = settled(self.nsqd, topic, "nsq_to_parquet")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0))


class WarmUpTests(unittest.TestCase):
    timeout = 240

    def test_the_warm_up_read_runs(self):
        """The read that starts Spark's Python processes for a Python data
        source ahead of the query succeeds where the job runs (it logs its
        failure only at debug: the query would start them anyway)."""
        import logging

        from nsq_spark import archive
        from tests.nsq_spark.harness import spark

        session = spark()
        records: list[logging.LogRecord] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record)

        logger = logging.getLogger("nsq_spark.archive")
        handler, level = Keep(logging.DEBUG), logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        try:
            thread = archive.warm_workers(session)
            thread.join(180)
            self.assertFalse(thread.is_alive())
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        self.assertEqual([r.getMessage() for r in records if "warming" in r.getMessage()], [])
        rows = session.read.format("nsq_warm_up").option("partitions", "3").load().collect()
        self.assertEqual(sorted(r.partition for r in rows), [0, 1, 2])


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it, all at once."""
    tree = [pid]
    i = 0
    while i < len(tree):
        children = subprocess.run(["pgrep", "-P", str(tree[i])], capture_output=True, text=True).stdout.split()
        tree.extend(int(c) for c in children)
        i += 1
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
