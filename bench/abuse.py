"""Misbehaving clients against a running nsqd: how much memory and time they cost it.

Each scenario starts nsqd (this checkout's ``nsqd`` next to the Python running this,
or ``--nsqd`` for another binary, e.g. Go's), plays a client that misbehaves, samples
nsqd's RSS every 0.25 s and times a well-behaved bystander's PUB round trip meanwhile:

- ``slow-consumer``: SUB, RDY 2500, msg_timeout 1 s, never read, NOP every 0.5 s,
  with 100 KB messages queued (issue 11 item 4);
- ``fin-flood``: SUB, then ``FIN <bogus id>`` as fast as possible, never read (item 5);
- ``mpub-lie``: an MPUB that declares a small body but carries 1 MB messages, plain and
  deflate-compressed (item 6);
- ``drip``: a PUB body dripped one byte every 1.5 s with a 1 s heartbeat (item 9).

    .venv/bin/python bench/abuse.py slow-consumer
    .venv/bin/python bench/abuse.py all --nsqd /opt/gonsq/bin/nsqd
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsq_wire.commands import encode_command, mpub

MB = 1024 * 1024


class Server:
    def __init__(self, binary: str, *args: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="abuse-")
        argv = [binary, "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--data-path", self.dir]
        self.proc = subprocess.Popen([*argv, *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        self.log_bytes = 0
        self.tcp = 0
        assert self.proc.stderr is not None
        while not self.tcp:
            line = self.proc.stderr.readline().decode()
            if not line:
                raise RuntimeError("nsqd exited")
            m = re.search(r"TCP: listening on [\d.]+:(\d+)", line)
            if m:
                self.tcp = int(m.group(1))
        threading.Thread(target=self._count_log, daemon=True).start()

    def _count_log(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):  # type: ignore[union-attr]
            self.log_bytes += len(chunk)

    def rss_mb(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except FileNotFoundError:
            pass
        return 0.0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def connect(port: int, identify: dict | None = None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"  V2")
    if identify is not None:
        s.sendall(encode_command(b"IDENTIFY", body=json.dumps(identify).encode()))
        read_frame(s)
    return s


def read_frame(s: socket.socket) -> tuple[int, bytes]:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    size, ft = struct.unpack(">ii", exactly(8))
    return ft, exactly(size - 4)


def pub_rtt(port: int) -> float:
    s = connect(port)
    s.settimeout(30)
    t = time.monotonic()
    s.sendall(encode_command(b"PUB", "bystander", body=b"x"))
    read_frame(s)
    s.close()
    return time.monotonic() - t


class Sampler(threading.Thread):
    """RSS of nsqd and a bystander's PUB round trip, every 0.25 s."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.rss: list[float] = []
        self.rtt: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.25):
            self.rss.append(self.server.rss_mb())
            try:
                self.rtt.append(pub_rtt(self.server.tcp))
            except OSError:
                self.rtt.append(float("inf"))

    def report(self, name: str, **extra: object) -> dict:
        self.done.set()
        self.join()
        out = {
            "scenario": name,
            "rss_start_mb": round(self.rss[0], 1) if self.rss else None,
            "rss_max_mb": round(max(self.rss), 1) if self.rss else None,
            "bystander_rtt_max_ms": round(max(self.rtt) * 1000, 1) if self.rtt else None,
            "log_mb": round(self.server.log_bytes / MB, 1),
        }
        out.update(extra)
        return out


def closed_by_server(s: socket.socket) -> bool:
    try:
        s.sendall(encode_command(b"NOP"))
        return False
    except OSError:
        return True


def slow_consumer(server: Server, seconds: float) -> dict:
    p = connect(server.tcp)
    body = b"m" * 100_000
    for _ in range(65):
        p.sendall(mpub("slow", [body] * 40))
        read_frame(p)
    p.close()
    sampler = Sampler(server)
    sampler.start()
    s = connect(server.tcp, {"msg_timeout": 1000, "heartbeat_interval": 1000, "feature_negotiation": True})
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(encode_command(b"SUB", "slow", "c") + encode_command(b"RDY", "2500"))
    start = time.monotonic()
    closed_after = None
    while time.monotonic() - start < seconds:
        time.sleep(0.5)
        if closed_by_server(s):
            closed_after = round(time.monotonic() - start, 1)
            break
    s.close()
    return sampler.report("slow-consumer", closed_after_s=closed_after)


def fin_flood(server: Server, seconds: float) -> dict:
    sampler = Sampler(server)
    sampler.start()
    s = connect(server.tcp)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(encode_command(b"SUB", "flood", "c"))
    line = encode_command(b"FIN", "0123456789abcdef") * 1000
    sent = 0
    s.settimeout(1)
    start = time.monotonic()
    closed_after = None
    while time.monotonic() - start < seconds:
        try:
            s.sendall(line)
            sent += len(line)
        except TimeoutError:
            continue  # nsqd stopped reading: that is the bound working
        except OSError:
            closed_after = round(time.monotonic() - start, 1)
            break
    s.close()
    return sampler.report("fin-flood", sent_mb=round(sent / MB, 1), closed_after_s=closed_after)


def mpub_lie(server: Server, deflate: bool) -> dict:
    sampler = Sampler(server)
    sampler.start()
    s = connect(server.tcp)
    if deflate:
        s.sendall(encode_command(b"IDENTIFY", body=json.dumps({"feature_negotiation": True, "deflate": True}).encode()))
        read_frame(s)
        comp = zlib.compressobj(6, zlib.DEFLATED, -15)
        send = lambda data: s.sendall(comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH))  # noqa: E731
    else:
        send = s.sendall
    n = 300
    body = b"z" * MB
    head = b"MPUB lie\n" + struct.pack(">I", 100) + struct.pack(">I", n)
    wire = 0
    answer = b""
    try:
        send(head)
        for _ in range(n):
            send(struct.pack(">I", len(body)) + body)
            wire += len(body)
        s.settimeout(10)
        answer = s.recv(200)
    except OSError as e:
        answer = str(e).encode()
    time.sleep(1)
    s.close()
    return sampler.report("mpub-lie-deflate" if deflate else "mpub-lie", answer=answer[8:].decode(errors="replace"))


def drip(server: Server) -> dict:
    sampler = Sampler(server)
    sampler.start()
    s = connect(server.tcp, {"heartbeat_interval": 1000})
    body = b"0123456789"
    s.sendall(b"PUB drip\n" + struct.pack(">I", len(body)))
    start = time.monotonic()
    closed_after = None
    for b in body:
        time.sleep(1.5)
        try:
            s.sendall(bytes([b]))
        except OSError:
            closed_after = round(time.monotonic() - start, 1)
            break
    s.settimeout(5)
    try:
        answer = s.recv(100)
    except OSError as e:
        answer = str(e).encode()
    if closed_after is None and not answer:
        closed_after = round(time.monotonic() - start, 1)
    s.close()
    return sampler.report("drip", answer=answer[8:].decode(errors="replace"), closed_after_s=closed_after)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=["slow-consumer", "fin-flood", "mpub-lie", "drip", "all"])
    p.add_argument("--nsqd", default=str(Path(sys.executable).parent / "nsqd"))
    p.add_argument("--seconds", type=float, default=20.0, help="how long the slow scenarios run at most")
    args = p.parse_args()
    runs = {
        "slow-consumer": lambda s: [slow_consumer(s, args.seconds)],
        "fin-flood": lambda s: [fin_flood(s, args.seconds)],
        "mpub-lie": lambda s: [mpub_lie(s, False), mpub_lie(s, True)],
        "drip": lambda s: [drip(s)],
    }
    names = list(runs) if args.scenario == "all" else [args.scenario]
    for name in names:
        server = Server(args.nsqd, "--mem-queue-size", "100")
        try:
            for result in runs[name](server):
                print(json.dumps(result), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
