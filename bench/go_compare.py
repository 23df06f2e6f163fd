"""nsq-tw next to Go nsqd, measured the same way, interleaved.

    python bench/go_compare.py --go-bin DIR throughput --rounds 3 --runfor 5s
    python bench/go_compare.py --go-bin DIR start --rounds 5
    python bench/go_compare.py --go-bin DIR memory --messages 200000
    python bench/go_compare.py --go-bin DIR create --count 200
    python bench/go_compare.py --go-bin DIR latency --rates 10000,50000 --seconds 10
    python bench/go_compare.py --go-bin DIR all
    python bench/go_compare.py --go-bin DIR --standby sync --standby async throughput --rounds 3

DIR holds Go's binaries, built outside this repository: ``nsqd`` and, for
``throughput``, Go's ``bench_writer`` and ``bench_reader``. The other figures use
one Python client for both servers. ``--server NAME=PATH`` adds more servers
(another build of ours, say); ``--ours PATH`` picks our ``nsqd`` (default: the one
next to this Python). Every round runs each server in turn, alternating the
order; the figures are medians over rounds. ``--standby MODE`` (``sync``, ``async``)
adds ``ours+MODE``: our nsqd as a replication primary with a standby nsqd (ours, on the
same machine) linked in that mode before each run (docs/replication.md). ``--pin 0/1``
keeps the measured nsqd on CPU 0 and the bench tools and the standby on CPU 1.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import process_cpu, server_env

from nsq_wire import commands
from nsq_wire.frames import FRAME_TYPE_MESSAGE, MAGIC_V2, FrameReader
from nsq_wire.gofmt import parse_duration
from nsq_wire.message import decode

_STAMP = struct.Struct(">q")


# -- servers ----------------------------------------------------------------------------


class Server:
    """One running nsqd (either implementation) on loopback ports of its own."""

    def __init__(self, exe: str, extra: list[str] = (), cpus: str = "") -> None:  # type: ignore[assignment]
        """``cpus``: the CPUs it may run on (``taskset -c``), empty: any."""
        self.data = tempfile.mkdtemp(prefix="go_compare.")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                *pinned(cpus),
                exe,
                "--tcp-address",
                "127.0.0.1:0",
                "--http-address",
                "127.0.0.1:0",
                "--data-path",
                self.data,
                *extra,
            ],
            stderr=subprocess.PIPE,
            text=True,
            env=server_env(),
        )
        self.tcp = self.http = ""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if m := re.search(r"TCP: listening on (\S+)", line):
                self.tcp = m.group(1)
            if m := re.search(r"HTTP: listening on (\S+)", line):
                self.http = m.group(1)
            if self.tcp and self.http:
                break
        else:
            raise RuntimeError(f"{exe} did not start")
        # drain stderr so the server never blocks on a full pipe
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()  # type: ignore[union-attr]

    def post(self, path: str) -> bytes:
        req = urllib.request.Request(f"http://{self.http}{path}", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read()

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://{self.http}{path}", timeout=30) as resp:
            return resp.read()

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def cpu(self) -> float:
        """The server's CPU time so far (user + system), seconds, from /proc."""
        return process_cpu(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def pinned(cpus: str) -> list[str]:
    """The command prefix that keeps a process on ``cpus`` (``--pin``)."""
    return ["taskset", "-c", cpus] if cpus else []


PIN: dict[str, str] = {"server": "", "others": ""}  # --pin: the measured server's CPUs, everything else's


@contextmanager
def running(exe: str, extra: list[str] = ()) -> Iterator[Server]:  # type: ignore[assignment]
    server = Server(exe, extra, PIN["server"])
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def running_pair(exe: str, extra: list[str], mode: str) -> Iterator[Server]:
    """Our nsqd as the primary of a replication pair (``mode``: sync or async), its
    standby (the same command and flags) linked and in sync before it is handed out."""
    secret = tempfile.NamedTemporaryFile("w", prefix="go_compare.secret.", delete=False)
    secret.write("bench\n")
    secret.close()
    shared = ["--replication-secret-file", secret.name, *extra]
    standby = Server(exe, ["--replication-role", "standby", *shared], PIN["others"])
    try:
        with running(exe, ["--replica", standby.tcp, "--replication-mode", mode, *shared]) as primary:
            deadline = time.monotonic() + 30
            while json.loads(primary.get("/replication"))["state"] != "in_sync":
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby did not get in sync")
                time.sleep(0.05)
            yield primary
    finally:
        standby.stop()
        os.unlink(secret.name)


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def connect(address: str) -> socket.socket:
    sock = socket.create_connection(host_port(address))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC_V2)
    return sock


def read_frame(sock: socket.socket, reader: FrameReader) -> tuple[int, bytes]:
    while (frame := reader.next()) is None:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by nsqd")
        reader.feed(chunk)
    return frame


class Subscriber(threading.Thread):
    """SUB, RDY ``rdy``, then each message to :meth:`handle` (which FINs it)
    until :meth:`stop`; answers heartbeats."""

    def __init__(self, address: str, topic: str, channel: str, rdy: int, poll: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.poll = poll
        self.sock = connect(address)
        self.reader = FrameReader()
        self.sock.sendall(commands.sub(topic, channel))
        read_frame(self.sock, self.reader)
        self.sock.sendall(commands.rdy(rdy))
        self.stopping = threading.Event()

    def run(self) -> None:
        self.sock.settimeout(self.poll)
        while not self.stopping.is_set():
            try:
                frame_type, data = read_frame(self.sock, self.reader)
            except TimeoutError:
                continue
            except OSError:
                return
            if frame_type != FRAME_TYPE_MESSAGE:
                if data == b"_heartbeat_":
                    self.sock.sendall(commands.NOP)
                continue
            self.handle(*decode(data))

    def handle(self, msg_id: bytes, body: bytes, ts: int, attempts: int) -> None:
        self.sock.sendall(commands.fin(msg_id))

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.sock.close()


def rounds_of(servers: dict[str, str], rounds: int) -> Iterator[tuple[int, str, str]]:
    names = list(servers)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            yield r, name, servers[name]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio_line(label: str, figures: dict[str, float], lower_is_better: bool = False) -> str:
    parts = [f"{name} {value:,.3f}" if value < 100 else f"{name} {value:,.0f}" for name, value in figures.items()]
    line = f"{label:<34} " + "  ".join(parts)
    if "go" in figures and "ours" in figures and figures["go"]:
        r = figures["ours"] / figures["go"]
        line += f"  ours/go {r:.2f}" + (" (lower is better)" if lower_is_better else "")
    return line


# -- throughput: Go's bench_writer then bench_reader ------------------------------------


def ops(out: str) -> float:
    found = re.findall(r"([\d.]+)ops/s", out)
    if not found:
        raise RuntimeError(f"no rate in {out!r}")
    return float(found[-1])


def messages(out: str) -> float:
    """How many messages a bench tool's run moved: its rate times its duration."""
    found = re.findall(r"duration: (\S+) -", out)
    if not found:
        raise RuntimeError(f"no duration in {out!r}")
    return ops(out) * parse_duration(found[-1])


def writers_env(writers: int) -> dict[str, str] | None:
    """Go's bench_writer runs one publisher per GOMAXPROCS: ``writers`` of them (0: per core)."""
    return dict(os.environ, GOMAXPROCS=str(writers)) if writers else None


def throughput(a: argparse.Namespace, servers: dict[str, str]) -> None:
    go_bin = Path(a.go_bin)
    pub: dict[str, list[float]] = {n: [] for n in servers}
    sub: dict[str, list[float]] = {n: [] for n in servers}
    # the server's CPU time per message (µs), from /proc: how far from the work itself
    pub_cpu: dict[str, list[float]] = {n: [] for n in servers}
    sub_cpu: dict[str, list[float]] = {n: [] for n in servers}
    size = ["-size", str(a.size)]
    for r, name, exe in rounds_of(servers, a.rounds):
        extra = ["--mem-queue-size", str(a.mem_queue_size)]
        mode = a.pairs.get(name)
        with running(exe, extra) if mode is None else running_pair(exe, extra, mode) as s:
            s.post("/topic/create?topic=sub_bench")
            if not a.topic_backlog:
                s.post("/channel/create?topic=sub_bench&channel=ch")
            addr = ["-nsqd-tcp-address", s.tcp, "-runfor", a.runfor]
            cpu0 = s.cpu()
            w = subprocess.run(
                [*pinned(PIN["others"]), str(go_bin / "bench_writer"), *addr, *size, "-batch-size", str(a.batch_size)],
                capture_output=True,
                text=True,
                check=True,
                env=writers_env(a.writers),
            )
            cpu1 = s.cpu()
            rd = subprocess.run(
                [*pinned(PIN["others"]), str(go_bin / "bench_reader"), *addr, *size],
                capture_output=True,
                text=True,
                check=True,
            )
            cpu2 = s.cpu()
        wrote, read = w.stdout + w.stderr, rd.stdout + rd.stderr
        pub[name].append(ops(wrote))
        sub[name].append(ops(read))
        pub_cpu[name].append((cpu1 - cpu0) / messages(wrote) * 1e6)
        sub_cpu[name].append((cpu2 - cpu1) / messages(read) * 1e6)
        print(
            f"round {r + 1} {name:<8} publish {pub[name][-1]:>11,.0f} msg/s {pub_cpu[name][-1]:5.2f} µs CPU/msg"
            f"  consume {sub[name][-1]:>11,.0f} msg/s {sub_cpu[name][-1]:5.2f} µs CPU/msg"
        )
    print(ratio_line("publish msg/s (median)", {n: median(v) for n, v in pub.items()}))
    print(ratio_line("consume msg/s (median)", {n: median(v) for n, v in sub.items()}))
    print(ratio_line("publish µs CPU/msg (median)", {n: median(v) for n, v in pub_cpu.items()}, True))
    print(ratio_line("consume µs CPU/msg (median)", {n: median(v) for n, v in sub_cpu.items()}, True))


# -- start time ----------------------------------------------------------------------------


def timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, capture_output=True, check=True)
    return time.monotonic() - t0


def start_to_ping(exe: str) -> float:
    t0 = time.monotonic()
    with running(exe) as s:
        while True:
            try:
                if s.get("/ping") == b"OK":
                    return time.monotonic() - t0
            except OSError:
                time.sleep(0.001)


def start(a: argparse.Namespace, servers: dict[str, str]) -> None:
    ping: dict[str, list[float]] = {n: [] for n in servers}
    version: dict[str, list[float]] = {n: [] for n in servers}
    helptime: dict[str, list[float]] = {n: [] for n in servers}
    reactor: list[float] = []
    for r, name, exe in rounds_of(servers, a.rounds):
        ping[name].append(start_to_ping(exe) * 1000)
        version[name].append(timed([exe, "--version"]) * 1000)
        helptime[name].append(timed([exe, "--help"]) * 1000)
        if name == "ours":
            reactor.append(timed([sys.executable, "-c", "import twisted.internet.reactor"]) * 1000)
        print(
            f"round {r + 1} {name:<8} start→/ping {ping[name][-1]:7.1f} ms  "
            f"--version {version[name][-1]:6.1f} ms  --help {helptime[name][-1]:6.1f} ms"
        )
    print(ratio_line("start → /ping OK ms (median)", {n: median(v) for n, v in ping.items()}, True))
    print(ratio_line("--version ms (median)", {n: median(v) for n, v in version.items()}, True))
    print(ratio_line("--help ms (median)", {n: median(v) for n, v in helptime.items()}, True))
    if reactor:
        ref = median(reactor)
        print(
            f"{'import twisted.internet.reactor ms':<34} {ref:,.1f}  ours start/import {median(ping['ours']) / ref:.2f}"
        )


# -- memory per queued message -----------------------------------------------------------


def publish(address: str, topic: str, count: int, size: int, batch: int = 200) -> None:
    """MPUB ``count`` messages and wait for every OK."""
    sock = connect(address)
    reader = FrameReader()
    body = b"a" * size
    sent = 0
    pending = 0
    while sent < count:
        n = min(batch, count - sent)
        sock.sendall(commands.mpub(topic, [body] * n))
        sent += n
        pending += 1
        while pending >= 8 or (sent >= count and pending):
            _frame_type, data = read_frame(sock, reader)
            if data != b"_heartbeat_":
                pending -= 1
    sock.close()


def depth(s: Server, topic: str, channel: str) -> int:
    stats = json.loads(s.get(f"/stats?format=json&topic={topic}&channel={channel}"))
    for t in stats.get("topics", []):
        for c in t.get("channels", []):
            if c["channel_name"] == channel:
                return int(c["depth"])
    return 0


def memory(a: argparse.Namespace, servers: dict[str, str]) -> None:
    per: dict[str, list[float]] = {n: [] for n in servers}
    for r, name, exe in rounds_of(servers, a.rounds):
        with running(exe, ["--mem-queue-size", str(a.messages * 2)]) as s:
            s.post("/topic/create?topic=mem")
            s.post("/channel/create?topic=mem&channel=ch")
            time.sleep(1)  # let start-up garbage settle before the baseline
            before = s.rss()
            publish(s.tcp, "mem", a.messages, a.size)
            while depth(s, "mem", "ch") < a.messages:
                time.sleep(0.05)
            time.sleep(1)
            per[name].append((s.rss() - before) / a.messages)
        print(f"round {r + 1} {name:<8} RSS per queued {a.size} B message: {per[name][-1]:,.0f} B")
    print(ratio_line(f"RSS B per queued {a.size} B message", {n: median(v) for n, v in per.items()}, True))


# -- SUB that creates a topic and channel ----------------------------------------------------


def round_trip(sock: socket.socket, reader: FrameReader, data: bytes) -> float:
    t0 = time.perf_counter()
    sock.sendall(data)
    _frame_type, resp = read_frame(sock, reader)
    took = time.perf_counter() - t0
    if resp != b"OK":
        raise RuntimeError(f"answer {resp!r}")
    return took * 1000


def create(a: argparse.Namespace, servers: dict[str, str]) -> None:
    creating: dict[str, list[float]] = {n: [] for n in servers}
    existing: dict[str, list[float]] = {n: [] for n in servers}
    publishing: dict[str, list[float]] = {n: [] for n in servers}
    for r, name, exe in rounds_of(servers, a.rounds):
        with running(exe) as s:
            for i in range(a.count):
                for target, topic in ((creating, f"new{i}"), (existing, f"new{i}")):
                    sock = connect(s.tcp)
                    target[name].append(round_trip(sock, FrameReader(), commands.sub(topic, "ch")))
                    sock.close()
                sock = connect(s.tcp)
                publishing[name].append(round_trip(sock, FrameReader(), commands.pub(f"pub{i}", b"x")))
                sock.close()
        print(
            f"round {r + 1} {name:<8} SUB creating {median(creating[name]):.2f} ms  "
            f"SUB existing {median(existing[name]):.2f} ms  PUB creating {median(publishing[name]):.2f} ms"
        )
    print(ratio_line("SUB creating topic+channel ms p50", {n: median(v) for n, v in creating.items()}, True))
    print(ratio_line("SUB on an existing channel ms p50", {n: median(v) for n, v in existing.items()}, True))
    print(ratio_line("PUB creating a topic ms p50", {n: median(v) for n, v in publishing.items()}, True))


# -- publish-to-delivery latency at a steady rate ------------------------------------------


def _producer(address: str, topic: str, rate: int, seconds: float, size: int, ready: Any, out: Any) -> None:
    sock = connect(address)
    pad = b"p" * max(0, size - _STAMP.size)
    tick = 0.001
    per_tick = rate * tick
    drained = threading.Thread(target=lambda: [None for _ in iter(lambda: sock.recv(65536), b"")], daemon=True)
    drained.start()
    ready.wait()
    t0 = time.monotonic()
    sent = 0.0
    while (now := time.monotonic()) - t0 < seconds:
        due = int((now - t0) / tick * per_tick) - int(sent)
        if due > 0:
            stamp = time.monotonic_ns()
            sock.sendall(b"".join(commands.pub(topic, _STAMP.pack(stamp) + pad) for _ in range(due)))
            sent += due
        time.sleep(tick / 2)
    sock.shutdown(socket.SHUT_WR)
    out.put(int(sent))


def _consumer(address: str, topic: str, seconds: float, warmup: float, out: Any, ready: Any) -> None:
    sock = connect(address)
    reader = FrameReader()
    sock.sendall(commands.sub(topic, "ch") + commands.rdy(2500))
    read_frame(sock, reader)  # OK
    ready.set()
    lat: list[int] = []
    received = 0
    t0 = time.monotonic()
    sock.settimeout(2)
    while time.monotonic() - t0 < seconds + 1:
        try:
            chunk = sock.recv(262144)
        except TimeoutError:
            break
        if not chunk:
            break
        reader.feed(chunk)
        now = time.monotonic_ns()
        fins = []
        for frame_type, data in reader.frames():
            if frame_type != FRAME_TYPE_MESSAGE:
                if data == b"_heartbeat_":
                    fins.append(commands.NOP)
                continue
            msg_id, body, _, _ = decode(data)
            received += 1
            if now - t0 * 1e9 > warmup * 1e9:
                lat.append(now - _STAMP.unpack_from(body)[0])
            fins.append(commands.fin(msg_id))
        if fins:
            sock.sendall(b"".join(fins))
    out.put((received, lat))


def latency(a: argparse.Namespace, servers: dict[str, str]) -> None:
    ctx = mp.get_context("spawn")
    for rate in [int(x) for x in a.rates.split(",")]:
        p50: dict[str, list[float]] = {n: [] for n in servers}
        p99: dict[str, list[float]] = {n: [] for n in servers}
        for r, name, exe in rounds_of(servers, a.rounds):
            with running(exe) as s:
                s.post("/topic/create?topic=lat")
                s.post("/channel/create?topic=lat&channel=ch")
                out, sent_out, ready = ctx.Queue(), ctx.Queue(), ctx.Event()
                consumer = ctx.Process(target=_consumer, args=(s.tcp, "lat", a.seconds, a.warmup, out, ready))
                producer = ctx.Process(target=_producer, args=(s.tcp, "lat", rate, a.seconds, a.size, ready, sent_out))
                consumer.start()
                producer.start()
                received, lat = out.get()
                sent = sent_out.get()
                producer.join()
                consumer.join()
            lat.sort()
            p50[name].append(lat[len(lat) // 2] / 1e6)
            p99[name].append(lat[int(len(lat) * 0.99)] / 1e6)
            print(
                f"round {r + 1} {name:<8} {rate:,} msg/s: received {received:,} of {sent:,}  "
                f"p50 {p50[name][-1]:.3f} ms  p99 {p99[name][-1]:.3f} ms"
            )
        print(ratio_line(f"{rate:,} msg/s p50 ms", {n: median(v) for n, v in p50.items()}, True))
        print(ratio_line(f"{rate:,} msg/s p99 ms", {n: median(v) for n, v in p99.items()}, True))


# -- command line ----------------------------------------------------------------------------

MEASURES: dict[str, Callable[[argparse.Namespace, dict[str, str]], None]] = {
    "throughput": throughput,
    "start": start,
    "memory": memory,
    "create": create,
    "latency": latency,
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="go_compare", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--go-bin", required=True, help="directory of Go's nsqd, bench_writer and bench_reader")
    p.add_argument("--ours", default=str(Path(sys.executable).parent / "nsqd"), help="our nsqd command")
    p.add_argument("--server", action="append", default=[], metavar="NAME=PATH", help="another nsqd to measure")
    p.add_argument(
        "--standby",
        action="append",
        default=[],
        choices=["sync", "async"],
        help="throughput: also ours as a replication primary with a standby in this mode (ours+MODE)",
    )
    p.add_argument("measure", choices=[*MEASURES, "all"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runfor", default="5s", help="throughput: each bench tool's run")
    p.add_argument("--size", type=int, default=200, help="message size")
    p.add_argument("--batch-size", type=int, default=200, help="throughput: MPUB batch")
    p.add_argument(
        "--pin",
        default="",
        metavar="SERVER_CPUS/OTHER_CPUS",
        help="throughput: taskset the measured nsqd to SERVER_CPUS, the bench tools and a standby to OTHER_CPUS "
        "(e.g. 0/1: the primary has a core of its own, as on a host of its own)",
    )
    p.add_argument(
        "--writers",
        type=int,
        default=0,
        help="throughput: bench_writer's concurrent publishers, each waiting for its OK (default: one per core)",
    )
    p.add_argument("--mem-queue-size", type=int, default=1_000_000, help="throughput: as Go's bench.sh")
    p.add_argument(
        "--topic-backlog",
        action="store_true",
        help="throughput: no channel until the reader's SUB (Go's bench.sh): the writer's messages wait in the topic",
    )
    p.add_argument("--messages", type=int, default=200_000, help="memory: messages queued")
    p.add_argument("--count", type=int, default=200, help="create: SUBs per round")
    p.add_argument("--rates", default="10000,50000", help="latency: msg/s, comma-separated")
    p.add_argument("--seconds", type=float, default=10.0, help="latency: how long each rate runs")
    p.add_argument("--warmup", type=float, default=1.0, help="latency: first seconds not counted")
    a = p.parse_args(argv)
    parse_duration(a.runfor)  # fail early on a bad duration
    if a.pin:
        PIN["server"], _, PIN["others"] = a.pin.partition("/")
    servers = {"go": str(Path(a.go_bin) / "nsqd"), "ours": a.ours}
    for spec in a.server:
        name, _, path = spec.partition("=")
        servers[name] = path
    a.pairs = {}
    for mode in a.standby:
        servers[f"ours+{mode}"] = a.ours
        a.pairs[f"ours+{mode}"] = mode
    for name, exe in servers.items():
        if not os.access(exe, os.X_OK):
            p.error(f"{name}: {exe} is not an executable")
    for measure in MEASURES if a.measure == "all" else [a.measure]:
        print(f"== {measure} ({a.rounds} rounds, interleaved)", flush=True)
        MEASURES[measure](a, servers)


if __name__ == "__main__":
    main()
