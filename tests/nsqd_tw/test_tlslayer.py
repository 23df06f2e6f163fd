"""The V2 connection's TLS layer against a pyOpenSSL client, in memory."""

from __future__ import annotations

import tracemalloc

from OpenSSL import SSL
from twisted.trial import unittest

from nsqd_tw.options import NSQDOptions
from nsqd_tw.tcp import tlslayer
from nsqd_tw.tcp.tlslayer import TLSLayer
from nsqd_tw.tls import ServerTLS
from tests.certs import make_certs
from tests.tlsmemory import Wire, client_bytes, decrypt


class TLSLayerTests(unittest.TestCase):
    # after the handshake, OpenSSL through the bindings pyOpenSSL calls (the
    # default); PyOpenSSLTLSLayerTests runs the same through pyOpenSSL's methods
    direct = True

    def setUp(self) -> None:
        files = make_certs(self.mktemp())
        self.server_context = ServerTLS(NSQDOptions(tls_cert=files.cert, tls_key=files.key)).getContext()
        self.wire = Wire()
        self.done: list[bool] = []
        self.layer = TLSLayer(self.server_context, self.wire, lambda: self.done.append(True), direct=self.direct)
        self.assertEqual(self.layer._ptr is not None, self.direct)
        ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
        self.client = SSL.Connection(ctx, None)
        self.client.set_connect_state()

    def handshake(self) -> None:
        client, layer = self.client, self.layer
        for _ in range(10):
            try:
                client.do_handshake()
            except SSL.WantReadError:
                pass
            else:
                if not layer.handshaking:
                    break
            self.assertEqual(layer.receive(client_bytes(client)), b"")
            if self.wire.written:
                client.bio_write(self.wire.take())
        self.assertFalse(layer.handshaking)
        self.assertEqual(self.done, [True])
        # what followed the handshake (TLS 1.3's tickets) reads as nothing
        self.assertEqual(decrypt(client, self.wire.take()), b"")

    def test_records_of_one_read_come_out_as_one_piece(self):
        """Twisted's TLS layer handed each record to the protocol on its own: a
        consumer's FINs, sent per record it read, were handled a few at a time."""
        self.handshake()
        for n in range(3):
            self.client.send(b"FIN %016d\n" % n)
        arrived = client_bytes(self.client)  # three records, one read
        self.assertEqual(
            self.layer.receive(arrived),
            b"FIN 0000000000000000\nFIN 0000000000000001\nFIN 0000000000000002\n",
        )

    def test_a_record_cut_across_reads_waits_for_its_end(self):
        self.handshake()
        self.client.send(b"NOP\n")
        arrived = client_bytes(self.client)
        self.assertEqual(self.layer.receive(arrived[:7]), b"")
        self.assertEqual(self.layer.receive(arrived[7:]), b"NOP\n")

    def test_a_flush_is_encrypted_at_once_in_one_piece(self):
        self.handshake()
        data = bytes(range(256)) * 1000  # several records
        sealed = self.layer.encrypt(data)
        self.assertEqual(self.wire.written, [], "the caller writes it")
        self.assertEqual(decrypt(self.client, sealed), data)

    def test_close_notify_ends_the_session_for_the_client(self):
        self.handshake()
        self.client.bio_write(self.layer.close_notify())
        with self.assertRaises(SSL.ZeroReturnError):
            self.client.recv(100)

    def test_the_client_s_close_notify_after_its_last_command(self):
        self.handshake()
        self.client.send(b"CLS\n")
        self.client.shutdown()
        self.assertEqual(self.layer.receive(client_bytes(self.client)), b"CLS\n")
        self.assertTrue(self.layer.peer_closed)
        self.assertEqual(self.layer.receive(b"more"), b"")

    def test_garbage_is_a_failure_with_its_alert(self):
        self.handshake()
        self.assertEqual(self.layer.receive(b"\x17\x03\x03\x00\x05hello"), b"")
        self.assertIsInstance(self.layer.failure, SSL.Error)
        self.assertTrue(self.wire.take(), "the alert")
        self.assertEqual(self.layer.encrypt(b"x"), b"")
        self.assertEqual(self.layer.close_notify(), b"")

    def test_a_refused_handshake_is_a_failure_with_its_alert(self):
        self.assertEqual(self.layer.receive(b"\x16\x03\x01\x00\x05hello"), b"")
        self.assertIsInstance(self.layer.failure, SSL.Error)
        self.assertEqual(self.done, [])
        self.assertTrue(self.wire.take(), "the alert")

    def test_a_session_that_cannot_encrypt_drops_its_connection(self):
        self.handshake()
        self.layer.ssl.shutdown()  # no more application data may be written
        self.assertEqual(self.layer.encrypt(b"OK"), b"")
        self.assertIsInstance(self.layer.failure, SSL.Error)
        self.assertTrue(self.wire.aborted)

    def test_a_flush_as_big_as_a_message_can_be(self):
        """A flush larger than the buffer the records are read out through."""
        self.handshake()
        data = bytes(range(256)) * 5000  # 1.28 MB: 79 records
        self.assertEqual(decrypt(self.client, self.layer.encrypt(data)), data)

    def test_a_big_flush(self):
        """What a consumer with RDY 2500 is sent at once: more than the buffer the
        records are read out through."""
        self.handshake()
        data = bytes(range(256)) * 2400  # 614 KB
        self.assertEqual(decrypt(self.client, self.layer.encrypt(data)), data)

    def test_many_records_in_one_read(self):
        """A read of more records than one SSL_read returns."""
        self.handshake()
        for n in range(50):
            self.client.send(b"x" * 1000 + b"%04d\n" % n)
        arrived = client_bytes(self.client)
        self.assertEqual(self.layer.receive(arrived), b"".join(b"x" * 1000 + b"%04d\n" % n for n in range(50)))

    def test_what_a_read_makes_of_its_own_goes_out(self):
        """A TLS 1.2 client asking to renegotiate: the server's answer is output of
        a read, written at once."""
        ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
        ctx.set_max_proto_version(SSL.TLS1_2_VERSION)
        self.client = SSL.Connection(ctx, None)
        self.client.set_connect_state()
        self.handshake()
        self.assertTrue(self.client.renegotiate())
        with self.assertRaises(SSL.WantReadError):
            self.client.do_handshake()
        self.assertEqual(self.layer.receive(client_bytes(self.client)), b"")
        self.assertTrue(self.wire.written, "the server's answer")

    def test_the_layer_s_benchmark_runs(self):
        """bench/core_paths.py --tls: its flushes and reads of FINs come out whole."""
        from bench.core_paths import tls_layer

        times = tls_layer(TLSLayer, self.server_context, rounds=20)
        self.assertTrue(all(t > 0 for t in times), times)

    def test_flushes_one_after_another_through_the_kept_buffer(self):
        """A view is good until the next flush: smaller, then bigger than the
        buffer kept, then smaller again, each decrypts whole."""
        self.handshake()
        for size in (1000, 300_000, 700_000, 50, 16_384):
            data = bytes([size % 251]) * size
            self.assertEqual(decrypt(self.client, bytes(self.layer.encrypt_view(data))), data)

    def test_a_flush_allocates_nothing_its_size(self):
        """A consumer with RDY 2500 is sent ~600 KB at a time: its records were read
        out into fresh objects that size, four times the cost of encrypting them."""
        self.handshake()
        data = bytes(range(256)) * 2400  # 614 KB
        decrypt(self.client, bytes(self.layer.encrypt_view(data)))  # the first grows the buffer
        tracemalloc.start()
        self.addCleanup(tracemalloc.stop)
        before = tracemalloc.get_traced_memory()[0]
        sealed = self.layer.encrypt_view(data)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        self.assertLess(peak - before, 64 * 1024)
        self.assertEqual(decrypt(self.client, bytes(sealed)), data)

    def test_a_huge_flush_does_not_stay_in_memory(self):
        self.handshake()
        data = bytes(range(256)) * (5 << 12)  # 5 MiB: over what is kept between flushes
        sealed = self.layer.encrypt_view(data)
        own = getattr(sealed, "obj", sealed)
        self.assertIsNot(own, tlslayer._out_buffer)
        self.assertLess(len(own), len(sealed) * 1.01, "a buffer its own size")
        self.assertEqual(decrypt(self.client, bytes(sealed)), data)
        self.assertLessEqual(len(tlslayer._out_buffer), tlslayer._OUT_KEEP)
        self.assertEqual(decrypt(self.client, bytes(self.layer.encrypt_view(b"after"))), b"after")

    def test_a_flush_of_many_pieces_is_the_records_of_one_write(self):
        """Encrypted a piece at a time, a flush is still full records, as one
        SSL_write of it all makes them: only the last is short."""
        self.handshake()
        data = bytes(range(256)) * 2400  # 614 KB: ten pieces and some
        sealed = bytes(self.layer.encrypt_view(data))
        lengths = []
        pos = 0
        while pos < len(sealed):
            self.assertEqual(sealed[pos], 23, "application data")
            size = int.from_bytes(sealed[pos + 3 : pos + 5], "big")
            lengths.append(size)
            pos += 5 + size
        self.assertEqual(pos, len(sealed))
        self.assertEqual(len(lengths), -(-len(data) // tlslayer._RECORD_SIZE))
        self.assertEqual(len(set(lengths[:-1])), 1, "full records but the last")
        self.assertLess(lengths[-1], lengths[0])
        self.assertEqual(decrypt(self.client, sealed), data)

    def test_records_bigger_than_reckoned_still_come_out_whole(self):
        """A cipher whose records carry more than :data:`_RECORD_OVERHEAD` (TLS
        1.2's CBC with its MAC and padding) outgrows the buffer the flush was
        given: it grows, and nothing is lost."""
        self.handshake()
        self.patch(tlslayer, "_RECORD_OVERHEAD", 0)
        self.patch(tlslayer, "_out_buffer", bytearray())
        data = bytes(range(256)) * 1024  # 256 KiB: a buffer exactly its size, too small for its records
        self.assertEqual(decrypt(self.client, bytes(self.layer.encrypt_view(data))), data)
        self.assertEqual(decrypt(self.client, bytes(self.layer.encrypt_view(b"after"))), b"after")


class PyOpenSSLTLSLayerTests(TLSLayerTests):
    direct = False

    def test_a_flush_allocates_nothing_its_size(self):
        """pyOpenSSL's methods return fresh bytes for each flush (the kept buffer
        is the bindings' path only)."""
        self.handshake()
        sealed = self.layer.encrypt_view(b"OK" * 100)
        self.assertIs(type(sealed), bytes)
        self.assertEqual(decrypt(self.client, sealed), b"OK" * 100)
