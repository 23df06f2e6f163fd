"""What one connection may cost nsqd: unsent output, read deadlines, the real bytes of an MPUB.

A client that stops reading is backed up when the transport holds more unsent
bytes than its buffer (the transport pauses us, as a real TCP transport does past
its buffer size): it gets no more messages and is not read from, and if it stays
backed up past its heartbeat interval (Go's write deadline) it is dropped and its
in-flight messages are requeued. The unit tests play the transport's part by
pausing and resuming the producer the protocol registered.
"""

from __future__ import annotations

import struct

from twisted.trial import unittest

from nsq_wire.compression import SnappyCodec
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, FrameReader
from nsqd_tw.tcp.upgrade import ANSWER_ALONE
from tests.helpers import FakeClient, make_nsqd

OK = (FRAME_TYPE_RESPONSE, b"OK")


class BoundsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd()
        self.clock = self.nsqd.reactor

    def consumer(self, rdy: int = 10, **identify) -> FakeClient:
        c = FakeClient(self.nsqd)
        if identify:
            c.identify(**identify)
        self.assertEqual(c.sub("t", "c", rdy), OK)
        return c

    def publish(self, *bodies: bytes) -> None:
        p = FakeClient(self.nsqd)
        self.assertEqual(p.mpub("t", list(bodies)), OK)

    def backed_up(self, c: FakeClient) -> None:
        """What a TCP transport does once its buffer of unsent bytes is full."""
        c.transport.producer.pauseProducing()

    def drained(self, c: FakeClient) -> None:
        c.transport.producer.resumeProducing()


class SlowConsumerTests(BoundsTestCase):
    def test_a_backed_up_consumer_gets_no_more_messages(self) -> None:
        slow = self.consumer()
        self.publish(b"1", b"2")
        self.assertEqual(len(slow.messages()), 2)
        self.backed_up(slow)
        other = self.consumer()
        self.publish(b"3", b"4", b"5")
        self.assertEqual(slow.frames(), [])
        self.assertEqual(sorted(m.body for m in other.messages()), [b"3", b"4", b"5"])

    def test_delivery_resumes_when_it_drains(self) -> None:
        slow = self.consumer()
        self.backed_up(slow)
        self.publish(b"1", b"2")
        self.assertEqual(slow.frames(), [])
        self.clock.advance(1)
        self.drained(slow)
        self.assertEqual(sorted(m.body for m in slow.messages()), [b"1", b"2"])
        self.assertFalse(slow.disconnected)

    def test_backed_up_past_the_heartbeat_interval_drops_it_and_requeues(self) -> None:
        slow = self.consumer(heartbeat_interval=1000)
        self.publish(b"1", b"2", b"3")
        self.assertEqual(len(slow.messages()), 3)
        self.backed_up(slow)
        self.clock.advance(0.9)
        self.assertFalse(slow.disconnected)
        self.clock.advance(0.2)
        self.assertTrue(slow.transport.disconnected, "aborted: what it holds unsent is thrown away")
        slow.lose()
        other = self.consumer()
        self.assertEqual(sorted(m.body for m in other.messages()), [b"1", b"2", b"3"])

    def test_timed_out_messages_are_not_sent_again_to_a_backed_up_consumer(self) -> None:
        slow = self.consumer(heartbeat_interval=60000, msg_timeout=1000)
        self.publish(b"1", b"2")
        self.assertEqual(len(slow.messages()), 2)
        self.backed_up(slow)
        for _ in range(10):
            self.clock.advance(1.1)
            self.nsqd.queue_scan()
        self.assertEqual(slow.frames(), [], "nothing more is queued for it")

    def test_a_backed_up_client_is_not_read_from(self) -> None:
        c = self.consumer()
        self.backed_up(c)
        self.assertEqual(c.transport.producerState, "paused", "reading stopped")
        c.send(b"FIN 0123456789abcdef\n" * 100)
        self.assertEqual(c.frames(), [], "its commands wait")
        self.drained(c)
        self.assertEqual(c.transport.producerState, "producing")
        frames = c.frames()
        self.assertEqual(len(frames), 100)
        self.assertEqual(frames[0], (FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"))

    def test_a_close_while_backed_up_still_closes(self) -> None:
        c = self.consumer()
        self.backed_up(c)
        self.drained(c)
        c.send(b"BOGUS\n")
        self.assertEqual(c.frames(), [(FRAME_TYPE_ERROR, b"E_INVALID invalid command BOGUS")])
        self.assertTrue(c.disconnected)
        self.assertIsNone(c.transport.producer, "unregistered, so the transport closes once drained")


class ReadDeadlineTests(BoundsTestCase):
    def test_the_deadline_covers_a_whole_command(self) -> None:
        """Go sets the read deadline once per command: bytes dripped into a body do not extend it."""
        c = FakeClient(self.nsqd)
        c.identify(heartbeat_interval=1000)
        c.send(b"PUB t\n" + struct.pack(">I", 10))
        for _ in range(3):
            self.clock.advance(0.9)
            c.send(b"x")
        self.assertTrue(c.disconnected, "2 s (twice the heartbeat interval) after the command began")

    def test_each_command_gets_a_new_deadline(self) -> None:
        c = FakeClient(self.nsqd)
        c.identify(heartbeat_interval=1000)
        for _ in range(5):
            self.clock.advance(1.5)
            c.send(b"NOP\n")
        self.assertFalse(c.disconnected)
        self.clock.advance(2.1)
        self.assertTrue(c.disconnected)


class MPUBBytesTests(BoundsTestCase):
    """Go reads an MPUB's messages by their count whatever size it declared; what
    nsqd reads of one is bounded by real bytes: its bodies total at most --max-body-size."""

    def setUp(self) -> None:
        self.nsqd = make_nsqd(max_msg_size=1000, max_body_size=2500)
        self.clock = self.nsqd.reactor

    def test_messages_past_the_declared_body_size_are_read_as_go_reads_them(self) -> None:
        c = FakeClient(self.nsqd)
        bodies = [b"a" * 1000, b"b" * 1000, b"c" * 500]
        c.send(b"MPUB t\n" + struct.pack(">II", 100, 3) + b"".join(struct.pack(">I", len(b)) + b for b in bodies))
        self.assertEqual(c.frames(), [OK])
        self.assertEqual(self.nsqd.topics["t"].depth(), 3)
        self.assertFalse(c.disconnected)

    def test_bodies_past_max_body_size_are_refused_before_they_are_read(self) -> None:
        c = FakeClient(self.nsqd)
        c.send(b"MPUB t\n" + struct.pack(">II", 100, 3))
        for _ in range(2):
            c.send(struct.pack(">I", 1000) + b"z" * 1000)
            self.assertEqual(c.frames(), [])
        c.send(struct.pack(">I", 1000))  # 3000 bytes of bodies: refused at its size, its body unread
        self.assertEqual(c.frames(), [(FRAME_TYPE_ERROR, b"E_BAD_BODY MPUB body too big 3000 > 2500")])
        self.assertTrue(c.disconnected)
        self.assertEqual(self.nsqd.topics["t"].depth(), 0, "none of it is published")

    def test_one_byte_of_bodies_over_is_refused(self) -> None:
        c = FakeClient(self.nsqd)
        bodies = [b"a" * 1000, b"b" * 1000, b"c" * 501]
        payload = struct.pack(">I", 3) + b"".join(struct.pack(">I", len(b)) + b for b in bodies)
        c.send(b"MPUB t\n" + struct.pack(">I", 2500) + payload)
        self.assertEqual(c.frames(), [(FRAME_TYPE_ERROR, b"E_BAD_BODY MPUB body too big 2501 > 2500")])

    def test_a_body_that_adds_up_is_accepted(self) -> None:
        c = FakeClient(self.nsqd)
        bodies = [b"a" * 10, b"b" * 20]
        payload = struct.pack(">I", 2) + b"".join(struct.pack(">I", len(b)) + b for b in bodies)
        c.send(b"MPUB t\n" + struct.pack(">I", len(payload)) + payload)
        self.assertEqual(c.frames(), [OK])


class BadInputTests(BoundsTestCase):
    def test_deeply_nested_identify(self) -> None:
        c = FakeClient(self.nsqd)
        c.command(b"IDENTIFY", body=b"[" * 5000)
        self.assertEqual(c.frames(), [(FRAME_TYPE_ERROR, b"E_BAD_BODY IDENTIFY failed to decode JSON body")])
        self.assertTrue(c.disconnected)
        c2 = FakeClient(self.nsqd)
        c2.command(b"IDENTIFY", body=b"[" * 5000 + b"]" * 5000)
        self.assertEqual(c2.frames(), [(FRAME_TYPE_ERROR, b"E_BAD_BODY IDENTIFY failed to decode JSON body")])

    def test_garbage_right_after_a_compression_upgrade(self) -> None:
        c = FakeClient(self.nsqd)
        identify = b'{"feature_negotiation":true,"snappy":true}'
        c.command(b"IDENTIFY", body=identify)
        c.send(b"\x00\x05\x00\x00abcde")  # pipelined: a snappy chunk with a bad checksum
        self.clock.advance(ANSWER_ALONE)
        raw = c.transport.value()
        reader = FrameReader()
        reader.feed(raw)
        identified = reader.next()
        self.assertEqual(identified and identified[0], FRAME_TYPE_RESPONSE)  # IDENTIFY's, in clear
        reader.feed(b"".join(SnappyCodec().decode(reader.rest())))
        frames = reader.frames()
        self.assertEqual(frames[0], OK)
        self.assertEqual(frames[1][0], FRAME_TYPE_ERROR)
        self.assertTrue(frames[1][1].startswith(b"E_BAD_BODY failed to read command - "), frames[1])
        self.assertTrue(c.disconnected)
