"""The replication link's frames: what one end writes, the other reads back."""

from __future__ import annotations

import json

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import Logger
from twisted.trial import unittest

from nsq_wire.message import records
from nsqd_tw.replication import wire
from nsqd_tw.replication.admission import Admission
from nsqd_tw.replication.link import Link

IDS = [b"%016x" % i for i in range(3)]
RECORDS = records(IDS, [b"a", b"", b"c" * 300], 1_700_000_000_000_000_000)


def read_all(data: bytes, step: int = 0) -> list[tuple[int, bytes]]:
    """The frames in ``data``, fed whole or ``step`` bytes at a time."""
    reader = wire.FrameReader()
    out = []
    chunks = [data] if not step else [data[i : i + step] for i in range(0, len(data), step)]
    for chunk in chunks:
        reader.feed(chunk)
        while (item := reader.next()) is not None:
            out.append(item)
    return out


class FrameTests(unittest.TestCase):
    def test_pub_round_trip(self) -> None:
        [(kind, payload)] = read_all(wire.pub("events", RECORDS))
        self.assertEqual(kind, wire.PUB)
        p = wire.Payload(payload)
        self.assertEqual((p.name(), p.records()), ("events", RECORDS))
        p.end()

    def test_pub_records_come_framed_as_a_data_file_holds_them(self) -> None:
        [(_, payload)] = read_all(wire.pub("events", RECORDS))
        p = wire.Payload(payload)
        p.name()
        batch = p.framed()
        self.assertEqual((batch.count, batch.smallest, batch.largest), (3, 26, 326))
        self.assertEqual(batch.data, b"".join(len(r).to_bytes(4, "big") + r for r in RECORDS))

    def test_records_not_as_their_header_says_are_link_errors(self) -> None:
        [(_, payload)] = read_all(wire.pub("t", RECORDS))
        head = 2 + 12  # the name, then count, smallest, largest
        for bad in (
            payload[:2] + (0).to_bytes(4, "big") + payload[6:],  # no records
            payload[:2] + (4).to_bytes(4, "big") + payload[6:],  # one more than there are
            payload[:head] + payload[head:-1],  # cut short
            payload[:6] + (400).to_bytes(4, "big") + payload[10:],  # the smallest bigger than the largest
        ):
            p = wire.Payload(bad)
            p.name()
            self.assertRaises(wire.LinkError, p.records)

    def test_dpub_carries_the_delay(self) -> None:
        [(kind, payload)] = read_all(wire.dpub("t", 1_500_000_000, RECORDS[:1]))
        p = wire.Payload(payload)
        self.assertEqual((kind, p.name(), p.i64(), p.records()), (wire.DPUB, "t", 1_500_000_000, RECORDS[:1]))

    def test_fin_req_and_entries(self) -> None:
        data = (
            wire.fin("t", "c", IDS)
            + wire.req("t", "c", 2_000, RECORDS[2])
            + wire.entries_frame("t", None, [(0, RECORDS[0]), (99, RECORDS[1])])
            + wire.entries_frame("t", "c", [(5, RECORDS[2])])
        )
        fin, req, topic_entries, channel_entries = read_all(data, step=7)
        p = wire.Payload(fin[1])
        self.assertEqual((fin[0], p.name(), p.name(), p.ids()), (wire.FIN, "t", "c", IDS))
        p = wire.Payload(req[1])
        self.assertEqual((req[0], p.name(), p.name(), p.i64(), p.rest()), (wire.REQ, "t", "c", 2_000, RECORDS[2]))
        p = wire.Payload(topic_entries[1])
        self.assertEqual(
            (topic_entries[0], p.name(), p.entries()), (wire.TOPIC_RECORDS, "t", [(0, RECORDS[0]), (99, RECORDS[1])])
        )
        p = wire.Payload(channel_entries[1])
        self.assertEqual(
            (channel_entries[0], p.name(), p.name(), p.entries()), (wire.CHANNEL_RECORDS, "t", "c", [(5, RECORDS[2])])
        )

    def test_json_ack_and_empty_frames(self) -> None:
        frames = read_all(wire.json_frame(wire.CTRL, {"op": "topic_pause"}) + wire.ack(7, 99) + wire.ping(99))
        self.assertEqual(frames[0][0], wire.CTRL)
        self.assertEqual(wire.json_payload(frames[0][1]), {"op": "topic_pause"})
        self.assertEqual(wire.ack_count(frames[1][1]), (7, 99))
        self.assertEqual(frames[2][0], wire.PING)
        self.assertEqual(wire.ping_token(frames[2][1]), 99)
        self.assertEqual(wire.ack_count(wire.ack(3)[5:]), (3, 0), "no PING received yet: no token")

    def test_a_partial_frame_waits(self) -> None:
        data = wire.pub("t", RECORDS)
        reader = wire.FrameReader()
        reader.feed(data[:-1])
        self.assertIsNone(reader.next())
        reader.feed(data[-1:])
        self.assertEqual(reader.next(), read_all(data)[0])
        self.assertIsNone(reader.next())

    def test_bad_sizes_and_short_payloads_are_link_errors(self) -> None:
        reader = wire.FrameReader(max_frame=100)
        reader.feed(b"\x00\x00\x10\x00\x20")
        self.assertRaises(wire.LinkError, reader.next)
        reader = wire.FrameReader()
        reader.feed(b"\x00\x00\x00\x00\x20")
        self.assertRaises(wire.LinkError, reader.next)
        self.assertRaises(wire.LinkError, wire.Payload(b"\x05ab").name)
        self.assertRaises(wire.LinkError, wire.Payload(b"\x00" * 17).ids)
        self.assertRaises(wire.LinkError, wire.json_payload, b"[1]")
        self.assertRaises(wire.LinkError, wire.ack_count, b"\x00")
        p = wire.Payload(b"\x01tX")
        p.name()
        self.assertRaises(wire.LinkError, p.end)


class HandshakeLimitTests(unittest.TestCase):
    def test_a_frame_over_the_limit_is_refused_from_its_header(self) -> None:
        reader = wire.FrameReader(max_frame=wire.MAX_HELLO)
        reader.feed(wire.frame(wire.HELLO, b"x" * (wire.MAX_HELLO - 1)))
        self.assertEqual(len(reader.next()[1]), wire.MAX_HELLO - 1)  # type: ignore[index]
        reader.feed(b"\x04\x00\x00\x00\x01")  # 64 MiB announced, none of it sent
        with self.assertRaises(wire.FrameTooBig) as caught:
            reader.next()
        self.assertEqual(str(caught.exception), "a frame of 67108864 bytes, over the limit of 65536")
        self.assertIsInstance(caught.exception, wire.LinkError)

    def test_json_payloads_are_bounded_in_depth(self) -> None:
        deep = b'{"a":' * wire.MAX_JSON_DEPTH + b"1" + b"}" * wire.MAX_JSON_DEPTH
        self.assertEqual(wire.json_depth(deep), wire.MAX_JSON_DEPTH)
        self.assertIsInstance(wire.json_payload(deep), dict)
        too_deep = b'{"a":' + deep + b"}"
        with self.assertRaises(wire.LinkError) as caught:
            wire.json_payload(too_deep)
        self.assertEqual(str(caught.exception), f"payload nested deeper than {wire.MAX_JSON_DEPTH}")
        for nested in (b"[" * 100_000 + b"]" * 100_000, b"[" * 100_000):  # RecursionError in json
            self.assertRaises(wire.LinkError, wire.json_payload, nested)
        # brackets in strings, escaped quotes among them, are not nesting
        text = json.dumps({"error": '[[[{{{"\\' * 100, "x": ["]]]"]}).encode()
        self.assertEqual(wire.json_depth(text), 2)
        self.assertEqual(wire.json_payload(text)["x"], ["]]]"])


class ProofTests(unittest.TestCase):
    def test_each_side_proves_the_secret_over_both_hellos(self) -> None:
        a, b = b'{"nonce":"1"}', b'{"nonce":"2"}'
        dialer = wire.proof(b"s3cret", b"dialer", a, b)
        self.assertTrue(wire.verify(wire.proof(b"s3cret", b"dialer", a, b), dialer))
        self.assertFalse(wire.verify(wire.proof(b"other", b"dialer", a, b), dialer))
        self.assertFalse(wire.verify(wire.proof(b"s3cret", b"acceptor", a, b), dialer))  # not replayable
        self.assertFalse(wire.verify(wire.proof(b"s3cret", b"dialer", a, b'{"nonce":"3"}'), dialer))


class _Service:
    """The node a link reports to: a clock, --replication-timeout, its refusals' log."""

    log = None
    timeout = 5.0

    def __init__(self) -> None:
        self.lost: list[str] = []
        self.events: list[dict] = []
        self.nsqd = type("NSQD", (), {"reactor": Clock()})()
        self.admission = Admission(self.nsqd.reactor, Logger(observer=self.events.append))

    def now(self) -> float:
        return 0.0

    def link_lost(self, link: object, why: str) -> None:
        self.lost.append(why)


class VersionTests(unittest.TestCase):
    def test_a_peer_of_another_link_version_is_refused_saying_so(self) -> None:
        """Version 3's PINGs carry the token its ACKs echo (the lease), version 4
        adds the retained logs' frames: a node of version 2 cannot read them, and
        is told so at its HELLO."""
        service = _Service()
        link = Link(service, dialer=False)  # type: ignore[arg-type]
        transport = StringTransport()
        link.makeConnection(transport)
        link.dataReceived(wire.frame(wire.HELLO, json.dumps({"version": 2, "nonce": "00"}).encode()))
        [(kind, payload)] = read_all(transport.value())
        why = "protocol version 2 not supported (this node speaks 4)"
        self.assertEqual((kind, wire.json_payload(payload)), (wire.ERROR, {"error": why}))
        self.assertEqual(service.lost, [why])
        self.assertTrue(transport.disconnecting)
        [event] = service.events  # one line, rate-limited
        self.assertIn("before authentication (the last from 192.168.1.1:54321)", event["text"])  # StringTransport
        self.assertTrue(event["text"].endswith(f" - {why}"))
