import random

from twisted.trial import unittest

from nsqd_tw.core.message import Message
from tests.helpers import make_nsqd
from tests.nsqd_tw.test_channel import FakeConsumer


class QueueScanTests(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd()
        self.clock = self.nsqd.reactor
        random.seed(1)

    def in_flight_everywhere(self, n_channels: int, timeout: float) -> list[FakeConsumer]:
        consumers = []
        topic = self.nsqd.get_topic("t")
        for i in range(n_channels):
            ch = topic.get_channel(f"c{i}")
            c = FakeConsumer(i + 1, rdy=1, msg_timeout=timeout)
            ch.add_client(c)
            consumers.append(c)
        topic.put_message(Message(self.nsqd.guid.new_id(), b"x", self.nsqd.now_ns()))
        return consumers

    def test_scan_requeues_every_expired_channel(self) -> None:
        # 100 channels, 20 sampled per pass: every dirty pass samples again
        consumers = self.in_flight_everywhere(100, 1.0)
        self.clock.advance(2)
        self.nsqd.queue_scan()
        redelivered = sum(1 for c in consumers if len(c.got) == 2)
        self.assertGreater(redelivered, 75)

    def test_nothing_due_means_one_pass(self) -> None:
        self.in_flight_everywhere(50, 60.0)
        calls = []
        for ch in self.nsqd.channels():
            orig = ch.process_queues
            ch.process_queues = lambda now, orig=orig: calls.append(1) or orig(now)
        self.nsqd.queue_scan()
        self.assertEqual(len(calls), 20)

    def test_new_channel_is_scanned_without_waiting_for_refresh(self) -> None:
        self.nsqd.queue_scan()
        (c,) = self.in_flight_everywhere(1, 1.0)
        self.clock.advance(1.5)
        self.nsqd.queue_scan()
        self.assertEqual(len(c.got), 2)

    def test_a_failing_channel_does_not_stop_the_loop(self) -> None:
        self.in_flight_everywhere(1, 1.0)
        (ch,) = self.nsqd.channels()

        def boom(now: float) -> bool:
            raise RuntimeError("boom")

        ch.process_queues = boom
        self.nsqd.queue_scan()  # must not raise
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class HealthTests(unittest.TestCase):
    def test_health(self) -> None:
        nsqd = make_nsqd()
        self.assertEqual(nsqd.get_health(), "OK")
        nsqd.set_health(OSError("disk full"))
        self.assertEqual((nsqd.is_healthy(), nsqd.get_health()), (False, "NOK - disk full"))
