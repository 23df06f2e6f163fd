"""How long can one V1 peer stall nsqlookupd's reactor? Prints figures, asserts nothing.

    .venv/bin/python bench/lookupd_blocking.py                        # every case
    .venv/bin/python bench/lookupd_blocking.py --case disconnect --registrations 20000

Starts ``nsqlookupd`` as a process (the console script next to this Python) and, while a
second process times ``GET /ping`` round trips over one keep-alive connection, runs:

- ``idle``: nothing but the prober, for ``--seconds`` (the baseline: the prober's round
  trips cost the server CPU too);
- ``pings``: a peer pipelines ``PING`` for ``--seconds`` and never reads an answer;
- ``pings-identified``: the same after IDENTIFY (a log line per PING, rate-limited);
- ``disconnect``: a peer IDENTIFYs, REGISTERs ``--registrations`` topics (reading every
  answer), then closes its socket; the window is the ``--window`` seconds after the close
  (nsqlookupd's log lines are rate-limited, so they cannot tell when the removal ends; the
  server's CPU seconds in the window show the work).

For each case: the worst and the 99th percentile /ping round trip during the window (the
worst reactor stall another client saw), the server's CPU seconds and its RSS growth.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

IDENTIFY = json.dumps(
    {"broadcast_address": "127.0.0.1", "hostname": "bench", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0"}
).encode()


def launch() -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    exe = Path(sys.executable).parent / "nsqlookupd"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lookupd_tw"]
    proc = subprocess.Popen(
        [*cmd, "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--broadcast-address", "127.0.0.1"],
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    stderr = proc.stderr
    assert stderr is not None
    addresses: dict[str, str] = {}
    for raw in stderr:
        m = re.search(rb"(TCP|HTTP): listening on (\S+)", raw)
        if m:
            addresses[m.group(1).decode()] = m.group(2).decode()
        if len(addresses) == 2:
            break
    else:
        raise RuntimeError("nsqlookupd did not start")
    # keep draining stderr, as a terminal would, so that nsqlookupd never blocks on it
    threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
    return proc, addresses


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def probe(address: str, stop: Any, out: Any) -> None:
    """In its own process: time GET /ping until ``stop`` is set; send the round trips back."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    rtts: list[float] = []
    while not stop.is_set():
        t0 = time.perf_counter()
        conn.request("GET", "/ping")
        resp = conn.getresponse()
        resp.read()
        rtts.append(time.perf_counter() - t0)
        time.sleep(0.002)
    out.send(rtts)


class Probe:
    def __init__(self, address: str) -> None:
        ctx = mp.get_context("spawn")  # a forked prober would hold the peers' sockets open
        self.stop = ctx.Event()
        self.recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=probe, args=(address, self.stop, send), daemon=True)
        self.proc.start()

    def finish(self) -> list[float]:
        self.stop.set()
        rtts: list[float] = self.recv.recv()
        self.proc.join()
        return rtts


def v1(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"  V1")
    return s


def read_answers(s: socket.socket, n: int) -> None:
    buf = b""
    got = 0
    while got < n:
        chunk = s.recv(1 << 16)
        if not chunk:
            raise RuntimeError("nsqlookupd closed the connection")
        buf += chunk
        while len(buf) >= 4:
            (size,) = struct.unpack(">i", buf[:4])
            if len(buf) < 4 + size:
                break
            buf = buf[4 + size :]
            got += 1


def identify(s: socket.socket) -> None:
    s.sendall(b"IDENTIFY\n" + struct.pack(">i", len(IDENTIFY)) + IDENTIFY)
    read_answers(s, 1)


def ping_flood(address: str, seconds: float, identified: bool) -> tuple[int, float]:
    """Pipeline PINGs for ``seconds`` without reading: (bytes the server accepted, seconds)."""
    s = v1(address)
    if identified:
        identify(s)
    s.setblocking(False)
    chunk = b"PING\n" * 13_000
    pending = memoryview(chunk)
    sent = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            n = s.send(pending)  # the rest of a partial send first, so the stream stays whole PINGs
        except BlockingIOError:
            time.sleep(0.01)
            continue
        sent += n
        pending = pending[n:] or memoryview(chunk)
    s.close()
    return sent, time.monotonic() - t0


def run_case(case: str, a: argparse.Namespace) -> dict[str, Any]:
    proc, addresses = launch()
    try:
        pid = proc.pid
        rss0 = rss_mb(pid)
        if case == "disconnect":
            # the peer registers before the window opens: only the disconnect is measured
            peer = register(addresses["TCP"], a.registrations)
            prober = Probe(addresses["HTTP"])
            time.sleep(0.5)  # the prober's first round trips, before the window opens
            cpu0 = cpu_seconds(pid)
            amount, seconds = disconnect(peer, a.registrations, a.window)
        elif case == "idle":
            prober = Probe(addresses["HTTP"])
            time.sleep(0.5)
            cpu0 = cpu_seconds(pid)
            time.sleep(a.seconds)
            amount, seconds = 0, a.seconds
        else:
            prober = Probe(addresses["HTTP"])
            time.sleep(0.5)
            cpu0 = cpu_seconds(pid)
            amount, seconds = ping_flood(addresses["TCP"], a.seconds, case == "pings-identified")
        cpu = cpu_seconds(pid) - cpu0
        rss = rss_mb(pid) - rss0
        rtts = sorted(prober.finish())
        return {
            "case": case,
            "amount": amount,
            "window_s": round(seconds, 2),
            "pings": len(rtts),
            "worst_ms": round(1000 * rtts[-1], 1),
            "p99_ms": round(1000 * rtts[int(0.99 * (len(rtts) - 1))], 1),
            "cpu_s": round(cpu, 2),
            "rss_growth_mb": round(rss, 1),
        }
    finally:
        proc.kill()
        proc.wait()


def register(tcp: str, registrations: int) -> socket.socket:
    s = v1(tcp)
    identify(s)
    batch = 1000
    for start in range(0, registrations, batch):
        n = min(batch, registrations - start)
        s.sendall(b"".join(b"REGISTER t%d\n" % i for i in range(start, start + n)))
        read_answers(s, n)
    return s


def disconnect(s: socket.socket, registrations: int, window: float) -> tuple[int, float]:
    """Close the peer, then watch for ``window`` seconds (longer than the removal takes)."""
    s.close()
    time.sleep(window)
    return registrations, window


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=["idle", "pings", "pings-identified", "disconnect", "all"], default="all")
    p.add_argument("--seconds", type=float, default=15.0, help="how long the PING flood lasts")
    p.add_argument("--registrations", type=int, default=20_000, help="topics the disconnecting peer registered")
    p.add_argument("--window", type=float, default=3.0, help="seconds watched after the disconnect")
    p.add_argument("--json", action="store_true", help="one JSON line per case")
    a = p.parse_args()
    cases = ["idle", "pings", "pings-identified", "disconnect"] if a.case == "all" else [a.case]
    for case in cases:
        r = run_case(case, a)
        if a.json:
            print(json.dumps(r), flush=True)
        else:
            if case == "disconnect":
                what = f"{r['amount']:,} registrations, {r['window_s']} s watched after the disconnect"
            elif case == "idle":
                what = f"{r['window_s']} s"
            else:
                what = f"{r['amount']:,} bytes of PINGs accepted in {r['window_s']} s"
            print(
                f"{case}: {what}; /ping worst {r['worst_ms']} ms, "
                f"p99 {r['p99_ms']} ms over {r['pings']} round trips; server CPU {r['cpu_s']} s, "
                f"RSS +{r['rss_growth_mb']} MB",
                flush=True,
            )


if __name__ == "__main__":
    main()
