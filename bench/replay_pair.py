"""A retained log on a replication pair (issue 36, part 4), measured on nsqd processes.

    python bench/replay_pair.py --megabytes 512

A standby B and its primary A, both ``--retention 24h``; MEGABYTES of 1 KiB messages
published to A (sync mode: each MPUB is on both nodes when answered), the topic's own
backlog emptied, so that the history is only in the retained logs. Then:

1. B stopped, its data path emptied, started again: the whole history goes to it in
   the catch-up. Reported: the time from B's start to ``in_sync``, the rate, A's RSS
   and ``/ping`` latency (sampled every 20 ms) during it.
2. The same, B killed (-9) halfway and started again: the time to ``in_sync`` after the
   restart (what it had is kept: only the rest is sent).
3. B stopped and started again with its history whole (a routine restart): the time
   to ``in_sync``.

After each, B's segments are compared with A's, byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from replay import Node, connect, mpub, rss

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsq_wire.frames import FrameReader


class Pinger(threading.Thread):
    """GET /ping every ``every`` seconds; the latencies (ms)."""

    def __init__(self, http: str, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{http}/ping"
        self.every = every
        self.ms: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=30) as resp:
                    resp.read()
                self.ms.append((time.monotonic() - t0) * 1000)
            except OSError:
                pass
            self.halt.wait(self.every)

    def stop(self) -> str:
        self.halt.set()
        self.join()
        ms = sorted(self.ms) or [0.0]
        return f"/ping median {statistics.median(ms):.1f} ms, max {ms[-1]:.0f} ms ({len(ms)} samples)"


def halt(node: Node) -> None:
    """SIGTERM, and wait: its data path stays (Server.stop removes it)."""
    node.proc.terminate()
    node.proc.wait(60)


def state(node: Node) -> str:
    try:
        return str(json.loads(node.get("/replication")).get("state"))
    except OSError:
        return ""


def digests(path: str, topic: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(path)):
        if name.startswith(f"{topic}.retained.") and name.endswith(".dat") and "meta" not in name:
            with open(os.path.join(path, name), "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def catch_up(a: Node, b_args: list[str], b_data: str, kill_after: float = 0.0) -> tuple[Node, float]:
    """Start B on ``b_data``; wait for in_sync (killing it -9 after ``kill_after`` s and
    starting it again, if given): B, and the seconds from its (last) start to in_sync."""
    pinger = Pinger(a.http)
    pinger.start()
    samples = [rss(a.proc.pid)]
    b = Node(a.exe, b_args, b_data)
    t0 = time.monotonic()
    if kill_after:
        while time.monotonic() < t0 + kill_after:
            time.sleep(0.02)
            samples.append(rss(a.proc.pid))
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()
        print(f"  B killed -9 {kill_after:.1f} s into its catch-up (state {state(a)})")
        b = Node(a.exe, b_args, b_data)
        t0 = time.monotonic()
    while state(b) != "in_sync":
        time.sleep(0.02)
        samples.append(rss(a.proc.pid))
        if time.monotonic() > t0 + 1800:
            raise RuntimeError("B not in sync in 30 minutes")
    took = time.monotonic() - t0
    print(f"  A's RSS at most {max(samples) / 2**20:.0f} MiB (before {samples[0] / 2**20:.0f}); {pinger.stop()}")
    return b, took


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="replay_pair", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nsqd", default=str(Path(sys.executable).parent / "nsqd"))
    p.add_argument("--megabytes", type=float, default=512.0, help="the retained history's size")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="replay_pair.")
    secret = os.path.join(tmp, "secret")
    with open(secret, "w") as f:
        f.write("the pair's secret\n")
    common = ["--retention", "24h", "--replication-secret-file", secret]
    b_data = os.path.join(tmp, "b")
    os.makedirs(b_data)
    b = Node(a.nsqd, ["--replication-role", "standby", *common], b_data)
    b_args = ["--replication-role", "standby", "--tcp-address", b.tcp, *common]
    primary = Node(a.nsqd, ["--replica", b.tcp, *common])
    try:
        while state(b) != "in_sync":
            time.sleep(0.05)
        primary.post("/topic/create?topic=big")
        body = b"x" * 1024
        total = int(a.megabytes * 2**20 / (len(body) + 30))
        sock, reader = connect(primary.tcp), FrameReader()
        started = time.monotonic()
        for at in range(0, total, 500):
            mpub(sock, reader, "big", [body] * min(500, total - at))
        sock.close()
        primary.post("/topic/empty?topic=big")
        retained = primary.stats("big")["retained"]
        size = retained["bytes"]
        print(
            f"published {total:,} x 1 KiB to A in {time.monotonic() - started:.1f} s (sync mode); retained "
            f"{size / 2**20:.0f} MiB in {retained['segments']} segments"
        )

        # 1. a standby with no history
        halt(b)
        shutil.rmtree(b_data)
        os.makedirs(b_data)
        print("1. B's data path emptied, B started again:")
        b, took = catch_up(primary, b_args, b_data)
        same = digests(b_data, "big") == digests(primary.data, "big")
        print(f"  in sync after {took:.1f} s ({size / 2**20 / took:.0f} MiB/s); segments identical: {same}")

        # 2. the same, killed halfway
        halt(b)
        shutil.rmtree(b_data)
        os.makedirs(b_data)
        print("2. the same, B killed -9 halfway:")
        b, again = catch_up(primary, b_args, b_data, kill_after=took / 2)
        same = digests(b_data, "big") == digests(primary.data, "big")
        print(f"  in sync {again:.1f} s after its restart; segments identical: {same}")

        # 3. a routine restart
        halt(b)
        print("3. B stopped and started again (its history whole):")
        b, took = catch_up(primary, b_args, b_data)
        same = digests(b_data, "big") == digests(primary.data, "big")
        print(f"  in sync after {took:.2f} s; segments identical: {same}")
    finally:
        b.stop()
        primary.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
