"""A task's intake, without Spark: take from nsqd, stage, then FIN; a staged
partition is read back, never taken twice; a losing duplicate attempt gives
its messages back; nothing is FINed that was not staged."""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
import threading
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

    def test_messages_arriving_after_the_take_are_neither_staged_nor_fined(self):
        """The quota was not met (10 of 100, then idle): a message published
        after the task stopped taking must not be FINed with the staged ones."""
        publish(self.address, "intake_late", bodies("early", 10))
        o = self.options("intake_late")
        taken = take(Plan("q", 1, 0, self.address, 100), o.topic, o.channel, o.connect_options(), 2500, 0.3)
        self.assertEqual(len(taken.ids), 10)
        publish(self.address, "intake_late", bodies("late", 10))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # nsqd has them, queued or sent
            c = channel_stats(self.nsqd, "intake_late", "spark")
            if c["depth"] + c["in_flight_count"] == 20:
                break
            time.sleep(0.02)
        area = StagingArea(self.staging)
        table = settle(area, area.part_path("q", 1, 0), taken)
        self.assertEqual(sorted(table.column("body").to_pylist()), sorted(bodies("early", 10)))
        stats = settled(self.nsqd, "intake_late", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (10, 0))  # the late ones wait for the next

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


class StalledPeer:
    """Just enough of nsqd for one consumer: answers IDENTIFY and SUB, sends
    as many messages as RDY asks for, then stops reading for ``stall``
    seconds with a 4 KiB receive buffer, then counts the FINs until CLS."""

    def __init__(self, stall: float) -> None:
        self.stall = stall
        self.fins = 0
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def frame(frame_type: int, data: bytes) -> bytes:
        return struct.pack(">ii", len(data) + 4, frame_type) + data

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        stream = sock.makefile("rb")
        stream.read(4)  # magic
        stream.readline()  # IDENTIFY
        stream.read(struct.unpack(">i", stream.read(4))[0])
        sock.sendall(self.frame(0, json.dumps({"max_rdy_count": 30000, "msg_timeout": 60000}).encode()))
        stream.readline()  # SUB
        sock.sendall(self.frame(0, b"OK"))
        count = int(stream.readline().split()[1])  # RDY
        now = time.time_ns()
        sock.sendall(b"".join(self.frame(2, struct.pack(">qh", now, 1) + b"%016x" % i + b"body") for i in range(count)))
        time.sleep(self.stall)
        for line in stream:
            if line.startswith(b"FIN "):
                self.fins += 1
            elif line == b"CLS\n":
                sock.sendall(self.frame(0, b"CLOSE_WAIT"))
                break
        sock.close()


class SlowNsqdTests(unittest.TestCase):
    timeout = 120

    def test_fins_wait_for_a_stalled_nsqd(self):
        """30,000 FINs (630 KB) to an nsqd that reads nothing for 2 s: the task
        waits for it and every FIN arrives. (The reading threads poll with
        select, not with a socket timeout, which would also bound how long a
        write may take.)"""
        peer = StalledPeer(stall=2.0)
        staging = os.path.join(tempfile.mkdtemp(prefix="nsq-intake-"), "staging")
        o = NSQOptions.parse(
            {"topic": "t", "channel": "c", "nsqdTcpAddresses": peer.address, "stagingLocation": staging},
            reading=True,
        )
        taken = take(Plan("q", 1, 0, peer.address, 30000), o.topic, o.channel, o.connect_options(), 30000, 0.5)
        self.assertEqual((len(taken.conns), len(taken.ids)), (1, 30000))
        area = StagingArea(staging)
        self.assertEqual(settle(area, area.part_path("q", 1, 0), taken).num_rows, 30000)
        peer.thread.join(30)
        self.assertEqual(peer.fins, 30000)
