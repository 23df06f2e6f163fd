"""Queue settings under an operator's worst day, with nsqd as a process.

Bad values (a duration of 300 digits, a file that nests 200,000 deep), cycles of
dead-letter topics, clocks that were wrong, expiry of hundreds of thousands of
messages at once, DPUBs into bounded queues and kill -9 in durable mode: nothing
may stop a start, block the reactor, pass a bound or lose a message silently.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread

from nsq_client.twisted_client import Consumer, connect
from tests.integration.procs import ServerProcess, command
from tests.integration.test_queue_settings_process import LOOPBACK, QueueSettingsProcessTestCase

HUGE = "1" + "0" * 320 + "h"  # parses to an infinite number of seconds as a float


def libfaketime() -> str:
    """libfaketime's preload library (Debian's faketime; scripts/test installs it)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise AssertionError("libfaketime is needed: apt-get install faketime")
    return found[0]


class Case(QueueSettingsProcessTestCase):
    timeout = 240

    @defer.inlineCallbacks
    def channel_stats(self, topic: str, channel: str) -> Any:
        doc = yield self.stats(topic)
        for c in doc["channels"] if doc else []:
            if c["channel_name"] == channel:
                return c
        return None

    @defer.inlineCallbacks
    def create(self, topic: str, *channels: str) -> Any:
        code, _ = yield self.call("POST", f"/topic/create?topic={topic}")
        self.assertEqual(code, 200)
        for channel in channels:
            code, _ = yield self.call("POST", f"/channel/create?topic={topic}&channel={channel}")
            self.assertEqual(code, 200)

    @defer.inlineCallbacks
    def settings(self, topic: str, channel: str | None, doc: Any) -> Any:
        where = f"topic={topic}" + (f"&channel={channel}" if channel else "")
        kind = "channel" if channel else "topic"
        result = yield self.call("PUT", f"/{kind}/settings?{where}", doc)
        return result

    @defer.inlineCallbacks
    def ping(self) -> Any:
        """GET /ping: (seconds it took, body)."""
        started = time.monotonic()
        resp = yield treq.get(f"http://{self.http}/ping", persistent=False)
        body = yield resp.content()
        return time.monotonic() - started, body


class SettingsValuesTests(Case):
    @defer.inlineCallbacks
    def test_a_duration_past_go_s_range_is_refused_and_the_node_keeps_saving(self) -> None:
        proc = self.start()
        yield self.create("t", "c")
        where = (("channel", "c", "max_age"), ("topic", None, "retention"), ("topic", None, "max_age"))
        for kind, channel, key in where:
            for value in (HUGE, "3000000h", "1e400h", "9223372037s"):
                code, doc = yield self.settings("t", channel, {key: value})
                self.assertEqual(code, 400, f"{kind} {key}={value}")
                self.assertTrue(doc["message"].startswith(f"INVALID_SETTINGS: {key}"), doc)
        code, doc = yield self.settings("t", "c", {"max_age": "2562047h"})  # Go's largest whole hours
        self.assertEqual((code, doc["settings"]["max_age"]), (200, "2562047h0m0s"))
        for path in ("/channel/settings?topic=t&channel=c", "/topic/settings?topic=t", "/stats?format=json"):
            code, _ = yield self.call("GET", path)
            self.assertEqual(code, 200, path)
        yield self.create("after")
        self.assertEqual((yield deferToThread(proc.stop)), 0)
        with open(os.path.join(self.dir, "nsqd.dat")) as f:
            names = [t["name"] for t in json.load(f)["topics"]]
        self.assertIn("after", names)

    @defer.inlineCallbacks
    def test_a_settings_body_over_64_kib_is_413(self) -> None:
        self.start()
        yield self.create("t")
        body = json.dumps({"max_depth": 1, "pad": "x" * 70_000}).encode()
        resp = yield treq.put(f"http://{self.http}/topic/settings?topic=t", body, persistent=False)
        self.assertEqual((resp.code, json.loads((yield resp.content()))), (413, {"message": "BODY_TOO_BIG"}))

    @defer.inlineCallbacks
    def test_bad_values_in_nsqd_dat_never_stop_a_start(self) -> None:
        proc = self.start()
        yield self.create("t", "c")
        self.assertEqual((yield deferToThread(proc.stop)), 0)
        path = os.path.join(self.dir, "nsqd.dat")
        with open(path) as f:
            meta = json.load(f)
        meta["topics"][0]["settings"] = {"retention": "3000000h", "max_depth": 7}
        meta["topics"][0]["channels"][0]["settings"] = {"max_age": HUGE, "max_attempts": 3, "max_bytes": [[[1]]]}
        with open(path, "w") as f:
            json.dump(meta, f)
        proc = self.start()
        code, doc = yield self.call("GET", "/channel/settings?topic=t&channel=c")
        self.assertEqual((code, doc["settings"]), (200, {"max_attempts": 3}), "only the bad keys are ignored")
        code, doc = yield self.call("GET", "/topic/settings?topic=t")
        self.assertEqual((code, doc["settings"]), (200, {"max_depth": 7}))
        warnings = [line for line in proc.lines if "ignoring" in line and "nsqd.dat" in line]
        self.assertEqual(len(warnings), 3, proc.lines)
        self.assertEqual((yield deferToThread(proc.stop)), 0)

    def test_a_huge_duration_flag_is_refused_at_start(self) -> None:
        for flag in ("--max-age", "--retention"):
            proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.dir, flag, HUGE)
            with self.assertRaises(RuntimeError) as e:
                proc.start()
            self.assertIn(flag.lstrip("-"), str(e.exception))
            self.assertNotIn("Traceback", str(e.exception))


class DeadLetterFaultTests(Case):
    @defer.inlineCallbacks
    def test_a_ttl_cycle_of_dead_letter_topics_ends(self) -> None:
        proc = self.start("--mem-queue-size", "100000")
        yield self.create("A", "c")
        yield self.create("B", "c")
        for here, there in (("A", "B"), ("B", "A")):
            code, _ = yield self.settings(
                here, "c", {"max_age": "1s", "expire_to_dead_letter": True, "dead_letter_topic": there}
            )
            self.assertEqual(code, 200)
        n = 5000
        yield self.publish(proc.port(), "A", [b"m%05d" % i for i in range(n)])

        @defer.inlineCallbacks
        def settled() -> Any:
            a = yield self.channel_stats("A", "c")
            b = yield self.channel_stats("B", "c")
            moves = a["dead_letter_count"] + b["dead_letter_count"]
            if moves > n:
                raise AssertionError(f"{moves} moves for {n} messages: the cycle goes on")
            return a["depth"] == b["depth"] == 0 and moves == n

        yield self.until(settled, timeout=60)
        a = yield self.channel_stats("A", "c")
        b = yield self.channel_stats("B", "c")
        self.assertEqual((a["dead_letter_count"], b["expired_count"], b["dead_letter_count"]), (n, n, 0))
        self.assertTrue(any("arrived already past max_age" in line for line in proc.lines), proc.lines[-20:])

    @defer.inlineCallbacks
    def test_an_ephemeral_dead_letter_topic_is_refused(self) -> None:
        self.start()
        yield self.create("t", "c")
        code, doc = yield self.settings("t", "c", {"max_attempts": 2, "dead_letter_topic": "dl#ephemeral"})
        self.assertEqual(code, 400)
        self.assertIn("dead_letter_topic", doc["message"])
        proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.mktemp(), "--dead-letter-topic", "dl#ephemeral")
        with self.assertRaises(RuntimeError) as e:
            proc.start()
        self.assertIn("dead-letter-topic", str(e.exception))

    @defer.inlineCallbacks
    def test_expire_to_dead_letter_alone_goes_to_topic_dot_dead(self) -> None:
        proc = self.start()
        yield self.create("t", "c")
        code, doc = yield self.settings("t", "c", {"max_age": "1s", "expire_to_dead_letter": True})
        self.assertEqual((code, doc["effective"]["dead_letter_topic"]), (200, "t.dead"))
        yield self.publish(proc.port(), "t", [b"m%03d" % i for i in range(100)])

        @defer.inlineCallbacks
        def moved() -> Any:
            dead = yield self.stats("t.dead")
            return dead is not None and dead["depth"] == 100

        yield self.until(moved)
        c = yield self.channel_stats("t", "c")
        self.assertEqual((c["dead_letter_count"], c["depth"]), (100, 0))

    @defer.inlineCallbacks
    def test_a_deeply_nested_dead_letters_json_does_not_stop_a_start(self) -> None:
        with open(os.path.join(self.dir, "dead_letters.json"), "w") as f:
            f.write("[" * 200_000 + "]" * 200_000)
        proc = self.start()
        ok = yield self.ping()
        self.assertEqual(ok[1], b"OK")
        self.assertTrue(any("dead_letters.json" in line and "ignoring" in line for line in proc.lines), proc.lines)


class ExpiryFaultTests(Case):
    @defer.inlineCallbacks
    def test_messages_stamped_in_the_future_do_not_stop_the_sweep(self) -> None:
        args = (*LOOPBACK, "--data-path", self.dir, "--mem-queue-size", "0", "--max-bytes-per-file", "102400")
        env = [f"LD_PRELOAD={libfaketime()}", "FAKETIME=+3650d"]  # env execs nsqd: SIGTERM reaches it
        ahead = ServerProcess("nsqd", argv=["env", *env, *command("nsqd"), *args]).start()
        self.addCleanup(ahead.kill)
        self.http = f"127.0.0.1:{ahead.port('HTTP')}"
        yield self.publish(ahead.port(), "events", [b"future %d" % i for i in range(10)])
        self.assertEqual((yield deferToThread(ahead.stop)), 0)

        proc = self.start("--mem-queue-size", "1000", "--max-bytes-per-file", "102400")
        yield self.publish(proc.port(), "events", [b"e%06d" % i for i in range(20_000)])
        code, _ = yield self.settings("events", None, {"max_age": "1s"})
        self.assertEqual(code, 200)

        @defer.inlineCallbacks
        def emptied() -> Any:
            topic = yield self.stats("events")
            return topic["depth"] == 0 and topic["expired_count"] == 20_010 and not self.data_files("events")

        yield self.until(emptied, timeout=60)
        self.assertTrue(any("in the future" in line for line in proc.lines), proc.lines[-20:])

    @defer.inlineCallbacks
    def _watch(self, topic: str, channel: str | None, total: int) -> Any:
        """Poll /ping and the queue until ``total`` expired: the slowest /ping and
        (monotonic time, expired_count) samples."""
        slowest = 0.0
        samples: list[tuple[float, int]] = []
        while True:
            took, body = yield self.ping()
            self.assertEqual(body, b"OK")
            slowest = max(slowest, took)
            queue = (yield self.channel_stats(topic, channel)) if channel else (yield self.stats(topic))
            samples.append((time.monotonic(), queue["expired_count"]))
            if queue["expired_count"] >= total:
                return slowest, samples

    def _assert_rate(self, samples: list[tuple[float, int]], rate: int = 100_000, slack: int = 20_000) -> None:
        for i, (t0, n0) in enumerate(samples):
            for t1, n1 in samples[i + 1 :]:
                self.assertLessEqual(n1 - n0, rate * (t1 - t0) + slack, f"{n1 - n0} expired in {t1 - t0:.2f}s")

    @defer.inlineCallbacks
    def test_expiring_to_a_dead_letter_topic_keeps_to_the_rate_and_the_node_responsive(self) -> None:
        proc = self.start("--mem-queue-size", "10000")
        yield self.create("t", "c")
        n = 250_000
        yield self.publish(proc.port(), "t", [b"%06d" % i for i in range(n)])
        code, _ = yield self.settings("t", "c", {"max_age": "1s", "expire_to_dead_letter": True})
        self.assertEqual(code, 200)
        slowest, samples = yield self._watch("t", "c", n)
        self._assert_rate(samples)
        self.assertLess(slowest, 1.0, "a /ping waited on the expiry")
        dead = yield self.stats("t.dead")
        self.assertEqual(dead["depth"], n)

    @defer.inlineCallbacks
    def test_a_consumer_meeting_an_expired_backlog_does_not_block_the_node(self) -> None:
        proc = self.start("--mem-queue-size", "1000", "--max-bytes-per-file", "1048576")
        yield self.create("t", "c")
        n = 300_000
        yield self.publish(proc.port(), "t", [b"%06d" % i for i in range(n)])
        code, _ = yield self.settings("t", "c", {"max_age": "2s"})
        self.assertEqual(code, 200)

        @defer.inlineCallbacks
        def all_expired_now() -> Any:
            c = yield self.channel_stats("t", "c")
            return c["oldest_message_age_ms"] >= 2500

        # the sweep would take 3 s at its rate: a consumer gets there first
        yield self.until(all_expired_now)
        got: list[bytes] = []
        yield Consumer.connect(reactor, "127.0.0.1", proc.port(), "t", "c", lambda m: got.append(m.body))
        slowest, _ = yield self._watch("t", "c", n)
        self.assertLess(slowest, 1.0, "a /ping waited on the expiry")
        yield self.publish(proc.port(), "t", [b"fresh"])
        yield self.until(lambda: got == [b"fresh"])

        def files_given_back() -> bool:
            return not [f for f in os.listdir(self.dir) if f.startswith("t:c.diskqueue.") and ".meta." not in f]

        yield self.until(files_given_back)


class BoundFaultTests(Case):
    @defer.inlineCallbacks
    def _dpubs(self, port: int, count: int, delay_ms: int) -> Any:
        """``count`` DPUBs, each on a connection of its own: how many were answered OK."""
        ok = 0
        for i in range(count):
            p = yield connect(reactor, "127.0.0.1", port)
            try:
                yield p.dpub("t", delay_ms, b"d%d" % i)
                ok += 1
            except Exception as e:
                self.assertIn("E_DPUB_FAILED DPUB failed CHANNEL(t:c) max_depth 5 reached", str(e))
            p.close()
        return ok

    @defer.inlineCallbacks
    def test_dpub_into_a_full_reject_queue_is_refused(self) -> None:
        proc = self.start()
        yield self.create("t", "c")
        code, _ = yield self.settings("t", "c", {"max_depth": 5})
        self.assertEqual(code, 200)
        ok = yield self._dpubs(proc.port(), 20, 1000)
        self.assertEqual(ok, 5)
        resp = yield treq.post(f"http://{self.http}/pub?topic=t&defer=1000", b"x", persistent=False)
        self.assertEqual(resp.code, 503)

        @defer.inlineCallbacks
        def due() -> Any:
            c = yield self.channel_stats("t", "c")
            return c["deferred_count"] == 0 and c["depth"] == 5

        yield self.until(due)

    @defer.inlineCallbacks
    def test_pipelined_dpubs_stop_at_the_bound(self) -> None:
        proc = self.start()
        yield self.create("t", "c")
        yield self.settings("t", "c", {"max_depth": 100})
        p = yield connect(reactor, "127.0.0.1", proc.port())
        answers = yield defer.DeferredList([p.dpub("t", 1, b"%d" % i) for i in range(5000)], consumeErrors=True)
        self.assertEqual(sum(1 for ok, _ in answers if ok), 100)

        @defer.inlineCallbacks
        def due() -> Any:
            c = yield self.channel_stats("t", "c")
            return c["deferred_count"] == 0 and c["depth"] == 100

        yield self.until(due)

    @defer.inlineCallbacks
    def test_a_lowered_bound_applies_at_once(self) -> None:
        proc = self.start()
        yield self.create("t", "c")
        yield self.publish(proc.port(), "t", [b"%04d" % i for i in range(1000)])
        code, _ = yield self.settings("t", "c", {"max_depth": 100, "overflow": "drop_oldest"})
        self.assertEqual(code, 200)
        c = yield self.channel_stats("t", "c")
        self.assertEqual((c["depth"], c["dropped_count"]), (100, 900))

    @defer.inlineCallbacks
    def test_requeued_messages_are_trimmed_by_drop_oldest(self) -> None:
        proc = self.start()
        yield self.create("t", "c")
        yield self.settings("t", "c", {"max_depth": 10, "overflow": "drop_oldest"})
        yield self.publish(proc.port(), "t", [b"old%d" % i for i in range(10)])
        held: list[Any] = []

        def hold(msg: Any) -> Any:
            held.append(msg)
            return defer.Deferred()  # answered below, by hand

        consumer = yield Consumer.connect(reactor, "127.0.0.1", proc.port(), "t", "c", hold, max_in_flight=10)
        yield self.until(lambda: len(held) == 10)
        consumer.conn.rdy(0)  # what comes back stays queued
        yield self.publish(proc.port(), "t", [b"new%d" % i for i in range(10)])
        for msg in held:
            msg.requeue()

        @defer.inlineCallbacks
        def trimmed() -> Any:
            c = yield self.channel_stats("t", "c")
            return c["in_flight_count"] == 0 and c["depth"] == 10 and c["dropped_count"] == 10

        yield self.until(trimmed)

    @defer.inlineCallbacks
    def test_durable_drop_oldest_across_kill_9(self) -> None:
        durable = ("--mem-queue-size", "0", "--sync-every", "1")
        proc = self.start(*durable)
        yield self.create("t", "c")
        yield self.settings("t", "c", {"max_depth": 200, "overflow": "drop_oldest"})
        held: list[Any] = []

        def hold(msg: Any) -> Any:
            held.append(msg)
            return defer.Deferred()  # never finished: the cursor stays at the first of them

        yield Consumer.connect(reactor, "127.0.0.1", proc.port(), "t", "c", hold, max_in_flight=20)
        yield self.publish(proc.port(), "t", [b"a%04d" % i for i in range(20)])
        yield self.until(lambda: len(held) == 20)
        yield self.publish(proc.port(), "t", [b"b%04d" % i for i in range(1980)])
        c = yield self.channel_stats("t", "c")
        self.assertEqual((c["depth"], c["in_flight_count"], c["dropped_count"]), (200, 20, 1780))
        proc.signal(signal.SIGKILL)
        yield deferToThread(proc.wait)

        proc = self.start(*durable)
        c = yield self.channel_stats("t", "c")
        # the 20 that were in flight are queued again, the oldest: the bound drops them
        self.assertEqual((c["depth"], c["dropped_count"]), (200, 1800))
        got: set[bytes] = set()
        yield Consumer.connect(reactor, "127.0.0.1", proc.port(), "t", "c", lambda m: got.add(m.body))
        yield self.until(lambda: len(got) >= 200)
        self.assertEqual(got, {b"b%04d" % i for i in range(1780, 1980)})

        @defer.inlineCallbacks
        def accounted() -> Any:
            c = yield self.channel_stats("t", "c")
            finished = sum(client["finish_count"] for client in c["clients"])
            return finished + c["dropped_count"] == 2000 and c["depth"] == c["in_flight_count"] == 0

        yield self.until(accounted)  # acknowledged = finished + dropped
