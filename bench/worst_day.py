"""An operator's worst day, measured on nsq-tw and Go nsqd side by side (issue 20).

    python bench/worst_day.py --go-bin DIR restart --topics 10000 --channels 2
    python bench/worst_day.py --go-bin DIR creates --topics 10000 --count 1000
    python bench/worst_day.py --go-bin DIR storm --clients 2000
    python bench/worst_day.py --go-bin DIR soak --minutes 10

- ``restart``: a data path with TOPICS topics of CHANNELS channels each, as a clean
  stop leaves it (``nsqd.dat`` and a metadata file per queue); the time from exec to
  the first ``/ping`` answered ``OK``.
- ``creates``: on such a data path, ``POST /channel/create`` one after another on one
  keep-alive connection: creates per second.
- ``storm``: CLIENTS connect at once to the TCP port (magic, ``IDENTIFY {}``, wait for
  ``OK``) and then to the HTTP port (``GET /ping``): how many were answered within 30 s,
  and the latency percentiles of those answered.
- ``soak``: see :mod:`soak` (the same load as ``bench/soak.py``, with RSS sampled).

``--go-bin DIR`` is where Go's ``nsqd`` is (built outside this repository); without it
only ours runs. Rounds alternate the order of the servers; figures are medians.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from go_compare import Server, median, ratio_line, rounds_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsq_wire.commands import encode_command
from nsq_wire.frames import MAGIC_V2
from tests.integration.procs import storm


def write_data_path(path: str, topics: int, channels: int) -> None:
    """What a clean stop of nsqd leaves for that many topics and channels."""
    names = [f"topic{i:05d}" for i in range(topics)]
    chans = [{"name": f"ch{j}", "paused": False} for j in range(channels)]
    doc = {"topics": [{"name": t, "paused": False, "channels": chans or None} for t in names], "version": "1.3.0"}
    with open(os.path.join(path, "nsqd.dat"), "w") as f:
        json.dump(doc, f)
    for t in names:
        for queue in [t, *(f"{t}:{c['name']}" for c in chans)]:
            with open(os.path.join(path, f"{queue}.diskqueue.meta.dat"), "w") as f:
                f.write("0\n0,0\n0,0\n")


def ping_ok(address: str, timeout: float) -> bool:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", "/ping")
        return conn.getresponse().read() == b"OK"
    except OSError:
        return False
    finally:
        conn.close()


@contextmanager
def started_on(template: str, exe: str) -> Iterator[tuple[Server, float]]:
    """``exe`` started on a copy of the data path ``template``, once /ping answers;
    and the seconds from exec to that answer."""
    data = tempfile.mkdtemp(prefix="worst_day.")
    shutil.rmtree(data)
    shutil.copytree(template, data)
    t0 = time.monotonic()
    s = Server(exe, ["--data-path", data])
    try:
        while not ping_ok(s.http, 600):
            time.sleep(0.005)
        yield s, time.monotonic() - t0
    finally:
        s.stop()
        shutil.rmtree(data, ignore_errors=True)


def restart(a: argparse.Namespace, servers: dict[str, str]) -> None:
    template = tempfile.mkdtemp(prefix="worst_day.")
    write_data_path(template, a.topics, a.channels)
    figures: dict[str, list[float]] = {n: [] for n in servers}
    try:
        for r, name, exe in rounds_of(servers, a.rounds):
            with started_on(template, exe) as (_, seconds):
                figures[name].append(seconds)
            print(f"round {r + 1} {name:<8} exec → /ping OK {seconds:7.2f} s", flush=True)
    finally:
        shutil.rmtree(template, ignore_errors=True)
    label = f"{a.topics} topics x {a.channels} channels: s"
    print(ratio_line(label, {n: median(v) for n, v in figures.items()}, True))


def creates(a: argparse.Namespace, servers: dict[str, str]) -> None:
    template = tempfile.mkdtemp(prefix="worst_day.")
    write_data_path(template, a.topics, 0)
    figures: dict[str, list[float]] = {n: [] for n in servers}
    try:
        for r, name, exe in rounds_of(servers, a.rounds):
            with started_on(template, exe) as (s, _):
                host, _, port = s.http.rpartition(":")
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                t0 = time.monotonic()
                for i in range(a.count):
                    conn.request("POST", f"/channel/create?topic=topic{i % a.topics:05d}&channel=new{i // a.topics}")
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{name}: /channel/create answered {resp.status}")
                figures[name].append(a.count / (time.monotonic() - t0))
                conn.close()
            print(f"round {r + 1} {name:<8} {figures[name][-1]:8.0f} creates/s", flush=True)
    finally:
        shutil.rmtree(template, ignore_errors=True)
    print(ratio_line(f"channel creates/s ({a.topics} topics)", {n: median(v) for n, v in figures.items()}))


# -- connect storms ------------------------------------------------------------------------

_OK_FRAME = struct.pack(">ii", 6, 0) + b"OK"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def storms(a: argparse.Namespace, servers: dict[str, str]) -> None:
    identify = MAGIC_V2 + encode_command(b"IDENTIFY", body=b"{}")
    kinds = {"tcp": (identify, _OK_FRAME), "http": (b"GET /ping HTTP/1.0\r\n\r\n", b"\r\n\r\nOK")}
    results: dict[str, dict[str, list[tuple[int, float, float]]]] = {k: {n: [] for n in servers} for k in kinds}
    for r, name, exe in rounds_of(servers, a.rounds):
        s = Server(exe)
        try:
            for kind, (request, answer) in kinds.items():
                times = storm(s.tcp if kind == "tcp" else s.http, a.clients, request, answer)
                ok = [t for t in times if t is not None]
                p50, p99 = percentile(ok, 0.5), percentile(ok, 0.99)
                results[kind][name].append((len(ok), p50, p99))
                print(
                    f"round {r + 1} {name:<8} {kind:<4} answered {len(ok)}/{a.clients}  "
                    f"p50 {p50 * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms  max {max(ok, default=0) * 1000:7.1f} ms",
                    flush=True,
                )
        finally:
            s.stop()
    for kind in kinds:
        for i, what in enumerate(("answered", "p50 ms", "p99 ms")):
            scale = 1 if i == 0 else 1000
            figures = {n: median([row[i] * scale for row in rows]) for n, rows in results[kind].items()}
            print(ratio_line(f"{kind} storm of {a.clients}: {what}", figures, i > 0))


def soak(a: argparse.Namespace, servers: dict[str, str]) -> None:
    for r, name, exe in rounds_of(servers, a.rounds):
        argv = [sys.executable, str(Path(__file__).parent / "soak.py"), "--nsqd", exe, "--minutes", str(a.minutes)]
        print(f"round {r + 1} {name}", flush=True)
        subprocess.run(argv, check=True)


MEASURES = {"restart": restart, "creates": creates, "storm": storms, "soak": soak}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="worst_day", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--go-bin", help="directory of Go's nsqd (left out: ours only)")
    p.add_argument("--ours", default=str(Path(sys.executable).parent / "nsqd"), help="our nsqd command")
    p.add_argument("--server", action="append", default=[], metavar="NAME=PATH", help="another nsqd to measure")
    p.add_argument("measure", choices=list(MEASURES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--topics", type=int, default=10_000)
    p.add_argument("--channels", type=int, default=2)
    p.add_argument("--count", type=int, default=1000, help="creates: channels created")
    p.add_argument("--clients", type=int, default=2000, help="storm: clients connecting at once")
    p.add_argument("--minutes", type=float, default=10.0, help="soak: how long")
    a = p.parse_args(argv)
    servers = {"ours": a.ours}
    if a.go_bin:
        servers = {"go": str(Path(a.go_bin) / "nsqd"), **servers}
    for spec in a.server:
        name, _, path = spec.partition("=")
        servers[name] = path
    MEASURES[a.measure](a, servers)


if __name__ == "__main__":
    main()
