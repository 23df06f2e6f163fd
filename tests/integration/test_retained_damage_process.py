"""A damaged or missing part of a retained log, with nsqd as a process: a damaged record costs
that record (rewinds, a backlog kept in the log), a missing segment is never skipped in silence."""

from __future__ import annotations

import os
import signal
import struct
from typing import Any
from urllib.parse import quote

from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread

from nsq_client.twisted_client import Consumer
from nsq_wire.gofmt import rfc3339_nano
from tests.integration.test_replay_process import ReplayProcessTestCase

# records of 330 bytes, 100 to a publish: a segment of --max-bytes-per-file 400000 seals at
# 1,200 records (396,000 bytes), with an index entry at record 0 and at record 800
SEGMENT_FLAGS = ("--retention", "1h", "--mem-queue-size", "100", "--max-bytes-per-file", "400000")


def body(i: int) -> bytes:
    return b"%05d" % i + b"." * 295


def records_of(path: str) -> list[tuple[int, int]]:
    """(offset, timestamp) of each record of a retained segment, as framed on disk."""
    with open(path, "rb") as f:
        data = f.read()
    out, at = [], 0
    while at + 4 <= len(data):
        (size,) = struct.unpack_from(">i", data, at)
        (ts,) = struct.unpack_from(">q", data, at + 4)
        out.append((at, ts))
        at += 4 + size
    return out


class RetainedFaultsTestCase(ReplayProcessTestCase):
    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def logged(self, proc: Any, *parts: str) -> list[str]:
        """The lines ``proc`` logged that have every one of ``parts``."""
        return [line for line in proc.lines if all(p in line for p in parts)]

    @defer.inlineCallbacks
    def stop(self, proc: Any) -> Any:
        proc.signal(signal.SIGTERM)
        code = yield deferToThread(proc.wait)
        self.assertEqual(code, 0)

    @defer.inlineCallbacks
    def drain(self, port: int, topic: str, channel: str) -> Any:
        """The bodies a consumer that FINs everything gets, until the channel holds nothing
        (nothing queued, in flight or still to rewind)."""
        got: list[bytes] = []
        consumer = yield Consumer.connect(
            reactor, "127.0.0.1", port, topic, channel, lambda m: got.append(m.body), max_in_flight=500
        )

        @defer.inlineCallbacks
        def idle() -> Any:
            stats = yield self.stats(topic)
            (c,) = [c for c in stats["channels"] if c["channel_name"] == channel]
            return got and c["depth"] == 0 and c["in_flight_count"] == 0 and "rewind" not in c

        yield self.until(idle)
        yield consumer.close()
        return got


class DamageProcessTests(RetainedFaultsTestCase):
    """Issue 36, 1: a flipped size prefix a third of the way into a sealed segment."""

    @defer.inlineCallbacks
    def check_one_record_lost(self, drop_index: bool) -> Any:
        proc = self.start(*SEGMENT_FLAGS)
        yield self.call("POST", "/topic/create?topic=events")
        yield self.call("POST", "/channel/create?topic=events&channel=slow")  # its backlog: runs of the log
        bodies = [body(i) for i in range(2400)]
        yield self.publish(proc.port(), "events", bodies, batch=100)
        yield self.stop(proc)
        segment = self.path("events.retained.000000.dat")
        offsets = [at for at, _ in records_of(segment)]
        self.assertEqual(len(offsets), 1200, "two sealed segments of 1,200 records")
        size = os.path.getsize(segment)
        victim = len(offsets) // 3
        at = offsets[victim]
        with open(segment, "r+b") as f:
            f.seek(at)
            prefix = f.read(4)
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in prefix))
        if drop_index:
            os.remove(self.path("events.retained.000000.idx"))

        proc = self.start(*SEGMENT_FLAGS)
        port = proc.port()
        expected = bodies[:victim] + bodies[victim + 1 :]
        code, _ = yield self.call("POST", "/channel/create?topic=events&channel=backfill&since=earliest")
        self.assertEqual(code, 200)
        rewound = yield self.drain(port, "events", "backfill")
        self.assertEqual(len(rewound), 2399, "a rewind loses the damaged record only")
        self.assertEqual(rewound, expected, "every other record once, in publish order")
        backlog = yield self.drain(port, "events", "slow")
        self.assertEqual(len(backlog), 2399, "a backlog kept in the log loses the damaged record only")
        self.assertEqual(backlog, expected)

        retained = yield self.retained("events")
        self.assertEqual(retained["damaged"], 1)
        self.assertEqual(os.path.getsize(segment), size, "nothing cut")
        bad = [f for f in os.listdir(self.dir) if f.startswith("events.retained.000000.dat.bad.")]
        self.assertEqual(bad, [f"events.retained.000000.dat.bad.{at}"], "the damaged bytes kept aside once")
        reported = [line for line in proc.lines if "damaged" in line and f"offset {at}" in line]
        self.assertEqual(len(reported), 1, "logged once, however many readers cross it")

    def test_a_damaged_record_in_a_segment_with_its_index(self) -> Any:
        return self.check_one_record_lost(drop_index=False)

    def test_a_damaged_record_in_a_segment_without_its_index(self) -> Any:
        return self.check_one_record_lost(drop_index=True)


class GapProcessTests(RetainedFaultsTestCase):
    """Issue 36, 2: a segment missing from the data path."""

    FLAGS = ("--retention", "1h", "--max-bytes-per-file", "200000")  # 600 records a segment

    @defer.inlineCallbacks
    def published(self) -> Any:
        proc = self.start(*self.FLAGS)
        yield self.call("POST", "/topic/create?topic=events")
        yield self.call("POST", "/channel/create?topic=events&channel=all")  # the topic keeps no backlog
        yield self.publish(proc.port(), "events", [body(i) for i in range(5000)], batch=100)
        yield self.stop(proc)
        return sorted(f for f in os.listdir(self.dir) if f.startswith("events.retained.0") and f.endswith(".dat"))

    @defer.inlineCallbacks
    def test_a_rewind_into_a_missing_middle_segment_is_refused(self) -> Any:
        segments = yield self.published()
        self.assertEqual(len(segments), 9, "0-599, 600-1199, ..., 4800-4999")
        before, missing, after = (records_of(self.path(f"events.retained.00000{n}.dat")) for n in (3, 4, 5))
        os.remove(self.path("events.retained.000004.dat"))
        os.remove(self.path("events.retained.000004.idx"))

        proc = self.start(*self.FLAGS)
        newest_before, oldest_after = before[-1][1], after[0][1]
        yield self.until(lambda: self.logged(proc, "TOPIC(events)", "retained log:"), timeout=15)
        warned = self.logged(proc, "WARNING", "events.retained.000004.dat")
        self.assertEqual(len(warned), 1, proc.lines)
        self.assertIn(rfc3339_nano(newest_before), warned[0])
        self.assertIn(rfc3339_nano(oldest_after), warned[0])

        inside = rfc3339_nano(missing[300][1])
        code, answer = yield self.call("POST", f"/channel/create?topic=events&channel=late&since={quote(inside)}")
        self.assertEqual(code, 400)
        self.assertTrue(answer["message"].startswith("RETAINED_GAP: "), answer)
        yield self.call("POST", "/channel/create?topic=events&channel=c")
        code, answer = yield self.call("POST", f"/channel/rewind?topic=events&channel=c&since={quote(inside)}")
        self.assertEqual(code, 400)
        self.assertEqual(
            answer,
            {
                "message": f"RETAINED_GAP: messages published from {rfc3339_nano(newest_before)} to "
                f"{rfc3339_nano(oldest_after)} are missing from the retained log",
                "missing_from": rfc3339_nano(newest_before),
                "missing_to": rfc3339_nano(oldest_after),
                "missing_to_ms": -(-oldest_after // 1_000_000),
                "segments": [4, 4],
            },
        )

        code, _ = yield self.call("POST", f"/channel/rewind?topic=events&channel=c&since={answer['missing_to_ms']}")
        self.assertEqual(code, 200, "the time in ms after the gap is accepted")
        since = quote(answer["missing_to"])
        code, answer = yield self.call("POST", f"/channel/rewind?topic=events&channel=c&since={since}")
        self.assertEqual((code, answer["messages"], "gaps" in answer), (200, 2000, False), "from after the gap on")
        code, answer = yield self.call("POST", "/channel/rewind?topic=events&channel=c&since=earliest")
        self.assertEqual(code, 200)
        self.assertEqual(answer["messages"], 4400)
        self.assertEqual(answer["gaps"], [{"segments": [4, 4], "from": newest_before, "to": oldest_after}])
        got = yield self.drain(proc.port(), "events", "c")
        self.assertEqual(sorted(set(got)), [body(i) for i in range(5000) if not 2400 <= i < 3000])

    @defer.inlineCallbacks
    def test_a_missing_head_segment_moves_available_since(self) -> Any:
        yield self.published()
        first = records_of(self.path("events.retained.000000.dat"))
        second = records_of(self.path("events.retained.000001.dat"))
        os.remove(self.path("events.retained.000000.dat"))

        proc = self.start(*self.FLAGS)
        yield self.until(lambda: self.logged(proc, "TOPIC(events)", "retained log:"), timeout=15)
        self.assertTrue(self.logged(proc, "WARNING", "events.retained.000000.dat"), proc.lines)
        retained = yield self.retained("events")
        self.assertEqual((retained["available_since"], retained["messages"]), (second[0][1], 4400))
        yield self.call("POST", "/channel/create?topic=events&channel=c")
        code, answer = yield self.call(
            "POST", f"/channel/rewind?topic=events&channel=c&since={quote(rfc3339_nano(first[0][1]))}"
        )
        self.assertEqual(code, 400)
        self.assertEqual(answer["earliest"], rfc3339_nano(second[0][1]), "SINCE_TOO_OLD: from the next segment on")
