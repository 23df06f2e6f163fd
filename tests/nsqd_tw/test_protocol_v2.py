"""The V2 exchange a client sees, command by command, success and error paths."""

import gc
import json
import struct
import weakref
import zlib
from typing import Any

from twisted.trial import unittest

from nsq_wire.commands import encode_command, mpub
from nsq_wire.compression import SnappyCodec
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameReader
from nsq_wire.parser import MAX_LINE_LENGTH
from nsqd_tw.core.message import Message
from nsqd_tw.tcp import upgrade
from nsqd_tw.tcp.protocol import decode_identify
from tests.helpers import FakeClient, make_nsqd

OK = (FRAME_TYPE_RESPONSE, b"OK")


def err(text: str) -> tuple[int, bytes]:
    return (FRAME_TYPE_ERROR, text.encode())


class ProtocolTestCase(unittest.TestCase):
    opts: dict = {}

    def setUp(self) -> None:
        self.nsqd = make_nsqd(**self.opts)
        self.clock = self.nsqd.reactor

    def client(self, magic: bool = True) -> FakeClient:
        return FakeClient(self.nsqd, magic)

    def consumer(self, topic: str = "t", channel: str = "c", rdy: int = 10, **identify) -> FakeClient:
        c = self.client()
        if identify:
            c.identify(**identify)
        self.assertEqual(c.sub(topic, channel, rdy), OK)
        return c

    def assertFatal(self, client: FakeClient, text: str) -> None:
        self.assertEqual(client.frames(), [err(text)])
        self.assertTrue(client.disconnected, "a fatal error closes the connection")


class MagicTests(ProtocolTestCase):
    def test_bad_magic(self) -> None:
        c = self.client(magic=False)
        c.send(b"  V1")
        self.assertFatal(c, "E_BAD_PROTOCOL")

    def test_magic_in_pieces_then_command(self) -> None:
        c = self.client(magic=False)
        c.send(b"  ")
        c.send(b"V2PUB t\n")
        c.send(struct.pack(">I", 1) + b"x")
        self.assertEqual(c.frames(), [OK])


class IdentifyTests(ProtocolTestCase):
    def test_plain_ok(self) -> None:
        self.assertEqual(self.client().identify(client_id="a", hostname="h"), OK)

    def test_feature_negotiation_reply(self) -> None:
        ft, data = self.client().identify(feature_negotiation=True, msg_timeout=5000, output_buffer_size=1024)
        self.assertEqual(ft, FRAME_TYPE_RESPONSE)
        self.assertEqual(
            data,
            b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":5000,'
            b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
            b'"sample_rate":0,"auth_required":false,"output_buffer_size":1024,"output_buffer_timeout":250}',
        )

    def test_fields_are_recorded(self) -> None:
        c = self.client()
        c.identify(client_id="cid", hostname="host", user_agent="ua/1", sample_rate=10)
        p = c.proto.client
        self.assertEqual((p.client_id, p.hostname, p.user_agent, p.sample_rate), ("cid", "host", "ua/1", 10))

    def test_bad_json(self) -> None:
        c = self.client()
        c.command(b"IDENTIFY", body=b"{nope")
        self.assertFatal(c, "E_BAD_BODY IDENTIFY failed to decode JSON body")

    def test_wrong_type(self) -> None:
        c = self.client()
        c.command(b"IDENTIFY", body=b'{"heartbeat_interval":"1000"}')
        self.assertFatal(c, "E_BAD_BODY IDENTIFY failed to decode JSON body")

    def test_range_checks(self) -> None:
        cases = [
            ({"heartbeat_interval": 999}, "heartbeat interval (999) is invalid"),
            ({"heartbeat_interval": 60001}, "heartbeat interval (60001) is invalid"),
            ({"output_buffer_size": 63}, "output buffer size (63) is invalid"),
            ({"output_buffer_size": 65537}, "output buffer size (65537) is invalid"),
            ({"output_buffer_timeout": 24}, "output buffer timeout (24) is invalid"),
            ({"sample_rate": 100}, "sample rate (100) is invalid"),
            ({"sample_rate": -1}, "sample rate (-1) is invalid"),
            ({"msg_timeout": 999}, "msg timeout (999) is invalid"),
            ({"msg_timeout": 900001}, "msg timeout (900001) is invalid"),
        ]
        for data, text in cases:
            c = self.client()
            c.command(b"IDENTIFY", body=json.dumps(data).encode())
            self.assertFatal(c, "E_BAD_BODY IDENTIFY " + text)

    def test_special_values(self) -> None:
        c = self.client()
        c.identify(heartbeat_interval=-1, output_buffer_size=-1)
        self.assertEqual((c.proto.client.heartbeat_interval, c.proto.client.output_buffer_size), (0, 1))
        self.assertEqual(c.proto.client.output_buffer_timeout, 0)

    def test_body_size_errors(self) -> None:
        c = self.client()
        c.send(b"IDENTIFY\n" + struct.pack(">I", 0))
        self.assertFatal(c, "E_BAD_BODY IDENTIFY invalid body size 0")
        c = self.client()
        c.send(b"IDENTIFY\n" + struct.pack(">I", 5 * 1024 * 1024 + 1))
        self.assertFatal(c, "E_BAD_BODY IDENTIFY body too big 5242881 > 5242880")

    def test_not_after_sub(self) -> None:
        c = self.consumer()
        c.send(b"IDENTIFY\n")
        self.assertFatal(c, "E_INVALID cannot IDENTIFY in current state")

    def test_decode_like_go(self) -> None:
        d = decode_identify(b'{"Client_ID":"x","unknown":1,"msg_timeout":null}')
        self.assertEqual((d["client_id"], d["msg_timeout"]), ("x", 0))
        self.assertRaises(ValueError, decode_identify, b'{"sample_rate": 1.5}')
        self.assertRaises(ValueError, decode_identify, b'{"sample_rate": 4294967296}')
        self.assertRaises(ValueError, decode_identify, b"[]")
        self.assertEqual(decode_identify(b"null")["hostname"], "")


class WriteLog:
    """Each write a connection makes to its transport, as one bytes object."""

    def __init__(self, transport: Any) -> None:
        self.writes: list[bytes] = []
        write, write_sequence = transport.write, transport.writeSequence

        def logged_write(data: bytes) -> None:
            self.writes.append(bytes(data))
            write(data)

        def logged_sequence(seq: Any) -> None:
            seq = list(seq)
            self.writes.append(b"".join(seq))
            write_sequence(seq)

        transport.write, transport.writeSequence = logged_write, logged_sequence


class CompressionUpgradeTests(ProtocolTestCase):
    """Without TLS, Go writes IDENTIFY's answer and the first compressed frame in
    two writes, and clients parse the answer from their first read: the answer goes
    out alone, and the compressed OK only once the reactor has slept (ANSWER_ALONE)."""

    ANSWER = (
        b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
        b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":true,'
        b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,"output_buffer_timeout":250}'
    )

    def test_snappy_bytes(self) -> None:
        c = self.client()
        log = WriteLog(c.transport)
        c.send(b"IDENTIFY\n" + struct.pack(">I", 42) + b'{"feature_negotiation":true,"snappy":true}')
        self.clock.advance(0)
        self.assertEqual(log.writes, [b"\x00\x00\x01\x0b\x00\x00\x00\x00" + self.ANSWER])
        self.clock.advance(upgrade.ANSWER_ALONE)
        self.assertEqual(
            log.writes[1:],
            [
                b"\xff\x06\x00\x00sNaPpY"  # the snappy stream's identifier
                b"\x01\x0e\x00\x00\x26\x98\x2b\xcf"  # an uncompressed chunk of 10 bytes and its masked CRC
                b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
            ],
        )
        self.assertTrue(c.proto.client.snappy)

    def test_deflate_answer_alone_then_the_compressed_ok(self) -> None:
        c = self.client()
        log = WriteLog(c.transport)
        c.command(b"IDENTIFY", body=b'{"feature_negotiation":true,"deflate":true}')
        self.clock.advance(0)
        self.assertEqual(len(log.writes), 1)
        self.assertEqual(json.loads(log.writes[0][8:])["deflate"], True)
        self.clock.advance(upgrade.ANSWER_ALONE)
        self.assertEqual(len(log.writes), 2)
        inflate = zlib.decompressobj(-15)
        self.assertEqual(inflate.decompress(log.writes[1]), b"\x00\x00\x00\x06\x00\x00\x00\x00OK")

    def test_commands_pipelined_after_identify_are_answered_after_the_ok(self) -> None:
        c = self.client()
        log = WriteLog(c.transport)
        codec = SnappyCodec()
        c.command(b"IDENTIFY", body=b'{"feature_negotiation":true,"snappy":true}')
        c.send(codec.encode(encode_command(b"PUB", "t", body=b"x")))
        self.clock.advance(0)
        self.assertEqual(len(log.writes), 1, "the answer alone")
        self.clock.advance(upgrade.ANSWER_ALONE)
        reader = FrameReader()
        reader.feed(b"".join(SnappyCodec().decode(b"".join(log.writes[1:]))))
        self.assertEqual(reader.frames(), [OK, OK])
        self.assertEqual(self.nsqd.topics["t"].message_count, 1)

    def test_a_heartbeat_due_meanwhile_follows_the_compressed_ok(self) -> None:
        c = self.client()
        self.assertEqual(c.identify(heartbeat_interval=1000), OK)
        self.clock.advance(1.0 - upgrade.ANSWER_ALONE / 2)
        log = WriteLog(c.transport)
        c.command(b"IDENTIFY", body=b'{"feature_negotiation":true,"snappy":true}')
        self.clock.advance(0)
        self.clock.advance(upgrade.ANSWER_ALONE)
        self.assertEqual(len(log.writes), 2, "nothing in clear after the answer")
        reader = FrameReader()
        reader.feed(b"".join(SnappyCodec().decode(log.writes[1])))
        self.assertEqual(reader.frames(), [OK, (FRAME_TYPE_RESPONSE, b"_heartbeat_")])

    def test_a_client_gone_before_the_ok_is_forgotten(self) -> None:
        c = self.client()
        c.command(b"IDENTIFY", body=b'{"feature_negotiation":true,"deflate":true}')
        self.clock.advance(0)
        c.lose()
        self.assertEqual(self.clock.getDelayedCalls(), [])


class SubTests(ProtocolTestCase):
    def test_sub_ok_creates_topic_and_channel(self) -> None:
        self.consumer("t", "c")
        self.assertIn("c", self.nsqd.topics["t"].channels)

    def test_errors(self) -> None:
        cases = [
            (b"SUB t\n", "E_INVALID SUB insufficient number of parameters"),
            (b"SUB bad! c\n", 'E_BAD_TOPIC SUB topic name "bad!" is not valid'),
            (b"SUB t bad!\n", 'E_BAD_CHANNEL SUB channel name "bad!" is not valid'),
            (b"SUB " + b"x" * 65 + b" c\n", 'E_BAD_TOPIC SUB topic name "' + "x" * 65 + '" is not valid'),
        ]
        for line, text in cases:
            c = self.client()
            c.send(line)
            self.assertFatal(c, text)

    def test_twice(self) -> None:
        c = self.consumer()
        c.send(b"SUB t c2\n")
        self.assertFatal(c, "E_INVALID cannot SUB in current state")

    def test_heartbeats_disabled(self) -> None:
        c = self.client()
        c.identify(heartbeat_interval=-1)
        c.send(b"SUB t c\n")
        self.assertFatal(c, "E_INVALID cannot SUB with heartbeats disabled")

    def test_max_channel_consumers(self) -> None:
        self.nsqd.opts.max_channel_consumers = 1
        self.consumer()
        c = self.client()
        c.send(b"SUB t c\n")
        self.assertFatal(c, "E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1")


class RdyTests(ProtocolTestCase):
    def test_before_sub(self) -> None:
        c = self.client()
        c.send(b"RDY 1\n")
        self.assertFatal(c, "E_INVALID cannot RDY in current state")

    def test_out_of_range(self) -> None:
        c = self.consumer(rdy=None)
        c.send(b"RDY 2501\n")
        self.assertFatal(c, "E_INVALID RDY count 2501 out of range 0-2500")

    def test_unparsable(self) -> None:
        c = self.consumer(rdy=None)
        c.send(b"RDY -1\n")
        self.assertFatal(c, "E_INVALID RDY could not parse count -1")

    def test_default_is_one(self) -> None:
        c = self.consumer(rdy=None)
        c.send(b"RDY\n")
        self.assertEqual(c.proto.client.ready_count, 1)
        self.assertEqual(c.frames(), [])

    def test_limits_in_flight(self) -> None:
        c = self.consumer(rdy=2)
        p = self.client()
        p.mpub("t", [b"a", b"b", b"c"])
        msgs = c.messages()
        self.assertEqual([m.body for m in msgs], [b"a", b"b"])
        c.fin(msgs[0].id)
        self.assertEqual([m.body for m in c.messages()], [b"c"])


class PubTests(ProtocolTestCase):
    def test_pub_delivers(self) -> None:
        c = self.consumer()
        self.assertEqual(self.client().pub("t", b"hello"), OK)
        (m,) = c.messages()
        self.assertEqual((m.body, m.attempts, len(m.id)), (b"hello", 1, 16))
        self.assertAlmostEqual(m.timestamp / 1e9, self.nsqd.now(), delta=1)

    def test_pub_errors(self) -> None:
        cases = [
            (b"PUB\n", "E_INVALID PUB insufficient number of parameters"),
            (b"PUB a*b\n", 'E_BAD_TOPIC PUB topic name "a*b" is not valid'),
            (b"PUB t\n" + struct.pack(">I", 0), "E_BAD_MESSAGE PUB invalid message body size 0"),
            (b"PUB t\n" + struct.pack(">I", 1048577), "E_BAD_MESSAGE PUB message too big 1048577 > 1048576"),
        ]
        for data, text in cases:
            c = self.client()
            c.send(data)
            self.assertFatal(c, text)

    def test_mpub(self) -> None:
        c = self.consumer()
        self.assertEqual(self.client().mpub("t", [b"1", b"2", b"3"]), OK)
        msgs = c.messages()
        self.assertEqual([m.body for m in msgs], [b"1", b"2", b"3"])
        self.assertEqual(len({m.id for m in msgs}), 3)
        self.assertEqual(self.nsqd.topics["t"].message_count, 3)

    def test_mpub_errors(self) -> None:
        s = struct.pack
        cases = [
            (b"MPUB\n", "E_INVALID MPUB insufficient number of parameters"),
            (b"MPUB a*b\n", 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "a*b" is not valid'),
            (b"MPUB t\n" + s(">I", 0), "E_BAD_BODY MPUB invalid body size 0"),
            (b"MPUB t\n" + s(">II", 8, 0), "E_BAD_BODY MPUB invalid message count 0"),
            (b"MPUB t\n" + s(">III", 9, 1, 0), "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
            (b"MPUB t\n" + s(">III", 9, 1, 1048577), "E_BAD_MESSAGE MPUB message too big 1048577 > 1048576"),
        ]
        for data, text in cases:
            c = self.client()
            c.send(data)
            self.assertFatal(c, text)

    def test_mpub_whose_size_counts_only_the_bodies(self) -> None:
        """segmentio/nsq-go's MultiPublish: the size field is the sum of the bodies
        (10 one-byte messages: 0x0a, the real body 54 bytes). Go reads the messages
        by their count and answers OK; so does nsqd, and the next command follows."""
        c = self.consumer(rdy=100)
        p = self.client()
        p.send(
            b"MPUB t\n"
            b"\x00\x00\x00\x0a"  # the size: 10, the bodies only
            b"\x00\x00\x00\x0a"  # 10 messages
            + b"".join(b"\x00\x00\x00\x01" + b"%d" % i for i in range(10))
            + b"PUB t\n\x00\x00\x00\x01x"
        )
        self.clock.advance(0)
        self.assertEqual(p.transport.value(), b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 2)
        self.assertFalse(p.disconnected)
        self.assertEqual([m.body for m in c.messages()], [b"%d" % i for i in range(10)] + [b"x"])

    def test_dpub(self) -> None:
        self.nsqd.opts.queue_scan_selection_count = 20
        c = self.consumer()
        p = self.client()
        p.command(b"DPUB", "t", "2000", body=b"later")
        self.assertEqual(p.frame(), OK)
        self.assertEqual(c.messages(), [])
        self.clock.advance(1.9)
        self.nsqd.queue_scan()
        self.assertEqual(c.messages(), [])
        self.clock.advance(0.2)
        self.nsqd.queue_scan()
        self.assertEqual([m.body for m in c.messages()], [b"later"])

    def test_dpub_errors(self) -> None:
        cases = [
            (b"DPUB t\n", "E_INVALID DPUB insufficient number of parameters"),
            (b"DPUB !t 1\n", 'E_BAD_TOPIC DPUB topic name "!t" is not valid'),
            (b"DPUB t x\n", "E_INVALID DPUB could not parse timeout x"),
            (b"DPUB t 3600001\n", "E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
        ]
        for data, text in cases:
            c = self.client()
            c.send(data)
            self.assertFatal(c, text)

    def test_pipelined_pubs_each_get_their_ok_in_order(self) -> None:
        """PUBs read together are stored together; nothing of that shows but fewer syscalls."""
        c = self.consumer(rdy=100)
        p = self.client()
        wire = b"".join(encode_command(b"PUB", "t", body=b"%d" % i) for i in range(5))
        wire += mpub("t", [b"m1", b"m2"]) + encode_command(b"PUB", "u", body=b"u0")
        wire += encode_command(b"PUB", "t", body=b"5") + b"NOP\n" + encode_command(b"PUB", "t", body=b"6")
        p.send(wire)
        self.assertEqual(p.frames(), [OK] * 9)
        self.assertEqual([m.body for m in c.messages()], [b"0", b"1", b"2", b"3", b"4", b"m1", b"m2", b"5", b"6"])
        self.assertEqual(p.proto.client.pub_counts, {"t": 9, "u": 1})
        self.assertEqual(self.nsqd.topics["u"].message_count, 1)

    def test_pubs_before_a_fatal_error_are_stored_and_answered(self) -> None:
        c = self.consumer(rdy=100)
        p = self.client()
        p.send(encode_command(b"PUB", "t", body=b"a") + encode_command(b"PUB", "t", body=b"b") + b"PUB a*b\n")
        self.assertEqual(p.frames(), [OK, OK, err('E_BAD_TOPIC PUB topic name "a*b" is not valid')])
        self.assertTrue(p.disconnected)
        self.assertEqual([m.body for m in c.messages()], [b"a", b"b"])
        p = self.client()
        p.send(encode_command(b"PUB", "t", body=b"c") + b"PUB t\n" + struct.pack(">I", 0))
        self.assertEqual(p.frames(), [OK, err("E_BAD_MESSAGE PUB invalid message body size 0")])
        p = self.client()
        p.send(encode_command(b"PUB", "t", body=b"d") + b"GARBAGE\n")
        self.assertEqual(p.frames(), [OK, err("E_INVALID invalid command GARBAGE")])
        self.assertEqual([m.body for m in c.messages()], [b"c", b"d"])

    def test_publish_in_any_state(self) -> None:
        c = self.consumer("other", "c")
        self.assertEqual(c.pub("t", b"x"), OK)
        self.assertEqual(c.proto.client.pub_counts, {"t": 1})


class FinReqTouchTests(ProtocolTestCase):
    def delivered(self, c: FakeClient, body: bytes = b"m") -> Message:
        self.client().pub("t", body)
        (m,) = c.messages()
        return m

    def test_fin(self) -> None:
        c = self.consumer()
        m = self.delivered(c)
        c.fin(m.id)
        self.assertEqual(c.frames(), [])
        self.assertEqual((c.proto.client.finish_count, c.proto.client.in_flight_count), (1, 0))

    def test_fin_not_in_flight_is_not_fatal(self) -> None:
        c = self.consumer()
        c.send(b"FIN 0123456789abcdef\n")
        self.assertEqual(c.frames(), [err("E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")])
        self.assertFalse(c.disconnected)
        self.assertEqual(c.pub("elsewhere", b"x"), OK)

    def test_fins_of_one_read(self) -> None:
        c = self.consumer(rdy=10)
        self.client().mpub("t", [b"1", b"2", b"3"])
        msgs = c.messages()
        lines = [b"FIN " + msgs[0].id + b"\n", b"FIN 0123456789abcdef\n", b"FIN " + msgs[1].id + b"\n"]
        c.send(b"".join(lines) + b"RDY 0\nFIN " + msgs[2].id + b"\n")
        self.assertEqual(c.frames(), [err("E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")])
        self.assertEqual((c.proto.client.finish_count, c.proto.client.in_flight_count), (3, 0))
        self.assertEqual(c.proto.client.ready_count, 0)

    def test_fin_by_another_client(self) -> None:
        a = self.consumer()
        b = self.consumer()
        p = self.client()
        p.pub("t", b"1")
        msgs = a.messages() + b.messages()
        other = b if a.proto.client.in_flight_count else a
        other.fin(msgs[0].id)
        self.assertEqual(
            other.frames(), [err(f"E_FIN_FAILED FIN {msgs[0].id.decode()} failed client does not own message")]
        )

    def test_state_and_params(self) -> None:
        for line, text in [
            (b"FIN 0123456789abcdef\n", "E_INVALID cannot FIN in current state"),
            (b"REQ 0123456789abcdef 0\n", "E_INVALID cannot REQ in current state"),
            (b"TOUCH 0123456789abcdef\n", "E_INVALID cannot TOUCH in current state"),
        ]:
            c = self.client()
            c.send(line)
            self.assertFatal(c, text)
        for line, text in [
            (b"FIN\n", "E_INVALID FIN insufficient number of params"),
            (b"REQ 0123456789abcdef\n", "E_INVALID REQ insufficient number of params"),
            (b"TOUCH\n", "E_INVALID TOUCH insufficient number of params"),
            (b"FIN 123\n", "E_INVALID invalid message ID"),
            (b"REQ 0123456789abcdef x\n", "E_INVALID REQ could not parse timeout x"),
        ]:
            c = self.consumer()
            c.send(line)
            self.assertFatal(c, text)

    def test_req_now(self) -> None:
        c = self.consumer()
        m = self.delivered(c)
        c.send(b"REQ " + m.id + b" 0\n")
        (again,) = c.messages()
        self.assertEqual((again.id, again.attempts), (m.id, 2))
        self.assertEqual(c.proto.client.requeue_count, 1)

    def test_req_deferred_and_clamped(self) -> None:
        self.nsqd.opts.max_req_timeout = 10
        c = self.consumer()
        m = self.delivered(c)
        c.send(b"REQ " + m.id + b" 99999999\n")
        self.clock.advance(9.9)
        self.nsqd.queue_scan()
        self.assertEqual(c.messages(), [])
        self.clock.advance(0.2)
        self.nsqd.queue_scan()
        self.assertEqual([x.id for x in c.messages()], [m.id])

    def test_req_not_in_flight(self) -> None:
        c = self.consumer()
        c.send(b"REQ 0123456789abcdef 0\n")
        self.assertEqual(c.frames(), [err("E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight")])

    def test_touch(self) -> None:
        c = self.consumer(msg_timeout=2000)
        m = self.delivered(c)
        self.clock.advance(1.5)
        c.send(b"TOUCH " + m.id + b"\n")
        self.clock.advance(1.5)
        self.nsqd.queue_scan()
        self.assertEqual(c.messages(), [])
        self.clock.advance(0.6)
        self.nsqd.queue_scan()
        self.assertEqual([x.attempts for x in c.messages()], [2])

    def test_touch_not_in_flight(self) -> None:
        c = self.consumer()
        c.send(b"TOUCH 0123456789abcdef\n")
        self.assertEqual(c.frames(), [err("E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight")])

    def test_timeout_redelivers(self) -> None:
        c = self.consumer(msg_timeout=1000)
        m = self.delivered(c)
        self.clock.advance(1.01)
        self.nsqd.queue_scan()
        (again,) = c.messages()
        self.assertEqual((again.id, again.attempts), (m.id, 2))
        self.assertEqual(self.nsqd.topics["t"].channels["c"].timeout_count, 1)
        self.assertEqual(c.proto.client.in_flight_count, 1)
        # the late FIN of the first delivery finishes the redelivery: same ID
        c.fin(m.id)
        self.assertEqual(c.frames(), [])


class ClsNopAuthTests(ProtocolTestCase):
    def test_cls(self) -> None:
        c = self.consumer()
        self.client().pub("t", b"1")
        (m,) = c.messages()
        c.send(b"CLS\n")
        self.assertEqual(c.frames(), [(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")])
        self.client().pub("t", b"2")
        self.assertEqual(c.messages(), [])
        c.fin(m.id)  # still allowed while closing
        c.send(b"RDY 5\n")  # ignored while closing
        self.assertEqual(c.frames(), [])
        self.assertFalse(c.disconnected)

    def test_cls_before_sub(self) -> None:
        c = self.client()
        c.send(b"CLS\n")
        self.assertFatal(c, "E_INVALID cannot CLS in current state")

    def test_nop(self) -> None:
        c = self.client()
        c.send(b"NOP\n")
        self.assertEqual(c.frames(), [])

    def test_auth_disabled(self) -> None:
        c = self.client()
        c.command(b"AUTH", body=b"secret")
        self.assertFatal(c, "E_AUTH_DISABLED AUTH disabled")

    def test_auth_params(self) -> None:
        c = self.client()
        c.send(b"AUTH x\n")
        self.assertFatal(c, "E_INVALID AUTH invalid number of parameters")

    def test_unknown_command(self) -> None:
        c = self.client()
        c.send(b"WHAT now\n")
        self.assertFatal(c, "E_INVALID invalid command WHAT")

    def test_line_too_long_closes_silently(self) -> None:
        c = self.client()
        c.send(b"P" * MAX_LINE_LENGTH)
        self.assertEqual(c.frames(), [])
        self.assertTrue(c.disconnected)

    def test_errors_do_not_disturb_other_clients(self) -> None:
        good = self.consumer()
        bad = self.client()
        bad.send(b"MPUB t\n" + struct.pack(">II", 8, 0))
        self.assertTrue(bad.disconnected)
        self.client().pub("t", b"fine")
        self.assertEqual([m.body for m in good.messages()], [b"fine"])


class HeartbeatTests(ProtocolTestCase):
    def test_heartbeat_and_timeout(self) -> None:
        c = self.client()
        self.clock.advance(30)
        self.assertEqual(c.frames(), [(FRAME_TYPE_RESPONSE, b"_heartbeat_")])
        c.send(b"NOP\n")
        self.clock.advance(59)
        self.assertFalse(c.disconnected)
        self.clock.advance(1.1)
        self.assertTrue(c.transport.disconnecting)

    def test_negotiated_interval(self) -> None:
        c = self.client()
        c.identify(heartbeat_interval=1000)
        self.clock.advance(1)
        self.assertEqual(c.frames(), [(FRAME_TYPE_RESPONSE, b"_heartbeat_")])
        self.clock.advance(2.1)
        self.assertTrue(c.transport.disconnecting)

    def test_disabled(self) -> None:
        c = self.client()
        c.identify(heartbeat_interval=-1)
        self.clock.advance(3600)
        self.assertEqual(c.frames(), [])
        self.assertFalse(c.disconnected)


class DeliveryTests(ProtocolTestCase):
    def test_several_consumers_share_a_channel(self) -> None:
        a, b = self.consumer(), self.consumer()
        self.client().mpub("t", [b"%d" % i for i in range(10)])
        got_a, got_b = a.messages(), b.messages()
        self.assertEqual((len(got_a), len(got_b)), (5, 5))

    def test_each_channel_gets_every_message(self) -> None:
        a, b = self.consumer("t", "a"), self.consumer("t", "b")
        self.client().mpub("t", [b"1", b"2"])
        self.assertEqual([m.body for m in a.messages()], [b"1", b"2"])
        self.assertEqual([m.body for m in b.messages()], [b"1", b"2"])

    def test_disconnect_requeues_at_once(self) -> None:
        a = self.consumer()
        self.client().pub("t", b"x")
        (m,) = a.messages()
        b = self.consumer()
        a.lose()
        (again,) = b.messages()
        self.assertEqual((again.id, again.attempts), (m.id, 2))

    def test_held_by_topic_until_consumer(self) -> None:
        self.client().mpub("t", [b"early"])
        c = self.consumer()
        self.clock.advance(0)
        self.assertEqual([m.body for m in c.messages()], [b"early"])

    def test_ephemeral_channel_goes_with_last_client(self) -> None:
        c = self.consumer("t", "c#ephemeral")
        c.lose()
        self.assertNotIn("c#ephemeral", self.nsqd.topics["t"].channels)

    def test_output_buffer_size_flushes_early(self) -> None:
        c = self.consumer(output_buffer_size=64)
        self.client().mpub("t", [b"x" * 100, b"y" * 100])
        # each frame is over 64 bytes, so it went out without the end-of-turn flush
        self.assertGreater(len(c.transport.value()), 200)

    def test_message_frame_bytes(self) -> None:
        c = self.consumer()
        self.client().pub("t", b"abc")
        self.clock.advance(0)
        data = c.transport.value()
        size, ft = struct.unpack(">ii", data[:8])
        self.assertEqual((size, ft, len(data)), (4 + 26 + 3, FRAME_TYPE_MESSAGE, 8 + 26 + 3))
        self.assertEqual(data[8 + 8 : 8 + 10], b"\x00\x01")


class DisconnectTests(ProtocolTestCase):
    def test_disconnect_mid_frame(self) -> None:
        c = self.client()
        c.send(b"PUB t\n" + struct.pack(">I", 100) + b"only part of the body")
        c.lose()
        self.assertNotIn("t", self.nsqd.topics)
        self.assertEqual(self.nsqd.clients, {})
        self.assertEqual(self.client().pub("t", b"next"), OK)

    def test_disconnect_mid_mpub(self) -> None:
        consumer = self.consumer()
        c = self.client()
        c.send(b"MPUB t\n" + struct.pack(">III", 100, 3, 1) + b"a" + struct.pack(">I", 5) + b"bc")
        c.lose()
        self.assertEqual(consumer.messages(), [])


class LifetimeTests(ProtocolTestCase):
    def test_a_closed_connection_is_freed_at_once(self) -> None:
        """A connection's parts point back at it weakly: once closed it is freed by
        reference counting, not left in garbage until a full collection (a churn
        of consumers kept hundreds, and the heap grew)."""
        gc.disable()
        self.addCleanup(gc.enable)
        producer = self.client()
        c = self.consumer(rdy=5, heartbeat_interval=1000)
        for i in range(3):
            self.assertEqual(producer.pub("t", b"m%d" % i), OK)
        first, second, _ = c.messages()
        c.command(b"FIN", first.id)
        c.command(b"REQ", second.id, b"0")
        c.command(b"TOUCH", c.messages()[0].id)
        c.lose()
        self.clock.advance(1)
        gone = [weakref.ref(c.proto), weakref.ref(c.proto.client), weakref.ref(c.proto.output)]
        del c
        self.assertEqual([ref() for ref in gone], [None, None, None])
