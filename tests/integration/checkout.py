"""A copy of this checkout with a virtualenv of its own, for the tests that run
the repository's scripts and documented commands as a user would.

The copy is what a fresh clone holds (the tracked files, plus new files not yet
committed), committed to a throwaway git repository so a test can ask
``git status`` what the commands left behind. Its ``.venv`` is a new
virtualenv that also sees this test run's site-packages (through a ``.pth``
file), so installing nsq-tw into it (``scripts/run`` does) needs no download
of the dependencies and never touches the developer's own ``.venv``.
"""

from __future__ import annotations

import atexit
import http.client
import os
import random
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

from tests.integration.procs import DEFAULT_PORTS

ROOT = Path(__file__).resolve().parents[2]
_SKIP = {".git", ".venv", "data", "build", "dist", "__pycache__"}


def source_files() -> list[str]:
    """The files a clone has (tracked, or new and not ignored), relative to the root."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        names = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in _SKIP and not d.startswith("_trial_temp")]
            names += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames]
    return sorted(n for n in names if (ROOT / n).is_file())


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@localhost", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def make_checkout(dest: Path) -> Path:
    """Copy the checkout to ``dest`` and give it a ``.venv``; returns ``dest``,
    which is removed when the test run ends."""
    atexit.register(shutil.rmtree, dest, True)
    for name in source_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "copy")
    venv = dest / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    inner = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(inner, "_nsq_tw_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(outer)))
    _copy_scripts(Path(sysconfig.get_paths()["scripts"]), venv / "bin")
    return dest


# made by installing nsq-tw itself (scripts/run does), or by the new virtualenv
_OWN_SCRIPTS = {"nsqd", "nsqlookupd", "nsq-spark-archive"}


def _copy_scripts(outer: Path, inner: Path) -> None:
    """The dependencies' commands (twistd, spark-submit...), as installing them
    into the new virtualenv would make them: Python ones run its python."""
    python = f"#!{inner / 'python'}\n".encode()
    for script in outer.iterdir():
        target = inner / script.name
        if target.exists() or script.name in _OWN_SCRIPTS or not script.is_file():
            continue
        if script.name.startswith(("python", "activate", "pip", "Activate")):
            continue
        data = script.read_bytes()
        first, _, rest = data.partition(b"\n")
        if first.startswith(b"#!") and b"python" in first:
            data = python + rest
        target.write_bytes(data)
        target.chmod(script.stat().st_mode)


def leftovers(checkout: Path) -> list[str]:
    """Files the commands added to or changed in the checkout (ignored ones aside)."""
    return [line for line in git(checkout, "status", "--porcelain", "--untracked-files=all").splitlines() if line]


def free_port() -> int:
    """A free port for a command that must be told its ports in advance
    (``scripts/run``, the docs' commands), from below the kernel's ephemeral range:
    a port that ``bind(0)`` picked and closed is handed out again to the next
    process that binds or connects, often before the command binds it."""
    low, _ = ephemeral_range()
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(10_000, max(10_001, low))
        if port in DEFAULT_PORTS:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def ping(port: int, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=timeout) as resp:
            return resp.status == 200 and resp.read() == b"OK"
    except (OSError, http.client.HTTPException):
        return False


def wait_for(condition, timeout: float, what: str, interval: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition`` until it is true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def children(pid: int) -> list[int]:
    """Every descendant of ``pid``."""
    found: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
        found += kids
        todo += kids
    return found
