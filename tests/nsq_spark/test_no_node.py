"""Planning batches on the driver: depth from /stats, partitions by depth,
and no nsqd reachable (a dead nsqlookupd, a dead nsqd): the source logs WARNINGs
and fails the query with a clear error after ``noNodeTimeout``, instead of
running forever with empty batches (or ending as if the topic were drained)."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import tempfile
import time

from twisted.trial import unittest

from nsq_spark.planner import Node, NoNodeError, Planner, PlannerConfig, allot
from tests.integration.procs import ServerProcess
from tests.nsq_spark.harness import channel_stats, publish, shared_nsqd, spark, tcp
from tests.nsq_spark.test_archive import archive_command


def dead_address() -> str:
    """An address nothing listens on: connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class PlannerTests(unittest.TestCase):
    """The driver-side planner alone, against real sockets."""

    timeout = 60

    def planner(self, **config: object) -> Planner:
        settings: dict = {"topic": "events", "channel": "spark", **config}
        planner = Planner(PlannerConfig(**settings))
        self.addCleanup(planner.close)
        return planner

    def records(self) -> Records:
        handler = Records()
        logger = logging.getLogger("nsq_spark")
        logger.addHandler(handler)
        self.addCleanup(logger.removeHandler, handler)
        return handler

    def wait_for_error(self, planner: Planner, timeout: float = 30) -> NoNodeError:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            planner.survey()
            try:
                planner.check_reachable()
            except NoNodeError as e:
                return e
            time.sleep(0.05)
        self.fail("check_reachable() never failed")

    def test_dead_lookupd_warns_then_fails(self):
        lookupd = dead_address()
        records = self.records()
        planner = self.planner(lookupd_addresses=[lookupd], no_node_timeout=1.0)
        started = time.monotonic()
        planner.start()
        error = self.wait_for_error(planner)
        self.assertGreaterEqual(time.monotonic() - started, 1.0)
        self.assertRegex(str(error), rf"^no nsqd could be reached for 1s: lookupd {lookupd}: .*Connection refused")
        warnings = [r.getMessage() for r in records.records if r.levelno == logging.WARNING]
        self.assertTrue(any(w.startswith(f"lookupd {lookupd}: ") for w in warnings), warnings)

    def test_dead_nsqd_fails(self):
        nsqd = dead_address()
        planner = self.planner(nsqd_addresses=[nsqd], no_node_timeout=1.0)
        planner.start()
        error = self.wait_for_error(planner)
        self.assertRegex(str(error), rf"^no nsqd could be reached for 1s: cannot consume from {nsqd}: ")

    def test_a_topic_no_node_has_yet_is_no_failure(self):
        """The lookupd answers (404: no producer has the topic): nothing is
        unreachable, there is simply nothing to plan."""
        lookupd = ServerProcess("nsqlookupd", "-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")
        lookupd.start()
        self.addCleanup(lookupd.kill)
        planner = self.planner(lookupd_addresses=[lookupd.addresses["HTTP"]], no_node_timeout=0.5)
        planner.start()
        self.assertEqual(planner.survey(), [])
        time.sleep(0.6)  # past the timeout: still no failure
        self.assertEqual(planner.survey(), [])
        planner.check_reachable()

    def test_zero_waits_forever(self):
        planner = self.planner(lookupd_addresses=[dead_address()], no_node_timeout=0.0)
        planner.start()
        planner.survey()
        planner.unreachable_since -= 3600  # as if unreachable for an hour
        self.assertIsNotNone(planner.last_error)
        planner.check_reachable()

    def test_depth_from_stats_and_the_channel_created(self):
        """A node known by its HTTP address: the planner reads the channel's
        depth, creating the channel when it is missing (a topic without
        channels hands its backlog to the first one)."""
        nsqd = shared_nsqd()
        http = nsqd.addresses["HTTP"]
        publish(tcp(nsqd), "planner_depth", [b"x"] * 70)
        planner = self.planner(nsqd_http_addresses=[http], topic="planner_depth", channel="fresh")
        planner.start()
        [(node, depth)] = planner.survey()
        self.assertEqual((node.tcp, node.http, depth), (tcp(nsqd), http, 70))
        self.assertEqual(channel_stats(nsqd, "planner_depth", "fresh")["depth"], 70)
        [(node, depth)] = planner.survey()
        self.assertEqual(depth, 70)


class AllotTests(unittest.TestCase):
    def test_depths_limit_and_partition_size(self):
        a, b, c = Node("a:1", "a:2"), Node("b:1", "b:2"), Node("c:1")
        # known depths under the limit: each node its depth, split in parts
        self.assertEqual(allot([(a, 25), (b, 0)], 100, 10), [("a:1", 9, True), ("a:1", 8, True), ("a:1", 8, True)])
        # over the limit: in proportion; an unknown depth wants an even share
        parts = allot([(a, 300), (c, None)], 100, 1000)
        self.assertEqual(parts, [("a:1", 86, True), ("c:1", 14, False)])
        self.assertEqual(allot([(a, 0), (b, 0)], 100, 10), [])


class QueryTests(unittest.TestCase):
    """A streaming query in the shared SparkSession."""

    timeout = 300

    def test_interval_query_against_a_dead_lookupd_fails_with_the_reason(self):
        lookupd = dead_address()
        out = tempfile.mkdtemp(prefix="nsq-spark-nonode-")
        df = (
            spark()
            .readStream.format("nsq")
            .option("lookupdHttpAddresses", lookupd)
            .option("topic", "spark_nonode")
            .option("channel", "spark")
            .option("noNodeTimeout", "2s")
            .option("stagingLocation", os.path.join(out, "staging"))
            .load()
        )
        query = (
            df.writeStream.format("parquet")
            .option("path", os.path.join(out, "out"))
            .option("checkpointLocation", os.path.join(out, "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            with self.assertRaises(Exception) as e:
                query.awaitTermination(120)
        finally:
            query.stop()
        self.assertIn(f"no nsqd could be reached for 2s: lookupd {lookupd}: ", str(e.exception))


class ArchiveTests(unittest.TestCase):
    """nsq-spark-archive as a user runs it, its console output included."""

    timeout = 400

    def run_archive(self, *args: str) -> subprocess.CompletedProcess[str]:
        work = tempfile.mkdtemp(prefix="nsq-archive-nonode-")
        argv = [*archive_command(), "--topic", "events", "--output", os.path.join(work, "archive"), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=work)

    def assertFailedClearly(self, done: subprocess.CompletedProcess[str], lookupd: str) -> None:
        self.assertEqual(done.returncode, 1, done.stderr[-3000:])
        reason = f"no nsqd could be reached for 3s: lookupd {lookupd}: "
        self.assertRegex(done.stderr, rf"nsq_spark.archive ERROR: archiving events failed: {re.escape(reason)}")
        self.assertNotIn("done: 0 messages", done.stderr)
        # the reason, as it happens, on the console
        self.assertRegex(done.stderr, rf"nsq_spark.planner WARNING: lookupd {re.escape(lookupd)}: .*refused")

    def test_available_now_against_a_dead_lookupd_exits_1_with_the_reason(self):
        lookupd = dead_address()
        done = self.run_archive("--lookupd-http-address", lookupd, "--no-node-timeout", "3s")
        self.assertFailedClearly(done, lookupd)

    def test_interval_trigger_against_a_dead_lookupd_warns_then_exits_1(self):
        lookupd = dead_address()
        done = self.run_archive("--lookupd-http-address", lookupd, "--no-node-timeout", "3s", "--trigger", "500ms")
        self.assertFailedClearly(done, lookupd)
