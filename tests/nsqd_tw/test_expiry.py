"""TTL expiry (nsqd_tw.core.expiry): at a bounded rate, a slice a reactor turn, past clocks that were wrong."""

from __future__ import annotations

import itertools
import os
from types import SimpleNamespace
from typing import Any

from twisted.trial import unittest

from nsq_wire.frames import FRAME_TYPE_RESPONSE
from nsqd_tw.core import expiry
from nsqd_tw.core.settings import parse_settings
from tests.helpers import FakeClient, make_nsqd, standing_still


class Base(unittest.TestCase):
    options: dict[str, Any] = {"mem_queue_size": 100}

    def setUp(self) -> None:
        self.nsqd = make_nsqd(**self.options)
        self.clock = self.nsqd.reactor

    def ttl(self, topic: str, channel: str | None = None, **values: Any) -> None:
        t = self.nsqd.get_topic(topic)
        t.update_settings(parse_settings({"max_age": "1s", **values}), t.get_channel(channel) if channel else None)


class RateTests(Base):
    def setUp(self) -> None:
        super().setUp()
        self.patch(expiry, "RATE", 1000)
        self.patch(expiry, "BURST", 100)
        self.patch(expiry, "SLICE", 50)
        self.nsqd.expiry = expiry.ExpirySweep(self.nsqd)  # made with the rates above
        self.nsqd.expiry.stopwatch = standing_still  # as make_nsqd does: counts alone

    def scan(self, after: float) -> None:
        self.clock.advance(after)
        self.nsqd.queue_scan()
        self.clock.advance(0)  # the slices on the next turns (Clock runs them all now)

    def test_a_slice_a_turn_and_the_rate_in_every_tenth_of_a_second(self) -> None:
        self.ttl("t")
        self.nsqd.publish("t", [b"%d" % i for i in range(3000)])
        topic = self.nsqd.get_topic("t")
        self.clock.advance(2)
        self.nsqd.queue_scan()
        self.assertEqual(topic.expired_count, 50, "the first slice, in the scan's turn")
        self.clock.advance(0)
        self.assertEqual(topic.expired_count, 100, "a tenth of a second's rate, then nothing until the next tick")
        for _ in range(10):
            self.scan(0.1)
        self.assertLessEqual(abs(topic.expired_count - 1100), 10, "a second: the rate")
        self.scan(5.0)
        self.assertLessEqual(abs(topic.expired_count - 1200), 10, "a quiet while is not saved up")
        for _ in range(30):
            self.scan(0.1)
        self.assertEqual((topic.expired_count, topic.depth()), (3000, 0))

    def test_expiring_to_a_dead_letter_topic_keeps_the_rate(self) -> None:
        self.ttl("t", "c", expire_to_dead_letter=True)
        self.nsqd.publish("t", [b"%d" % i for i in range(2500)])
        self.scan(2.0)
        channel = self.nsqd.get_topic("t").get_channel("c")
        self.assertEqual((channel.dead_letter_count, self.nsqd.get_topic("t.dead").depth()), (100, 100))


class FutureTests(Base):
    def test_messages_stamped_in_the_future_are_redated_and_do_not_stop_the_sweep(self) -> None:
        now = self.clock.seconds()
        self.clock.rightNow = now + 10 * 365 * 86400  # a clock ten years ahead wrote these
        self.nsqd.publish("t", [b"future %d" % i for i in range(10)])
        self.clock.rightNow = now
        self.nsqd.publish("t", [b"%d" % i for i in range(200)])  # memory (100) then backend
        self.ttl("t")
        topic = self.nsqd.get_topic("t")
        self.clock.advance(2)
        self.nsqd.queue_scan()
        self.assertEqual((topic.expired_count, topic.depth()), (200, 10))
        self.assertTrue(all(m.timestamp <= self.nsqd.now_ns() for m in topic.peek(10)), "re-dated to now")
        self.clock.advance(2)
        self.nsqd.queue_scan()
        self.assertEqual((topic.expired_count, topic.depth()), (210, 0))


class DispatchTests(Base):
    options = {"mem_queue_size": 10_000}

    def test_a_delivery_steps_over_at_most_a_limit_of_expired_a_turn(self) -> None:
        self.patch(expiry, "DISPATCH_LIMIT", 100)
        self.ttl("t", "c")
        self.nsqd.publish("t", [b"old %d" % i for i in range(450)])
        self.clock.advance(2)
        self.nsqd.publish("t", [b"fresh"])
        channel = self.nsqd.get_topic("t").get_channel("c")
        consumer = FakeClient(self.nsqd)
        self.assertEqual(consumer.sub("t", "c"), (FRAME_TYPE_RESPONSE, b"OK"))
        consumer.command(b"RDY", b"10")
        self.assertEqual(channel.expired_count, 100, "this turn: the limit, then the rest on later turns")
        self.assertTrue([c for c in self.clock.getDelayedCalls() if getattr(c.func, "__name__", "") == "<lambda>"])
        self.assertEqual([m.body for m in consumer.messages()], [b"fresh"])  # (Clock runs the later turns)
        self.assertEqual(channel.expired_count, 450)


class BusyMachineTests(Base):
    """A slice of the sweep also stops when its time is up (:data:`expiry.SLICE_SECONDS`,
    on a stopwatch, not the reactor's clock)."""

    options = {"mem_queue_size": 10, "backend_factory": None, "max_bytes_per_file": 1000}

    def setUp(self) -> None:
        self.options = {**self.options, "data_path": self.mktemp()}
        os.makedirs(self.options["data_path"])
        super().setUp()
        self.nsqd.startService()
        self.addCleanup(self.nsqd.stopService)

    def test_the_suites_sweep_does_not_depend_on_the_machines_speed(self) -> None:
        # a machine so busy that every look at the stopwatch finds the slice's time up:
        # a test that counts what one scan expired must not fail there (it did, now and then)
        steps = itertools.count()
        self.patch(expiry, "time", SimpleNamespace(perf_counter=lambda: float(next(steps))))
        self.ttl("t")
        self.nsqd.publish("t", [b"x" * 50 for _ in range(200)])
        self.clock.advance(2)
        self.nsqd.queue_scan()
        self.assertEqual(self.nsqd.get_topic("t").depth(), 0)

    def test_a_slice_whose_time_is_up_leaves_the_rest_to_the_next_turns(self) -> None:
        steps = itertools.count()
        self.nsqd.expiry.stopwatch = lambda: next(steps) * 0.001  # a millisecond a look
        self.ttl("t")
        self.nsqd.publish("t", [b"x" * 50 for _ in range(1000)])
        topic = self.nsqd.get_topic("t")
        self.clock.advance(2)
        self.nsqd.queue_scan()
        first = topic.expired_count
        self.assertGreater(first, 0)
        self.assertLess(first, 1000, "the slice stopped when its time was up")
        self.clock.advance(0)  # the next turns' slices (Clock runs them all now)
        self.assertEqual((topic.expired_count, topic.depth()), (1000, 0))
