"""Start nsqd, run bench_writer then bench_reader N times, print medians.

    python bench/run.py                     # 3 runs, --size 200 --batch-size 200, 10 s each
    python bench/run.py --profile out/      # also py-spy the server during each phase
    python bench/run.py --tls --server go=DIR/nsqd   # the same clients against Go's nsqd too,
                                                     # runs interleaved, medians and ratios

Like Go's bench.sh: nsqd runs with --mem-queue-size=1000000 and the channel
exists before the writer starts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _common import connect, process_cpu, process_sleeps, server_env  # noqa: E402

from nsq_wire.commands import encode_command  # noqa: E402

FEATURE_FLAGS = ("tls", "snappy", "deflate")


def rows_of(a: argparse.Namespace) -> dict[str, argparse.Namespace]:
    """The rows ``--rows`` asks for, each the flags of its clients: the plain row
    first, then one per feature; without ``--rows`` one row, unnamed, as asked."""
    if not a.rows:
        return {"": a}
    features = [f for f in a.rows.split(",") if f]
    if set(features) - set(FEATURE_FLAGS) or any(getattr(a, f) for f in FEATURE_FLAGS):
        raise ValueError(f"--rows takes {', '.join(FEATURE_FLAGS)} (and not with --tls, --snappy or --deflate)")
    rows = {"plain": argparse.Namespace(**{**vars(a), **dict.fromkeys(FEATURE_FLAGS, False)})}
    for f in features:
        rows[f] = argparse.Namespace(**{**vars(rows["plain"]), f: True})
    return rows


def against_plain(results: dict[tuple[str, str, str], list[float]], row: str, server: str, tool: str) -> list[float]:
    """Round by round, ``row``'s ours/``server`` ratio over the plain row's in the
    same round: what a drift of the machine between rounds does to both cancels."""
    ours, theirs = results[row, "ours", tool], results[row, server, tool]
    plain_ours, plain_theirs = results["plain", "ours", tool], results["plain", server, tool]
    return [(o / t) / (po / pt) for o, t, po, pt in zip(ours, theirs, plain_ours, plain_theirs, strict=True)]


def launch(extra: list[str], exe: str | None = None) -> tuple[subprocess.Popen, str]:
    """nsqd (``exe``, else the one next to this Python) on loopback ports."""
    ours = Path(sys.executable).parent / "nsqd"
    cmd = [exe] if exe else [str(ours)] if ours.exists() else [sys.executable, "-m", "nsqd_tw"]
    proc = subprocess.Popen(
        [*cmd, "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", *extra],
        stderr=subprocess.PIPE,
        text=True,
        env=server_env(),
    )
    assert proc.stderr is not None
    found: dict[str, str] = {}
    for line in proc.stderr:
        m = re.search(r"(TCP|HTTP): listening on (\S+)", line)
        if m:
            found[m.group(1)] = m.group(2)
            if len(found) == 2:
                break
    else:
        raise RuntimeError("nsqd did not start")
    address = found["TCP"]
    proc.http_address = found["HTTP"]  # type: ignore[attr-defined]
    # keep draining stderr so nsqd never blocks on a full pipe
    import threading

    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
    return proc, address


def row_cost(cpu: dict[tuple[str, str, str], list[float]], row: str, server: str, tool: str) -> float:
    """What a feature row costs ``server`` beyond the plain row, µs of CPU a message:
    the median of the rounds' differences (each round's rows run back to back)."""
    return statistics.median(f - p for f, p in zip(cpu[row, server, tool], cpu["plain", server, tool], strict=True))


def tool(name: str, address: str, a: argparse.Namespace) -> dict:
    argv = [
        sys.executable,
        str(HERE / f"{name}.py"),
        "--nsqd-tcp-address",
        address,
        "--size",
        str(a.size),
        "--runfor",
        a.runfor,
        "--json",
    ]
    if name == "bench_writer":
        argv += ["--batch-size", str(a.batch_size)]
    elif a.rdy:
        argv += ["--rdy", str(a.rdy)]
    if a.workers:
        argv += ["--workers", str(a.workers)]
    argv += [f"--{f}" for f in FEATURE_FLAGS if getattr(a, f)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def profile(pid: int, seconds: float, path: Path, native: bool = False) -> subprocess.Popen | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists() and not shutil.which("py-spy"):
        print("py-spy not found; pip install py-spy", file=sys.stderr)
        return None
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(path),
            # native stacks need the process paused while sampled
            *(["--native"] if native else ["--nonblocking"]),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def summarize(path: Path, top: int = 15) -> list[tuple[str, float]]:
    """Self time per function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        n = int(count)
        total += n
        leaf = frames[-1]
        own[re.sub(r" \(.*/", " (", leaf)] += n
    return [(f, round(100.0 * c / total, 1)) for f, c in own.most_common(top)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=200)
    p.add_argument("--runfor", default="10s")
    p.add_argument("--workers", type=int, default=0, help="bench worker processes (default: one per core)")
    p.add_argument("--rdy", type=int, default=0, help="the reader's RDY count (default: bench_reader's, 2500)")
    p.add_argument("--mem-queue-size", type=int, default=1_000_000)
    p.add_argument("--profile", type=Path, help="directory for py-spy profiles of the server")
    p.add_argument("--native", action="store_true", help="with --profile: C frames too (OpenSSL, zlib, snappy)")
    p.add_argument("--tls", action="store_true", help="clients upgrade to TLS (nsqd gets a throwaway certificate)")
    p.add_argument("--snappy", action="store_true", help="clients negotiate snappy")
    p.add_argument("--deflate", action="store_true", help="clients negotiate deflate")
    p.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another nsqd (Go's) run with the same flags and clients, interleaved with ours",
    )
    p.add_argument(
        "--rows",
        default="",
        metavar="FEATURES",
        help="the plain row and these feature rows (a comma list of tls, snappy, deflate) interleaved "
        "in one run, each feature row's ratio to the others' set against the plain row's, round by round",
    )
    p.add_argument("nsqd_args", nargs="*", help="extra nsqd flags (after --)")
    a = p.parse_args()

    servers: dict[str, str | None] = {"ours": None}
    for spec in a.server:
        name, _, path = spec.partition("=")
        servers[name] = path
    try:
        rows = rows_of(a)
    except ValueError as e:
        p.error(str(e))
    data = tempfile.mkdtemp(prefix="nsq-bench-")
    extra = []
    if any(row.tls for row in rows.values()):
        from tests.certs import make_certs

        files = make_certs(os.path.join(data, "certs"))
        extra = ["--tls-cert", files.cert, "--tls-key", files.key, "--https-address", "127.0.0.1:0"]
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for name, exe in servers.items():
            path = os.path.join(data, name)
            os.mkdir(path)
            flags = ["--mem-queue-size", str(a.mem_queue_size), "--data-path", path, *extra, *a.nsqd_args]
            procs[name] = launch(flags, exe)
            s = connect(procs[name][1], "bench_setup", {})
            s.sendall(encode_command(b"SUB", "sub_bench", "ch"))
            s.recv(100)
            s.close()
        runfor = float(a.runfor.rstrip("s"))
        tools = ("bench_writer", "bench_reader")
        results: dict[tuple[str, str, str], list[float]] = {
            (row, server, t): [] for row in rows for server in servers for t in tools
        }
        cpu: dict[tuple[str, str, str], list[float]] = {key: [] for key in results}
        for run in range(a.runs):
            for row, flags_of_row in rows.items():
                # interleaved: each server in turn, in another order each run
                order = list(servers)[run % len(servers) :] + list(servers)[: run % len(servers)]
                for server in order:
                    proc, address = procs[server]
                    for name in tools:
                        spy = None
                        if a.profile:
                            a.profile.mkdir(parents=True, exist_ok=True)
                            out = a.profile / f"{server}-{row + '-' if row else ''}{name}-{run}.txt"
                            spy = profile(proc.pid, max(1, runfor - 1), out, a.native)
                        cpu0, sleeps0 = process_cpu(proc.pid), process_sleeps(proc.pid)
                        r = tool(name, address, flags_of_row)
                        # the server's CPU per message, µs (what the clients' share of the box does not move)
                        used = (process_cpu(proc.pid) - cpu0) * 1e6 / max(r["messages"], 1)
                        # how often its threads waited, a thousand messages (a reactor idle for want of FINs)
                        waited = (process_sleeps(proc.pid) - sleeps0) * 1e3 / max(r["messages"], 1)
                        if spy is not None:
                            spy.wait()
                        results[row, server, name].append(r["msg_per_s"])
                        cpu[row, server, name].append(used)
                        print(
                            f"run {run + 1} {row + ' ' if row else ''}{server} {name}: "
                            f"{r['msg_per_s']:,.0f} msg/s  {r['mb_per_s']:.1f} MB/s  server {used:.2f} µs CPU/msg, "
                            f"{waited:.2f} waits/1k msgs",
                            flush=True,
                        )
        for row in rows:
            print(f"\n{row} row:" if row else "")
            for name in tools:
                label = "publish" if name == "bench_writer" else "consume"
                for server in servers:
                    values = results[row, server, name]
                    who = "" if len(servers) == 1 else f"{server} "
                    print(
                        f"{who}{label}: median {statistics.median(values):,.0f} msg/s over {len(values)} runs "
                        f"({', '.join(f'{v:,.0f}' for v in values)}); server "
                        f"{statistics.median(cpu[row, server, name]):.2f} µs CPU/msg"
                    )
                for server in list(servers)[1:]:
                    ours, theirs = results[row, "ours", name], results[row, server, name]
                    ratio = statistics.median(ours) / statistics.median(theirs)
                    print(f"{label}: ours/{server} {ratio:.2f}")
        if len(rows) > 1 and len(servers) > 1:
            print()
        for row in list(rows)[1:]:
            for server in list(servers)[1:]:
                for name in tools:
                    label = "publish" if name == "bench_writer" else "consume"
                    med = statistics.median
                    rows_ratio = (med(results[row, "ours", name]) / med(results[row, server, name])) / (
                        med(results["plain", "ours", name]) / med(results["plain", server, name])
                    )
                    each = against_plain(results, row, server, name)
                    print(
                        f"{row} {label}: ours/{server} over the plain row's {rows_ratio:.2f} (of the medians); "
                        f"round by round {', '.join(f'{v:.2f}' for v in each)}, median {med(each):.2f}"
                    )
        for row in list(rows)[1:]:
            for name in tools:
                label = "publish" if name == "bench_writer" else "consume"
                costs = ", ".join(f"{server} {row_cost(cpu, row, server, name):+.2f}" for server in servers)
                print(f"{row} {label}: the server's µs CPU/msg over the plain row's (median round by round): {costs}")
        if a.profile:
            for row, server, name in results:
                for run in range(a.runs):
                    f = a.profile / f"{server}-{row + '-' if row else ''}{name}-{run}.txt"
                    if f.exists():
                        print(f"\n{server} self time during {row + ' ' if row else ''}{name} run {run + 1}:")
                        for func, pct in summarize(f):
                            print(f"  {pct:5.1f}%  {func}")
                        break
    finally:
        for proc, _ in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
