"""How soon a consumer has its first message, with and without nsqlookupd attached.

    python bench/first_message.py --rounds 200
    python bench/first_message.py --rounds 200 --server before=/tmp/before/bin --server go=~/go-nsq-1.3/bin

Each server directory gives an ``nsqd`` and an ``nsqlookupd`` (ours: next to this
Python). For each, nsqd runs alone and then with ``--lookupd-tcp-address`` (its
nsqlookupd registered first), and every round, on a new topic, does what client
tests do: a producer PUBs one message (which creates the topic) and waits for its
OK; a consumer connects, SUBs and waits for its OK, then sends RDY 1. Timed:

- ``PUB→OK``: the publish that creates the topic (Go's nsqd answers it once it has
  asked the lookupds for the topic's channels);
- ``SUB→OK``: the subscribe that creates the channel (and REGISTERs it);
- ``RDY→msg``: from RDY to the message, queued before the consumer came;
- ``RDY unread``: in another connection per round, SUB and RDY sent together as
  go-nsq does on a new topic with a message queued, and the connection reset
  ``--kill-ms`` after them: how often nsqd had not taken in the RDY by then (the
  message never left: the channel's ``/stats`` shows nothing sent).

Medians, 90th percentiles and maxima over the rounds, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsq_wire import commands
from nsq_wire.frames import FRAME_TYPE_MESSAGE, MAGIC_V2

_FRAME = struct.Struct(">ii")
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets, as a killed process's socket


def start(argv: list[str]) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    found: dict[str, str] = {}
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"(TCP|HTTP): listening on (\S+)", line):
            found[m.group(1)] = m.group(2)
        if len(found) == 2:
            break
    else:
        raise RuntimeError(f"{argv[0]} did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
    return proc, found


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait()


class Conn:
    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(MAGIC_V2)
        self.buf = b""

    def frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buf) >= 8:
                size, ft = _FRAME.unpack_from(self.buf)
                if len(self.buf) >= 4 + size:
                    data, self.buf = self.buf[8 : 4 + size], self.buf[4 + size :]
                    if data != b"_heartbeat_":
                        return ft, data
                    continue
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by nsqd")
            self.buf += chunk

    def ok(self) -> None:
        ft, data = self.frame()
        if data != b"OK":
            raise RuntimeError(f"not OK: {ft} {data!r}")

    def reset(self) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        self.sock.close()


def channel_sent(http: str, topic: str, channel: str) -> bool:
    """Whether the channel ever sent a message (in flight, requeued or timed out)."""
    with urllib.request.urlopen(f"http://{http}/stats?format=json&topic={topic}", timeout=10) as resp:
        stats = json.loads(resp.read())
    for t in stats.get("topics", []):
        for c in t.get("channels", []):
            if c["channel_name"] == channel:
                return bool(c["in_flight_count"] or c["requeue_count"] or c["timeout_count"])
    return False


def measure(bin_dir: str, lookupd: bool, rounds: int, kill_ms: float, broadcast: str) -> dict[str, list[float]]:
    procs = []
    extra: list[str] = []
    if lookupd:
        where = ["--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"]
        if broadcast:
            where += ["--broadcast-address", broadcast]
        lp, la = start([f"{bin_dir}/nsqlookupd", *where])
        procs.append(lp)
        extra = ["--lookupd-tcp-address", la["TCP"], "--broadcast-address", "127.0.0.1"]
    data = tempfile.mkdtemp(prefix="bench_first.")
    ports = ["--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"]
    np_, na = start([f"{bin_dir}/nsqd", *ports, "--data-path", data, *extra])
    procs.append(np_)
    out: dict[str, list[float]] = {"PUB→OK": [], "SUB→OK": [], "RDY→msg": [], "RDY unread": []}
    try:
        if lookupd:  # registered: the lookupd knows nsqd's HTTP address (its IDENTIFY answered)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with urllib.request.urlopen(f"http://{la['HTTP']}/nodes", timeout=10) as resp:
                    if json.loads(resp.read()).get("producers"):
                        break
                time.sleep(0.05)
        producer = Conn(na["TCP"])
        for r in range(rounds):
            topic = f"first{r}"
            t0 = time.perf_counter()
            producer.sock.sendall(commands.pub(topic, b"x" * 100))
            producer.ok()
            out["PUB→OK"].append((time.perf_counter() - t0) * 1000)
            consumer = Conn(na["TCP"])
            t0 = time.perf_counter()
            consumer.sock.sendall(commands.sub(topic, "c"))
            consumer.ok()
            out["SUB→OK"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            consumer.sock.sendall(commands.rdy(1))
            while consumer.frame()[0] != FRAME_TYPE_MESSAGE:
                pass
            out["RDY→msg"].append((time.perf_counter() - t0) * 1000)
            consumer.sock.close()

            killed = f"killed{r}"
            producer.sock.sendall(commands.pub(killed, b"x" * 100))
            producer.ok()
            victim = Conn(na["TCP"])
            victim.sock.sendall(commands.sub(killed, "c") + commands.rdy(1))
            time.sleep(kill_ms / 1000)
            victim.reset()
            time.sleep(0.02)  # the reset has reached nsqd before /stats is asked
            out["RDY unread"].append(0.0 if channel_sent(na["HTTP"], killed, "c") else 1.0)
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(data, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="first_message", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--kill-ms", type=float, default=1.0, help="RDY unread: the reset this long after SUB+RDY")
    p.add_argument("--server", action="append", default=[], metavar="NAME=DIR", help="also the servers in DIR")
    p.add_argument(
        "--lookupd-broadcast",
        default="",
        metavar="ADDR",
        help="nsqlookupd's --broadcast-address (default: its own, the host name, which nsqd resolves)",
    )
    a = p.parse_args(argv)
    dirs = {"ours": str(Path(sys.executable).parent)}
    for spec in a.server:
        name, _, path = spec.partition("=")
        dirs[name] = os.path.expanduser(path)
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, d in dirs.items():
        for lookupd in (False, True):
            out = measure(d, lookupd, a.rounds, a.kill_ms, a.lookupd_broadcast)
            label = f"{name} {'with' if lookupd else 'without'} nsqlookupd"
            parts = []
            for key, xs in out.items():
                if key == "RDY unread":
                    parts.append(f"RDY unread at {a.kill_ms:g} ms {sum(xs):.0f}/{len(xs)}")
                else:
                    xs = sorted(xs)
                    p90 = xs[int(len(xs) * 0.9)]
                    parts.append(f"{key} {statistics.median(xs):.3f}/{p90:.3f}/{xs[-1]:.3f} ms")
            print(f"{label:<28} " + "  ".join(parts), flush=True)
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("(median/p90/max)")


if __name__ == "__main__":
    main()
