from twisted.trial import unittest

from nsq_wire.frames import FRAME_TYPE_MESSAGE, FrameReader
from nsq_wire.message import records
from nsqd_tw.core.message import Message


class MessageTests(unittest.TestCase):
    def test_encode_layout(self) -> None:
        m = Message(b"0123456789abcdef", b"body", 1_700_000_000_000_000_001, attempts=3)
        data = m.encode()
        self.assertEqual(data[:8], (1_700_000_000_000_000_001).to_bytes(8, "big"))
        self.assertEqual(data[8:10], b"\x00\x03")
        self.assertEqual(data[10:26], b"0123456789abcdef")
        self.assertEqual(data[26:], b"body")

    def test_round_trip(self) -> None:
        m = Message(b"0123456789abcdef", b"\x00\xffbody", 12345, attempts=65535)
        d = Message.decode(m.encode())
        self.assertEqual((d.id, d.body, d.timestamp, d.attempts), (m.id, m.body, m.timestamp, m.attempts))

    def test_records_of_a_publish_are_what_encode_makes(self) -> None:
        ids, bodies = [b"0123456789abcdef", b"fedcba9876543210"], [b"one", b""]
        made = records(ids, bodies, -5)  # a negative timestamp wraps as Go's uint64
        self.assertEqual(made, [Message(i, b, -5).encode() for i, b in zip(ids, bodies, strict=True)])

    def test_decode_too_short(self) -> None:
        e = self.assertRaises(ValueError, Message.decode, b"x" * 25)
        self.assertEqual(str(e), "invalid message buffer size (25)")

    def test_frame(self) -> None:
        m = Message(b"0123456789abcdef", b"hello", 42, attempts=1)
        reader = FrameReader()
        reader.feed(m.frame())
        self.assertEqual(reader.frames(), [(FRAME_TYPE_MESSAGE, m.encode())])
        self.assertEqual(reader.rest(), b"")

    def test_copy_is_independent(self) -> None:
        m = Message(b"0123456789abcdef", b"x", 1)
        m.deferred = 1.5
        m.attempts = 3
        c = m.copy()
        c.attempts += 1
        self.assertEqual((m.attempts, c.attempts, c.deferred, c.id), (3, 1, 1.5, m.id))
