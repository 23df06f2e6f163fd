"""Backfills from nsqd's retained log: the source's ``startingTimestamp`` and
nsq-spark-archive's ``--since`` rewind the channel, and the archive keeps each
message once across the rewind."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from typing import Any

import pyarrow.parquet as pq
from twisted.trial import unittest

from nsq_spark.options import NSQOptions, OptionError, since_millis
from tests.nsq_spark.harness import consume_all, publish, settled, spark, start_nsqd, tcp
from tests.nsq_spark.test_archive import archive_command


def bodies(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def between_publishes() -> int:
    """A Unix ms strictly after what was published before and before what comes after."""
    time.sleep(0.01)  # nsqd stamps in ns: keep the halves apart by more than a millisecond
    ms = int(time.time() * 1000) + 1
    time.sleep(0.01)
    return ms


class RetainedNode:
    """An nsqd that retains every topic for an hour."""

    def setUp(self) -> None:
        self.nsqd = start_nsqd("--retention", "1h")
        self.addCleanup(self.nsqd.kill)
        self.address = tcp(self.nsqd)
        self.http = f"127.0.0.1:{self.nsqd.port('HTTP')}"
        self.dir = tempfile.mkdtemp(prefix="nsq-spark-replay-")


class StartingTimestampTests(RetainedNode, unittest.TestCase):
    timeout = 300

    def test_a_new_query_gets_what_was_published_since(self):
        publish(self.address, "replay_src", bodies("old", 150))
        since = between_publishes()
        publish(self.address, "replay_src", bodies("new", 150))
        self.assertEqual(len(consume_all(self.address, "replay_src", "spark", 300)), 300)  # all FINed
        settled(self.nsqd, "replay_src", "spark")

        def query(name: str) -> Any:
            return (
                spark()
                .readStream.format("nsq")
                .option("nsqdHttpAddresses", self.http)
                .option("topic", "replay_src")
                .option("channel", "spark")
                .option("stagingLocation", os.path.join(self.dir, "staging"))
                .option("startingTimestamp", str(since))
                .load()
                .writeStream.format("parquet")
                .option("path", os.path.join(self.dir, "out"))
                .option("checkpointLocation", os.path.join(self.dir, "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )

        q = query("first")
        q.awaitTermination(120)
        self.assertIsNone(q.exception())
        table = pq.read_table(os.path.join(self.dir, "out"), columns=["body", "attempts"])
        self.assertEqual(sorted(table.column("body").to_pylist()), sorted(bodies("new", 150)))
        # a restart from the checkpoint does not rewind again
        publish(self.address, "replay_src", bodies("later", 10))
        q = query("again")
        q.awaitTermination(120)
        self.assertIsNone(q.exception())
        got = pq.read_table(os.path.join(self.dir, "out"), columns=["body"]).column("body").to_pylist()
        self.assertEqual(sorted(got), sorted(bodies("new", 150) + bodies("later", 10)))

    def test_option_errors(self):
        base = {"topic": "t", "channel": "c", "stagingLocation": self.dir}
        with self.assertRaises(OptionError) as e:
            NSQOptions.parse({**base, "nsqdHttpAddresses": self.http, "startingTimestamp": "yesterday"}, reading=True)
        self.assertIn("Unix milliseconds", str(e.exception))
        with self.assertRaises(OptionError) as e:
            NSQOptions.parse({**base, "nsqdTcpAddresses": self.address, "startingTimestamp": "1"}, reading=True)
        self.assertIn("nsqdHttpAddresses", str(e.exception))
        o = NSQOptions.parse({**base, "nsqdHttpAddresses": self.http, "startingTimestamp": "EARLIEST"}, reading=True)
        self.assertEqual(o.starting_timestamp, "earliest")


class ArchiveSinceTests(RetainedNode, unittest.TestCase):
    timeout = 600

    def archive(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [*archive_command(), "--nsqd-http-address", self.http, "--topic", "replay_arch", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=self.dir)
        if ok and done.returncode != 0:
            self.fail(f"nsq-spark-archive exited {done.returncode}: {done.stderr[-3000:]}")
        return done

    def archived(self, output: str) -> list[bytes]:
        return pq.read_table(output, columns=["body"]).column("body").to_pylist()

    def test_rewound_copies_are_archived_once_and_a_backfill_gets_the_rest(self):
        output = os.path.join(self.dir, "archive")
        publish(self.address, "replay_arch", bodies("a", 500))
        since = between_publishes()
        publish(self.address, "replay_arch", bodies("b", 500))
        self.archive("--output", output)
        self.assertEqual(len(self.archived(output)), 1000)

        # the channel gets everything again since `since` (b-*), with c-* published meanwhile:
        # the archive keeps each message once, however long ago it archived it (here with
        # a checkpoint of its own and no deduplication window: only the archive's files
        # can tell that b-* are there already)
        publish(self.address, "replay_arch", bodies("c", 200))
        other = ["--checkpoint", os.path.join(self.dir, "other-checkpoint"), "--dedup-window", "0"]
        done = self.archive("--output", output, "--since", str(since), *other)
        self.assertIn("rewound replay_arch/nsq_to_parquet", done.stderr)
        got = self.archived(output)
        self.assertEqual(sorted(got), sorted(bodies("a", 500) + bodies("b", 500) + bodies("c", 200)))
        stats = settled(self.nsqd, "replay_arch", "nsq_to_parquet")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0))

        # a backfill into a new output on a new channel: what was published since, from the log
        backfill = os.path.join(self.dir, "backfill")
        self.archive("--output", backfill, "--channel", "backfill", "--since", str(since))
        self.assertEqual(sorted(self.archived(backfill)), sorted(bodies("b", 500) + bodies("c", 200)))

    def test_since_older_than_the_log_fails_with_the_earliest_time(self):
        publish(self.address, "replay_arch", bodies("x", 10))
        done = self.archive("--output", os.path.join(self.dir, "old"), "--since", "2001-01-01T00:00:00Z", ok=False)
        self.assertEqual(done.returncode, 1, done.stderr[-2000:])
        self.assertRegex(done.stderr, r"refused to rewind replay_arch/nsq_to_parquet: SINCE_TOO_OLD: messages are")

    def test_since_needs_an_http_address(self):
        argv = [*archive_command(), "--nsqd-tcp-address", self.address, "--topic", "t", "--output", self.dir]
        done = subprocess.run([*argv, "--since", "2h"], capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 2)
        self.assertIn("--since rewinds the channel over HTTP", done.stderr)


class SinceTests(unittest.TestCase):
    def test_forms(self):
        now = 1_800_000_000.0
        self.assertEqual(since_millis("earliest", now), 0)
        self.assertEqual(since_millis("1700000000123", now), 1_700_000_000_123)
        self.assertEqual(since_millis("2026-11-26T10:00:00Z", now), 1_795_687_200_000)
        self.assertEqual(since_millis("2026-11-26T10:00:00.0005Z", now), 1_795_687_200_001)
        self.assertEqual(since_millis("2h", now), 1_800_000_000_000 - 7_200_000)
        with self.assertRaises(ValueError):
            since_millis("yesterday", now)
