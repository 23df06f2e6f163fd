"""The V1 exchange, byte for byte as Go nsqlookupd answers it (recorded from Go 1.3)."""

import json
import struct

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial import unittest

from lookupd_tw.nsqlookupd import NSQLookupd
from lookupd_tw.options import NSQLookupdOptions
from lookupd_tw.protocol_v1 import LookupProtocolV1
from lookupd_tw.registration_db import Registration

IDENTIFY_BODY = json.dumps(
    {"version": "1.3.0", "tcp_port": 4150, "http_port": 4151, "hostname": "h", "broadcast_address": "127.0.0.1"}
).encode()

# what Go nsqd 1.3 sends when it connects with topic gt and channel gc (recorded)
_GO_IDENTIFY = b'{"broadcast_address":"127.0.0.1","hostname":"vm","http_port":24251,"tcp_port":24250,"version":"1.3.0"}'
GO_NSQD_SESSION = (
    b"  V1IDENTIFY\n"
    + struct.pack(">i", len(_GO_IDENTIFY))
    + _GO_IDENTIFY
    + b"REGISTER gt\nREGISTER gt gc\nREGISTER gt ge#ephemeral\n"
    + b"UNREGISTER gt gc\nUNREGISTER gt\nUNREGISTER gt ge#ephemeral\n"
)


def responses(data: bytes) -> list[bytes]:
    out = []
    while len(data) >= 4:
        (n,) = struct.unpack(">i", data[:4])
        out.append(data[4 : 4 + n])
        data = data[4 + n :]
    return out


class V1Tests(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.lookupd = NSQLookupd(NSQLookupdOptions(broadcast_address="127.0.0.1"), self.clock)
        self.lookupd.tcp_address = ("127.0.0.1", 4160)
        self.lookupd.http_address = ("127.0.0.1", 4161)
        self.port = 40000

    def client(self):
        self.port += 1
        proto = LookupProtocolV1(self.lookupd)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", self.port))
        proto.makeConnection(transport)
        return proto, transport

    def session(self, data: bytes) -> tuple[list[bytes], StringTransport]:
        proto, transport = self.client()
        proto.dataReceived(data)
        return responses(transport.value()), transport

    def identified(self):
        proto, transport = self.client()
        proto.dataReceived(b"  V1IDENTIFY\n" + struct.pack(">i", len(IDENTIFY_BODY)) + IDENTIFY_BODY)
        transport.clear()
        return proto, transport

    def test_go_nsqd_session(self) -> None:
        out, transport = self.session(GO_NSQD_SESSION)
        ident = json.loads(out[0])
        self.assertEqual(list(ident), ["broadcast_address", "hostname", "http_port", "tcp_port", "version"])
        self.assertEqual((ident["tcp_port"], ident["http_port"], ident["version"]), (4160, 4161, "1.3.0"))
        self.assertEqual(out[1:], [b"OK"] * 6)
        self.assertFalse(transport.disconnecting)

    def test_register_unregister(self) -> None:
        proto, transport = self.identified()
        for line in (b"PING\n", b"REGISTER t c\n", b"REGISTER t\n", b"REGISTER t2 c2#ephemeral\n"):
            proto.dataReceived(line)
        db = self.lookupd.db
        self.assertEqual(
            sorted(db.registrations),
            sorted(
                [
                    Registration("client", "", ""),
                    Registration("topic", "t", ""),
                    Registration("channel", "t", "c"),
                    Registration("topic", "t2", ""),
                    Registration("channel", "t2", "c2#ephemeral"),
                ]
            ),
        )
        proto.dataReceived(b"UNREGISTER t2 c2#ephemeral\n")
        self.assertNotIn(Registration("channel", "t2", "c2#ephemeral"), db.registrations, "ephemeral goes")
        proto.dataReceived(b"UNREGISTER t\n")
        self.assertEqual(db.find_producers("channel", "t", "c"), [], "a topic UNREGISTER takes its channels")
        self.assertEqual(responses(transport.value()), [b"OK"] * 6)

    def test_disconnect_removes_the_peer_everywhere(self) -> None:
        proto, _ = self.identified()
        proto.dataReceived(b"REGISTER t c\n")
        proto.connectionLost(None)
        self.assertEqual(self.lookupd.db.find_producers("topic", "t", ""), [])
        self.assertEqual(self.lookupd.db.find_producers("client", "", ""), [])

    def test_ping_updates_last_update(self) -> None:
        proto, _ = self.identified()
        self.clock.advance(30)
        proto.dataReceived(b"PING\n")
        self.assertEqual(proto.peer_info.last_update, 1030)

    def test_errors_recorded_from_go(self) -> None:
        cases = [
            (b"  V1REGISTER t c\n", b"E_INVALID client must IDENTIFY"),
            (b"  V1FOO bar\n", b"E_INVALID invalid command FOO"),
            (b"  V1\n", b"E_INVALID invalid command "),
            (b"  V2", b"E_BAD_PROTOCOL"),
            (b"  V1IDENTIFY\n" + struct.pack(">i", 14) + b'{"tcp_port":1}', b"E_BAD_BODY IDENTIFY missing fields"),
            (b"  V1IDENTIFY\n" + struct.pack(">i", 5) + b"{nope", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        ]
        for data, error in cases:
            out, transport = self.session(data)
            self.assertEqual(out, [error], data)
            self.assertTrue(transport.disconnecting)

    def test_errors_after_identify(self) -> None:
        for line, error in [
            (b"REGISTER bad! c\n", b"E_BAD_TOPIC REGISTER topic name 'bad!' is not valid"),
            (b"REGISTER t c! \n", b"E_BAD_CHANNEL REGISTER channel name 'c!' is not valid"),
            (b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
            (b"UNREGISTER\n", b"E_INVALID UNREGISTER insufficient number of params"),
            (b"IDENTIFY\n", b"E_INVALID cannot IDENTIFY again"),
        ]:
            proto, transport = self.identified()
            proto.dataReceived(line)
            self.assertEqual(responses(transport.value()), [error], line)
            self.assertTrue(transport.disconnecting)

    def test_whitespace_and_crlf(self) -> None:
        out, _ = self.session(b"  V1  PING  \nPING\r\n")
        self.assertEqual(out, [b"OK", b"OK"])

    def test_byte_at_a_time(self) -> None:
        proto, transport = self.client()
        for i in range(len(GO_NSQD_SESSION)):
            proto.dataReceived(GO_NSQD_SESSION[i : i + 1])
        self.assertEqual(len(responses(transport.value())), 7)

    def test_negative_identify_size(self) -> None:
        out, _transport = self.session(b"  V1IDENTIFY\n" + struct.pack(">i", -5))
        self.assertEqual(out, [b"E_BAD_BODY IDENTIFY failed to read body"])
