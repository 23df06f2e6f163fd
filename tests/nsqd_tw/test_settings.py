"""Per-queue settings (beyond Go): dead letters, TTL, bounded queues, and their HTTP and nsqd.dat faces."""

from __future__ import annotations

import json
import os
import random
from typing import Any

from treq.testing import StubTreq
from twisted.internet import defer
from twisted.trial import unittest

from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE
from nsqd_tw.core.metadata import decode_metadata
from nsqd_tw.core.queue import QueueFull
from nsqd_tw.core.settings import Policy, SettingsError, parse_settings, resolve, settings_json
from nsqd_tw.http.api import NSQDHTTPAPI
from nsqd_tw.http.stats import get_stats
from tests.helpers import FakeClient, make_nsqd


class ParseTests(unittest.TestCase):
    def test_values_kept_and_written_back(self) -> None:
        own = parse_settings(
            {
                "max_attempts": 5,
                "dead_letter_topic": "errors",
                "expire_to_dead_letter": True,
                "max_age": "1m30s",
                "max_depth": 0,
                "max_bytes": 1024,
                "overflow": "drop_oldest",
            }
        )
        self.assertEqual(own["max_age"], 90.0)
        self.assertEqual(
            settings_json(own),
            {
                "max_attempts": 5,
                "dead_letter_topic": "errors",
                "expire_to_dead_letter": True,
                "max_age": "1m30s",
                "max_depth": 0,
                "max_bytes": 1024,
                "overflow": "drop_oldest",
            },
        )

    def test_refusals_say_what(self) -> None:
        for doc, text in [
            ([], "settings must be a JSON object"),
            ({"max_retries": 3}, "unknown setting 'max_retries'"),
            ({"max_attempts": 0}, "max_attempts must be [1,65535]"),
            ({"max_attempts": 65536}, "max_attempts must be [1,65535]"),
            ({"max_attempts": "3"}, "max_attempts must be an integer"),
            ({"max_attempts": True}, "max_attempts must be an integer"),
            ({"dead_letter_topic": "bad name"}, "dead_letter_topic must be a valid topic name"),
            ({"max_age": 30}, "max_age must be a duration string"),
            ({"max_age": "soon"}, "max_age: invalid duration 'soon'"),
            ({"max_age": "3000000h"}, "max_age: invalid duration '3000000h'"),
            ({"retention": "1" + "0" * 320 + "h"}, "retention: invalid duration"),
            ({"dead_letter_topic": "dl#ephemeral"}, "dead_letter_topic must not be ephemeral"),
            ({"max_age": "0s"}, "max_age must be positive"),
            ({"max_depth": -1}, "max_depth must be >= 0"),
            ({"overflow": "drop_newest"}, "overflow must be one of reject, drop_oldest"),
            ({"expire_to_dead_letter": 1}, "expire_to_dead_letter must be true or false"),
        ]:
            with self.assertRaises(SettingsError) as e:
                parse_settings(doc)
            self.assertIn(text, str(e.exception), doc)

    def test_null_clears(self) -> None:
        self.assertEqual(parse_settings({"max_depth": None}), {"max_depth": None})

    def test_layers(self) -> None:
        channel = {"max_attempts": 3}
        topic = {"max_attempts": 9, "max_age": 60.0}
        defaults = {"overflow": "reject", "max_depth": 100}
        policy = resolve(channel, topic, defaults)
        self.assertEqual((policy.max_attempts, policy.max_age, policy.max_depth), (3, 60.0, 100))
        self.assertFalse(resolve({}, {"overflow": "reject"}).active)

    def test_default_dead_letter_topic(self) -> None:
        self.assertEqual(Policy(max_attempts=3).dead_letter_to("orders"), "orders.dead")
        self.assertEqual(Policy(max_attempts=3).dead_letter_to("clicks#ephemeral"), "clicks.dead")
        self.assertEqual(Policy(dead_letter_topic="x").dead_letter_to("orders"), "x")
        self.assertIsNone(Policy().dead_letter_to("orders"))


class Base(unittest.TestCase):
    options: dict[str, Any] = {}

    def setUp(self) -> None:
        self.nsqd = make_nsqd(**self.options)
        self.clock = self.nsqd.reactor
        self.producer = FakeClient(self.nsqd)

    def consumer(self, topic: str, channel: str, rdy: int = 100) -> FakeClient:
        c = FakeClient(self.nsqd)
        c.identify(msg_timeout=1000)
        self.assertEqual(c.sub(topic, channel, rdy), (FRAME_TYPE_RESPONSE, b"OK"))
        return c

    def settings(self, topic: str, channel: str | None = None, **values: Any) -> None:
        t = self.nsqd.get_topic(topic)
        t.update_settings(parse_settings(values), t.get_channel(channel) if channel else None)


class DeadLetterTests(Base):
    def test_requeued_n_times_then_dead_lettered(self) -> None:
        self.nsqd.get_topic("t").get_channel("c")
        self.settings("t", "c", max_attempts=3)
        consumer = self.consumer("t", "c")
        self.producer.mpub("t", [b"a", b"b"])
        seen: dict[bytes, list[int]] = {}
        for _ in range(10):
            for msg in consumer.messages():
                seen.setdefault(msg.body, []).append(msg.attempts)
                consumer.command(b"REQ", msg.id, b"0")
        self.assertEqual(seen, {b"a": [1, 2, 3], b"b": [1, 2, 3]})
        channel = self.nsqd.get_topic("t").get_channel("c")
        self.assertEqual((channel.dead_letter_count, channel.depth(), len(channel.in_flight)), (2, 0, 0))
        dead = self.nsqd.get_topic("t.dead")
        self.assertEqual(dead.depth(), 2)
        kept = dead.queued()
        self.assertEqual(sorted(m.body for m in kept), [b"a", b"b"])
        self.assertEqual({m.attempts for m in kept}, {3})

    def test_body_id_timestamp_kept(self) -> None:
        self.settings("t", max_attempts=1)  # the topic's setting is its channels' default
        consumer = self.consumer("t", "c")
        self.producer.pub("t", b"poison")
        (msg,) = consumer.messages()
        self.clock.advance(5)
        consumer.command(b"REQ", msg.id, b"1000")  # a delayed REQ past the limit goes at once
        (dead,) = self.nsqd.get_topic("t.dead").queued()
        self.assertEqual((dead.id, dead.body, dead.timestamp, dead.attempts), (msg.id, b"poison", msg.timestamp, 1))
        self.assertEqual(len(self.nsqd.get_topic("t").get_channel("c").deferred), 0)

    def test_timeouts_count(self) -> None:
        self.settings("t", "c", max_attempts=2, dead_letter_topic="errors")
        consumer = FakeClient(self.nsqd)
        consumer.identify(msg_timeout=1000)
        consumer.sub("t", "c", 10)
        self.producer.pub("t", b"slow")
        for _ in range(2):
            self.assertEqual(len(consumer.messages()), 1)
            self.clock.advance(1.1)
            self.nsqd.queue_scan()
        self.assertEqual(consumer.messages(), [])
        self.assertEqual(self.nsqd.get_topic("errors").depth(), 1)

    def test_dead_letter_consumer_reads_it(self) -> None:
        self.settings("t", "c", max_attempts=1)
        dead_reader = self.consumer("t.dead", "inspect")
        consumer = self.consumer("t", "c")
        self.producer.pub("t", b"x")
        (msg,) = consumer.messages()
        consumer.command(b"REQ", msg.id, b"0")
        (dead,) = dead_reader.messages()
        self.assertEqual((dead.id, dead.body, dead.attempts), (msg.id, b"x", 2))

    def test_disconnect_counts_as_a_return(self) -> None:
        self.settings("t", "c", max_attempts=1)
        consumer = self.consumer("t", "c")
        self.producer.pub("t", b"x")
        self.assertEqual(len(consumer.messages()), 1)
        consumer.lose()
        self.assertEqual(self.nsqd.get_topic("t.dead").depth(), 1)

    def test_origin_is_recorded(self) -> None:
        self.settings("t", "c", max_attempts=1)
        consumer = self.consumer("t", "c")
        self.producer.pub("t", b"x")
        (msg,) = consumer.messages()
        consumer.command(b"REQ", msg.id, b"0")
        origin = self.nsqd.dead_letters.origin("t.dead", msg.id)
        self.assertEqual(
            origin,
            {"topic": "t", "channel": "c", "attempts": 1, "reason": "max_attempts", "timestamp": self.nsqd.now_ns()},
        )

    def test_a_default_name_too_long_keeps_the_message(self) -> None:
        name = "t" * 60  # t...t.dead is 65 characters: not a topic name
        self.settings(name, "c", max_attempts=1)
        consumer = self.consumer(name, "c")
        self.producer.pub(name, b"x")
        (msg,) = consumer.messages()
        consumer.command(b"REQ", msg.id, b"0")
        (again,) = consumer.messages()  # still delivered: never lost
        self.assertEqual((again.id, again.attempts), (msg.id, 2))
        self.assertNotIn(name + ".dead", self.nsqd.topics)

    def test_no_loop_into_its_own_topic(self) -> None:
        with self.assertRaises(SettingsError):
            self.settings("t", "c", dead_letter_topic="t")

    def test_attempts_saturate(self) -> None:
        consumer = self.consumer("t", "c")
        self.producer.pub("t", b"x")
        (msg,) = consumer.messages()
        channel = self.nsqd.get_topic("t").get_channel("c")
        channel.in_flight.get(msg.id).attempts = 65535
        consumer.command(b"REQ", msg.id, b"0")
        (again,) = consumer.messages()
        self.assertEqual(again.attempts, 65535)  # not 0 (nsqio/nsq#1397)


class DefaultsTests(Base):
    options = {"max_attempts": 2, "dead_letter_topic": "all.dead"}

    def test_flags_are_every_queue_default(self) -> None:
        consumer = self.consumer("t", "c")
        self.producer.pub("t", b"x")
        for _ in range(2):
            (msg,) = consumer.messages()
            consumer.command(b"REQ", msg.id, b"0")
        self.assertEqual(self.nsqd.get_topic("all.dead").depth(), 1)

    def test_own_setting_wins(self) -> None:
        self.settings("t", "c", max_attempts=5)
        channel = self.nsqd.get_topic("t").get_channel("c")
        self.assertEqual((channel.policy.max_attempts, channel.policy.dead_letter_topic), (5, "all.dead"))


class TTLTests(Base):
    options = {"mem_queue_size": 100}

    def test_never_delivered_past_max_age(self) -> None:
        self.settings("t", max_age="5s")
        self.nsqd.get_topic("t").get_channel("c")
        self.producer.pub("t", b"old")
        self.clock.advance(6)
        self.producer.pub("t", b"new")
        consumer = self.consumer("t", "c")
        self.assertEqual([m.body for m in consumer.messages()], [b"new"])
        self.assertEqual(self.nsqd.get_topic("t").get_channel("c").expired_count, 1)

    def test_scan_empties_a_topic_without_consumers(self) -> None:
        self.settings("t", max_age="5s")
        self.producer.mpub("t", [b"%d" % i for i in range(250)])  # memory and backend
        topic = self.nsqd.get_topic("t")
        self.assertEqual(topic.depth(), 250)
        self.clock.advance(6)
        self.nsqd.queue_scan()
        self.assertEqual((topic.depth(), topic.expired_count), (0, 250))

    def test_expired_to_dead_letter(self) -> None:
        self.settings("t", "c", max_age="5s", max_attempts=9, expire_to_dead_letter=True)
        self.producer.pub("t", b"late")
        self.clock.advance(6)
        self.nsqd.queue_scan()
        channel = self.nsqd.get_topic("t").get_channel("c")
        self.assertEqual((channel.expired_count, channel.dead_letter_count, channel.depth()), (1, 1, 0))
        self.assertEqual([m.body for m in self.nsqd.get_topic("t.dead").queued()], [b"late"])

    def test_property_nothing_older_is_delivered(self) -> None:
        rng = random.Random(7)
        self.settings("t", "c", max_age="2s")
        consumer = self.consumer("t", "c", rdy=0)
        delivered = []
        for _ in range(300):
            self.clock.advance(rng.random() * 0.5)
            if rng.random() < 0.5:
                self.nsqd.publish("t", [b"m"])
            if rng.random() < 0.3:
                self.nsqd.queue_scan()
            if rng.random() < 0.2:
                consumer.command(b"RDY", str(rng.randrange(3)).encode())
            while msgs := consumer.messages():  # each delivered now (REQs come back at once): its age
                for msg in msgs:
                    delivered.append(self.nsqd.now_ns() - msg.timestamp)
                    consumer.fin(msg.id) if rng.random() < 0.5 else consumer.command(b"REQ", msg.id, b"0")
        self.assertTrue(delivered)
        self.assertLessEqual(max(delivered), 2e9)


class BoundTests(Base):
    options = {"mem_queue_size": 5}

    def test_reject_refuses_the_whole_publish(self) -> None:
        self.settings("t", max_depth=3)
        self.assertEqual(self.producer.mpub("t", [b"1", b"2"]), (FRAME_TYPE_RESPONSE, b"OK"))
        ft, data = self.producer.mpub("t", [b"3", b"4"])
        self.assertEqual(ft, FRAME_TYPE_ERROR)
        self.assertEqual(data, b"E_MPUB_FAILED MPUB failed TOPIC(t) max_depth 3 reached (overflow reject)")
        self.assertEqual(self.nsqd.get_topic("t").depth(), 2)
        self.assertTrue(self.nsqd.is_healthy())

    def test_channel_bound_rejects(self) -> None:
        self.nsqd.get_topic("t").get_channel("c")
        self.settings("t", "c", max_bytes=10)
        self.producer.pub("t", b"0123456789")
        with self.assertRaises(QueueFull):
            self.nsqd.publish("t", [b"!"])

    def test_drop_oldest_keeps_the_newest(self) -> None:
        self.nsqd.get_topic("t").get_channel("c")
        self.settings("t", "c", max_depth=10, overflow="drop_oldest")
        for i in range(100):
            self.clock.advance(0.001)
            self.producer.pub("t", b"%d" % i)
        channel = self.nsqd.get_topic("t").get_channel("c")
        self.assertEqual((channel.depth(), channel.dropped_count), (10, 90))
        consumer = self.consumer("t", "c")
        self.assertEqual(sorted(int(m.body) for m in consumer.messages()), list(range(90, 100)))

    def test_topic_without_channels_buffers_nothing(self) -> None:
        self.settings("t", max_depth=0, overflow="drop_oldest")
        self.producer.mpub("t", [b"a", b"b"])
        topic = self.nsqd.get_topic("t")
        self.assertEqual((topic.depth(), topic.dropped_count, topic.message_count), (0, 2, 2))
        consumer = self.consumer("t", "c")
        self.producer.pub("t", b"c")
        self.assertEqual([m.body for m in consumer.messages()], [b"c"])


class DiskTests(unittest.TestCase):
    """The same on disk queues: drop_oldest and TTL reach the disk head, files go."""

    def setUp(self) -> None:
        self.path = self.mktemp()
        os.makedirs(self.path)
        self.nsqd = make_nsqd(backend_factory=None, data_path=self.path, mem_queue_size=10, max_bytes_per_file=1000)
        self.nsqd.startService()
        self.addCleanup(self.nsqd.stopService)

    def files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.path) if ".diskqueue." in f and not f.endswith(".meta.dat"))

    def test_ttl_deletes_the_files(self) -> None:
        self.nsqd.get_topic("t").update_settings(parse_settings({"max_age": "5s"}))
        self.nsqd.publish("t", [b"x" * 50 for _ in range(200)])
        self.assertGreater(len(self.files()), 3)
        self.nsqd.reactor.advance(6)
        self.nsqd.queue_scan()
        self.assertEqual(self.nsqd.get_topic("t").depth(), 0)
        self.assertEqual(self.files(), [])

    def test_drop_oldest_takes_from_disk_head(self) -> None:
        topic = self.nsqd.get_topic("t")
        topic.update_settings(parse_settings({"max_depth": 30, "overflow": "drop_oldest"}))
        for i in range(100):
            self.nsqd.reactor.advance(0.001)
            self.nsqd.publish("t", [b"%03d" % i])
        self.assertEqual(topic.depth(), 30)
        channel = topic.get_channel("c")
        self.nsqd.reactor.advance(0)
        got = []
        while (item := channel._next()[0]) is not None:
            got.append(int(item.body))
        self.assertEqual(sorted(got), list(range(70, 100)))


class PersistenceTests(unittest.TestCase):
    def test_settings_survive_a_restart_and_go_ignores_them(self) -> None:
        path = self.mktemp()
        os.makedirs(path)
        nsqd = make_nsqd(backend_factory=None, data_path=path)
        nsqd.startService()
        topic = nsqd.get_topic("t")
        topic.update_settings(parse_settings({"max_age": "1h"}))
        topic.update_settings(parse_settings({"max_attempts": 4}), topic.get_channel("c"))
        nsqd.get_topic("plain").get_channel("c")
        nsqd.stopService()
        with open(os.path.join(path, "nsqd.dat"), "rb") as f:
            data = f.read()
        doc = json.loads(data)
        plain = next(t for t in doc["topics"] if t["name"] == "plain")
        self.assertEqual(plain, {"name": "plain", "paused": False, "channels": [{"name": "c", "paused": False}]})
        self.assertEqual(sorted(t.name for t in decode_metadata(data, "nsqd.dat")), ["plain", "t"])

        self.assertFalse(os.path.exists(os.path.join(path, "dead_letters.json")), "nothing beyond Go was needed")

        again = make_nsqd(backend_factory=None, data_path=path)
        again.startService()
        self.addCleanup(again.stopService)
        t = again.get_topic("t")
        self.assertEqual(t.policy.max_age, 3600.0)
        self.assertEqual(t.get_channel("c").policy.max_attempts, 4)
        self.assertEqual(t.get_channel("c").policy.max_age, 3600.0)


class HTTPTests(Base):
    def setUp(self) -> None:
        super().setUp()
        self.treq = StubTreq(NSQDHTTPAPI(self.nsqd).resource())
        self.nsqd.get_topic("t").get_channel("c")

    @defer.inlineCallbacks
    def call(self, method: str, url: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        resp = yield self.treq.request(method, "http://nsqd" + url, data=data)
        content = yield resp.content()
        return resp.code, json.loads(content)

    @defer.inlineCallbacks
    def test_put_get_and_effective(self) -> None:
        code, doc = yield self.call("PUT", "/topic/settings?topic=t", {"max_age": "10m", "max_attempts": 5})
        self.assertEqual(code, 200)
        self.assertEqual(doc["settings"], {"max_attempts": 5, "max_age": "10m0s"})
        code, doc = yield self.call("PUT", "/channel/settings?topic=t&channel=c", {"max_attempts": 2})
        self.assertEqual(doc["settings"], {"max_attempts": 2})
        self.assertEqual(doc["effective"]["max_attempts"], 2)
        self.assertEqual(doc["effective"]["max_age"], "10m0s")
        self.assertEqual(doc["effective"]["dead_letter_topic"], "t.dead")
        code, doc = yield self.call("PUT", "/channel/settings?topic=t&channel=c", {"max_attempts": None})
        self.assertEqual((doc["settings"], doc["effective"]["max_attempts"]), ({}, 5))
        code, doc = yield self.call("GET", "/channel/settings?topic=t&channel=c")
        self.assertEqual((code, doc["channel"]), (200, "c"))

    @defer.inlineCallbacks
    def test_refusals(self) -> None:
        for url, body, status, message in [
            ("/topic/settings?topic=t", {"nope": 1}, 400, "INVALID_SETTINGS: unknown setting 'nope'"),
            ("/topic/settings?topic=t", b"{", 400, "INVALID_SETTINGS: body is not JSON"),
            ("/topic/settings?topic=t", {"max_depth": -2}, 400, "INVALID_SETTINGS: max_depth must be >= 0"),
            ("/topic/settings?topic=zz", {}, 404, "TOPIC_NOT_FOUND"),
            ("/channel/settings?topic=t&channel=zz", {}, 404, "CHANNEL_NOT_FOUND"),
            ("/topic/settings", {}, 400, "MISSING_ARG_TOPIC"),
        ]:
            code, doc = yield self.call("PUT", url, body)
            self.assertEqual(code, status, url)
            self.assertTrue(doc["message"].startswith(message), doc)

    @defer.inlineCallbacks
    def test_refused_publish_names_the_bound(self) -> None:
        yield self.call("PUT", "/topic/settings?topic=q", {})  # 404: settings do not create topics
        self.settings("q", max_depth=0)
        resp = yield self.treq.request("POST", "http://nsqd/pub?topic=q", data=b"x")
        self.assertEqual(resp.code, 503)
        doc = json.loads((yield resp.content()))
        self.assertEqual(doc["message"], "QUEUE_FULL: TOPIC(q) max_depth 0 reached (overflow reject)")

    @defer.inlineCallbacks
    def test_dead_letter_origin(self) -> None:
        self.settings("t", "c", max_attempts=1, dead_letter_topic="failed")
        consumer = self.consumer("t", "c")
        self.producer.pub("t", b"x")
        (msg,) = consumer.messages()
        consumer.command(b"REQ", msg.id, b"0")
        code, doc = yield self.call("GET", f"/topic/dead_letter?topic=failed&id={msg.id.decode()}")
        self.assertEqual((code, doc["channel"], doc["attempts"], doc["reason"]), (200, "c", 1, "max_attempts"))
        self.assertEqual((doc["id"], doc["dead_letter_topic"], doc["topic"]), (msg.id.decode(), "failed", "t"))
        code, doc = yield self.call("GET", "/topic/peek?topic=failed")
        (peeked,) = doc["messages"]
        self.assertEqual((peeked["id"], peeked["dead_letter"]["channel"]), (msg.id.decode(), "c"))
        code, doc = yield self.call("GET", "/topic/dead_letter?topic=failed&id=0000000000000000")
        self.assertEqual((code, doc), (404, {"message": "DEAD_LETTER_NOT_FOUND"}))
        code, doc = yield self.call("GET", "/topic/dead_letter?topic=failed")
        self.assertEqual((code, doc), (400, {"message": "MISSING_ARG_ID"}))

    def test_stats_keys_after_gos(self) -> None:
        self.settings("t", "c", max_attempts=3)
        stats = get_stats(self.nsqd)
        (topic,) = [t for t in stats["topics"] if t["topic_name"] == "t"]
        self.assertNotIn("settings", topic)  # nothing beyond Go applies to the topic itself
        channel = topic["channels"][0]
        self.assertEqual(list(channel)[-4:], ["dead_letter_count", "expired_count", "dropped_count", "settings"])
        self.assertEqual(channel["settings"]["max_attempts"], 3)


class LedgerPersistenceTests(unittest.TestCase):
    def test_origins_survive_a_restart(self) -> None:
        path = self.mktemp()
        os.makedirs(path)
        nsqd = make_nsqd(backend_factory=None, data_path=path)
        nsqd.startService()
        topic = nsqd.get_topic("t")
        topic.update_settings(parse_settings({"max_attempts": 1}))
        consumer = FakeClient(nsqd)
        consumer.sub("t", "c", 1)
        nsqd.publish("t", [b"x"])
        (msg,) = consumer.messages()
        consumer.command(b"REQ", msg.id, b"0")
        nsqd.reactor.advance(1.5)
        nsqd.queue_scan()  # written with the next sync, at most once a second
        nsqd.reactor.advance(0)
        with open(os.path.join(path, "dead_letters.json")) as f:
            self.assertEqual(json.load(f)[0]["channel"], "c")
        consumer.lose()
        nsqd.stopService()
        again = make_nsqd(backend_factory=None, data_path=path)
        again.startService()
        self.addCleanup(again.stopService)
        self.assertEqual(again.dead_letters.origin("t.dead", msg.id)["channel"], "c")
