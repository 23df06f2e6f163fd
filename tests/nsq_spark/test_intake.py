"""A task's intake, without Spark: take from nsqd, stage, then FIN; a staged
partition is read back, never taken twice; a losing duplicate attempt gives
its messages back; nothing is FINed that was not staged."""

from __future__ import annotations

import os
import tempfile
import time

from twisted.trial import unittest

from nsq_spark.intake import Plan, take
from nsq_spark.source import NSQOptions, read_partition, settle
from nsq_spark.staging import StagingArea
from tests.nsq_spark.harness import channel_stats, publish, settled, shared_nsqd, tcp


def bodies(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


class IntakeTests(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.nsqd = shared_nsqd()
        self.address = tcp(self.nsqd)
        self.staging = os.path.join(tempfile.mkdtemp(prefix="nsq-intake-"), "staging")

    def options(self, topic: str, **extra: str) -> NSQOptions:
        raw = {
            "topic": topic,
            "channel": "spark",
            "nsqdTcpAddresses": self.address,
            "stagingLocation": self.staging,
            "idleTimeout": "300ms",
            **extra,
        }
        return NSQOptions.parse(raw, reading=True)

    def test_staged_then_fined_and_read_back_not_taken_again(self):
        publish(self.address, "intake_once", bodies("a", 300))
        o = self.options("intake_once")
        plan = Plan("q", 1, 0, self.address, 200)
        first = read_partition(o, plan)
        self.assertEqual(first.num_rows, 200)
        self.assertEqual(first.column_names[-1], "received")
        path = StagingArea(self.staging).part_path("q", 1, 0)
        self.assertTrue(os.path.exists(path))
        stats = settled(self.nsqd, "intake_once", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"], stats["requeue_count"]), (100, 0, 0))
        # a retried attempt (or a replay) reads the file: same rows, nothing taken
        again = read_partition(o, plan)
        self.assertEqual(again.column("id").to_pylist(), first.column("id").to_pylist())
        self.assertEqual(channel_stats(self.nsqd, "intake_once", "spark")["depth"], 100)

    def test_a_losing_duplicate_attempt_gives_its_messages_back(self):
        publish(self.address, "intake_race", bodies("r", 100))
        o = self.options("intake_race")
        plan = Plan("q", 1, 0, self.address, 60)
        # the speculative attempt takes its messages first...
        loser = take(plan, o.topic, o.channel, o.connect_options(), o.max_in_flight, o.idle_timeout)
        self.assertEqual(len(loser.ids), 60)
        # ...the original attempt takes the rest, stages and FINs first
        winner = read_partition(o, plan)
        self.assertEqual(winner.num_rows, 40)
        got = settle(StagingArea(self.staging), StagingArea(self.staging).part_path("q", 1, 0), loser)
        self.assertEqual(got.column("id").to_pylist(), winner.column("id").to_pylist())
        stats = settled(self.nsqd, "intake_race", "spark")
        self.assertEqual((stats["depth"], stats["requeue_count"], stats["in_flight_count"]), (60, 60, 0))

    def test_nothing_is_fined_when_staging_fails(self):
        publish(self.address, "intake_nodisk", bodies("d", 50))
        o = self.options("intake_nodisk")

        class FullDisk(StagingArea):
            def claim(self, path: str, table: object, caught_up: bool) -> bool:
                raise OSError(28, "No space left on device")

        taken = take(Plan("q", 1, 0, self.address, 50), o.topic, o.channel, o.connect_options(), 2500, 0.3)
        self.assertEqual(len(taken.ids), 50)
        staging = FullDisk(self.staging)
        with self.assertRaises(OSError):
            settle(staging, staging.part_path("q", 1, 0), taken)
        stats = settled(self.nsqd, "intake_nodisk", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (50, 0))  # all given back

    def test_a_quota_beyond_one_connections_rdy(self):
        publish(self.address, "intake_wide", bodies("w", 6000))
        o = self.options("intake_wide", maxInFlight="2500")
        plan = Plan("q", 1, 0, self.address, 6000)
        taken = take(plan, o.topic, o.channel, o.connect_options(), o.max_in_flight, o.idle_timeout)
        self.assertEqual(len(taken.conns), 3)
        table = settle(StagingArea(self.staging), StagingArea(self.staging).part_path("q", 1, 0), taken)
        self.assertEqual(sorted(table.column("body").to_pylist()), sorted(bodies("w", 6000)))
        self.assertEqual(settled(self.nsqd, "intake_wide", "spark")["depth"], 0)

    def test_available_now_gives_back_what_came_after_the_start(self):
        publish(self.address, "intake_cutoff", bodies("old", 30))
        cutoff = time.time_ns()
        time.sleep(0.01)
        publish(self.address, "intake_cutoff", bodies("new", 30))
        o = self.options("intake_cutoff")
        taken = take(Plan("q", 1, 0, self.address, 100, cutoff), o.topic, o.channel, o.connect_options(), 2500, 0.3)
        self.assertTrue(taken.caught_up)
        table = settle(StagingArea(self.staging), StagingArea(self.staging).part_path("q", 1, 0), taken)
        self.assertEqual(sorted(table.column("body").to_pylist()), sorted(bodies("old", 30)))
        summary = StagingArea(self.staging).summary("q", 1)
        self.assertEqual((summary[0].rows, summary[0].caught_up), (30, True))
        self.assertEqual(settled(self.nsqd, "intake_cutoff", "spark")["depth"], 30)
