"""A retained log across a replication pair, with nsqd as processes (issue 36, part 4):
the history a standby holds survives its restarts and reaches it in every
catch-up, a failover keeps it, a demoted primary keeps its own until the new
primary's snapshot has replaced it, and a rewind in progress goes on on the new
primary."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from nsq_client.blocking import Connection, ConnectOptions, TLSConfig
from nsq_wire.frames import FRAME_TYPE_MESSAGE
from nsq_wire.message import decode
from tests.integration.failover_load import wait_until
from tests.integration.procs import ServerProcess, call
from tests.integration.procs import replication_status as status
from tests.integration.test_replication_failover_process import PairCase

RETAIN = ("--retention", "1h", "--max-bytes-per-file", "65536")  # small segments: several sealed ones


def publish(node: ServerProcess, topic: str, bodies: list[bytes]) -> None:
    conn = Connection(node.addresses["TCP"], ConnectOptions(TLSConfig())).open()
    try:
        conn.publish(topic, [bodies[i : i + 100] for i in range(0, len(bodies), 100)])
    finally:
        conn.close()


def consume(node: ServerProcess, topic: str, channel: str, count: int, rdy: int = 100, timeout: float = 60) -> list:
    """At least ``count`` messages of ``channel``, each FINed, in the order they came as (id, timestamp,
    body); then RDY 0, and what was in flight taken and FINed too: none is left to come back by REQ."""
    conn = Connection(node.addresses["TCP"], ConnectOptions(TLSConfig())).open()
    got: list[tuple[bytes, int, bytes]] = []

    def take(frames: list[tuple[int, bytes]]) -> None:
        for kind, data in frames:
            if kind == FRAME_TYPE_MESSAGE:
                msg_id, body, ts, _ = decode(data)
                got.append((msg_id, ts, body))
                conn.fin([msg_id])

    try:
        conn.subscribe(topic, channel)
        conn.rdy(rdy)
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            take(conn.poll_frames(0.5))
        conn.rdy(0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not drained(node, topic, channel, in_flight_only=True):
            take(conn.poll_frames(0.1))
    finally:
        conn.close()
    return got


def retained(node: ServerProcess, topic: str) -> dict[str, Any]:
    code, body = call(node, "GET", f"/stats?format=json&topic={topic}")
    topics = json.loads(body)["topics"] if code == 200 else []
    return dict(topics[0].get("retained") or {}) if topics else {}


class RetainedHistoryProcessTests(PairCase):
    def segments(self, data: str, topic: str) -> dict[str, int]:
        """The retained segment files of ``topic`` under node ``data``'s data path, with their inodes."""
        path = os.path.join(self.dir, data)
        return {
            f: os.stat(os.path.join(path, f)).st_ino
            for f in os.listdir(path)
            if f.startswith(f"{topic}.retained.") and f.endswith(".dat") and not f.endswith("meta.dat")
        }

    def promote(self, node: ServerProcess) -> None:
        code, body = call(node, "POST", "/replication/promote?force=true")
        self.assertEqual(code, 200, body)
        self.assertTrue(wait_until(lambda: status(node).get("role") == "primary", 30))

    def test_history_survives_a_standby_restart_a_failover_and_the_old_primary_rejoining(self) -> None:
        b = self.nsqd("b", "--replication-role", "standby", *RETAIN)
        a = self.nsqd("a", "--replica", b.addresses["TCP"], *RETAIN)
        self.wait_in_sync(b)
        call(a, "POST", "/topic/create?topic=events")
        code, body = call(a, "POST", "/channel/create?topic=events&channel=c")
        self.assertEqual(code, 200, body)
        first = [b"one %05d " % i + b"x" * 100 for i in range(1000)]  # 130 KiB: two sealed segments and a third
        publish(a, "events", first)
        self.assertEqual(len(consume(a, "events", "c", 1000)), 1000)  # every one finished: in the log only
        self.assertTrue(wait_until(lambda: retained(b, "events").get("messages") == 1000, 30), retained(b, "events"))
        self.assertTrue(wait_until(lambda: drained(b, "events", "c"), 30))

        # a routine restart of the standby: its history is kept, the catch-up brings what it lacks
        self.assertEqual(b.stop(), 0)
        b = self.nsqd("b", "--replication-role", "standby", *RETAIN, tcp=b.addresses["TCP"])
        self.wait_in_sync(b)
        second = [b"two %05d " % i + b"x" * 100 for i in range(1000)]
        publish(a, "events", second)
        self.assertTrue(wait_until(lambda: retained(b, "events").get("messages") == 2000, 30), retained(b, "events"))

        # the primary dies: the standby takes over with the whole history
        a_tcp = a.addresses["TCP"]
        a_files = self.segments("a", "events")
        a.signal(signal.SIGKILL)
        a.wait()
        self.promote(b)
        self.assertEqual(retained(b, "events")["messages"], 2000)
        code, _ = call(b, "POST", "/channel/create?topic=events&channel=replay&since=earliest")
        self.assertEqual(code, 200)
        got = consume(b, "events", "replay", 2000)
        self.assertEqual([body for _, _, body in got], first + second, "the whole history, in order, once")

        # the old primary comes back: it becomes the standby and ends up with the same history,
        # keeping the segments of its own that the new primary's are the same as
        a = self.nsqd("a", "--replica", b.addresses["TCP"], *RETAIN, tcp=a_tcp)
        self.assertTrue(wait_until(lambda: status(a).get("role") == "standby", 30))
        self.wait_in_sync(a)
        self.assertEqual(retained(a, "events")["messages"], 2000)
        kept = {f: ino for f, ino in self.segments("a", "events").items() if a_files.get(f) == ino}
        self.assertGreater(len(kept), 1, "its sealed segments were kept, not copied again")
        publish(b, "events", [b"three"])
        self.assertTrue(wait_until(lambda: retained(a, "events").get("messages") == 2001, 30))

    def test_a_rewind_in_progress_goes_on_on_the_new_primary(self) -> None:
        b = self.nsqd("b", "--replication-role", "standby", *RETAIN)
        a = self.nsqd("a", "--replica", b.addresses["TCP"], *RETAIN)
        self.wait_in_sync(b)
        call(a, "POST", "/topic/create?topic=events")
        code, body = call(a, "POST", "/channel/create?topic=events&channel=c")
        self.assertEqual(code, 200, body)
        bodies = [b"%05d" % i for i in range(20000)]
        publish(a, "events", bodies)
        self.assertEqual(len(consume(a, "events", "c", 20000, rdy=1000)), 20000)
        self.assertTrue(wait_until(lambda: drained(a, "events", "c"), 30))
        code, body = call(a, "POST", "/channel/rewind?topic=events&channel=c&since=earliest")
        self.assertEqual(code, 200, body)
        before = consume(a, "events", "c", 3000, rdy=100)
        self.assertEqual([body for _, _, body in before], bodies[: len(before)])
        # the standby has seen those finished and the rewind's position move on
        self.assertTrue(
            wait_until(lambda: (r := channel_stats(b, "events", "c")) and r["depth"] + r["in_flight_count"] < 17000, 30)
        )

        a.signal(signal.SIGKILL)
        a.wait()
        self.promote(b)
        left = 20000 - len(before)
        rest = consume(b, "events", "c", left, rdy=1000)
        came = [body for _, _, body in rest]
        self.assertEqual(set(came) | {body for _, _, body in before}, set(bodies), "every message of the rewind")
        self.assertLessEqual(len(came), left + 100, "it went on from where it was, not from the start")
        self.assertEqual(came, sorted(came), "in publish order")


def channel_stats(node: ServerProcess, topic: str, channel: str) -> dict[str, Any] | None:
    code, body = call(node, "GET", f"/stats?format=json&topic={topic}&channel={channel}")
    if code != 200:
        return None
    for t in json.loads(body)["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return dict(c)
    return None


def drained(node: ServerProcess, topic: str, channel: str, in_flight_only: bool = False) -> bool:
    """Nothing queued (unless ``in_flight_only``) or in flight in ``channel``."""
    c = channel_stats(node, topic, channel)
    return c is not None and (in_flight_only or c["depth"] == 0) and c["in_flight_count"] == 0
