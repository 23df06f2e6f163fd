"""Retention and rewinds with nsqd as a process: rewind after everything was FINed, across kill -9,
no loss of an acknowledged message in durable mode, segments aged out; a rewind carried across
a clean restart, in publish order; what many rewinds hold in memory together."""

from __future__ import annotations

import os
import signal
from typing import Any
from urllib.parse import quote

from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread

from nsq_client.twisted_client import Consumer, ReceivedMessage, connect
from nsq_wire.gofmt import rfc3339_nano
from tests.integration.procs import rss_mb
from tests.integration.test_queue_settings_process import QueueSettingsProcessTestCase


class ReplayProcessTestCase(QueueSettingsProcessTestCase):
    """An nsqd process on a data path of the test's own (start, call, until)."""

    @defer.inlineCallbacks
    def retained(self, topic: str) -> Any:
        _, doc = yield self.call("GET", f"/stats?format=json&topic={topic}")
        return doc["topics"][0]["retained"]

    @defer.inlineCallbacks
    def consume(self, port: int, topic: str, channel: str, count: int) -> Any:
        """Messages delivered to a consumer that FINs each, until ``count`` came."""
        got: list[ReceivedMessage] = []
        consumer = yield Consumer.connect(reactor, "127.0.0.1", port, topic, channel, got.append, max_in_flight=500)
        yield self.until(lambda: len(got) >= count)
        yield consumer.close()
        return got

    def segments(self, topic: str) -> list[str]:
        return sorted(f for f in os.listdir(self.dir) if f.startswith(f"{topic}.retained.0"))

    @defer.inlineCallbacks
    def idle(self, topic: str, channel: str) -> Any:
        """Whether ``channel`` has no consumer and nothing in flight (every FIN taken in)."""
        stats = yield self.stats(topic)
        c = next(c for c in stats["channels"] if c["channel_name"] == channel)
        return c["client_count"] == 0 and c["in_flight_count"] == 0


def inversions(values: list[bytes]) -> int:
    """How many pairs of ``values`` are out of order (i < j, values[i] > values[j])."""
    if len(values) < 2:
        return 0
    half = len(values) // 2
    left, right = sorted(values[:half]), sorted(values[half:])
    across, j = 0, 0
    for v in left:  # for each of the left half, how many of the right half are smaller
        while j < len(right) and right[j] < v:
            j += 1
        across += j
    return inversions(values[:half]) + inversions(values[half:]) + across


class RewindProcessTests(ReplayProcessTestCase):
    @defer.inlineCallbacks
    def test_rewind_after_everything_was_finished_and_again_after_kill_9(self) -> None:
        proc = self.start("--retention", "1h")
        port = proc.port()
        p = yield connect(reactor, "127.0.0.1", port)
        for batch in range(30):
            answer = yield p.mpub("events", [b"%05d" % i for i in range(batch * 100, batch * 100 + 100)])
            self.assertEqual(answer, b"OK")
        p.close()
        got = yield self.consume(port, "events", "c", 3000)
        self.assertEqual([m.body for m in got], [b"%05d" % i for i in range(3000)])
        ids = [m.id for m in got]
        since = rfc3339_nano(got[1500].timestamp)  # the first of the 16th MPUB
        self.assertLess(got[1499].timestamp, got[1500].timestamp)

        code, answer = yield self.call("POST", f"/channel/rewind?topic=events&channel=c&since={quote(since)}")
        self.assertEqual((code, answer["messages"]), (200, 1500))
        again = yield self.consume(port, "events", "c", 1500)
        self.assertEqual([m.id for m in again], ids[1500:], "exactly 1500..2999, in order, original IDs")
        self.assertEqual([m.timestamp for m in again], [m.timestamp for m in got[1500:]])

        proc.signal(signal.SIGKILL)
        yield deferToThread(proc.wait)
        proc = self.start("--retention", "1h")
        port = proc.port()
        retained = yield self.retained("events")
        self.assertEqual(retained["messages"], 3000)
        code, answer = yield self.call("POST", f"/channel/rewind?topic=events&channel=c&since={quote(since)}")
        self.assertEqual((code, answer["messages"]), (200, 1500))
        again = yield self.consume(port, "events", "c", 1500)
        self.assertEqual([m.id for m in again], ids[1500:], "the same after kill -9 and restart")

        code, answer = yield self.call("POST", "/channel/create?topic=events&channel=backfill&since=earliest")
        self.assertEqual(code, 200)
        fresh = yield self.consume(port, "events", "backfill", 3000)
        self.assertEqual([m.id for m in fresh], ids, "a new channel from the retained past")

        code, answer = yield self.call("POST", "/channel/rewind?topic=events&channel=c&since=1000")
        self.assertEqual(code, 400)
        self.assertEqual(answer["earliest_ms"], -(-retained["available_since"] // 1_000_000))


class DurableProcessTests(ReplayProcessTestCase):
    @defer.inlineCallbacks
    def test_no_acknowledged_message_is_missing_after_kills(self) -> None:
        durable = ("--retention", "1h", "--mem-queue-size", "0", "--sync-every", "1")
        acked: list[bytes] = []
        n = 0
        for _kill in range(3):
            proc = self.start(*durable)
            p = yield connect(reactor, "127.0.0.1", proc.port())
            pending = []

            def ok(answer: bytes, body: bytes) -> None:
                if answer == b"OK":
                    acked.append(body)

            for _ in range(300):  # PUBs in flight when the kill comes
                body = b"d%06d" % n
                n += 1
                d = p.pub("durable", body)
                d.addCallback(ok, body)
                d.addErrback(lambda f: None)
                pending.append(d)
                if n % 300 == 150:
                    yield pending[-100]
                    proc.signal(signal.SIGKILL)
            yield defer.DeferredList(pending)
            yield deferToThread(proc.wait)
        self.assertGreater(len(acked), 300)
        self.assertLess(len(acked), n, "killed with publishes unanswered")
        proc = self.start(*durable)
        code, _ = yield self.call("POST", "/channel/create?topic=durable&channel=all&since=earliest")
        self.assertEqual(code, 200)
        retained = yield self.retained("durable")
        got = yield self.consume(proc.port(), "durable", "all", retained["messages"])
        bodies = {m.body for m in got}
        self.assertEqual([b for b in acked if b not in bodies], [], "every OK'd message is in the retained log")


class AgeOutProcessTests(ReplayProcessTestCase):
    @defer.inlineCallbacks
    def test_segments_are_deleted_once_aged_out(self) -> None:
        proc = self.start("--retention", "2s", "--mem-queue-size", "100")
        p = yield connect(reactor, "127.0.0.1", proc.port())
        for batch in range(10):
            yield p.mpub("ticks", [b"t%05d" % i for i in range(batch * 100, batch * 100 + 100)])
        p.close()
        self.assertTrue(self.segments("ticks"))
        retained = yield self.retained("ticks")
        self.assertEqual(retained["messages"], 1000)

        @defer.inlineCallbacks
        def gone() -> Any:
            retained = yield self.retained("ticks")
            return retained["messages"] == 0 and not self.segments("ticks")

        yield self.until(gone, timeout=30)
        retained = yield self.retained("ticks")
        self.assertEqual((retained["bytes"], retained["segments"]), (0, 0))
        code, _ = yield self.call("POST", "/channel/create?topic=ticks&channel=late&since=earliest")
        self.assertEqual(code, 200)


class SpillProcessTests(ReplayProcessTestCase):
    """A retained topic's channel keeps its backlog as runs of the retained log (storage/spill.py)."""

    def queue_data_files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.dir) if ".diskqueue." in f and not f.endswith(".meta.dat"))

    @defer.inlineCallbacks
    def test_a_backlog_past_memory_is_written_once_and_survives_kill_9(self) -> None:
        flags = ("--retention", "1h", "--mem-queue-size", "100")
        proc = self.start(*flags)
        yield self.call("POST", "/topic/create?topic=orders")
        code, _ = yield self.call("POST", "/channel/create?topic=orders&channel=slow")
        self.assertEqual(code, 200)
        p = yield connect(reactor, "127.0.0.1", proc.port())
        for batch in range(30):
            answer = yield p.mpub("orders", [b"o%05d" % i for i in range(batch * 100, batch * 100 + 100)])
            self.assertEqual(answer, b"OK")
        p.close()
        _, doc = yield self.call("GET", "/stats?format=json&topic=orders")
        channel = doc["topics"][0]["channels"][0]
        self.assertEqual((channel["depth"], channel["backend_depth"]), (3000, 2900))
        self.assertEqual(self.queue_data_files(), [], "the backlog is in the retained log only")

        yield self.until(lambda: os.path.exists(os.path.join(self.dir, "orders:slow.spill.dat")))
        proc.signal(signal.SIGKILL)
        yield deferToThread(proc.wait)
        proc = self.start(*flags)
        got = yield self.consume(proc.port(), "orders", "slow", 2900)
        bodies = {m.body for m in got}
        missing = [i for i in range(100, 3000) if b"o%05d" % i not in bodies]
        self.assertEqual(missing, [], "everything past memory comes again after kill -9")


class RewindOrderProcessTests(ReplayProcessTestCase):
    """A rewind carried across a clean stop (SIGTERM) goes on in publish order (docs/replay.md)."""

    @defer.inlineCallbacks
    def check_order_across_sigterm(self, *flags: str) -> Any:
        total = 30_000
        proc = self.start("--retention", "1h", *flags)
        yield self.call("POST", "/topic/create?topic=log")
        yield self.publish(proc.port(), "log", [b"%06d" % i for i in range(total)])
        yield self.call("POST", "/topic/empty?topic=log")  # its own backlog: only the retained log is left
        code, _ = yield self.call("POST", "/channel/create?topic=log&channel=replay&since=earliest")
        self.assertEqual(code, 200)
        first = yield self.consume(proc.port(), "log", "replay", 10_000)
        yield self.until(lambda: self.idle("log", "replay"))
        stats = yield self.stats("log")
        self.assertGreater(stats["channels"][0]["rewind"]["messages_left"], 0, "stopped in the middle of the rewind")
        proc.signal(signal.SIGTERM)
        self.assertEqual((yield deferToThread(proc.wait)), 0)

        proc = self.start("--retention", "1h", *flags)
        rest = yield self.consume(proc.port(), "log", "replay", total - len(first))
        yield self.until(lambda: self.idle("log", "replay"))
        stats = yield self.stats("log")
        self.assertEqual((stats["channels"][0]["depth"], "rewind" in stats["channels"][0]), (0, False))
        bodies = [m.body for m in first + rest]
        self.assertEqual(sorted(bodies), [b"%06d" % i for i in range(total)], "every message once")
        self.assertEqual(inversions([m.body for m in rest]), 0, "in publish order after the restart")
        self.assertEqual(bodies, [b"%06d" % i for i in range(total)], "and across it")

    def test_a_rewind_goes_on_in_publish_order_after_a_clean_restart(self) -> Any:
        return self.check_order_across_sigterm()

    def test_the_same_in_durable_mode(self) -> Any:
        return self.check_order_across_sigterm("--mem-queue-size", "0", "--sync-every", "1")


class RewindBudgetProcessTests(ReplayProcessTestCase):
    """All rewinds together hold at most 20,000 messages and 16 MiB in their channels' memory (docs/replay.md)."""

    @defer.inlineCallbacks
    def test_many_channels_rewinding_without_consumers_hold_the_budget_at_most(self) -> Any:
        proc = self.start("--retention", "1h")
        yield self.call("POST", "/topic/create?topic=big")
        total = 20_000
        yield self.publish(proc.port(), "big", [b"%05d" % i + b"x" * 1019 for i in range(total)])
        yield self.call("POST", "/topic/empty?topic=big")
        rss_before = rss_mb(proc.proc.pid)  # type: ignore[union-attr]
        channels = [f"c{k:02d}" for k in range(16)]
        for channel in channels:  # one after the other: each start makes the others' shares smaller
            code, _ = yield self.call("POST", f"/channel/create?topic=big&channel={channel}&since=earliest")
            self.assertEqual(code, 200)

        @defer.inlineCallbacks
        def held() -> Any:
            stats = yield self.stats("big")
            return {c["channel_name"]: (c["depth"] - c["backend_depth"], c["memory_bytes"]) for c in stats["channels"]}

        before: list[Any] = [None]

        @defer.inlineCallbacks
        def settled() -> Any:  # two looks a while apart find the same
            now = yield held()
            same, before[0] = now == before[0], now
            return same

        yield self.until(settled)
        queued = before[0]
        self.assertEqual(sorted(queued), channels)
        self.assertLessEqual(sum(n for n, _ in queued.values()), 20_000)
        self.assertLessEqual(sum(b for _, b in queued.values()), (16 << 20) + 16 * 1024, "a record over each at most")
        self.assertGreater(min(n for n, _ in queued.values()), 0, "each has its share")
        self.assertLess(rss_mb(proc.proc.pid) - rss_before, 64, "RSS grows by about the budget")  # type: ignore[union-attr]

        got = yield self.consume(proc.port(), "big", "c07", total)  # one consumer: its channel goes on
        self.assertEqual([m.body[:5] for m in got], [b"%05d" % i for i in range(total)])
        queued = yield held()
        self.assertEqual(queued["c07"], (0, 0))
        self.assertEqual(
            {k: v for k, v in queued.items() if k != "c07"}, {k: v for k, v in before[0].items() if k != "c07"}
        )
