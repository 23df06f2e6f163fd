"""Bounded queues (nsqd_tw.core.bounds): what a bound counts, and every moment it applies."""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.trial import unittest

from nsqd_tw.core.metadata import decode_metadata
from nsqd_tw.core.queue import QueueFull
from nsqd_tw.core.settings import parse_settings
from tests.helpers import FakeClient, make_nsqd


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd(mem_queue_size=100)
        self.clock = self.nsqd.reactor
        self.channel = self.nsqd.get_topic("t").get_channel("c")

    def bound(self, **values: Any) -> None:
        self.nsqd.get_topic("t").update_settings(parse_settings(values), self.channel)

    def consumer(self, rdy: int) -> FakeClient:
        c = FakeClient(self.nsqd)
        c.identify(msg_timeout=1000)
        c.sub("t", "c", rdy)
        return c


class RejectTests(Base):
    def test_deferred_messages_count(self) -> None:
        self.bound(max_depth=3)
        for i in range(3):
            self.nsqd.publish("t", [b"%d" % i], delay=1.0)
        with self.assertRaises(QueueFull):
            self.nsqd.publish("t", [b"x"], delay=1.0)
        with self.assertRaises(QueueFull):
            self.nsqd.publish("t", [b"x"])
        self.clock.advance(1.5)
        self.nsqd.queue_scan()
        self.assertEqual((self.channel.depth(), len(self.channel.deferred)), (3, 0))

    def test_deferred_bytes_count(self) -> None:
        self.bound(max_bytes=10)
        self.nsqd.publish("t", [b"0123456789"], delay=1.0)
        self.assertEqual(self.channel.deferred.bytes, 10)
        with self.assertRaises(QueueFull):
            self.nsqd.publish("t", [b"!"], delay=1.0)
        self.clock.advance(1.5)
        self.nsqd.queue_scan()
        self.assertEqual((self.channel.deferred.bytes, self.channel.queued_bytes()), (0, 10))

    def test_a_message_given_back_is_never_refused(self) -> None:
        self.bound(max_depth=2)
        consumer = self.consumer(2)
        self.nsqd.publish("t", [b"a", b"b"])
        held = consumer.messages()
        consumer.command(b"RDY", b"0")
        self.nsqd.publish("t", [b"c", b"d"])
        for msg in held:
            consumer.command(b"REQ", msg.id, b"0")
        self.assertEqual(self.channel.depth(), 4, "past the bound by what was in flight")


class DropOldestTests(Base):
    def test_a_lowered_bound_applies_at_once(self) -> None:
        self.nsqd.publish("t", [b"%d" % i for i in range(50)])
        self.bound(max_depth=10, overflow="drop_oldest")
        self.assertEqual((self.channel.depth(), self.channel.dropped_count), (10, 40))

    def test_requeued_and_due_messages_are_trimmed(self) -> None:
        self.bound(max_depth=4, overflow="drop_oldest")
        consumer = self.consumer(2)
        self.nsqd.publish("t", [b"a", b"b"])
        held = consumer.messages()
        consumer.command(b"RDY", b"0")
        self.nsqd.publish("t", [b"c", b"d", b"e", b"f"])
        consumer.command(b"REQ", held[0].id, b"0")
        consumer.command(b"REQ", held[1].id, b"1000")
        consumer.frames()
        self.assertEqual((self.channel.depth(), len(self.channel.deferred)), (3, 1))
        self.assertEqual(self.channel.dropped_count, 2)
        self.clock.advance(1.5)
        self.nsqd.queue_scan()
        self.assertEqual((self.channel.depth(), len(self.channel.deferred), self.channel.dropped_count), (4, 0, 2))

    def test_deferred_are_dropped_once_due(self) -> None:
        self.bound(max_depth=2, overflow="drop_oldest")
        for i in range(5):
            self.nsqd.publish("t", [b"%d" % i], delay=1.0)
        self.assertEqual((len(self.channel.deferred), self.channel.dropped_count), (5, 0))
        self.clock.advance(1.5)
        self.nsqd.queue_scan()
        self.assertEqual((self.channel.depth(), self.channel.dropped_count), (2, 3))


class PersistenceTests(unittest.TestCase):
    def test_dropped_count_survives_a_restart_and_nsqd_dat_stays_gos_without_it(self) -> None:
        path = self.mktemp()
        os.makedirs(path)
        nsqd = make_nsqd(backend_factory=None, data_path=path, mem_queue_size=10)
        nsqd.startService()
        topic = nsqd.get_topic("t")
        channel = topic.get_channel("c")
        nsqd.get_topic("plain").get_channel("c")
        topic.update_settings(parse_settings({"max_depth": 5, "overflow": "drop_oldest"}), channel)
        nsqd.publish("t", [b"%d" % i for i in range(30)])
        self.assertEqual(channel.dropped_count, 25)
        nsqd.stopService()
        with open(os.path.join(path, "nsqd.dat"), "rb") as f:
            data = f.read()
        doc = json.loads(data)
        entries = {t["name"]: t for t in doc["topics"]}
        self.assertEqual(entries["t"]["channels"][0]["dropped_count"], 25)
        plain = {"name": "plain", "paused": False, "channels": [{"name": "c", "paused": False}]}
        self.assertEqual(entries["plain"], plain, "nothing dropped: Go's entry")
        (meta,) = [t for t in decode_metadata(data, "nsqd.dat") if t.name == "t"]
        self.assertEqual(meta.channels[0].dropped, 25)
        again = make_nsqd(backend_factory=None, data_path=path, mem_queue_size=10)
        again.startService()
        self.addCleanup(again.stopService)
        self.assertEqual(again.get_topic("t").get_channel("c").dropped_count, 25)

    def test_a_bad_count_is_ignored(self) -> None:
        for value in ("12", -1, 1.5, True, [1], 1 << 70):
            data = json.dumps({"topics": [{"name": "t", "paused": False, "dropped_count": value}], "version": "1.3.0"})
            (meta,) = decode_metadata(data.encode(), "nsqd.dat")
            self.assertEqual(meta.dropped, 0, value)

    def test_bounds_apply_at_start(self) -> None:
        path = self.mktemp()
        os.makedirs(path)
        nsqd = make_nsqd(backend_factory=None, data_path=path, mem_queue_size=10)
        nsqd.startService()
        nsqd.get_topic("t").get_channel("c")
        nsqd.publish("t", [b"%d" % i for i in range(30)])
        nsqd.stopService()
        with open(os.path.join(path, "nsqd.dat")) as f:
            doc = json.load(f)
        doc["topics"][0]["channels"][0]["settings"] = {"max_depth": 5, "overflow": "drop_oldest"}
        with open(os.path.join(path, "nsqd.dat"), "w") as f:
            json.dump(doc, f)
        again = make_nsqd(backend_factory=None, data_path=path, mem_queue_size=10)
        again.startService()
        self.addCleanup(again.stopService)
        channel = again.get_topic("t").get_channel("c")
        self.assertEqual((channel.depth(), channel.dropped_count), (5, 25))
