"""A soak: nsqd under a constant, mixed load for minutes, its RSS sampled.

    .venv/bin/python bench/soak.py --minutes 10
    .venv/bin/python bench/soak.py --minutes 10 --nsqd /opt/gonsq/bin/nsqd

It starts nsqd (this checkout's, or ``--nsqd``) on free loopback ports with a
temporary data path, then for ``--minutes`` keeps publishing to topic ``soak`` at
a fixed rate (``--rate`` msg/s in all) by every route a producer has: PUB on one
connection, MPUB batches of 10, DPUB with delays of 0.1-3 s, and HTTP ``/pub`` and
``/mpub`` on a new connection each. Consumers of every kind read meanwhile:

- ``all``: FINs every message;
- ``req``: REQs each message once (200 ms), FINs it the second time;
- ``touch``: TOUCHes each message, FINs it 100 ms later;
- ``stuck``: one consumer takes 20 messages and never answers (1 s msg_timeout, so
  they come back), reconnecting every 30 s; a second one FINs;
- ``churn``: a consumer connects, FINs 50 messages and leaves, again and again, beside
  a steady one;
- ``eph#ephemeral``: a consumer stays 5 s and leaves (the channel goes with it),
  reconnecting a second later.

Then publishing stops and every channel but the ephemeral one must receive every
acknowledged message (at least once): the number lost is printed. RSS is sampled
every 5 s; the summary gives its slope after ``--warmup`` minutes (least squares,
MB/min), the RSS at the end of the load and after the drain.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import treq
from twisted.internet import defer, task
from twisted.internet.task import LoopingCall

from nsq_client.twisted_client import Consumer, ReceivedMessage, connect

PUBLISHERS = ("pub", "mpub", "dpub", "http_pub", "http_mpub")
CHANNELS = ("all", "req", "touch", "stuck", "churn", "eph")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minutes, MB) points, MB/min."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else float("nan")


class Take:
    """A handler that passes messages on and fires ``done`` at the ``n``-th."""

    def __init__(self, handler: Any, n: int) -> None:
        self.handler = handler
        self.left = n
        self.done: defer.Deferred[None] = defer.Deferred()

    def __call__(self, msg: ReceivedMessage) -> None:
        self.handler(msg)
        self.left -= 1
        if self.left == 0:
            self.done.callback(None)


class Soak:
    def __init__(self, reactor: Any, a: argparse.Namespace, tcp: tuple[str, int], http: str, pid: int) -> None:
        self.reactor = reactor
        self.a = a
        self.host, self.port = tcp
        self.http = http
        self.pid = pid
        self.seq = 0
        self.acked: set[int] = set()
        self.failed = 0
        self.parts = set(a.parts.split(","))
        self.seen: dict[str, set[int]] = {c: set() for c in CHANNELS if c in self.parts and c != "eph"}
        self.samples: list[tuple[float, float]] = []
        self.loops: list[LoopingCall] = []
        self.consumers: list[Consumer] = []
        self.publishing = True
        self.started = reactor.seconds()
        self.pad = b"." * max(0, a.size - 12)

    # -- publishing -------------------------------------------------------------

    def bodies(self, n: int) -> tuple[list[int], list[bytes]]:
        seqs = list(range(self.seq, self.seq + n))
        self.seq += n
        return seqs, [b"%011d " % s + self.pad for s in seqs]

    def acked_all(self, seqs: list[int]) -> Any:
        def ok(_: Any) -> None:
            self.acked.update(seqs)

        def failed(f: Any) -> None:
            self.failed += len(seqs)

        return ok, failed

    def every(self, interval: float, fn: Any) -> None:
        loop = LoopingCall(fn)
        loop.clock = self.reactor
        loop.start(interval, now=False).addErrback(lambda f: print("loop failed:", f.getErrorMessage()))
        self.loops.append(loop)

    @defer.inlineCallbacks
    def start_publishers(self) -> Any:
        # shares of the rate: PUB 25%, MPUB 25%, DPUB 12.5%, HTTP pub 12.5%, HTTP mpub 25%
        rate = self.a.rate
        pub_conn = yield connect(self.reactor, self.host, self.port)
        dpub_conn = yield connect(self.reactor, self.host, self.port)

        def pub() -> None:
            for _ in range(max(1, rate // 40)):  # 10 ticks/s
                seqs, bodies = self.bodies(1)
                ok, failed = self.acked_all(seqs)
                pub_conn.pub("soak", bodies[0]).addCallbacks(ok, failed)

        def mpub() -> None:
            for _ in range(max(1, rate // 400)):
                seqs, bodies = self.bodies(10)
                ok, failed = self.acked_all(seqs)
                pub_conn.mpub("soak", bodies).addCallbacks(ok, failed)

        def dpub() -> None:
            for _ in range(max(1, rate // 80)):
                seqs, bodies = self.bodies(1)
                ok, failed = self.acked_all(seqs)
                dpub_conn.dpub("soak", random.randint(100, 3000), bodies[0]).addCallbacks(ok, failed)

        def http_pub() -> None:
            for _ in range(max(1, rate // 80)):
                seqs, bodies = self.bodies(1)
                self.http_post("/pub?topic=soak", bodies[0], seqs)

        def http_mpub() -> None:
            for _ in range(max(1, rate // 400)):
                seqs, bodies = self.bodies(10)
                self.http_post("/mpub?topic=soak", b"\n".join(bodies), seqs)

        for fn in (pub, mpub, dpub, http_pub, http_mpub):
            if fn.__name__ in self.parts:
                self.every(0.1, fn)

    def http_post(self, path: str, body: bytes, seqs: list[int]) -> None:
        ok, failed = self.acked_all(seqs)

        def answered(resp: Any) -> Any:
            d = resp.content()
            d.addCallback(lambda content: ok(None) if resp.code == 200 else failed(None))
            return d

        treq.post(f"http://{self.http}{path}", data=body, persistent=False).addCallbacks(answered, failed)

    # -- consuming -------------------------------------------------------------------

    def record(self, channel: str, msg: ReceivedMessage) -> None:
        self.seen[channel].add(int(msg.body[:11]))

    @defer.inlineCallbacks
    def consumer(self, channel: str, handler: Any, rdy: int = 50, **identify: Any) -> Any:
        c = yield Consumer.connect(self.reactor, self.host, self.port, "soak", channel, handler, rdy, **identify)
        return c

    @defer.inlineCallbacks
    def start_consumers(self) -> Any:
        def plain(channel: str) -> Any:
            return lambda msg: self.record(channel, msg)

        def req(msg: ReceivedMessage) -> None:
            if msg.attempts == 1:
                msg.requeue(200)
            else:
                self.record("req", msg)

        def touch(msg: ReceivedMessage) -> Any:
            msg.touch()
            self.record("touch", msg)
            return task.deferLater(self.reactor, 0.1, lambda: None)

        def hold(msg: ReceivedMessage) -> None:
            msg.auto_respond = False  # never answered: it times out and comes back

        steady = {"all": (plain("all"), 50), "req": (req, 50), "touch": (touch, 500), "stuck": (plain("stuck"), 50)}
        steady["churn"] = (plain("churn"), 50)
        for channel, (handler, rdy) in steady.items():
            if channel in self.parts:
                self.consumers.append((yield self.consumer(channel, handler, rdy)))
        if "stuck" in self.parts:
            self.cycle(lambda: self.consumer("stuck", hold, rdy=20, msg_timeout=1000), 30.0)
        if "churn" in self.parts:
            self.churn()
        if "eph" in self.parts:
            self.cycle(lambda: self.consumer("eph#ephemeral", lambda msg: None), 5.0, then=1.0)

    def cycle(self, make: Any, stay: float, then: float = 0.0) -> None:
        """Connect with ``make()``, stay ``stay`` seconds, close, wait ``then``, again."""

        @defer.inlineCallbacks
        def run() -> Any:
            while self.publishing:
                c = yield make()
                yield task.deferLater(self.reactor, stay, lambda: None)
                c.conn.close()  # no CLS: what it holds goes back at once
                yield c.conn.closed_d
                yield task.deferLater(self.reactor, then, lambda: None)

        run().addErrback(lambda f: print("cycle failed:", f.getErrorMessage()))

    def churn(self) -> None:
        @defer.inlineCallbacks
        def run() -> Any:
            while self.publishing:
                take = Take(lambda msg: self.record("churn", msg), 50)
                c = yield self.consumer("churn", take, rdy=10)
                yield take.done.addTimeout(10, self.reactor).addErrback(lambda f: None)
                yield c.close()

        run().addErrback(lambda f: print("churn failed:", f.getErrorMessage()))

    # -- the run -----------------------------------------------------------------------

    def sample(self) -> None:
        minutes = (self.reactor.seconds() - self.started) / 60
        mb = rss_mb(self.pid)
        self.samples.append((minutes, mb))
        print(
            f"{minutes:6.2f} min  rss {mb:7.1f} MB  acked {len(self.acked):8d}  "
            + "  ".join(f"{c} {len(s)}" for c, s in self.seen.items()),
            flush=True,
        )

    @defer.inlineCallbacks
    def run(self) -> Any:
        yield self.start_consumers()
        yield self.start_publishers()
        self.every(5.0, self.sample)
        yield task.deferLater(self.reactor, self.a.minutes * 60, lambda: None)
        self.publishing = False
        for loop in self.loops[:-1]:
            loop.stop()
        yield task.deferLater(self.reactor, 1.0, lambda: None)  # the last answers
        end_rss = rss_mb(self.pid)
        deadline = self.reactor.seconds() + self.a.drain
        while self.reactor.seconds() < deadline and any(self.acked - s for s in self.seen.values()):
            yield task.deferLater(self.reactor, 1.0, lambda: None)
        drained_rss = rss_mb(self.pid)
        for c in self.consumers:
            yield c.close()
        if self.a.inspect:
            yield self.inspect()
        if self.a.hold:
            print(f"holding nsqd for {self.a.hold:g} s", flush=True)
            yield task.deferLater(self.reactor, self.a.hold, lambda: None)
        warm = [p for p in self.samples if p[0] >= self.a.warmup]
        print(f"acknowledged {len(self.acked)}, publishes refused {self.failed}")
        for c, s in self.seen.items():
            print(f"channel {c}: lost {len(self.acked - s)}")
        print(
            f"rss: start {self.samples[0][1]:.1f} MB, end of load {end_rss:.1f} MB, after the drain "
            f"{drained_rss:.1f} MB, max {max(p[1] for p in self.samples):.1f} MB; slope after "
            f"{self.a.warmup:g} min {slope(warm):+.2f} MB/min"
        )

    @defer.inlineCallbacks
    def inspect(self) -> Any:
        """What the server holds: live objects by type, before and after a full collection."""
        for when in ("before", "after"):
            if when == "after":
                yield treq.post(f"http://{self.http}/debug/freememory", persistent=False)
            resp = yield treq.get(f"http://{self.http}/debug/pprof/heap?debug=1", persistent=False)
            text = (yield resp.text()).splitlines()
            print(f"-- {when} /debug/freememory: rss {rss_mb(self.pid):.1f} MB")
            print("\n".join(text[: self.a.inspect]))


def start_nsqd(exe: str, data: str, extra: list[str]) -> tuple[subprocess.Popen[str], str, str]:
    argv = [exe, "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--data-path", data, *extra]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    tcp = http = ""
    for line in proc.stderr:
        if m := re.search(r"TCP: listening on (\S+)", line):
            tcp = m.group(1)
        if m := re.search(r"HTTP: listening on (\S+)", line):
            http = m.group(1)
        if tcp and http:
            break
    else:
        raise RuntimeError(f"{exe} did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
    return proc, tcp, http


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="soak", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nsqd", default=str(Path(sys.executable).parent / "nsqd"), help="the nsqd to soak")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0, help="minutes left out of the slope")
    p.add_argument("--rate", type=int, default=1000, help="messages published per second, in all")
    p.add_argument("--size", type=int, default=200, help="message size")
    p.add_argument("--drain", type=float, default=120.0, help="seconds to wait for the channels to drain")
    p.add_argument("--inspect", type=int, default=0, metavar="N", help="print N lines of ours' /debug/pprof/heap")
    p.add_argument("--parts", default=",".join(PUBLISHERS + CHANNELS), help="the publishers and channels to run")
    p.add_argument("--hold", type=float, default=0.0, help="seconds to keep nsqd running at the end")
    p.add_argument("extra", nargs="*", help="more nsqd flags (after --)")
    a = p.parse_args(argv)
    data = tempfile.mkdtemp(prefix="soak.")
    proc, tcp, http = start_nsqd(a.nsqd, data, a.extra)
    print(f"nsqd pid {proc.pid}, TCP {tcp}, HTTP {http}", flush=True)
    host, _, port = tcp.rpartition(":")
    try:
        task.react(lambda reactor: Soak(reactor, a, (host, int(port)), http, proc.pid).run())
    except SystemExit as e:
        if e.code:
            raise
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
