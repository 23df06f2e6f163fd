"""Dead letters, TTL, bounded queues and their settings with nsqd as a process and real clients."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import treq
from twisted.internet import defer, reactor, task
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from nsq_client.twisted_client import Consumer, connect
from tests.integration.procs import ServerProcess
from tests.integration.test_pynsq import _run

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")
SCRIPT = Path(__file__).with_name("pynsq_dead_letters.py")


class QueueSettingsProcessTestCase(unittest.TestCase):
    timeout = 180

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)

    def start(self, *args: str) -> ServerProcess:
        proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.dir, *args).start()
        self.addCleanup(proc.kill)
        self.http = f"127.0.0.1:{proc.port('HTTP')}"
        return proc

    @defer.inlineCallbacks
    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        resp = yield treq.request(method, f"http://{self.http}{path}", data=data, persistent=False)
        content = yield resp.content()
        return resp.code, json.loads(content) if content else None

    @defer.inlineCallbacks
    def stats(self, topic: str) -> Any:
        _, doc = yield self.call("GET", f"/stats?format=json&topic={topic}")
        return doc["topics"][0] if doc["topics"] else None

    @defer.inlineCallbacks
    def until(self, condition: Any, timeout: float = 60.0) -> Any:
        """Poll ``condition()`` (may return a Deferred) until it is true."""
        for _ in range(int(timeout / 0.1)):
            value = yield defer.maybeDeferred(condition)
            if value:
                return value
            yield task.deferLater(reactor, 0.1, lambda: None)
        self.fail(f"not true within {timeout}s: {condition}")

    def data_files(self, topic: str) -> list[str]:
        prefix = topic + ".diskqueue."
        return [f for f in os.listdir(self.dir) if f.startswith(prefix) and not f.endswith(".meta.dat")]

    @defer.inlineCallbacks
    def publish(self, port: int, topic: str, bodies: list[bytes], batch: int = 500) -> Any:
        p = yield connect(reactor, "127.0.0.1", port)
        for i in range(0, len(bodies), batch):
            answer = yield p.mpub(topic, bodies[i : i + batch])
            self.assertEqual(answer, b"OK")
        p.close()
        yield p.closed_d


class DeadLetterProcessTests(QueueSettingsProcessTestCase):
    @defer.inlineCallbacks
    def test_pynsq_consumer_that_requeues_everything(self) -> None:
        proc = self.start()
        yield self.call("POST", "/topic/create?topic=jobs")
        yield self.call("POST", "/channel/create?topic=jobs&channel=work")
        code, _ = yield self.call("PUT", "/channel/settings?topic=jobs&channel=work", {"max_attempts": 3})
        self.assertEqual(code, 200)
        out = yield _run([sys.executable, str(SCRIPT), f"127.0.0.1:{proc.port()}", "jobs", "50"])
        result = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(result["work"], {f"m{i}": [1, 2, 3] for i in range(50)}, "each delivered exactly 3 times")
        self.assertEqual(set(result["dead"]), {f"m{i}" for i in range(50)})
        self.assertEqual({d["attempts"] for d in result["dead"].values()}, {4}, "3 tries, then this delivery")
        channel = (yield self.stats("jobs"))["channels"][0]
        self.assertEqual((channel["dead_letter_count"], channel["depth"]), (50, 0))
        code, origin = yield self.call("GET", f"/topic/dead_letter?topic=jobs.dead&id={result['dead']['m7']['id']}")
        self.assertEqual((code, origin["topic"], origin["channel"], origin["attempts"]), (200, "jobs", "work", 3))
        resp = yield treq.get(f"http://{self.http}/metrics", persistent=False)
        text = (yield resp.content()).decode()
        self.assertIn('nsq_channel_dead_letters_total{channel="work",topic="jobs"} 50.0', text)
        self.assertIn('nsq_queue_setting{channel="work",setting="max_attempts",topic="jobs"} 3.0', text)

    @defer.inlineCallbacks
    def test_kill_9_while_dead_lettering_loses_nothing(self) -> None:
        durable = ("--mem-queue-size", "0", "--sync-every", "1")
        proc = self.start(*durable)
        port = proc.port()
        yield self.call("POST", "/topic/create?topic=jobs")
        yield self.call("POST", "/channel/create?topic=jobs&channel=work")
        yield self.call("PUT", "/channel/settings?topic=jobs&channel=work", {"max_attempts": 1})
        bodies = [b"m%05d" % i for i in range(3000)]
        yield self.publish(port, "jobs", bodies)

        requeued: list[bytes] = []

        def requeue(msg: Any) -> None:
            requeued.append(msg.body)
            if len(requeued) == 500:
                proc.signal(signal.SIGKILL)  # in the middle of the stream
            msg.requeue()

        yield Consumer.connect(reactor, "127.0.0.1", port, "jobs", "work", requeue, max_in_flight=50)
        yield deferToThread(proc.wait)

        proc = self.start(*durable)
        port = proc.port()
        left = (yield self.stats("jobs"))["channels"][0]["depth"]
        self.assertGreater(left, 0, "killed while messages were still moving")
        got: dict[str, set[bytes]] = {"work": set(), "dead": set()}

        def keep(where: str) -> Any:
            def handle(msg: Any) -> None:
                got[where].add(msg.body)
                if where == "work":
                    msg.requeue()  # moved to the dead letters, not lost

            return handle

        yield Consumer.connect(reactor, "127.0.0.1", port, "jobs", "work", keep("work"), max_in_flight=50)
        yield Consumer.connect(reactor, "127.0.0.1", port, "jobs.dead", "inspect", keep("dead"), max_in_flight=50)
        yield self.until(lambda: got["dead"] >= set(bodies), timeout=120)
        self.assertEqual(got["dead"], set(bodies), "every acknowledged message reached the dead-letter topic")


class TTLProcessTests(QueueSettingsProcessTestCase):
    @defer.inlineCallbacks
    def test_topic_without_consumers_empties_itself_and_its_files(self) -> None:
        proc = self.start("--mem-queue-size", "1000", "--max-bytes-per-file", "102400")
        yield self.call("POST", "/topic/create?topic=events")
        code, _ = yield self.call("PUT", "/topic/settings?topic=events", {"max_age": "2s"})
        self.assertEqual(code, 200)
        yield self.publish(proc.port(), "events", [b"e%06d" % i for i in range(20_000)])
        self.assertTrue(self.data_files("events"), "the backlog went to disk")
        stats = yield self.stats("events")
        self.assertEqual(stats["depth"], 20_000)

        @defer.inlineCallbacks
        def emptied() -> Any:
            topic = yield self.stats("events")
            return topic["depth"] == 0 and not self.data_files("events")

        yield self.until(emptied, timeout=30)
        topic = yield self.stats("events")
        self.assertEqual((topic["expired_count"], topic["settings"]["max_age"]), (20_000, "2s"))

    @defer.inlineCallbacks
    def test_consumer_gets_nothing_older(self) -> None:
        proc = self.start()
        yield self.call("POST", "/topic/create?topic=events")
        yield self.call("POST", "/channel/create?topic=events&channel=c")
        yield self.call("PUT", "/channel/settings?topic=events&channel=c", {"max_age": "1s"})
        yield self.publish(proc.port(), "events", [b"old"])
        yield self.until(lambda: self._expired("events"))
        yield self.publish(proc.port(), "events", [b"new"])
        got: list[bytes] = []
        yield Consumer.connect(reactor, "127.0.0.1", proc.port(), "events", "c", lambda m: got.append(m.body))
        yield self.until(lambda: got)
        self.assertEqual(got, [b"new"])

    @defer.inlineCallbacks
    def _expired(self, topic: str) -> Any:
        stats = yield self.stats(topic)
        return stats["channels"][0]["expired_count"] == 1


class BoundedProcessTests(QueueSettingsProcessTestCase):
    @defer.inlineCallbacks
    def test_drop_oldest_with_a_slow_consumer(self) -> None:
        proc = self.start("--mem-queue-size", "500")
        yield self.call("POST", "/topic/create?topic=ticks")
        yield self.call("POST", "/channel/create?topic=ticks&channel=slow")
        code, doc = yield self.call(
            "PUT", "/channel/settings?topic=ticks&channel=slow", {"max_depth": 1000, "overflow": "drop_oldest"}
        )
        self.assertEqual((code, doc["effective"]["max_depth"]), (200, 1000))
        depths = []
        p = yield connect(reactor, "127.0.0.1", proc.port())
        for i in range(0, 20_000, 500):
            yield p.mpub("ticks", [b"%06d" % n for n in range(i, i + 500)])
            depths.append((yield self.stats("ticks"))["channels"][0]["depth"])
        self.assertLessEqual(max(depths), 1000)
        got: list[int] = []
        yield Consumer.connect(
            reactor, "127.0.0.1", proc.port(), "ticks", "slow", lambda m: got.append(int(m.body)), max_in_flight=100
        )
        yield self.until(lambda: len(got) >= 1000)
        self.assertEqual(sorted(got), list(range(19_000, 20_000)), "the newest are kept")
        channel = (yield self.stats("ticks"))["channels"][0]
        self.assertEqual(channel["dropped_count"], 19_000)

    @defer.inlineCallbacks
    def test_reject_answers_e_pub_failed_and_503(self) -> None:
        proc = self.start()
        yield self.call("POST", "/topic/create?topic=capped")
        yield self.call("PUT", "/topic/settings?topic=capped", {"max_depth": 2})
        p = yield connect(reactor, "127.0.0.1", proc.port())
        self.assertEqual((yield p.mpub("capped", [b"a", b"b"])), b"OK")
        with self.assertRaises(Exception) as e:
            yield p.pub("capped", b"c")
        self.assertIn("E_PUB_FAILED PUB failed TOPIC(capped) max_depth 2 reached", str(e.exception))
        resp = yield treq.post(f"http://{self.http}/pub?topic=capped", b"c", persistent=False)
        self.assertEqual(resp.code, 503)
        self.assertEqual(
            json.loads((yield resp.content())),
            {"message": "QUEUE_FULL: TOPIC(capped) max_depth 2 reached (overflow reject)"},
        )
        resp = yield treq.get(f"http://{self.http}/ping", persistent=False)
        self.assertEqual((yield resp.content()), b"OK", "a full bounded queue is not an unhealthy node")


class SettingsProcessTests(QueueSettingsProcessTestCase):
    @defer.inlineCallbacks
    def test_settings_survive_kill_9_and_defaults_come_from_flags(self) -> None:
        proc = self.start("--max-age", "1h", "--max-attempts", "7")
        yield self.call("POST", "/topic/create?topic=t")
        yield self.call("POST", "/channel/create?topic=t&channel=c")
        code, doc = yield self.call("PUT", "/channel/settings?topic=t&channel=c", {"max_attempts": 2})
        self.assertEqual(doc["effective"]["max_age"], "1h0m0s")
        proc.kill()
        self.start()
        code, doc = yield self.call("GET", "/channel/settings?topic=t&channel=c")
        self.assertEqual((code, doc["settings"], doc["effective"]["max_age"]), (200, {"max_attempts": 2}, None))
        code, doc = yield self.call("PUT", "/channel/settings?topic=t&channel=c", {"max_attempts": 0})
        self.assertEqual((code, doc["message"]), (400, "INVALID_SETTINGS: max_attempts must be [1,65535]"))
        with open(os.path.join(self.dir, "nsqd.dat")) as f:
            meta = json.load(f)
        self.assertEqual(meta["topics"][0]["channels"][0]["settings"], {"max_attempts": 2})
