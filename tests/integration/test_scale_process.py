"""nsqd as a process on an operator's worst day: thousands of queues at start-up,
connect storms, and what it says when a stop cannot write what it holds."""

from __future__ import annotations

import json
import os
import resource
import struct
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from twisted.trial import unittest

from nsq_wire.commands import encode_command
from nsq_wire.frames import MAGIC_V2
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
