"""Misbehaving clients cost a running nsqd bounded memory, and others do not notice.

nsqd runs as a process; its RSS is read from /proc while a client that never
reads, floods error frames or lies about an MPUB's size does its worst.
``bench/abuse.py`` runs the same scenarios at full size and prints the figures.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
import zlib
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from nsq_client.twisted_client import Consumer
from nsq_wire.commands import encode_command, mpub
from tests.integration.procs import ServerProcess, rss_mb

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")
MB = 1024 * 1024


def v2(port: int, identify: dict | None = None, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    s.settimeout(30)
    s.sendall(b"  V2")
    if identify is not None:
        s.sendall(encode_command(b"IDENTIFY", body=json.dumps(identify).encode()))
        read_frame(s)
    return s


def read_frame(s: socket.socket, decode=lambda b: b) -> tuple[int, bytes]:
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += decode(chunk)
    size, ft = struct.unpack(">ii", buf[:8])
    return ft, buf[8 : 4 + size]


class RSSWatch(threading.Thread):
    """The highest RSS of a process, sampled every 50 ms until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.start_mb = rss_mb(pid)
        self.max_mb = self.start_mb
        self.stopped = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            try:
                self.max_mb = max(self.max_mb, rss_mb(self.pid))
            except OSError:
                return

    def stop(self) -> float:
        """Stop sampling; return the growth in MB."""
        self.stopped.set()
        self.join()
        return self.max_mb - self.start_mb


class AbuseTestCase(unittest.TestCase):
    timeout = 120

    def start(self, *args: str) -> ServerProcess:
        path = self.mktemp()
        import os

        os.makedirs(path)
        proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", path, *args).start()
        self.addCleanup(proc.kill)
        return proc

    @defer.inlineCallbacks
    def stats(self, proc: ServerProcess, topic: str):
        resp = yield treq.get(f"http://{proc.addresses['HTTP']}/stats?format=json&topic={topic}", persistent=False)
        return json.loads((yield resp.content()))

    @defer.inlineCallbacks
    def bystander_pub(self, proc: ServerProcess):
        answer = yield deferToThread(self._pub, proc.port())
        self.assertEqual(answer, (0, b"OK"), "other clients are served")

    @staticmethod
    def _pub(port: int) -> tuple[int, bytes]:
        s = v2(port)
        s.sendall(encode_command(b"PUB", "bystander", body=b"x"))
        try:
            return read_frame(s)
        finally:
            s.close()


class SlowConsumerTests(AbuseTestCase):
    @defer.inlineCallbacks
    def test_a_consumer_that_stops_reading_is_dropped_and_its_messages_requeued(self):
        proc = self.start("--mem-queue-size", "100")
        body = b"m" * 100_000
        p = v2(proc.port())
        for _ in range(10):
            p.sendall(mpub("slow", [body] * 40))
            self.assertEqual(read_frame(p), (0, b"OK"))
        p.close()

        watch = RSSWatch(proc.proc.pid)
        slow = v2(proc.port(), {"heartbeat_interval": 1000, "msg_timeout": 1000}, rcvbuf=4096)
        slow.sendall(encode_command(b"SUB", "slow", "c") + encode_command(b"RDY", "2500"))
        deadline = time.monotonic() + 60
        seen = False
        while True:
            self.assertLess(time.monotonic(), deadline, "the slow consumer was never dropped")
            self.assertLess(watch.max_mb - watch.start_mb, 300, "nsqd's memory grows without bound")
            stats = yield self.stats(proc, "slow")
            clients = stats["topics"][0]["channels"][0]["clients"] if stats["topics"] else []
            seen = seen or bool(clients)
            if seen and not clients:
                break
            try:
                slow.sendall(encode_command(b"NOP"))
            except OSError:
                pass
            yield deferToThread(time.sleep, 0.5)
        growth = watch.stop()
        slow.close()
        self.assertLess(growth, 300)
        yield self.bystander_pub(proc)

        got: list[bytes] = []
        done: defer.Deferred = defer.Deferred()

        def handle(msg):
            got.append(msg.body)
            if len(got) == 400 and not done.called:
                done.callback(None)

        consumer = yield Consumer.connect(reactor, "127.0.0.1", proc.port(), "slow", "c", handle, max_in_flight=50)
        yield done
        yield consumer.close()
        self.assertEqual(len(got), 400, "every message it held came back")


class ErrorFloodTests(AbuseTestCase):
    @defer.inlineCallbacks
    def test_a_fin_flood_that_is_never_read_is_bounded(self):
        proc = self.start()
        watch = RSSWatch(proc.proc.pid)
        sent = yield deferToThread(self._flood, proc.port(), 40 * MB)
        yield self.bystander_pub(proc)
        growth = watch.stop()
        self.assertGreater(sent, MB)
        self.assertLess(growth, 100, f"{sent / MB:.0f} MB of FINs cost {growth:.0f} MB")
        fin_lines = [line for line in proc.lines if "E_FIN_FAILED" in line]
        self.assertLess(len(fin_lines), 2000, "repeated log lines are rate-limited")
        self.assertTrue(any("dropping them for now" in line for line in proc.lines), "and the log says so")

    @staticmethod
    def _flood(port: int, limit: int) -> int:
        s = v2(port, rcvbuf=4096)
        s.sendall(encode_command(b"SUB", "flood", "c"))
        chunk = encode_command(b"FIN", "0123456789abcdef") * 2000
        s.settimeout(3)
        sent = 0
        try:
            while sent < limit:
                s.sendall(chunk)
                sent += len(chunk)
        except (TimeoutError, OSError):
            pass  # nsqd stopped reading us: the bound at work
        s.close()
        return sent


class MPUBSizeTests(AbuseTestCase):
    @defer.inlineCallbacks
    def test_an_mpub_that_declares_little_and_streams_more_is_bounded_by_real_bytes(self):
        """Go reads an MPUB by its message count whatever size it declared; nsqd
        does, but stops at --max-body-size of bodies read (5 MiB), however compressed."""
        proc = self.start()
        for deflate in (False, True):
            watch = RSSWatch(proc.proc.pid)
            answer, sent = yield deferToThread(self._lie, proc.port(), deflate)
            growth = watch.stop()
            self.assertEqual(answer, (1, b"E_BAD_BODY MPUB body too big 6291456 > 5242880"), deflate)
            self.assertLess(sent, 100 * MB, "nsqd stopped reading it")
            self.assertLess(growth, 50, f"deflate={deflate}: {growth:.0f} MB")
        yield self.bystander_pub(proc)

    @defer.inlineCallbacks
    def test_an_mpub_whose_size_counts_only_the_bodies_is_served(self):
        proc = self.start()
        answer = yield deferToThread(self._bodies_only, proc.port())
        self.assertEqual(answer, b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 2)

    @staticmethod
    def _bodies_only(port: int) -> bytes:
        s = v2(port)
        one = b"\x00\x00\x00\x01" + b"x"
        s.sendall(b"MPUB t\n\x00\x00\x00\x0a\x00\x00\x00\x0a" + one * 10 + b"PUB t\n" + one)
        got = b""
        try:
            while len(got) < 20:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            return got
        finally:
            s.close()

    @staticmethod
    def _lie(port: int, deflate: bool) -> tuple[tuple[int, bytes], int]:
        """300 messages of 1 MB said to fit in 100 bytes, sent until nsqd answers."""
        s = v2(port)
        send = s.sendall
        reader = FrameReader(s)
        if deflate:
            s.sendall(encode_command(b"IDENTIFY", body=b'{"feature_negotiation":true,"deflate":true}'))
            reader.frame()  # IDENTIFY's answer, in clear; what follows is compressed
            comp = zlib.compressobj(6, zlib.DEFLATED, -15)
            send = lambda data: s.sendall(comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH))  # noqa: E731
            reader.inflate()
            if reader.frame() != (0, b"OK"):
                raise AssertionError("deflate upgrade failed")
        sent = 0
        try:
            send(b"MPUB lie\n" + struct.pack(">II", 100, 300))
            for _ in range(300):
                readable, _, _ = select.select([s], [], [], 0)
                if readable:
                    break  # nsqd has answered
                send(struct.pack(">I", MB))
                for _ in range(16):
                    send(b"z" * (MB // 16))
                    sent += MB // 16
        except OSError:
            pass  # nsqd closed the connection: its answer was sent before
        try:
            return reader.frame(), sent
        finally:
            s.close()


class FrameReader:
    """Frames from a blocking socket, through raw inflate once negotiated."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.raw = b""
        self.buf = b""
        self.dec: Any = None

    def inflate(self) -> None:
        self.dec = zlib.decompressobj(-15)
        self.buf, self.raw = b"", self.buf  # bytes after the last clear frame are compressed

    def frame(self) -> tuple[int, bytes]:
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">i", self.buf[:4])[0]:
            if self.raw:
                data, self.raw = self.raw, b""
            else:
                data = self.s.recv(65536)
                if not data:
                    raise ConnectionError("closed")
            self.buf += self.dec.decompress(data) if self.dec is not None else data
        size, ft = struct.unpack(">ii", self.buf[:8])
        frame, self.buf = (ft, self.buf[8 : 4 + size]), self.buf[4 + size :]
        return frame
