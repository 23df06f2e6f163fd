"""The bench clients' TLS socket (bench/_common.py ``TLSSocket``): one ``recv``
gives every record one read of the socket brought, as a plain socket's does, so a
TLS consume row measures the server and not a client paying a round of work (and a
write of its FINs) per 16 KiB record."""

from __future__ import annotations

import socket
import ssl
import sys
import threading
from pathlib import Path

from twisted.trial import unittest

from tests.certs import make_certs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from _common import TLSSocket


class BenchTLSSocketTests(unittest.TestCase):
    def setUp(self) -> None:
        files = make_certs(self.mktemp())
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(files.cert, files.key)
        client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client_ctx.check_hostname = False
        client_ctx.verify_mode = ssl.CERT_NONE
        self.raw, self.peer = socket.socketpair()
        self.raw.settimeout(60)
        self.peer.settimeout(60)
        self.addCleanup(self.raw.close)
        self.addCleanup(self.peer.close)
        # the server's side in memory, so that the test decides when its bytes arrive
        self.s_in, self.s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.server = server_ctx.wrap_bio(self.s_in, self.s_out, server_side=True)
        made: list[TLSSocket] = []
        t = threading.Thread(target=lambda: made.append(TLSSocket(self.raw, client_ctx, "127.0.0.1")))
        t.start()
        while True:
            self.s_in.write(self.peer.recv(1 << 16))
            try:
                self.server.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.peer.sendall(self.s_out.read())
        self.peer.sendall(self.s_out.read())  # the last flight (TLS 1.3's session tickets)
        t.join(60)
        self.assertEqual(len(made), 1)
        self.client = made[0]

    def server_sends(self, *plaintexts: bytes) -> None:
        for p in plaintexts:
            self.server.write(p)  # one record each (at most 16 KiB)
        self.peer.sendall(self.s_out.read())

    def server_reads(self, size: int) -> bytes:
        got = b""
        while len(got) < size:
            try:
                got += self.server.read(1 << 16)
            except ssl.SSLWantReadError:
                self.s_in.write(self.peer.recv(1 << 16))
        return got

    def test_one_recv_gives_every_record_the_read_brought(self):
        records = [bytes([i]) * (1 << 14) for i in range(4)]
        self.server_sends(*records)  # all in the socket before the client reads
        self.assertEqual(self.client.recv(1 << 18), b"".join(records))

    def test_reads_bigger_and_smaller_than_the_kept_buffers_come_back_whole(self):
        # the plaintext and ciphertext buffers are kept between reads and grow: what
        # one recv returned is not overwritten by the next
        first = [bytes([i]) * (1 << 14) for i in range(20)]  # 320 KiB: more than one read takes
        for p in first:
            self.server.write(p)
        # more than the socket pair holds: sent while the client reads
        t = threading.Thread(target=self.peer.sendall, args=(self.s_out.read(),))
        t.start()
        self.addCleanup(t.join)
        got = []
        while sum(map(len, got)) < 20 << 14:
            got.append(self.client.recv(1 << 18))
        self.assertEqual(b"".join(got), b"".join(first))
        self.server_sends(b"second")
        self.assertEqual(self.client.recv(1 << 10), b"second")
        self.assertEqual(b"".join(got), b"".join(first))

    def test_a_record_split_across_reads_waits_for_its_rest(self):
        self.server.write(b"x" * 1000)
        wire = self.s_out.read()
        self.peer.sendall(wire[:100])
        t = threading.Timer(0.05, self.peer.sendall, (wire[100:],))
        t.start()
        self.addCleanup(t.join)
        self.assertEqual(self.client.recv(1 << 18), b"x" * 1000)

    def test_sendall_reaches_the_server(self):
        self.client.sendall(b"FIN 0123456789abcdef\n" * 100)
        self.assertEqual(self.server_reads(2100), b"FIN 0123456789abcdef\n" * 100)

    def test_close_sends_close_notify(self):
        self.client.close()
        self.s_in.write(self.peer.recv(1 << 16))
        self.assertEqual(self.server.read(10), b"")  # Python's answer to close_notify

    def test_the_servers_close_notify_reads_as_the_end(self):
        self.server_sends(b"last words")
        try:
            self.server.unwrap()
        except ssl.SSLWantReadError:
            pass  # it sent its close_notify; the client's answer is not awaited
        self.peer.sendall(self.s_out.read())
        self.assertEqual(self.client.recv(1 << 18), b"last words")
        self.assertEqual(self.client.recv(1 << 18), b"")

    def test_the_end_of_the_stream_reads_as_empty(self):
        self.peer.shutdown(socket.SHUT_WR)
        self.assertEqual(self.client.recv(1 << 18), b"")
