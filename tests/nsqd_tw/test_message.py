import random

from twisted.trial import unittest

from nsq_wire.frames import FRAME_TYPE_MESSAGE, FrameReader
from nsq_wire.message import _frames, _records, decode, frames, numbered_records, records
from nsqd_tw.core.message import Message
from nsqd_tw.storage.backend import CutRecord


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

    def test_decode_a_view_of_a_read_buffer(self) -> None:
        """A disk queue's read_views hands records as memoryviews: the message holds bytes."""
        m = Message(b"0123456789abcdef", b"\x00\xffbody" * 200, 1_700_000_000_000_000_001, attempts=7)
        buf = b"xx" + m.encode() + b"yy"
        d = Message.decode(memoryview(buf)[2:-2])
        self.assertEqual((d.id, d.body, d.timestamp, d.attempts), (m.id, m.body, m.timestamp, m.attempts))
        self.assertEqual((type(d.id), type(d.body)), (bytes, bytes))
        e = self.assertRaises(ValueError, Message.decode, memoryview(buf)[:25])
        self.assertEqual(str(e), "invalid message buffer size (25)")

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


class BurstTests(unittest.TestCase):
    """What the compiled module (setup.py) writes and reads in place is what the
    layout's struct-based code does; the suite runs against both builds."""

    ID = b"0123456789abcdef"

    def test_frames_are_each_frame_back_to_back(self) -> None:
        edges = [0, 1, -1, 255, 256, 2**31, 2**63 - 1, -(2**63), 1_700_000_000_123_456_789]
        bodies = [b"", b"x", b"\x00\xff" * 100, bytes(range(256)) * 4]
        msgs = [Message(self.ID, bodies[i % 4], ts, attempts=a) for i, ts in enumerate(edges) for a in (0, 1, 65535)]
        self.assertEqual(frames(msgs), b"".join(m.frame() for m in msgs))
        self.assertEqual(frames([]), b"")

    def test_frames_of_other_shapes_are_the_pure_ones(self) -> None:
        class Body(bytes):
            pass

        odd = [
            Message(self.ID, Body(b"subclass"), 5, attempts=2),
            Message(b"short", b"an ID of the wrong length", 6),
            Message(self.ID, memoryview(b"a view"), 7),  # type: ignore[arg-type]
        ]
        for m in odd:
            burst = [Message(self.ID, b"plain", 1), m]
            self.assertEqual(frames(burst), _frames(burst))
            self.assertEqual(frames(burst), b"".join(x.frame() for x in burst))

    def test_decode_is_the_struct_decode(self) -> None:
        rng = random.Random(39)
        heads = [bytes(rng.getrandbits(8) for _ in range(26)) for _ in range(2000)]
        heads += [b"\x80" + b"\x00" * 25, b"\x7f" + b"\xff" * 25, b"\xff" * 26, b"\x00" * 26]
        for head in heads:
            data = head + b"body"
            m = Message.decode(data)
            self.assertEqual((m.id, m.body, m.timestamp, m.attempts), decode(data))
        for data in (bytearray(heads[0] + b"b"), CutRecord(heads[1] + b"b", 27)):
            m = Message.decode(data)  # type: ignore[arg-type]
            self.assertEqual((m.id, bytes(m.body), m.timestamp, m.attempts), decode(bytes(data)))

    def test_decoded_message_is_a_fresh_one(self) -> None:
        made = Message(self.ID, b"body", 42, attempts=7)
        got = Message.decode(made.encode())
        names = ("id", "body", "timestamp", "attempts", "deferred", "client_id", "delivery_ts", "pri", "bucket", "ref")
        for name in names:
            self.assertEqual(getattr(got, name), getattr(made, name), name)
            self.assertIs(type(getattr(got, name)), type(getattr(made, name)), name)

    def test_numbered_records_are_records_of_the_ids_the_runs_make(self) -> None:
        runs = [(b"0123456789abc", [b"%03x" % s for s in range(4090, 4096)]), (b"0123456789abd", [b"000", b"001"])]
        ids = [p + s for p, ss in runs for s in ss]
        bodies = [bytes(range(i % 256)) * (1 + 30 * i) for i in range(len(ids))]
        for ts in (0, -1, 2**63 - 1, 1_700_000_000_123_456_789):
            self.assertEqual(numbered_records(runs, bodies, ts), records(ids, bodies, ts))
        self.assertEqual(numbered_records([], [], 5), [])
        # other shapes (the pure path) make the same records, or the same error
        odd = [
            ([(b"0123456789", [b"abcdef"])], [b"x"]),  # a prefix of another length
            ([(b"0123456789abc", (b"000",))], [b"x"]),  # suffixes not a list
            ([[b"0123456789abc", [b"000"]]], [b"x"]),  # a run not a tuple
            ([(b"0123456789abc", [b"000"])], [memoryview(b"view")]),
            (((b"0123456789abc", [b"000"]),), [b"x"]),  # runs not a list
        ]
        for r, b in odd:
            want = records([p + s for p, ss in r for s in ss], b, 7)  # type: ignore[arg-type]
            self.assertEqual(numbered_records(r, b, 7), want)  # type: ignore[arg-type]
        self.assertRaises(ValueError, numbered_records, runs, bodies[:3], 7)
        long_id = [(b"0123456789abc", [b"0000"])]  # 17 bytes: as records() makes it (the pure path)
        self.assertEqual(numbered_records(long_id, [b"x"], 7), records([b"0123456789abc0000"], [b"x"], 7))

    def test_records_are_each_encode(self) -> None:
        ids = [b"%016x" % i for i in range(50)]
        bodies = [bytes(range(i % 256)) * (1 + i // 10) for i in range(50)]
        for ts in (0, -1, 2**63 - 1, -(2**63), 1_700_000_000_123_456_789):
            want = [Message(i, b, ts).encode() for i, b in zip(ids, bodies, strict=True)]
            self.assertEqual(records(ids, bodies, ts), want)
        self.assertEqual(records([], [], 5), [])
        odd = [([b"short"], [b"body"]), (ids[:1], [memoryview(b"view")]), ((ids[0],), (b"tuple",))]
        for i, b in odd:
            self.assertEqual(records(i, b, 7), _records(i, b, 7))  # type: ignore[arg-type]
        self.assertRaises(ValueError, records, ids[:2], bodies[:1], 7)
