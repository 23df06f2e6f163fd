"""Retention and rewinds (issue 24), measured on nsqd processes.

    python bench/replay.py rewind --messages 200000 --seconds 120
    python bench/replay.py cost --rounds 3 --runfor 5s
    python bench/replay.py durable --kills 10
    python bench/replay.py ageout --retention 10s
    python bench/replay.py rss --gigabytes 2
    python bench/replay.py concurrent --channels 16 --rdy 2500 --rounds 3

- ``rewind``: MESSAGES published (MPUB of ``--batch``) at an even pace over SECONDS to a topic
  with ``--retention 1h``; one consumer (RDY 1000) FINs them all, keeping their IDs and
  timestamps. Then ``POST /channel/rewind`` to the timestamp of message MESSAGES/2 (RFC 3339,
  ns): exactly the second half must come again (count, IDs, order); then kill -9, restart on
  the same data path, and the same rewind again.
- ``cost``: publish (``bench_writer``, MPUB 200 x 200 B, 2 processes) and consume
  (``bench_reader``) on two nsqds, one with ``--retention 1h``, one without (and ``--before``,
  another build, without), rounds interleaved (Go's bench.sh setup: ``--mem-queue-size
  1000000``, channel made first); medians, and the server's CPU time per message published.
  The same nsqds serve every round (their retained log grows by GBs: the kernel's writeback of
  it shares the cores), or, with ``--fresh``, new ones with empty data paths each round.
- ``durable``: ``--mem-queue-size 0 --sync-every 1 --retention 1h``; two publishers PUB
  (4 in flight each) while nsqd is killed (-9) every 0.5-1.5 s, KILLS times, restarted on
  the same data path; then a channel made with ``since=earliest`` must deliver every message
  that was answered OK.
- ``ageout``: ``--retention`` (10s): 100,000 messages published over ~5 s to a topic with a
  consumed channel and one nobody reads; the retained files and the queues' files sampled
  every 0.1 s: when the retained log is gone (against when its newest message aged out) and
  what is left on disk (the unread channel's backlog).
- ``rss``: a retained log of GIGABYTES (1 KiB messages) published to a topic with no channel,
  the topic's own backlog emptied, then a channel made with ``since=earliest`` and a consumer
  FINing everything: nsqd's RSS before, at most during the rewind (sampled every ~20 ms), and
  after; a ``GET /ping``'s latency during it (median, max).

- ``concurrent``: CHANNELS channels rewinding at once, one consumer each at RDY ``--rdy`` FINing
  everything: a retained log of MESSAGES x ``--size`` bytes published to a topic with no channel
  (its own backlog emptied), then every channel made with ``since=earliest`` and its consumer
  connected. Against that, ``plain``: the same consumers on channels with plain backlogs (no
  retention: the channels made first, the same messages published, what memory cannot hold on
  disk). Throughout, nsqd's RSS and a ``GET /ping``'s latency are sampled every ~20 ms: RSS
  before the consumers, at most during, after the drain (3 s later); /ping median, 99th
  percentile and max; and, for the rewinds, the most their memory queues held (``/stats``).
  ``--mode`` picks one. ROUNDS rounds, the two interleaved; medians.

``--nsqd`` is the nsqd to run (default: the one beside this Python).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from go_compare import Server, Subscriber, connect, read_frame

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsq_wire import commands
from nsq_wire.frames import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameReader
from nsq_wire.gofmt import parse_duration, rfc3339_nano

HERE = Path(__file__).resolve().parent


class Node(Server):
    """An nsqd that can be killed and started again on the same data path."""

    def __init__(self, exe: str, extra: list[str], data: str | None = None) -> None:
        # Server makes a data path of its own and names it first; a later --data-path wins
        super().__init__(exe, ["--data-path", data, *extra] if data else extra)
        if data:
            os.rmdir(self.data)
            self.data = data
        self.exe, self.extra = exe, extra

    def post(self, path: str) -> bytes:
        import urllib.error

        try:
            return super().post(path)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"POST {path}: {e.code} {e.read()!r}") from None

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def again(self) -> Node:
        return Node(self.exe, self.extra, self.data)

    def stats(self, topic: str) -> dict[str, Any]:
        doc = json.loads(self.get(f"/stats?format=json&topic={topic}&include_clients=false"))
        return (doc.get("topics") or [{}])[0]


class Collector(Subscriber):
    """SUB, RDY ``rdy``; FIN every message; keeps (id, timestamp, body)."""

    def __init__(self, address: str, topic: str, channel: str, rdy: int = 1000, keep: bool = True) -> None:
        """``keep``: keep what came (else only count it)."""
        super().__init__(address, topic, channel, rdy, poll=0.2)
        self.keep = keep
        self.count = 0
        self.got: list[tuple[bytes, int, bytes]] = []

    def handle(self, msg_id: bytes, body: bytes, ts: int, attempts: int) -> None:
        self.count += 1
        if self.keep:
            self.got.append((msg_id, ts, body))
        super().handle(msg_id, body, ts, attempts)

    def wait_for(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.got) < n and time.monotonic() < deadline:
            time.sleep(0.05)


def mpub(sock: Any, reader: FrameReader, topic: str, bodies: list[bytes]) -> None:
    sock.sendall(commands.mpub(topic, bodies))
    while True:
        frame_type, data = read_frame(sock, reader)
        if data != b"_heartbeat_":
            if (frame_type, data) != (FRAME_TYPE_RESPONSE, b"OK"):
                raise RuntimeError(f"MPUB refused: {data!r}")
            return


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: str, part: str) -> int:
    total = 0
    for f in os.listdir(path):
        if part in f:
            try:
                total += os.path.getsize(os.path.join(path, f))
            except FileNotFoundError:
                pass
    return total


# -- rewind -------------------------------------------------------------------------------


def rewind(a: argparse.Namespace) -> None:
    node = Node(a.nsqd, ["--retention", "1h"])
    try:
        node.post("/topic/create?topic=events")
        node.post("/channel/create?topic=events&channel=c")
        consumer = Collector(node.tcp, "events", "c")
        consumer.start()
        sock, reader = connect(node.tcp), FrameReader()
        gap = a.seconds * a.batch / a.messages
        started = time.monotonic()
        for i, at in enumerate(range(0, a.messages, a.batch)):
            mpub(sock, reader, "events", [b"%09d" % n for n in range(at, min(at + a.batch, a.messages))])
            pause = started + (i + 1) * gap - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        published = time.monotonic() - started
        sock.close()
        consumer.wait_for(a.messages, 120)
        consumer.stop()
        got = consumer.got
        print(f"published {a.messages:,} in {published:.1f} s; consumed and FINed {len(got):,}")
        assert [g[2] for g in got] == [b"%09d" % n for n in range(a.messages)], "consumed in order"
        half = a.messages // 2
        ids = [g[0] for g in got]
        since = rfc3339_nano(got[half][1])
        print(f"message {half:,}: timestamp {got[half][1]} ({since}); the one before: {got[half - 1][1]}")
        for attempt in ("first run", "after kill -9 and restart"):
            if attempt != "first run":
                node.kill9()
                node = node.again()
            retained = node.stats("events")["retained"]
            consumer = Collector(node.tcp, "events", "c")
            consumer.start()
            t0 = time.monotonic()
            answer = json.loads(node.post(f"/channel/rewind?topic=events&channel=c&since={quote(since)}"))
            consumer.wait_for(a.messages - half, 300)
            took = time.monotonic() - t0
            time.sleep(2)  # anything more would be an error
            consumer.stop()
            again = [g[0] for g in consumer.got]
            exact = again == ids[half:]
            print(
                f"{attempt}: retained {retained['messages']:,} ({retained['bytes'] / 1e6:.1f} MB); rewind answered "
                f"{answer['messages']:,}; redelivered {len(again):,} in {took:.2f} s "
                f"({len(again) / took:,.0f} msg/s); IDs {half:,}..{a.messages - 1:,} exactly, in order: {exact}"
            )
    finally:
        node.stop()


# -- cost ----------------------------------------------------------------------------------


def bench_tool(name: str, address: str, a: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, str(HERE / f"{name}.py"), "--nsqd-tcp-address", address, "--size", "200"]
    argv += ["--runfor", a.runfor, "--json"]
    if name == "bench_writer":
        argv += ["--batch-size", "200"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def cost(a: argparse.Namespace) -> None:
    servers = {"off": (a.nsqd, []), "on": (a.nsqd, ["--retention", "1h"])}
    if a.before:
        servers["before"] = (a.before, [])
    if a.durable:
        servers = {k: (exe, [*v, "--sync-every", "1"]) for k, (exe, v) in servers.items()}
    mem = "0" if a.durable else "1000000"

    def start(exe: str, extra: list[str]) -> Node:
        node = Node(exe, ["--mem-queue-size", mem, *extra])
        s = connect(node.tcp)
        s.sendall(commands.sub("sub_bench", "ch"))
        read_frame(s, FrameReader())
        s.close()
        return node

    nodes = {k: start(exe, v) for k, (exe, v) in servers.items()}
    figures: dict[str, dict[str, list[float]]] = {k: {"publish": [], "consume": [], "cpu_us": []} for k in nodes}
    try:
        for r in range(a.rounds):
            for name in list(nodes) if r % 2 == 0 else list(nodes)[::-1]:
                if a.fresh and r:
                    nodes[name].stop()
                    nodes[name] = start(*servers[name])
                node = nodes[name]
                cpu = node.cpu()
                w = bench_tool("bench_writer", node.tcp, a)
                figures[name]["cpu_us"].append((node.cpu() - cpu) * 1e6 / max(1, w["messages"]))
                r_ = bench_tool("bench_reader", node.tcp, a)
                figures[name]["publish"].append(w["msg_per_s"])
                figures[name]["consume"].append(r_["msg_per_s"])
                print(
                    f"round {r + 1} {name:<6}: publish {w['msg_per_s']:>10,.0f} msg/s "
                    f"({figures[name]['cpu_us'][-1]:.2f} µs CPU/msg)  consume {r_['msg_per_s']:>10,.0f} msg/s",
                    flush=True,
                )
        print()
        med = {k: {m: statistics.median(v) for m, v in f.items()} for k, f in figures.items()}
        for m, unit in (("publish", "msg/s"), ("consume", "msg/s"), ("cpu_us", "µs CPU per message published")):
            figures_text = "  ".join(f"{k} {v[m]:,.2f}" for k, v in med.items())
            ratios = "  ".join(f"{k}/off {v[m] / med['off'][m]:.3f}" for k, v in med.items() if k != "off")
            print(f"{m:<8} median: {figures_text} {unit}  ({ratios})")
        retained = nodes["on"].stats("sub_bench").get("retained", {})
        print(f"retained at the end: {retained.get('messages', 0):,} messages, {retained.get('bytes', 0) / 1e9:.2f} GB")
    finally:
        for node in nodes.values():
            node.stop()


# -- durable -------------------------------------------------------------------------------


class Publisher(threading.Thread):
    """PUB ``p<k>-<n>`` bodies, ``window`` in flight, until the connection dies; keeps those OK'd."""

    def __init__(self, address: str, k: int, start: int, window: int = 4) -> None:
        super().__init__(daemon=True)
        self.address, self.k, self.n, self.window = address, k, start, window
        self.acked: list[bytes] = []

    def run(self) -> None:
        try:
            sock, reader = connect(self.address), FrameReader()
            sock.sendall(commands.identify({"client_id": f"p{self.k}"}))
            read_frame(sock, reader)
        except OSError:
            return
        pending: list[bytes] = []
        try:
            while True:
                while len(pending) < self.window:
                    body = b"p%d-%09d" % (self.k, self.n)
                    self.n += 1
                    sock.sendall(commands.pub("durable", body))
                    pending.append(body)
                frame_type, data = read_frame(sock, reader)
                if data == b"_heartbeat_":
                    sock.sendall(commands.NOP)
                    continue
                body = pending.pop(0)
                if (frame_type, data) == (FRAME_TYPE_RESPONSE, b"OK"):
                    self.acked.append(body)
        except OSError:
            return


def durable(a: argparse.Namespace) -> None:
    flags = ["--retention", "1h", "--mem-queue-size", "0", "--sync-every", "1"]
    node = Node(a.nsqd, flags)
    acked: list[bytes] = []
    counters = [0, 0]
    rng = random.Random(24)
    try:
        for kill in range(a.kills):
            pubs = [Publisher(node.tcp, k, counters[k]) for k in range(2)]
            for p in pubs:
                p.start()
            time.sleep(rng.uniform(0.5, 1.5))
            node.kill9()
            for k, p in enumerate(pubs):
                p.join(10)
                acked += p.acked
                counters[k] = p.n
            print(f"kill {kill + 1}: {len(acked):,} acknowledged so far", flush=True)
            node = node.again()
        retained = node.stats("durable")["retained"]
        node.post("/channel/create?topic=durable&channel=check&since=earliest")
        consumer = Collector(node.tcp, "durable", "check")
        consumer.start()
        consumer.wait_for(retained["messages"], 300)
        consumer.stop()
        seen = {g[2] for g in consumer.got}
        lost = [b for b in acked if b not in seen]
        print(
            f"{a.kills} kills: {len(acked):,} PUBs answered OK, {retained['messages']:,} retained, "
            f"{len(seen):,} different messages delivered to a channel made since=earliest "
            f"({len(consumer.got):,} deliveries: the topic's own backlog too); lost: {len(lost)}"
        )
    finally:
        node.stop()


# -- ageout --------------------------------------------------------------------------------


def ageout(a: argparse.Namespace) -> None:
    retention = parse_duration(a.retention)
    node = Node(a.nsqd, ["--retention", a.retention, "--mem-queue-size", "1000"])
    try:
        node.post("/topic/create?topic=ticks")
        node.post("/channel/create?topic=ticks&channel=live")
        node.post("/channel/create?topic=ticks&channel=unread")
        consumer = Collector(node.tcp, "ticks", "live")
        consumer.start()
        sock, reader = connect(node.tcp), FrameReader()
        started = time.monotonic()
        for at in range(0, 100_000, 1000):
            mpub(sock, reader, "ticks", [b"%07d" % n for n in range(at, at + 1000)])
            pause = started + (at / 1000 + 1) * 0.05 - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        last = time.monotonic()
        sock.close()
        peak = dir_bytes(node.data, ".retained.")
        print(f"published 100,000 in {last - started:.1f} s; retained log {peak / 1e6:.1f} MB")
        gone_at = None
        while time.monotonic() < last + retention + 30:
            if dir_bytes(node.data, ".retained.0") == 0:
                gone_at = time.monotonic()
                break
            time.sleep(0.1)
        consumer.stop()
        queues = dir_bytes(node.data, ".diskqueue.")
        unread = node.stats("ticks")["channels"]
        backlog = {c["channel_name"]: c["backend_bytes"] for c in unread}
        if gone_at is None:
            print("the retained log was not deleted")
            return
        print(
            f"retained segments deleted {gone_at - last:.2f} s after the last publish "
            f"({gone_at - last - retention:+.2f} s after its newest message aged out, retention {a.retention}); "
            f"left on disk: {dir_bytes(node.data, '.retained.')} bytes of retained files (the meta file), "
            f"{queues / 1e6:.2f} MB of queue files; channels' backlog on disk: {backlog}"
        )
    finally:
        node.stop()


# -- rss -----------------------------------------------------------------------------------


def rss_rewind(a: argparse.Namespace) -> None:
    node = Node(a.nsqd, ["--retention", "24h"])
    try:
        node.post("/topic/create?topic=big")
        body = b"x" * 1024
        total = int(a.gigabytes * 2**30 / (len(body) + 30))
        sock, reader = connect(node.tcp), FrameReader()
        started = time.monotonic()
        for at in range(0, total, 500):
            mpub(sock, reader, "big", [body] * min(500, total - at))
        sock.close()
        node.post("/topic/empty?topic=big")  # the topic's own backlog: only the retained log stays
        retained = node.stats("big")["retained"]
        print(
            f"published {total:,} x 1 KiB in {time.monotonic() - started:.1f} s; retained log "
            f"{retained['bytes'] / 2**30:.2f} GiB in {retained['segments']} segments"
        )
        time.sleep(1)
        sampler = Sampler(node)
        sampler.start()
        time.sleep(0.5)
        before = sampler.rss[-1]
        t0 = time.monotonic()
        node.post("/channel/create?topic=big&channel=replay&since=earliest")  # before a SUB makes it
        consumer = Collector(node.tcp, "big", "replay", rdy=2500, keep=False)
        consumer.start()
        while consumer.count < retained["messages"] and time.monotonic() < t0 + 1800:
            time.sleep(0.2)
        took = time.monotonic() - t0
        samples, pings = list(sampler.rss), list(sampler.ping)
        consumer.stop()
        sampler.stop()
        after = rss(node.proc.pid)
        print(
            f"rewound {retained['messages']:,} messages ({retained['bytes'] / 2**30:.2f} GiB) in {took:.1f} s "
            f"({retained['bytes'] / 2**20 / took:.0f} MiB/s); nsqd RSS before {before / 2**20:.1f} MiB, "
            f"at most {max(samples) / 2**20:.1f} MiB during (+{(max(samples) - before) / 2**20:.1f} MiB, "
            f"{len(samples)} samples every ~20 ms), after {after / 2**20:.1f} MiB; /ping median "
            f"{statistics.median(pings) * 1e3:.1f} ms, max {max(pings) * 1e3:.1f} ms"
        )
    finally:
        node.stop()


# -- concurrent ----------------------------------------------------------------------------


class Consumers(threading.Thread):
    """One consumer per channel of ``topic`` (SUB, RDY ``rdy``), all in one thread over a
    selector: each read's messages FINed in one write. Counts what each channel got."""

    def __init__(self, address: str, topic: str, channels: list[str], rdy: int) -> None:
        super().__init__(daemon=True)
        import selectors

        self.selector = selectors.DefaultSelector()
        self.counts = dict.fromkeys(channels, 0)
        self.stopping = threading.Event()
        self.socks = []
        for channel in channels:
            sock, reader = connect(address), FrameReader()
            sock.sendall(commands.sub(topic, channel))
            read_frame(sock, reader)
            self.socks.append((sock, reader, channel))
        for sock, reader, channel in self.socks:
            sock.sendall(commands.rdy(rdy))
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, (reader, channel))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def run(self) -> None:
        counts = self.counts
        while not self.stopping.is_set():
            for key, _ in self.selector.select(0.2):
                sock = key.fileobj
                reader, channel = key.data
                try:
                    chunk = sock.recv(1 << 20)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                reader.feed(chunk)
                out = []
                for frame_type, data in reader.frames():
                    if frame_type == FRAME_TYPE_MESSAGE:
                        out.append(b"FIN " + data[10:26] + b"\n")
                    elif data == b"_heartbeat_":
                        out.append(commands.NOP)
                counts[channel] += len(out)
                if out:
                    sock.setblocking(True)  # type: ignore[union-attr]
                    sock.sendall(b"".join(out))  # type: ignore[union-attr]
                    sock.setblocking(False)  # type: ignore[union-attr]

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        for sock, _, _ in self.socks:
            sock.close()


class Sampler(threading.Thread):
    """nsqd's RSS and a GET /ping's latency, every ``every`` seconds, until stopped."""

    def __init__(self, node: Node, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.node, self.every = node, every
        self.rss: list[int] = []
        self.ping: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        import http.client

        host, _, port = self.node.http.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        while not self.stopping.is_set():
            self.rss.append(rss(self.node.proc.pid))
            t0 = time.monotonic()
            try:
                conn.request("GET", "/ping")
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                continue
            took = time.monotonic() - t0
            self.ping.append(took)
            time.sleep(max(0.0, self.every - took))
        conn.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(35)


def one_concurrent(a: argparse.Namespace, mode: str) -> dict[str, float]:
    """One run of ``concurrent`` (``mode``: rewind or plain); its figures."""
    channels = [f"c{k:02d}" for k in range(a.channels)]
    node = Node(a.nsqd, ["--retention", "24h"] if mode == "rewind" else [])
    try:
        node.post("/topic/create?topic=many")
        if mode == "plain":
            for channel in channels:
                node.post(f"/channel/create?topic=many&channel={channel}")
        sock, reader = connect(node.tcp), FrameReader()
        for at in range(0, a.messages, 500):
            n = min(500, a.messages - at)
            mpub(sock, reader, "many", [b"%09d" % i + b"x" * (a.size - 9) for i in range(at, at + n)])
        sock.close()
        if mode == "rewind":
            node.post("/topic/empty?topic=many")  # only the retained log stays
        time.sleep(2)
        sampler = Sampler(node)
        sampler.start()
        time.sleep(0.5)
        before = sampler.rss[-1]
        t0 = time.monotonic()
        if mode == "rewind":
            for channel in channels:
                node.post(f"/channel/create?topic=many&channel={channel}&since=earliest")
        consumers = Consumers(node.tcp, "many", channels, a.rdy)
        consumers.start()
        want = a.messages * a.channels
        most_queued = most_bytes = 0
        while consumers.total < want and time.monotonic() < t0 + 1800:
            time.sleep(0.25)
            if mode == "rewind":
                stats = node.stats("many").get("channels", [])
                most_queued = max(most_queued, sum(c["depth"] - c["backend_depth"] for c in stats))
                most_bytes = max(most_bytes, sum(c["memory_bytes"] for c in stats))
        took = time.monotonic() - t0
        peak = max(sampler.rss)
        pings = list(sampler.ping)
        time.sleep(3)  # nsqd gives back what the rewinds used once they are over (its tick: 1 s)
        after = sampler.rss[-1]
        sampler.stop()
        consumers.stop()
        if consumers.total < want:
            raise RuntimeError(f"{mode}: only {consumers.total:,} of {want:,} delivered")
        return {
            "took": took,
            "rate": want / took,
            "before": before / 2**20,
            "peak": peak / 2**20,
            "after": after / 2**20,
            "ping_median": statistics.median(pings) * 1e3,
            "ping_p99": sorted(pings)[int(len(pings) * 0.99)] * 1e3,
            "ping_max": max(pings) * 1e3,
            "pings": len(pings),
            "most_queued": most_queued,
            "most_bytes": most_bytes / 2**20,
        }
    finally:
        node.stop()


def concurrent(a: argparse.Namespace) -> None:
    modes = ["rewind", "plain"] if a.mode == "both" else [a.mode]
    load = os.getloadavg()
    print(
        f"{a.channels} channels x {a.messages:,} messages of {a.size} B, one consumer each at RDY {a.rdy}; "
        f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        flush=True,
    )
    figures: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for r in range(a.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            f = one_concurrent(a, mode)
            figures[mode].append(f)
            print(
                f"round {r + 1} {mode:<6}: {f['took']:.1f} s ({f['rate']:,.0f} msg/s); "
                f"RSS before {f['before']:.1f} MiB, peak {f['peak']:.1f} (+{f['peak'] - f['before']:.1f}), "
                f"after {f['after']:.1f} ({f['after'] - f['before']:+.1f}); /ping median {f['ping_median']:.1f} ms, "
                f"p99 {f['ping_p99']:.1f}, max {f['ping_max']:.1f} ({f['pings']:.0f} pings)"
                + (
                    f"; the memory queues held at most {f['most_queued']:,.0f} messages, {f['most_bytes']:.1f} MiB"
                    if mode == "rewind"
                    else ""
                ),
                flush=True,
            )
    if a.rounds > 1:
        print()
        for mode, runs in figures.items():
            med = {k: statistics.median(f[k] for f in runs) for k in runs[0]}
            print(
                f"{mode:<6} median of {len(runs)}: {med['rate']:,.0f} msg/s; "
                f"RSS +{med['peak'] - med['before']:.1f} MiB at the peak ({med['peak']:.1f}), "
                f"{med['after'] - med['before']:+.1f} after; /ping median {med['ping_median']:.1f} ms, "
                f"p99 {med['ping_p99']:.1f}, max {med['ping_max']:.1f}"
            )
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="replay", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("measure", choices=["rewind", "cost", "durable", "ageout", "rss", "concurrent"])
    p.add_argument("--nsqd", default=str(Path(sys.executable).parent / "nsqd"))
    p.add_argument("--messages", type=int, default=200_000, help="rewind: messages published")
    p.add_argument("--seconds", type=float, default=120.0, help="rewind: over how long")
    p.add_argument("--batch", type=int, default=100, help="rewind: MPUB size")
    p.add_argument("--rounds", type=int, default=3, help="cost: interleaved rounds")
    p.add_argument("--runfor", default="5s", help="cost: each bench tool's run")
    p.add_argument("--durable", action="store_true", help="cost: the nsqds in durable mode")
    p.add_argument("--before", help="cost: another nsqd (a build before), run without retention as a third")
    p.add_argument("--fresh", action="store_true", help="cost: new nsqds (empty data paths) for every round")
    p.add_argument("--kills", type=int, default=10, help="durable: kill -9 this many times")
    p.add_argument("--retention", default="10s", help="ageout: the retention")
    p.add_argument("--gigabytes", type=float, default=2.0, help="rss: the retained log's size")
    p.add_argument("--channels", type=int, default=16, help="concurrent: channels (one consumer each)")
    p.add_argument("--rdy", type=int, default=2500, help="concurrent: each consumer's RDY")
    p.add_argument("--size", type=int, default=1024, help="concurrent: message size (bytes)")
    p.add_argument("--mode", choices=["both", "rewind", "plain"], default="both", help="concurrent: which runs")
    a = p.parse_args(argv)
    if a.measure == "concurrent" and "--messages" not in (argv if argv is not None else sys.argv):
        a.messages = 100_000
    measures = {"rewind": rewind, "cost": cost, "durable": durable, "ageout": ageout, "rss": rss_rewind}
    {**measures, "concurrent": concurrent}[a.measure](a)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
