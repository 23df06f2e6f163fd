import struct
import zlib

from twisted.trial import unittest

from nsq_wire import commands, compression, lookupd, message, v1
from nsq_wire.commands import encode_command, mpub
from nsq_wire.errors import ClientError, FatalClientError, NSQError
from nsq_wire.frames import FRAME_TYPE_RESPONSE, FrameReader, pack_frame
from nsq_wire.gofmt import go_quote, join_host_port, parse_base10, to_int64
from nsq_wire.names import is_valid_name
from nsq_wire.parser import MAX_LINE_LENGTH, Command, ProtocolViolation, V2Parser


def parse_all(parser: V2Parser, data: bytes) -> list[Command]:
    """The complete commands in ``data`` (a body command's line comes out first, incomplete)."""
    parser.feed(data)
    out = []
    while (cmd := parser.next()) is not None:
        if cmd.complete:
            out.append(cmd)
    return out


class FrameTests(unittest.TestCase):
    def test_pack_frame(self) -> None:
        self.assertEqual(pack_frame(FRAME_TYPE_RESPONSE, b"OK"), b"\x00\x00\x00\x06\x00\x00\x00\x00OK")

    def test_reader_keeps_a_partial_frame(self) -> None:
        data = pack_frame(0, b"OK") + pack_frame(1, b"E_INVALID x")
        reader = FrameReader()
        reader.feed(data[:-3])
        self.assertEqual(reader.frames(), [(0, b"OK")])
        self.assertEqual(reader.next(), None)
        reader.feed(data[-3:])
        self.assertEqual(reader.next(), (1, b"E_INVALID x"))
        self.assertEqual(reader.next(), None)

    def test_reader_one_at_a_time_then_the_rest(self) -> None:
        reader = FrameReader()
        reader.feed(pack_frame(0, b"OK") + b"\x01\x02")  # then bytes of another kind (a TLS record)
        self.assertEqual(reader.next(), (0, b"OK"))
        self.assertEqual(reader.rest(), b"\x01\x02")
        self.assertEqual(reader.frames(), [])

    def test_reader_refuses_a_size_below_four(self) -> None:
        for take in (FrameReader.next, FrameReader.frames):
            reader = FrameReader()
            reader.feed(b"\x00\x00\x00\x03\x00\x00\x00\x00")
            e = self.assertRaises(NSQError, take, reader)
            self.assertEqual(str(e), "invalid frame size 3")


class ClientCodecTests(unittest.TestCase):
    def test_message_decode(self) -> None:
        data = (-1 & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "big") + b"\x00\x02" + b"0123456789abcdef" + b"body"
        self.assertEqual(message.decode(data), (b"0123456789abcdef", b"body", -1, 2))
        self.assertEqual(message.message_id(data), b"0123456789abcdef")
        e = self.assertRaises(ValueError, message.decode, data[:25])
        self.assertEqual(str(e), "invalid message buffer size (25)")

    def test_commands(self) -> None:
        self.assertEqual(commands.sub("t", "c"), b"SUB t c\n")
        self.assertEqual(commands.rdy(5), b"RDY 5\n")
        self.assertEqual(commands.fin(b"x" * 16), b"FIN " + b"x" * 16 + b"\n")
        self.assertEqual(commands.req(b"x" * 16, 10), b"REQ " + b"x" * 16 + b" 10\n")
        self.assertEqual(commands.touch(b"x" * 16), b"TOUCH " + b"x" * 16 + b"\n")
        self.assertEqual(commands.pub("t", b"ab"), b"PUB t\n\x00\x00\x00\x02ab")
        self.assertEqual(commands.dpub("t", 7, b"ab"), b"DPUB t 7\n\x00\x00\x00\x02ab")
        self.assertEqual(commands.auth(b"s"), b"AUTH\n\x00\x00\x00\x01s")
        self.assertEqual(commands.identify({"a": 1}), b'IDENTIFY\n\x00\x00\x00\x08{"a": 1}')
        fields = commands.identify_defaults("ua/1", "me")
        self.assertEqual(
            (fields["client_id"], fields["user_agent"], fields["feature_negotiation"]), ("me", "ua/1", True)
        )

    def test_error(self) -> None:
        e = NSQError.from_frame(b"E_INVALID bad \xff", "h:1")
        self.assertEqual(
            (e.code, e.text, e.address, str(e)),
            ("E_INVALID", "E_INVALID bad \ufffd", "h:1", "h:1: E_INVALID bad \ufffd"),
        )

    def test_v1(self) -> None:
        self.assertEqual(v1.identify(b"{}"), b"IDENTIFY\n\x00\x00\x00\x02{}")
        self.assertEqual(v1.register("t"), b"REGISTER t\n")
        self.assertEqual(v1.unregister("t", "c"), b"UNREGISTER t c\n")
        reader = v1.ResponseReader(max_size=10)
        reader.feed(v1.pack_response(b"OK") + b"\x00\x00")
        self.assertEqual(reader.next(), b"OK")
        self.assertEqual(reader.next(), None)
        reader.feed(b"\x00\x0b")
        e = self.assertRaises(v1.ResponseTooLarge, reader.next)
        self.assertEqual(e.size, 11)

    def test_lookupd_urls(self) -> None:
        self.assertEqual(lookupd.lookup_url("h:4161", "a b&c"), "http://h:4161/lookup?topic=a%20b%26c")
        self.assertEqual(lookupd.channels_url("https://h/", "t"), "https://h/channels?topic=t")
        self.assertEqual(lookupd.nodes_url("[::1]:4161"), "http://[::1]:4161/nodes")

    def test_lookupd_answers(self) -> None:
        body = (
            b'{"channels":["c",1],"producers":[{"broadcast_address":"::1","tcp_port":4150},'
            b'{"address":"h","tcp_port":1},{"broadcast_address":"x"}]}'
        )
        self.assertEqual(lookupd.producers(body), [("::1", 4150), ("h", 1)])
        self.assertEqual(lookupd.channels(body), ["c"])
        self.assertEqual(lookupd.channels(b'{"status_code":200,"data":{"channels":["d"]}}'), ["d"])
        self.assertRaises(ValueError, lookupd.producers, b"[]")

    def test_join_host_port(self) -> None:
        self.assertEqual(join_host_port("::1", 4150), "[::1]:4150")
        self.assertEqual(join_host_port("127.0.0.1", "80"), "127.0.0.1:80")


class DeflateCodecTests(unittest.TestCase):
    """IDENTIFY deflate: raw DEFLATE, every flush decodable at once, whichever zlib compresses."""

    def test_compressed_with_zlib_ng_when_installed(self) -> None:
        from zlib_ng import zlib_ng

        self.assertIs(compression.deflater(), zlib_ng)

    def test_zlib_ng_is_imported_by_the_first_deflate_not_at_start(self) -> None:
        """Its package takes ~15 ms to import: nsqd's start does not pay for it."""
        import subprocess
        import sys

        check = (
            "import sys, nsqd_tw.tcp.connection, nsq_wire.compression as c; "
            "before = 'zlib_ng' in sys.modules; c.DeflateCodec(6); print(before, 'zlib_ng' in sys.modules)"
        )
        out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True, timeout=120)
        self.assertEqual(out.stdout.split(), ["False", "True"])

    def test_each_flush_inflates_at_once_with_either_zlib(self) -> None:
        from zlib_ng import zlib_ng

        flushes = [pack_frame(2, b"%d" % i * 40) * 50 for i in range(5)]
        for deflate_with in (zlib_ng, zlib):
            for level in (1, 6, 9):
                codec = compression.DeflateCodec(level, deflate_with)
                inflate = zlib.decompressobj(-zlib.MAX_WBITS)  # as a client's flate reader
                for data in flushes:
                    self.assertEqual(inflate.decompress(codec.encode(data)), data, (deflate_with, level))

    def test_decodes_what_a_client_deflates(self) -> None:
        codec = compression.DeflateCodec(6)
        c = zlib.compressobj(6, zlib.DEFLATED, -15)
        wire = c.compress(b"FIN 0123456789abcdef\n" * 10) + c.flush(zlib.Z_SYNC_FLUSH)
        self.assertEqual(b"".join(codec.decode(wire)), b"FIN 0123456789abcdef\n" * 10)


class NameTests(unittest.TestCase):
    def test_valid(self) -> None:
        for name in ["a", "test_topic", "a.b-c_d", "x" * 64, "foo#ephemeral", "x" * 54 + "#ephemeral"]:
            self.assertTrue(is_valid_name(name), name)

    def test_invalid(self) -> None:
        for name in ["", "x" * 65, "a b", "a!b", "#ephemeral", "a#eph", "a\n", "tópico", "a#ephemeral#ephemeral"]:
            self.assertFalse(is_valid_name(name), name)

    def test_trailing_newline_is_invalid(self) -> None:
        # Python's $ would accept "abc\n"; Go's regexp does not
        self.assertFalse(is_valid_name(b"abc\n"))

    def test_go_quote(self) -> None:
        self.assertEqual(go_quote(b"a!b"), '"a!b"')
        self.assertEqual(go_quote(b'a"b\\'), '"a\\"b\\\\"')
        self.assertEqual(go_quote(b"\x00\t\xff"), '"\\x00\\t\\xff"')
        self.assertEqual(go_quote("é".encode()), '"é"')
        self.assertEqual(go_quote(b"\x7f"), '"\\x7f"')


class Base10Tests(unittest.TestCase):
    def test_digits(self) -> None:
        self.assertEqual(parse_base10(b"1234"), 1234)
        self.assertEqual(parse_base10(b""), 0)

    def test_rejects_sign_and_letters(self) -> None:
        for bad in [b"-1", b"1a", b" 1", b"+1"]:
            self.assertRaises(ValueError, parse_base10, bad)

    def test_wraps_like_uint64(self) -> None:
        self.assertEqual(parse_base10(b"18446744073709551617"), 1)
        self.assertEqual(to_int64(2**64 - 1), -1)


class ParserTests(unittest.TestCase):
    def parser(self) -> V2Parser:
        return V2Parser(max_msg_size=1024, max_body_size=4096)

    def test_simple_commands(self) -> None:
        cmds = parse_all(self.parser(), b"NOP\nRDY 10\r\nFIN 0123456789abcdef\n")
        self.assertEqual(
            [(c.name, c.params) for c in cmds],
            [(b"NOP", [b"NOP"]), (b"RDY", [b"RDY", b"10"]), (b"FIN", [b"FIN", b"0123456789abcdef"])],
        )

    def test_take_fins(self) -> None:
        p = self.parser()
        p.feed(b"FIN 0123456789abcdef\nFIN fedcba9876543210\nRDY 5\nFIN 0123456789abcdef\n")
        self.assertEqual(p.take_fins(), [b"0123456789abcdef", b"fedcba9876543210"])
        self.assertEqual(p.take_fins(), [])  # RDY is next: for next()
        self.assertEqual(p.next().params, [b"RDY", b"5"])  # type: ignore[union-attr]
        self.assertEqual(p.take_fins(), [b"0123456789abcdef"])
        self.assertIsNone(p.next())

    def test_take_fins_leaves_other_shapes_to_next(self) -> None:
        for data, params in [
            (b"FIN 0123456789abcdef\r\n", [b"FIN", b"0123456789abcdef"]),
            (b"FIN 0123456789 abcde\n", [b"FIN", b"0123456789", b"abcde"]),
            (b"FIN 0123\nFIN 0123456789\n", [b"FIN", b"0123"]),
            (b"FIN 0123456789abcdefX\n", [b"FIN", b"0123456789abcdefX"]),
            (b"FIN 0123456789abcde\r\n", [b"FIN", b"0123456789abcde"]),
        ]:
            p = self.parser()
            p.feed(data)
            self.assertEqual(p.take_fins(), [], data)
            self.assertEqual(p.next().params, params, data)  # type: ignore[union-attr]

    def test_the_fin_loop_ends_where_the_regular_expression_does(self) -> None:
        """take_fins compiled reads the FIN run with a C loop (_fin_run_end), else with
        _FIN_RUN: the two agree on every shape, at any offset."""
        import random

        from nsq_wire.parser import _FIN_RUN, _fin_ids, _fin_run_end

        rng = random.Random(39)
        pieces = [b"FIN 0123456789abcdef\n", b"FIN 0123456789abcde\r\n", b"FIN 0123456789 abcde\n", b"FIN 01\n"]
        pieces += [b"RDY 5\n", b"FIN 0123456789abcdefX\n", b"FIN\t0123456789abcdef\n", b"fin 0123456789abcdef\n"]
        pieces += [b"FIN 0123456789abcde\n\n", b"FIN 0123456789abcdef", bytes(range(256))]
        for _ in range(2000):
            data = b"".join(rng.choice(pieces[:1] * 6 + pieces) for _ in range(rng.randrange(1, 8)))
            data = data[: rng.randrange(len(data) + 1)]
            for pos in {0, rng.randrange(len(data) + 1)}:
                run = _FIN_RUN.match(data, pos)
                end = run.end() if run else pos
                self.assertEqual(_fin_run_end(data, pos), end, (data, pos))
                self.assertEqual(_fin_ids(data, pos, end), [data[at + 4 : at + 20] for at in range(pos, end, 21)])

    def test_take_fins_cut_by_the_read(self) -> None:
        data = b"FIN 0123456789abcdef\n" * 3
        for cut in range(1, len(data)):
            p = self.parser()
            p.feed(data[:cut])
            ids = p.take_fins()
            p.feed(data[cut:])
            while (cmd := p.next()) is not None:
                ids.append(cmd.params[1])
                ids += p.take_fins()
            self.assertEqual(ids, [b"0123456789abcdef"] * 3, cut)

    def test_empty_line_is_an_empty_command(self) -> None:
        cmds = parse_all(self.parser(), b"\n")
        self.assertEqual(cmds[0].name, b"")

    def test_pub_split_anywhere(self) -> None:
        data = encode_command(b"PUB", "t", body=b"hello world") + b"NOP\n"
        for cut in range(1, len(data)):
            p = self.parser()
            cmds = parse_all(p, data[:cut]) + parse_all(p, data[cut:])
            self.assertEqual([c.name for c in cmds], [b"PUB", b"NOP"], cut)
            self.assertEqual(cmds[0].body, b"hello world")

    def test_byte_at_a_time(self) -> None:
        data = mpub("t", [b"a", b"bc", b"def"]) + encode_command(b"DPUB", "t", "10", body=b"x")
        p = self.parser()
        cmds = []
        for i in range(len(data)):
            cmds += parse_all(p, data[i : i + 1])
        self.assertEqual(cmds[0].bodies, [b"a", b"bc", b"def"])
        self.assertEqual((cmds[1].name, cmds[1].params, cmds[1].body), (b"DPUB", [b"DPUB", b"t", b"10"], b"x"))

    def test_mpub_inner_messages_define_the_stream(self) -> None:
        # as in Go, MPUB reads count and messages from the stream; a short inner
        # payload leaves the rest of the declared body to be read as commands
        inner = struct.pack(">I", 1) + struct.pack(">I", 2) + b"hi"
        data = b"MPUB t\n" + struct.pack(">I", len(inner) + 4) + inner + b"NOP\n"
        cmds = parse_all(self.parser(), data)
        self.assertEqual([c.name for c in cmds], [b"MPUB", b"NOP"])
        self.assertEqual(cmds[0].bodies, [b"hi"])

    def test_mpub_whose_size_counts_only_the_bodies(self) -> None:
        # segmentio/nsq-go declares the sum of the bodies: 10 one-byte messages say
        # 0x0a of a 54-byte body. Go reads them by their count, and so does nsqd
        bodies = [b"%d" % i for i in range(10)]
        payload = struct.pack(">I", 10) + b"".join(struct.pack(">I", 1) + b for b in bodies)
        self.assertEqual(len(payload), 54)
        data = b"MPUB t\n\x00\x00\x00\x0a" + payload + b"NOP\n"
        for step in (len(data), 1):
            p = self.parser()
            cmds: list[Command] = []
            for i in range(0, len(data), step):
                cmds += parse_all(p, data[i : i + step])
            self.assertEqual([c.name for c in cmds], [b"MPUB", b"NOP"], step)
            self.assertEqual(cmds[0].bodies, bodies, step)

    def test_mpub_bodies_are_bounded_by_max_body_size(self) -> None:
        # whatever it declared, an MPUB's bodies total at most --max-body-size (4096):
        # the one that would pass it is refused at its size, before its body is read
        data = b"MPUB t\n" + struct.pack(">II", 8, 5) + (struct.pack(">I", 1024) + b"x" * 1024) * 4
        data += struct.pack(">I", 1024)
        self.assertFatal(data, "E_BAD_BODY MPUB body too big 5120 > 4096")
        p = self.parser()
        with self.assertRaises(FatalClientError) as e:
            for i in range(len(data)):
                parse_all(p, data[i : i + 1])
        self.assertEqual(str(e.exception), "E_BAD_BODY MPUB body too big 5120 > 4096")
        self.assertEqual(i, len(data) - 1, "refused at the last byte of its size")
        exact = b"MPUB t\n" + struct.pack(">II", 8, 4) + (struct.pack(">I", 1024) + b"x" * 1024) * 4
        self.assertEqual(len(parse_all(self.parser(), exact)[0].bodies or []), 4, "4096 bytes of bodies are read")

    def assertFatal(self, data: bytes, text: str, parser: V2Parser | None = None) -> None:
        p = parser or self.parser()
        e = self.assertRaises(FatalClientError, parse_all, p, data)
        self.assertEqual(str(e), text)

    def test_body_size_errors(self) -> None:
        size = struct.pack
        self.assertFatal(b"PUB t\n" + size(">I", 0), "E_BAD_MESSAGE PUB invalid message body size 0")
        self.assertFatal(b"PUB t\n" + size(">I", 1025), "E_BAD_MESSAGE PUB message too big 1025 > 1024")
        self.assertFatal(b"DPUB t 1\n" + size(">i", -1), "E_BAD_MESSAGE DPUB invalid message body size -1")
        self.assertFatal(b"MPUB t\n" + size(">I", 0), "E_BAD_BODY MPUB invalid body size 0")
        self.assertFatal(b"MPUB t\n" + size(">I", 4097), "E_BAD_BODY MPUB body too big 4097 > 4096")
        self.assertFatal(b"IDENTIFY\n" + size(">I", 4097), "E_BAD_BODY IDENTIFY body too big 4097 > 4096")
        self.assertFatal(b"IDENTIFY\n" + size(">I", 0), "E_BAD_BODY IDENTIFY invalid body size 0")
        self.assertFatal(b"AUTH\n" + size(">I", 0xFFFFFFFF), "E_BAD_BODY AUTH invalid body size -1")

    def test_mpub_count_and_message_errors(self) -> None:
        s = struct.pack
        self.assertFatal(b"MPUB t\n" + s(">II", 100, 0), "E_BAD_BODY MPUB invalid message count 0")
        # (max_body_size - 4) / 5 == 818
        self.assertFatal(b"MPUB t\n" + s(">II", 100, 819), "E_BAD_BODY MPUB invalid message count 819")
        self.assertFatal(
            b"MPUB t\n" + s(">IIIcI", 100, 2, 1, b"a", 0), "E_BAD_MESSAGE MPUB invalid message(1) body size 0"
        )
        self.assertFatal(b"MPUB t\n" + s(">III", 100, 2, 1025), "E_BAD_MESSAGE MPUB message too big 1025 > 1024")
        self.assertFatal(
            b"MPUB t\n" + s(">IIIcI", 100, 2, 1, b"a", 0xFFFFFFFF), "E_BAD_MESSAGE MPUB invalid message(1) body size -1"
        )

    def test_mpub_cut_anywhere_by_the_reads(self) -> None:
        """MPUBs fed in random cuts (the compiled build reads whole pairs in C):
        the bodies come out whole and in order, and a refused size is refused
        with its index wherever the reads cut."""
        import random

        rng = random.Random(45)
        for _ in range(300):
            bodies = [bytes([rng.randrange(256)]) * rng.randrange(1, 100) for _ in range(rng.randrange(1, 40))]
            data = mpub("t", bodies) + b"NOP\n"
            bad = rng.random() < 0.3
            if bad:  # a message of a size refused, somewhere in the batch
                at = rng.randrange(len(bodies))
                size = rng.choice([0, -7, 1025])
                # the last message's size and 1-byte body become the refused size
                data = mpub("t", [*bodies[:at], b"x"])[: -(4 + 1)] + struct.pack(">i", size)
            p = self.parser()
            cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(0, 6))))
            pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
            cmds: list[Command] = []
            if bad:
                with self.assertRaises(FatalClientError) as e:
                    for piece in pieces:
                        cmds += parse_all(p, piece)
                self.assertIn(b"(%d)" % at if size <= 0 else b"too big", str(e.exception).encode())
                continue
            for piece in pieces:
                cmds += parse_all(p, piece)
            self.assertEqual([c.name for c in cmds], [b"MPUB", b"NOP"])
            self.assertEqual(cmds[0].bodies, bodies)

    def test_a_body_commands_line_comes_out_before_its_size_is_read(self) -> None:
        p = self.parser()
        p.feed(b"PUB t\n" + struct.pack(">I", 0))
        line = p.next()
        assert line is not None
        self.assertEqual((line.name, line.params, line.complete, line.body), (b"PUB", [b"PUB", b"t"], False, None))
        with self.assertRaises(FatalClientError):  # only now is the (bad) size read
            p.next()
        p2 = self.parser()
        p2.feed(b"PUB t\n" + struct.pack(">I", 2) + b"ab")
        self.assertFalse(p2.next().complete)  # type: ignore[union-attr]
        cmd = p2.next()
        assert cmd is not None
        self.assertEqual((cmd.complete, cmd.body), (True, b"ab"))

    def test_line_too_long(self) -> None:
        p = self.parser()
        self.assertRaises(ProtocolViolation, parse_all, p, b"X" * MAX_LINE_LENGTH)
        p = self.parser()
        self.assertEqual(parse_all(p, b"X" * (MAX_LINE_LENGTH - 1) + b"\n")[0].name, b"X" * (MAX_LINE_LENGTH - 1))

    def test_take_remainder(self) -> None:
        p = self.parser()
        p.feed(b"NOP\n\x16\x03\x01")
        self.assertEqual(p.next().name, b"NOP")
        self.assertEqual(p.take_remainder(), b"\x16\x03\x01")
        self.assertIsNone(p.next())

    def test_large_body_in_many_chunks(self) -> None:
        p = V2Parser(max_msg_size=1 << 20, max_body_size=5 << 20)
        body = bytes(range(256)) * 4000
        data = encode_command(b"PUB", "t", body=body)
        cmds = []
        for i in range(0, len(data), 1000):
            cmds += parse_all(p, data[i : i + 1000])
        self.assertEqual(cmds[0].body, body)


class ErrorTests(unittest.TestCase):
    def test_wire_text(self) -> None:
        self.assertEqual(
            FatalClientError("E_INVALID", "cannot FIN in current state").wire(),
            b"E_INVALID cannot FIN in current state",
        )
        self.assertTrue(FatalClientError("E_X").fatal)
        self.assertFalse(ClientError("E_X").fatal)
