"""Hostile peers on the replication link, nsqd run as processes (issue 35,
findings 4 and 5; docs/replication.md, "The handshake"): connections that open a
link and never authenticate hold no memory and no slot for long; a HELLO nested
too deep is refused in one line; a second primary with the pair's secret cannot
take the standby from its primary."""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import threading
import time

from twisted.trial import unittest

from nsqd_tw.replication import wire
from tests.certs import make_certs
from tests.integration.failover_load import wait_until
from tests.integration.procs import ServerProcess, call, rss_mb, secret_dir
from tests.integration.procs import replication_status as status

LOOPBACK = ("--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--broadcast-address", "127.0.0.1")
MAGIC, HELLO, ERROR = b"  R1", 0x01, 0x03
BIG = 64 << 20  # the largest frame a link takes once authenticated


def errors(answer: bytes) -> list[str]:
    """The ``error`` of each ERROR frame in what a link's peer answered."""
    out, pos = [], 0
    while len(answer) - pos >= 5:
        size, kind = struct.unpack_from(">IB", answer, pos)
        payload = answer[pos + 5 : pos + 4 + size]
        if len(payload) < size - 1:
            break
        if kind == ERROR:
            out.append(json.loads(payload).get("error", ""))
        pos += 4 + size
    return out


class Intruder(threading.Thread):
    """A raw connection to nsqd's TCP port that opens a link and never finishes
    its handshake: the magic and the header of a HELLO of ``size`` bytes, then
    ``body`` bytes of it as fast as the socket takes them, then one byte every
    ``drip`` seconds (never completing the frame). Notes what it was answered
    and when the other end closed it."""

    def __init__(self, address: str, size: int, body: int = 0, drip: float = 0.5, payload: bytes = b"") -> None:
        super().__init__(daemon=True)
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.opened = time.monotonic()
        self.head = MAGIC + struct.pack(">IB", size, HELLO) + payload
        self.body, self.drip = body, drip
        self.answer = b""
        self.closed_at: float | None = None
        self.stopping = threading.Event()

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def run(self) -> None:
        s = self.sock
        try:
            s.sendall(self.head)
            s.settimeout(0.2)
            sent, next_drip = 0, time.monotonic()
            while not self.stopping.is_set():
                if select.select([s], [], [], 0)[0]:
                    data = s.recv(65536)
                    if not data:
                        break
                    self.answer += data
                    continue
                if sent < self.body:
                    try:
                        sent += s.send(b"\0" * min(1 << 20, self.body - sent))
                    except TimeoutError:
                        self.body = sent  # the other end reads no more: drip from here
                    continue
                if time.monotonic() >= next_drip:
                    s.send(b"\0")
                    next_drip += self.drip
                self.stopping.wait(0.05)
        except OSError:
            pass
        finally:
            if not self.stopping.is_set():
                self.closed_at = time.monotonic()
            s.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


class PeerProcessTests(unittest.TestCase):
    timeout = 180

    def setUp(self) -> None:
        self.dir, self.secret = secret_dir(self)

    def nsqd(self, data: str, *args: str) -> ServerProcess:
        cwd = os.path.join(self.dir, data)
        os.makedirs(cwd, exist_ok=True)
        proc = ServerProcess(
            "nsqd", *LOOPBACK, "--data-path", cwd, "--replication-secret-file", self.secret, *args, cwd=cwd
        ).start()
        self.addCleanup(proc.kill)
        return proc

    def intruders(self, n: int, address: str, **kwargs: object) -> list[Intruder]:
        out = [Intruder(address, **kwargs) for _ in range(n)]  # type: ignore[arg-type]
        for i in out:
            self.addCleanup(i.stop)
            i.start()
        return out

    def depth(self, node: ServerProcess, topic: str) -> int:
        _, body = call(node, "GET", f"/stats?format=json&topic={topic}")
        topics = json.loads(body)["topics"]
        return int(topics[0]["channels"][0]["depth"]) if topics and topics[0]["channels"] else -1

    def test_links_sending_the_header_of_a_64_mib_frame_hold_no_memory(self) -> None:
        """8 connections each send the magic, the header of a 64 MiB HELLO and as
        much of it as nsqd reads, then a byte every 0.5 s: before authentication
        a link may send a HELLO of 64 KiB at most, refused from its header."""
        standby = self.nsqd("s", "--replication-role=standby")
        primary = self.nsqd("p", f"--replica={standby.addresses['TCP']}")
        self.assertTrue(wait_until(lambda: status(standby).get("state") == "in_sync", 30))
        before = rss_mb(standby.proc.pid)
        attack = self.intruders(8, standby.addresses["TCP"], size=BIG, body=BIG - 4096)
        peak = before
        deadline = time.monotonic() + 5.0 + 5.0  # --replication-timeout, and time to spare
        while time.monotonic() < deadline and not all(i.closed for i in attack):
            peak = max(peak, rss_mb(standby.proc.pid))
            time.sleep(0.1)
        peak = max(peak, rss_mb(standby.proc.pid))
        print(f"\n    standby RSS {before:.0f} MB before the attack, at most {peak:.0f} MB during it", end="")
        self.assertLess(peak - before, 30)
        self.assertEqual([i for i in attack if not i.closed], [])
        for i in attack:
            self.assertTrue(errors(i.answer) or i.answer == b"", i.answer[:200])
        # the primary's link was not disturbed: it publishes, the standby holds it
        self.assertEqual(status(standby)["state"], "in_sync")
        self.assertEqual(call(primary, "POST", "/pub?topic=t", b"after")[0], 200)
        _, body = call(standby, "GET", "/stats?format=json&topic=t")
        self.assertEqual(json.loads(body)["topics"][0]["depth"], 1)
        self.assertFalse(any("Traceback" in line for line in standby.lines))

    def test_slow_handshakes_are_cut_at_the_deadline_and_few_wait_at_once(self) -> None:
        """6 connections drip a small HELLO: 4 wait (the limit of links not yet
        authenticated), the others are refused at once with an ERROR; the 4 are
        cut at --replication-timeout; then the real primary links."""
        standby = self.nsqd("s", "--replication-role=standby", "--replication-timeout=2s")
        attack = self.intruders(6, standby.addresses["TCP"], size=2000)
        self.assertTrue(wait_until(lambda: sum(i.closed for i in attack) >= 2, 10))
        refused = [i for i in attack if i.closed]
        self.assertEqual(len(refused), 2)
        for i in refused:
            self.assertLess(i.closed_at - i.opened, 1.5)  # type: ignore[operator]
            [why] = errors(i.answer)
            self.assertIn("too many links awaiting authentication", why)
        self.assertTrue(wait_until(lambda: all(i.closed for i in attack), 10))
        for i in attack:
            if i not in refused:
                self.assertLess(i.closed_at - i.opened, 2.0 + 2.0)  # type: ignore[operator]
                self.assertGreater(i.closed_at - i.opened, 1.5)  # type: ignore[operator]
                self.assertEqual(errors(i.answer), ["no handshake in 2s"])
        self.assertEqual(sum("too many links awaiting authentication" in line for line in standby.lines), 1)
        primary = self.nsqd("p", f"--replica={standby.addresses['TCP']}")
        self.assertTrue(wait_until(lambda: status(standby).get("state") == "in_sync", 30))
        self.assertEqual(call(primary, "POST", "/pub?topic=t", b"linked")[0], 200)

    def test_a_stranger_that_never_starts_tls_is_cut_at_the_deadline(self) -> None:
        """Its HELLO is answered, TLS is started, and it says nothing more: the
        standby closes the connection at --replication-timeout all the same."""
        certs = make_certs(os.path.join(self.dir, "certs"))
        standby = self.nsqd(
            "s",
            "--replication-role=standby",
            "--replication-timeout=2s",
            f"--tls-cert={certs.cert}",
            f"--tls-key={certs.key}",
            "--tls-required=tcp-https",
            "--https-address=127.0.0.1:0",
        )
        doc = {"version": wire.VERSION, "nonce": "00", "node": "x", "role": "primary", "epoch": 0}
        hello = json.dumps(doc).encode()
        [i] = self.intruders(1, standby.addresses["TCP"], size=len(hello) + 1, payload=hello, drip=3600.0)
        self.assertTrue(wait_until(lambda: i.closed, 10))
        self.assertLess(i.closed_at - i.opened, 2.0 + 2.0)  # type: ignore[operator]
        self.assertTrue(any("no handshake in 2s" in line for line in standby.lines))

    def test_a_hello_nested_too_deep_is_refused_in_one_line(self) -> None:
        standby = self.nsqd("s", "--replication-role=standby")
        for depth in (100_000, 30_000):  # over the 64 KiB of a HELLO; within it
            payload = b"[" * depth + b"]" * depth
            [i] = self.intruders(1, standby.addresses["TCP"], size=len(payload) + 1, payload=payload)
            self.assertTrue(wait_until(lambda i=i: i.closed, 10))
            self.assertEqual(len(errors(i.answer)), 1, i.answer[:200])
        self.assertTrue(
            wait_until(lambda: sum("before authentication" in line for line in standby.lines) == 2, 10),
            standby.lines[-5:],
        )
        self.assertFalse(any("Traceback" in line or "RecursionError" in line for line in standby.lines))
        self.assertEqual(status(standby)["role"], "standby")

    def test_a_second_primary_with_the_secret_cannot_take_the_standby(self) -> None:
        """P2, a fresh nsqd with the pair's secret and --replica S, dials S over and
        over: S refuses it (it follows P, node and epoch), keeps P's link and
        queues, and once P is killed and S promoted S holds all P acknowledged."""
        s = self.nsqd("s", "--replication-role=standby")
        p = self.nsqd("p", f"--replica={s.addresses['TCP']}")
        self.assertTrue(wait_until(lambda: status(s).get("state") == "in_sync", 30))
        p_node = status(p)["node"]
        self.assertEqual(call(p, "POST", "/topic/create?topic=t")[0], 200)
        self.assertEqual(call(p, "POST", "/channel/create?topic=t&channel=c")[0], 200)
        for i in range(20):  # 2,000 acknowledged in sync
            body = b"\n".join(b"%04d" % (i * 100 + j) for j in range(100))
            self.assertEqual(call(p, "POST", "/mpub?topic=t", body), (200, b"OK"))
        p2 = self.nsqd("p2", f"--replica={s.addresses['TCP']}")
        p2_node = status(p2)["node"]

        def refusals() -> list[str]:
            return [line for line in s.lines if "REPLICATION: refusing primary" in line]

        self.assertTrue(wait_until(lambda: len(refusals()) >= 1, 30))
        line = refusals()[0]
        self.assertIn("ERROR", line)
        self.assertIn(f"node {p2_node}", line)
        self.assertIn(f"this standby follows primary {p.addresses['TCP']} (node {p_node}, epoch 0)", line)
        self.assertIn("remove replication.json", line)
        # P2 is told why, and tries again and again (every 2 s once its backoff is up)
        told = f"{s.addresses['TCP']} refused the link - {line[line.index('refusing primary') :]}"
        self.assertTrue(wait_until(lambda: sum(told in line for line in p2.lines) >= 4, 30))
        attempts = sum("refused the link" in line for line in p2.lines)
        self.assertLessEqual(len(refusals()), attempts + 1)  # a line per attempt at most
        self.assertEqual(sum("receiving the snapshot" in line for line in s.lines), 1)
        self.assertEqual((status(s)["peer"], status(s)["state"]), (p.addresses["TCP"], "in_sync"))
        self.assertEqual(self.depth(s, "t"), 2000)

        p.proc.kill()  # type: ignore[union-attr]
        p.proc.wait()  # type: ignore[union-attr]
        self.assertTrue(wait_until(lambda: call(s, "POST", "/replication/promote")[0] == 200, 30))
        self.assertEqual((status(s)["role"], status(s)["epoch"]), ("primary", 1))
        self.assertEqual(self.depth(s, "t"), 2000)
        # promoted, S does not take P2 as its standby either (P2 is not the node it was paired
        # with); P2, at a lower epoch, stops serving beside it
        self.assertTrue(wait_until(lambda: any("REPLICATION: refusing standby" in line for line in s.lines), 30))
        self.assertTrue(wait_until(lambda: status(p2).get("role") == "standby", 30))
        self.assertEqual(call(p2, "POST", "/pub?topic=t", b"x")[0], 503)
        self.assertEqual(status(s)["state"], "disconnected")
        self.assertFalse(any("Traceback" in line for line in s.lines + p2.lines))
