"""How soon nsqd and nsqlookupd can be used after they are started.

    python bench/start.py --rounds 7
    python bench/start.py --rounds 7 --server before=/tmp/before/bin --server go=~/go-nsq-1.3/bin

For each server (``nsqd`` and ``nsqlookupd`` in each directory given; ours is the one
next to this Python), every round starts it on two loopback ports chosen beforehand and
measures, from the exec:

- ``accept``: the first TCP connection to its TCP port that the kernel accepts (the
  port is connect-polled from the exec on; a refused connect is tried again 0.5 ms later);
- ``/ping``: the first ``GET /ping`` on its HTTP port answered ``OK``;
- ``--version``: the whole run of ``--version``;

and, for reference, ``python -c "import twisted.internet.reactor"`` with the servers'
Python. Rounds alternate the servers' order; the figures are medians, with the load
average before and after.

The repository's environment may forbid writing bytecode (``PYTHONDONTWRITEBYTECODE``)
while the servers run from the work tree (an editable install), so each start would
compile every module of ours: not what an installed package does (pip compiles them).
By default the servers run with bytecode cached under a temporary ``PYTHONPYCACHEPREFIX``
(after one warm-up start), as installed; ``--as-is`` keeps the environment as it is.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepted(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def ping(port: int) -> bool:
    """``GET /ping`` answered ``200 OK`` with ``OK`` (the request may wait in the
    listen backlog until the server serves it)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /ping HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
    except OSError:
        return False
    return answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n", 1)[0] and answer.endswith(b"OK")


def one_start(exe: str, env: dict[str, str]) -> tuple[float, float]:
    """(exec → accept, exec → /ping OK) in ms for one start of ``exe``."""
    tcp, http = free_port(), free_port()
    data = tempfile.mkdtemp(prefix="bench_start.")
    argv = [exe, "--tcp-address", f"127.0.0.1:{tcp}", "--http-address", f"127.0.0.1:{http}"]
    if Path(exe).name == "nsqd":
        argv += ["--data-path", data]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        while not accepted(tcp):
            if proc.poll() is not None:
                raise RuntimeError(f"{exe} exited with {proc.returncode}")
            time.sleep(0.0005)
        t_accept = time.monotonic() - t0
        while not ping(http):
            if proc.poll() is not None:
                raise RuntimeError(f"{exe} exited with {proc.returncode}")
            time.sleep(0.0005)
        t_ping = time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)
    return t_accept * 1000, t_ping * 1000


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, capture_output=True, check=True, env=env)
    return (time.monotonic() - t0) * 1000


def interpreter(exe: str) -> str | None:
    """The Python a console script runs (its ``#!`` line); None for a binary (Go's)."""
    with open(exe, "rb") as f:
        first = f.readline()
    if first.startswith(b"#!") and b"python" in first:
        return first[2:].split()[0].decode()
    return None


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="start", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also measure the nsqd and nsqlookupd in DIR (Go's, another build of ours)",
    )
    p.add_argument("--app", action="append", choices=["nsqd", "nsqlookupd"], help="only these (default: both)")
    p.add_argument("--as-is", action="store_true", help="the environment as it is (see above)")
    a = p.parse_args(argv)
    dirs = {"ours": str(Path(sys.executable).parent)}
    for spec in a.server:
        name, _, path = spec.partition("=")
        dirs[name] = os.path.expanduser(path)
    apps = a.app or ["nsqd", "nsqlookupd"]
    env = dict(os.environ)
    cache = ""
    if not a.as_is:
        cache = tempfile.mkdtemp(prefix="bench_start.pycache.")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache
    runs = [(f"{name} {app}", str(Path(d) / app)) for name, d in dirs.items() for app in apps]
    pythons = sorted({py for _, exe in runs if (py := interpreter(exe)) is not None})
    for _label, exe in runs:  # warm-up: bytecode written, files in the page cache
        one_start(exe, env)
        timed([exe, "--version"], env)
    for py in pythons:
        timed([py, "-c", "import twisted.internet.reactor"], env)
    print(f"load before: {load()}  ({'environment as is' if a.as_is else 'bytecode cached, as installed'})")
    figures: dict[str, dict[str, list[float]]] = {label: {"accept": [], "ping": [], "version": []} for label, _ in runs}
    reactor: dict[str, list[float]] = {py: [] for py in pythons}
    for r in range(a.rounds):
        order = runs if r % 2 == 0 else runs[::-1]
        for label, exe in order:
            acc, png = one_start(exe, env)
            ver = timed([exe, "--version"], env)
            f = figures[label]
            f["accept"].append(acc)
            f["ping"].append(png)
            f["version"].append(ver)
            print(f"round {r + 1} {label:<20} accept {acc:6.1f} ms  /ping {png:6.1f} ms  --version {ver:5.1f} ms")
        for py in pythons:
            reactor[py].append(timed([py, "-c", "import twisted.internet.reactor"], env))
    print(f"load after: {load()}")
    ref = {py: statistics.median(v) for py, v in reactor.items()}
    for py, ms in ref.items():
        print(f"import twisted.internet.reactor ({py}): {ms:.1f} ms (median)")
    print(f"{'medians':<20} {'accept ms':>10} {'/ping ms':>10} {'--version ms':>13} {'/ping ÷ import':>15}")
    for label, exe in runs:
        f = figures[label]
        png = statistics.median(f["ping"])
        py = interpreter(exe)
        ratio = f"{png / ref[py]:.2f}" if py is not None else ""
        print(
            f"{label:<20} {statistics.median(f['accept']):10.1f} {png:10.1f} "
            f"{statistics.median(f['version']):13.1f} {ratio:>15}"
        )
    if cache:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
