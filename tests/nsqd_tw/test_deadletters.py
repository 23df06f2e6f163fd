"""Dead letters (nsqd_tw.core.deadletters): cycles end, nothing is dropped on arrival, bad files are ignored."""

from __future__ import annotations

import os
from typing import Any

from twisted.trial import unittest

from nsqd_tw.core.settings import Policy, SettingsError, check_defaults, parse_settings
from nsqd_tw.options import NSQDOptions
from tests.helpers import make_nsqd


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd(mem_queue_size=1000)
        self.clock = self.nsqd.reactor

    def settings(self, topic: str, channel: str, **values: Any) -> None:
        t = self.nsqd.get_topic(topic)
        t.update_settings(parse_settings(values), t.get_channel(channel))

    def channel(self, topic: str, name: str) -> Any:
        return self.nsqd.get_topic(topic).get_channel(name)

    def expire(self) -> None:
        self.clock.advance(2)
        self.nsqd.queue_scan()


class CycleTests(Base):
    def test_a_ttl_cycle_moves_each_message_once(self) -> None:
        ttl = {"max_age": "1s", "expire_to_dead_letter": True}
        self.settings("A", "c", dead_letter_topic="B", **ttl)
        self.settings("B", "c", dead_letter_topic="A", **ttl)
        self.nsqd.publish("A", [b"%d" % i for i in range(50)])
        for _ in range(5):
            self.expire()
        a, b = self.channel("A", "c"), self.channel("B", "c")
        self.assertEqual((a.dead_letter_count, a.expired_count, a.depth()), (50, 50, 0))
        self.assertEqual((b.dead_letter_count, b.expired_count, b.depth()), (0, 50, 0), "expired on arrival")

    def test_a_channel_where_it_is_still_young_gets_it_once(self) -> None:
        ttl = {"max_age": "1s", "expire_to_dead_letter": True}
        self.settings("A", "c", dead_letter_topic="D", **ttl)
        self.settings("D", "bounce", dead_letter_topic="A", **ttl)
        keep = self.channel("D", "keep")  # no TTL: the dead letters rest here
        self.nsqd.publish("A", [b"%d" % i for i in range(20)])
        for _ in range(5):
            self.expire()
        self.assertEqual(keep.depth(), 20)
        self.assertEqual(self.channel("D", "bounce").expired_count, 20)
        self.assertEqual(self.channel("A", "c").dead_letter_count, 20)

    def test_a_chain_with_longer_ttls_goes_on(self) -> None:
        self.settings("S", "c", max_age="1s", expire_to_dead_letter=True, dead_letter_topic="T")
        self.settings("T", "c", max_age="10s", expire_to_dead_letter=True, dead_letter_topic="U")
        sink = self.channel("U", "c")
        self.nsqd.publish("S", [b"x"])
        self.expire()
        self.assertEqual(self.channel("T", "c").depth(), 1, "still young in T")
        self.clock.advance(10)
        self.nsqd.queue_scan()
        self.assertEqual(sink.depth(), 1)

    def test_max_attempts_dead_letters_are_not_dropped_on_arrival(self) -> None:
        self.settings("jobs", "work", max_attempts=1)
        self.settings("jobs.dead", "c", max_age="1s", expire_to_dead_letter=True, dead_letter_topic="archive")
        archive = self.channel("archive", "c")
        self.nsqd.publish("jobs", [b"old"])
        self.clock.advance(5)  # older than jobs.dead's TTL when it gets there
        channel = self.channel("jobs", "work")
        (msg,) = channel.peek(1)
        channel._back(channel._take(1, 1, self.nsqd.now())[0])
        self.assertEqual(channel.dead_letter_count, 1)
        self.nsqd.queue_scan()
        self.assertEqual((archive.depth(), msg.body), (1, b"old"), "moved on for its age, once")


class TargetTests(unittest.TestCase):
    def test_ephemeral_dead_letter_topics_are_refused(self) -> None:
        with self.assertRaises(SettingsError) as e:
            parse_settings({"dead_letter_topic": "dl#ephemeral"})
        self.assertIn("must not be ephemeral", str(e.exception))
        with self.assertRaises(SettingsError):
            check_defaults(NSQDOptions(dead_letter_topic="dl#ephemeral"))

    def test_expire_to_dead_letter_alone_goes_to_topic_dot_dead(self) -> None:
        policy = Policy(max_age=1.0, expire_to_dead_letter=True)
        self.assertEqual(policy.dead_letter_to("t"), "t.dead")
        self.assertEqual(policy.as_json("t")["dead_letter_topic"], "t.dead")
        self.assertIsNone(Policy(expire_to_dead_letter=True).dead_letter_to("t"), "no TTL, nothing expires")
        nsqd = make_nsqd()
        topic = nsqd.get_topic("t")
        topic.update_settings(parse_settings({"max_age": "1s", "expire_to_dead_letter": True}), topic.get_channel("c"))
        nsqd.publish("t", [b"a", b"b"])
        nsqd.reactor.advance(2)
        nsqd.queue_scan()
        self.assertEqual(nsqd.get_topic("t.dead").depth(), 2)


class LedgerFileTests(unittest.TestCase):
    def test_a_file_that_cannot_be_read_is_ignored(self) -> None:
        for content in (b"[" * 200_000 + b"]" * 200_000, b"{", b'{"a": 1}', b"\xff\xfe", b"[1, 2]"):
            path = self.mktemp()
            os.makedirs(path)
            with open(os.path.join(path, "dead_letters.json"), "wb") as f:
                f.write(content)
            nsqd = make_nsqd(backend_factory=None, data_path=path)
            lines: list[str] = []

            def warn(fmt: str, lines: list[str] = lines, **kw: Any) -> None:
                lines.append(fmt.format(**kw))

            nsqd.log.warn = warn  # type: ignore[method-assign]
            nsqd.startService()
            self.addCleanup(nsqd.stopService)
            self.assertTrue(nsqd.running)
            self.assertTrue(any("ignoring" in line and "dead_letters.json" in line for line in lines), (content, lines))
