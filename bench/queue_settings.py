"""The queue settings beyond Go, measured on one nsqd process (issue 21).

    python bench/queue_settings.py ttl --messages 100000 --max-age 5s
    python bench/queue_settings.py bounded --messages 1000000 --max-depth 10000
    python bench/queue_settings.py dead --messages 20000 --max-attempts 3
    python bench/queue_settings.py expire --messages 300000 --to-dead-letter
    python bench/queue_settings.py expire --messages 900000 --consumer
    python bench/queue_settings.py cycle --messages 50000

- ``ttl``: MESSAGES published to a topic with no channel and ``max_age``; the depth and
  the disk queue's data files sampled until both are gone: the time from the last publish
  to an empty topic with no data file left.
- ``bounded``: MESSAGES published (MPUB of 200) to a topic whose channel has ``max_depth``
  and ``overflow: drop_oldest``, while a slow consumer (RDY 1) FINs; the channel's depth,
  nsqd's RSS and the data path's bytes sampled all along; then the consumer takes what is
  left: it must be the newest MAX_DEPTH messages.
- ``dead``: MESSAGES published to a channel with ``max_attempts``, whose consumer REQs
  every delivery: deliveries per message, and the time until the dead-letter topic holds them all.
- ``expire``: MESSAGES queued in a channel (most on disk), then given a ``max_age`` of 1s
  (``--to-dead-letter``: expiring to its dead-letter topic; ``--consumer``: a consumer
  arrives once all expired, instead of leaving it to the sweep); ``GET /ping`` every 20 ms
  all along: how long expiring took (the rate), the slowest and median /ping, and the
  channel's data files left once it is empty.
- ``cycle``: MESSAGES published to ``A`` whose channel and ``B``'s expire to each other's
  topic after 1s: the dead-letter moves, nsqd's CPU and the slowest /ping over 10 s.

``--nsqd`` is the nsqd to run (default: the one beside this Python).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

from go_compare import Server, Subscriber, connect, read_frame

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsq_wire import commands
from nsq_wire.frames import FrameReader


def put(server: Server, path: str, doc: dict) -> None:
    req = urllib.request.Request(f"http://{server.http}{path}", data=json.dumps(doc).encode(), method="PUT")
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def stats(server: Server, topic: str) -> dict:
    doc = json.loads(server.get(f"/stats?format=json&topic={topic}&include_clients=false"))
    return (doc.get("topics") or [{}])[0]


def data_bytes(path: str, prefix: str = "") -> tuple[int, int]:
    """The data files (not metadata) under ``path`` whose name starts with ``prefix``: count, bytes."""
    files = [f for f in os.listdir(path) if f.startswith(prefix) and ".diskqueue." in f and not f.endswith("meta.dat")]
    return len(files), sum(os.path.getsize(os.path.join(path, f)) for f in files)


def publish(address: str, topic: str, bodies: list[bytes], batch: int = 200, window: int = 8) -> None:
    """MPUB in batches, ``window`` in flight, and wait for every OK."""
    sock = connect(address)
    reader = FrameReader()
    pending = 0
    for i in range(0, len(bodies), batch):
        sock.sendall(commands.mpub(topic, bodies[i : i + batch]))
        pending += 1
        while pending >= window:
            if read_frame(sock, reader)[1] != b"_heartbeat_":
                pending -= 1
    while pending:
        if read_frame(sock, reader)[1] != b"_heartbeat_":
            pending -= 1
    sock.close()


class Consumer(Subscriber):
    """SUB, RDY ``rdy``; FIN (or REQ) every message; keeps the bodies and attempts it saw."""

    def __init__(self, address: str, topic: str, channel: str, rdy: int, requeue: bool = False, pause: float = 0.0):
        super().__init__(address, topic, channel, rdy)
        self.requeue, self.pause = requeue, pause
        self.seen: list[tuple[bytes, int]] = []

    def handle(self, msg_id: bytes, body: bytes, ts: int, attempts: int) -> None:
        self.seen.append((body, attempts))
        if self.pause:
            time.sleep(self.pause)
        self.sock.sendall(commands.req(msg_id, 0) if self.requeue else commands.fin(msg_id))


def ttl(a: argparse.Namespace) -> None:
    server = Server(a.nsqd, ["--mem-queue-size", str(a.mem_queue_size)])
    try:
        server.post("/topic/create?topic=ttl")
        put(server, "/topic/settings?topic=ttl", {"max_age": a.max_age})
        started = time.monotonic()
        publish(server.tcp, "ttl", [b"t" * a.size] * a.messages)
        published = time.monotonic()
        files, size = data_bytes(server.data, "ttl.")
        print(
            f"published {a.messages:,} in {published - started:.1f}s: depth {stats(server, 'ttl')['depth']:,}, "
            f"{files} data file(s), {size:,} bytes"
        )
        while True:
            topic = stats(server, "ttl")
            files, size = data_bytes(server.data, "ttl.")
            if topic["depth"] == 0 and files == 0:
                break
            time.sleep(0.1)
        done = time.monotonic()
        print(
            f"empty, no data file: {done - published:.1f}s after the last publish "
            f"({done - started:.1f}s after the first); expired_count {topic['expired_count']:,}"
        )
    finally:
        server.stop()


def bounded(a: argparse.Namespace) -> None:
    server = Server(a.nsqd, ["--mem-queue-size", str(a.mem_queue_size)])
    try:
        server.post("/topic/create?topic=ticks")
        server.post("/channel/create?topic=ticks&channel=slow")
        put(server, "/channel/settings?topic=ticks&channel=slow", {"max_depth": a.max_depth, "overflow": "drop_oldest"})
        consumer = Consumer(server.tcp, "ticks", "slow", rdy=1, pause=0.001)
        consumer.start()
        samples: list[tuple[float, int, int, int]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                channel = stats(server, "ticks")["channels"][0]
                samples.append((time.monotonic(), channel["depth"], server.rss(), data_bytes(server.data)[1]))
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        publish(server.tcp, "ticks", [b"%012d" % i + b"x" * (a.size - 12) for i in range(a.messages)])
        elapsed = time.monotonic() - started
        stop.set()
        sampler.join()
        consumer.stop()
        channel = stats(server, "ticks")["channels"][0]
        print(
            f"published {a.messages:,} in {elapsed:.1f}s ({a.messages / elapsed:,.0f} msg/s) while a slow "
            f"consumer took {len(consumer.seen):,}; dropped {channel['dropped_count']:,}"
        )
        depths = [s[1] for s in samples]
        rss = [s[2] / 1e6 for s in samples]
        disk = [s[3] / 1e6 for s in samples]
        third = max(1, len(samples) // 3)
        print(f"channel depth: max {max(depths):,} over {len(samples)} samples (bound {a.max_depth:,})")
        print(
            f"RSS MB: first third max {max(rss[:third]):.1f}, last third max {max(rss[-third:]):.1f}, end {rss[-1]:.1f}"
        )
        print(f"data files MB: max {max(disk):.1f}, end {disk[-1]:.1f}")
        rest = Consumer(server.tcp, "ticks", "slow", rdy=500)
        rest.start()
        deadline = time.monotonic() + 60
        while len(rest.seen) < channel["depth"] and time.monotonic() < deadline:
            time.sleep(0.1)
        rest.stop()
        got = {int(body[:12]) for body, _ in rest.seen}
        newest = set(range(a.messages - a.max_depth, a.messages))
        print(f"left in the channel: {len(got):,}, of which {len(got & newest):,} among the newest {a.max_depth:,}")
    finally:
        server.stop()


def dead(a: argparse.Namespace) -> None:
    server = Server(a.nsqd, ["--mem-queue-size", str(a.mem_queue_size)])
    try:
        server.post("/topic/create?topic=jobs")
        server.post("/channel/create?topic=jobs&channel=work")
        put(server, "/channel/settings?topic=jobs&channel=work", {"max_attempts": a.max_attempts})
        consumer = Consumer(server.tcp, "jobs", "work", rdy=100, requeue=True)
        consumer.start()
        started = time.monotonic()
        publish(server.tcp, "jobs", [b"%09d" % i for i in range(a.messages)])
        while stats(server, "jobs.dead").get("depth", 0) < a.messages:
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        consumer.stop()
        per_body: dict[bytes, list[int]] = {}
        for body, attempts in consumer.seen:
            per_body.setdefault(body, []).append(attempts)
        exact = sum(1 for v in per_body.values() if v == list(range(1, a.max_attempts + 1)))
        print(
            f"{a.messages:,} messages, each delivered exactly {a.max_attempts} times: {exact:,}; "
            f"dead-letter topic depth {stats(server, 'jobs.dead')['depth']:,} after {elapsed:.1f}s "
            f"({a.messages * a.max_attempts / elapsed:,.0f} deliveries/s)"
        )
    finally:
        server.stop()


class Pinger(threading.Thread):
    """``GET /ping`` every ``every`` seconds until stopped: each answer's latency."""

    def __init__(self, server: Server, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.server, self.every = server, every
        self.times: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            started = time.monotonic()
            try:
                self.server.get("/ping")
            except Exception:
                pass
            self.times.append(time.monotonic() - started)
            time.sleep(self.every)

    def stop(self) -> str:
        self.done.set()
        self.join()
        times = sorted(self.times) or [0.0]
        median, slowest = times[len(times) // 2] * 1000, times[-1] * 1000
        return f"/ping: {len(times)} answered, median {median:.1f} ms, max {slowest:.0f} ms"


def expire(a: argparse.Namespace) -> None:
    server = Server(a.nsqd, ["--mem-queue-size", str(a.mem_queue_size)])
    try:
        server.post("/topic/create?topic=t")
        server.post("/channel/create?topic=t&channel=c")
        publish(server.tcp, "t", [b"%09d" % i for i in range(a.messages)])
        pinger = Pinger(server)
        pinger.start()
        settings: dict = {"max_age": "1s"}
        if a.to_dead_letter:
            settings.update(expire_to_dead_letter=True, dead_letter_topic="t.dead")
        if a.consumer:  # the sweep sees none of it: the consumer comes first
            put(server, "/channel/settings?topic=t&channel=c", {"max_age": "3600s"})
            time.sleep(1.5)
            put(server, "/channel/settings?topic=t&channel=c", settings)
            consumer = Consumer(server.tcp, "t", "c", rdy=100)
            consumer.start()
        else:
            time.sleep(1.0)
            put(server, "/channel/settings?topic=t&channel=c", settings)
        started = time.monotonic()
        while stats(server, "t")["channels"][0]["expired_count"] < a.messages:
            time.sleep(0.05)
        took = time.monotonic() - started
        if a.consumer:
            consumer.stop()
        where = " to t.dead" if a.to_dead_letter else ""
        print(f"{a.messages:,} expired{where} in {took:.1f}s ({a.messages / took:,.0f}/s)")
        print(pinger.stop())
        files, size = data_bytes(server.data, "t:c.")
        print(f"the channel's data files left: {files} ({size:,} bytes)")
    finally:
        server.stop()


def cycle(a: argparse.Namespace) -> None:
    server = Server(a.nsqd, ["--mem-queue-size", str(a.mem_queue_size)])
    try:
        for here, there in (("A", "B"), ("B", "A")):
            server.post(f"/topic/create?topic={here}")
            server.post(f"/channel/create?topic={here}&channel=c")
            doc = {"max_age": "1s", "expire_to_dead_letter": True, "dead_letter_topic": there}
            put(server, f"/channel/settings?topic={here}&channel=c", doc)
        publish(server.tcp, "A", [b"%09d" % i for i in range(a.messages)])
        pinger = Pinger(server)
        pinger.start()
        cpu = server.cpu()
        time.sleep(10)
        cpu = server.cpu() - cpu
        moves = sum(stats(server, t)["channels"][0]["dead_letter_count"] for t in ("A", "B"))
        print(f"{a.messages:,} messages: {moves:,} dead-letter moves in 10 s, nsqd CPU {cpu / 10:.0%}")
        print(pinger.stop())
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="queue_settings", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("measure", choices=["ttl", "bounded", "dead", "expire", "cycle"])
    p.add_argument("--nsqd", default=str(Path(sys.executable).parent / "nsqd"))
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--mem-queue-size", type=int, default=10_000)
    p.add_argument("--max-age", default="5s", help="ttl: the topic's max_age")
    p.add_argument("--max-depth", type=int, default=10_000, help="bounded: the channel's max_depth")
    p.add_argument("--max-attempts", type=int, default=3, help="dead: the channel's max_attempts")
    p.add_argument("--to-dead-letter", action="store_true", help="expire: to the dead-letter topic")
    p.add_argument("--consumer", action="store_true", help="expire: a consumer meets them, not the sweep")
    a = p.parse_args(argv)
    {"ttl": ttl, "bounded": bounded, "dead": dead, "expire": expire, "cycle": cycle}[a.measure](a)


if __name__ == "__main__":
    main()
