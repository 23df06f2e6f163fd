"""nsqd as a process on an operator's worst day: thousands of queues at start-up,
connect storms, and what it says when a stop cannot write what it holds."""

from __future__ import annotations

import json
import os
import resource
import socket
import struct
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from twisted.trial import unittest

from nsq_wire.commands import encode_command
from nsq_wire.frames import FRAME_TYPE_MESSAGE, MAGIC_V2, FrameReader
from nsq_wire.message import decode
from tests.integration.procs import ServerProcess, storm

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")


def get(address: str, path: str, timeout: float) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as resp:
        return resp.status, resp.read()


class ManyQueuesTests(unittest.TestCase):
    timeout = 300

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)

    def test_restart_with_thousands_of_topics_answers_at_once(self) -> None:
        """4,000 topics of 2 channels (12,001 files) as a clean stop leaves them:
        nsqd listed the data path once per queue and answered nothing for about
        a minute (Go: under a second). Now /ping answers as soon as it listens."""
        topics = [f"t{i:04d}" for i in range(4000)]
        doc = {
            "topics": [
                {
                    "name": t,
                    "paused": False,
                    "channels": [{"name": "a", "paused": False}, {"name": "b", "paused": True}],
                }
                for t in topics
            ],
            "version": "1.3.0",
        }
        with open(os.path.join(self.dir, "nsqd.dat"), "w") as f:
            json.dump(doc, f)
        for t in topics:
            for queue in (t, f"{t}:a", f"{t}:b"):
                with open(os.path.join(self.dir, f"{queue}.diskqueue.meta.dat"), "w") as f:
                    f.write("0\n0,0\n0,0\n")
        proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.dir).start()
        self.addCleanup(proc.kill)
        started = time.monotonic()
        self.assertEqual(get(proc.addresses["HTTP"], "/ping", timeout=30), (200, b"OK"))
        ping_after = time.monotonic() - started
        _, body = get(proc.addresses["HTTP"], "/stats?format=json", timeout=30)
        stats = json.loads(body)
        self.assertEqual([t["topic_name"] for t in stats["topics"]], topics)
        self.assertEqual({tuple(c["channel_name"] for c in t["channels"]) for t in stats["topics"]}, {("a", "b")})
        self.assertEqual({c["paused"] for t in stats["topics"] for c in t["channels"]}, {False, True})
        self.assertEqual(proc.stop(), 0, f"/ping answered {ping_after:.1f} s after the listening lines")

    def test_channels_created_together_survive_a_kill(self) -> None:
        """nsqd.dat is written once for all the creations that arrive while a
        write runs (not once each), and none of them is lost: once a pause is
        answered (Go answers it after nsqd.dat is written), kill -9 keeps all."""
        proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.dir).start()
        self.addCleanup(proc.kill)
        http = proc.addresses["HTTP"]

        def post(path: str) -> int:
            req = urllib.request.Request(f"http://{http}{path}", method="POST")
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status

        post("/topic/create?topic=t")
        names = [f"c{i:03d}" for i in range(400)]
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda c: post(f"/channel/create?topic=t&channel={c}"), names))
        self.assertEqual(set(codes), {200})
        self.assertEqual(post("/channel/pause?topic=t&channel=c000"), 200)
        proc.kill()
        again = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.dir).start()
        self.addCleanup(again.kill)
        _, body = get(again.addresses["HTTP"], "/stats?format=json&topic=t", timeout=30)
        (topic,) = json.loads(body)["topics"]
        self.assertEqual(sorted(c["channel_name"] for c in topic["channels"]), names)
        self.assertEqual(again.stop(), 0)


class ConnectStormTests(unittest.TestCase):
    """Twisted listens with a backlog of 50; Go with the kernel's somaxconn. With 50,
    a storm of connects overflows the accept queue: SYNs are dropped, clients wait
    for retransmits (1 s, 3 s, 7 s...) and some give up."""

    timeout = 300
    CLIENTS = 2000

    def setUp(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < self.CLIENTS + 500:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, self.CLIENTS + 500), hard))
            self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))

    def assert_all_answered(self, address: str, request: bytes, answer: bytes) -> None:
        times = storm(address, self.CLIENTS, request, answer, deadline=60)
        answered = [t for t in times if t is not None]
        self.assertEqual(len(answered), self.CLIENTS, f"slowest answered after {max(answered, default=0):.1f} s")

    def test_nsqd(self) -> None:
        data = os.path.abspath(self.mktemp())
        os.makedirs(data)
        proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", data).start()
        self.addCleanup(proc.kill)
        identify = MAGIC_V2 + encode_command(b"IDENTIFY", body=b"{}")
        self.assert_all_answered(proc.addresses["TCP"], identify, struct.pack(">ii", 6, 0) + b"OK")
        self.assert_all_answered(proc.addresses["HTTP"], b"GET /ping HTTP/1.0\r\n\r\n", b"\r\n\r\nOK")
        self.assertEqual(proc.stop(), 0)

    def test_nsqlookupd(self) -> None:
        proc = ServerProcess("nsqlookupd", *LOOPBACK).start()
        self.addCleanup(proc.kill)
        self.assert_all_answered(proc.addresses["TCP"], b"  V1PING\n", struct.pack(">i", 2) + b"OK")
        self.assert_all_answered(proc.addresses["HTTP"], b"GET /ping HTTP/1.0\r\n\r\n", b"\r\n\r\nOK")
        self.assertEqual(proc.stop(), 0)


class MemoryTests(unittest.TestCase):
    """A busy nsqd's memory stays flat: connections and HTTP requests that ended
    leave nothing behind (no garbage waiting for a full collection, no heap
    growing between the pieces of its reads)."""

    timeout = 600

    def setUp(self) -> None:
        data = os.path.abspath(self.mktemp())
        os.makedirs(data)
        self.proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", data).start()
        self.addCleanup(self.proc.kill)
        self.tcp = ("127.0.0.1", self.proc.port())
        self.http = self.proc.addresses["HTTP"]

    def rss_mb(self) -> float:
        assert self.proc.proc is not None
        with open(f"/proc/{self.proc.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def live(self) -> dict[str, int]:
        """Objects by type in nsqd now, without a collection first."""
        _, body = get(self.http, "/debug/pprof/heap", timeout=30)
        counts = {}
        for line in body.decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                counts[parts[1]] = int(parts[0])
        return counts

    def churn(self, n: int) -> None:
        """n consumers in turn: SUB, take 20 messages, FIN them, leave; and an HTTP
        publish of 20 more for each."""
        body = b"x" * 200
        for _ in range(n):
            req = urllib.request.Request(
                f"http://{self.http}/mpub?topic=t", data=b"\n".join([body] * 20), method="POST"
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                self.assertEqual(resp.status, 200)
            s = socket.create_connection(self.tcp, timeout=30)
            s.sendall(MAGIC_V2 + encode_command(b"IDENTIFY", body=b"{}") + encode_command(b"SUB", b"t", b"c"))
            s.sendall(encode_command(b"RDY", b"20"))
            reader = FrameReader()
            got = 0
            while got < 20:
                chunk = s.recv(65536)
                self.assertTrue(chunk, "nsqd closed the connection")
                reader.feed(chunk)
                while (frame := reader.next()) is not None:
                    if frame[0] == FRAME_TYPE_MESSAGE:
                        got += 1
                        s.sendall(encode_command(b"FIN", decode(frame[1])[0]))
            s.sendall(encode_command(b"CLS"))
            s.close()

    def test_flat_under_connection_and_request_churn(self) -> None:
        self.churn(1000)  # warm-up: the heap reaches its working size
        before = self.rss_mb()
        self.churn(3000)
        after = self.rss_mb()
        live = self.live()
        # before: each ended connection's V2Protocol and each request waited in
        # garbage (137 and 1,266 in a soak), and RSS rose 6.5 MB a minute
        self.assertLessEqual(live.get("V2Protocol", 0), 5, live)
        self.assertLessEqual(after - before, 3.0, f"RSS {before:.1f} MB -> {after:.1f} MB")
        self.assertEqual(self.proc.stop(), 0)
