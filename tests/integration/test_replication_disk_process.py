"""Replication between nsqd processes when a standby cannot keep up
(docs/replication.md, "A full disk" and "Acknowledgements"): a standby whose disk
fills says so to its primary, which goes degraded and backs off, and it never
reads itself as synced after a restart; a standby that stalls holds the primary
to --replication-max-lag-bytes of memory, not to what its producers send."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time

from twisted.trial import unittest

from tests.integration.failover_load import wait_until
from tests.integration.procs import ServerProcess, call, rss_mb, secret_dir
from tests.integration.procs import replication_status as status

LOOPBACK = ("--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--broadcast-address", "127.0.0.1")
MAX_LAG_BYTES = 64 << 20  # --replication-max-lag-bytes' default


class Producer:
    """A TCP producer that waits for each answer: ``command`` over and over until
    :meth:`stop`; ``answers`` counts the OKs, ``errors`` the error frames."""

    def __init__(self, address: str, command: bytes) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.sendall(b"  V2")
        self.command = command
        self.answers = 0
        self.errors: list[bytes] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def _run(self) -> None:
        try:
            while not self.stopping:
                self.sock.sendall(self.command)
                size, kind = struct.unpack(">II", self._read(8))
                body = self._read(size - 4)
                if kind == 0 and body == b"OK":
                    self.answers += 1
                elif kind == 1:
                    self.errors.append(body)
                    return
        except OSError:
            pass

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(60)
        self.sock.close()


def pub(topic: str, body: bytes) -> bytes:
    return b"PUB %s\n" % topic.encode() + struct.pack(">I", len(body)) + body


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = struct.pack(">I", len(bodies)) + b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    return b"MPUB %s\n" % topic.encode() + struct.pack(">I", len(payload)) + payload


class ReplicationDiskProcessTests(unittest.TestCase):
    timeout = 180

    def setUp(self) -> None:
        self.dir, self.secret = secret_dir(self)

    def nsqd(self, path: str, *args: str) -> ServerProcess:
        os.makedirs(path, exist_ok=True)
        proc = ServerProcess(
            "nsqd", *LOOPBACK, "--data-path", path, f"--replication-secret-file={self.secret}", *args, cwd=path
        ).start()
        self.addCleanup(proc.kill)
        return proc

    def small_disk(self, path: str, size: str = "8m") -> None:
        """A filesystem of ``size`` at ``path``: a tmpfs (root only)."""
        os.makedirs(path)
        if os.geteuid() != 0:
            self.fail("a full disk is a small tmpfs, and mounting one needs root (scripts/test runs as root in CI)")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True
        )
        if done.returncode:
            self.fail(f"cannot mount a tmpfs for a full disk: {done.stderr.strip()}")
        self.addCleanup(subprocess.run, ["umount", "-l", path], capture_output=True)

    def test_a_standby_on_a_full_disk_tells_its_primary_and_is_never_promotable(self) -> None:
        standby_path = os.path.join(self.dir, "standby")
        self.small_disk(standby_path)
        standby_args = ("--replication-role=standby", "--mem-queue-size=10")
        standby = self.nsqd(standby_path, *standby_args)
        primary = self.nsqd(
            os.path.join(self.dir, "primary"), f"--replica={standby.addresses['TCP']}", "--mem-queue-size=10"
        )
        self.assertTrue(wait_until(lambda: status(primary).get("state") == "in_sync", 30))

        def full() -> bool:
            return any("REPLICATION: cannot store" in line for line in standby.lines)

        producer = Producer(primary.addresses["TCP"], pub("t", b"x" * 10_000))
        self.assertTrue(wait_until(full, 60), standby.lines[-20:])
        failed_at = time.monotonic()
        # told at once: degraded within a second or two
        self.assertTrue(wait_until(lambda: status(primary).get("degraded") is True, 2.0))
        self.assertTrue(any("cannot store" in line for line in primary.lines), primary.lines[-20:])
        producer.stop()
        self.assertEqual(producer.errors, [])  # acknowledged alone once the standby said it could not hold them

        # and backs off: the snapshots that follow are seconds apart, not 9 a second
        def snapshots() -> int:
            return sum("sending its snapshot" in line for line in primary.lines)

        before = snapshots()
        self.assertTrue(wait_until(lambda: snapshots() >= before + 2, 60), primary.lines[-20:])
        self.assertGreater(time.monotonic() - failed_at, 2.5)
        tracebacks = [line for line in standby.lines if "Traceback" in line or "Unhandled Error" in line]
        self.assertEqual(tracebacks, [])

        # killed, the primary gone too, restarted on the disk still full: not synced, not promotable
        standby.kill()
        primary.kill()
        standby = self.nsqd(standby_path, *standby_args)
        state = status(standby)
        self.assertEqual((state["role"], state["synced"]), ("standby", False))
        code, body = call(standby, "POST", "/replication/promote")
        self.assertEqual((code, json.loads(body)["message"]), (409, "NOT_IN_SYNC"))
        self.assertEqual([line for line in standby.lines if "Traceback" in line], [])

    def test_a_stalled_standby_holds_the_primary_to_the_byte_bound(self) -> None:
        standby = self.nsqd(os.path.join(self.dir, "standby"), "--replication-role=standby", "--mem-queue-size=16")
        primary = self.nsqd(
            os.path.join(self.dir, "primary"),
            f"--replica={standby.addresses['TCP']}",
            "--replication-mode=async",
            "--mem-queue-size=16",
        )
        self.assertTrue(wait_until(lambda: status(primary).get("state") == "in_sync", 30))
        assert primary.proc is not None and standby.proc is not None
        start = peak = rss_mb(primary.proc.pid)
        command = mpub("t", [b"m" * (64 << 10)] * 16)  # 1 MiB
        producers = [Producer(primary.addresses["TCP"], command) for _ in range(4)]
        lag = 0
        try:
            for _ in range(8):  # stopped 0.9 s of every second
                standby.signal(signal.SIGSTOP)
                until = time.monotonic() + 0.9
                while time.monotonic() < until:
                    peak = max(peak, rss_mb(primary.proc.pid))
                    lag = max(lag, status(primary).get("lag", {}).get("bytes", 0))
                    time.sleep(0.05)
                standby.signal(signal.SIGCONT)
                time.sleep(0.1)
        finally:
            standby.signal(signal.SIGCONT)
            for p in producers:
                p.stop()
        answered = sum(p.answers for p in producers)
        print(f"\nprimary RSS {start:.0f} -> peak {peak:.0f} MB, {answered} MiB acknowledged, lag up to {lag} bytes")
        self.assertGreater(answered, 0)
        self.assertLessEqual(lag, MAX_LAG_BYTES + len(producers) * len(command) + 4096)
        self.assertLess(peak - start, MAX_LAG_BYTES / 2**20 + 100)
