"""Run nsqd as a real process, the way client test harnesses do."""

from __future__ import annotations

import errno
import os
import re
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_LISTEN = re.compile(r"(TCP|HTTP|HTTPS): listening on (\S+)")
# Go's default ports: a test that listens on one fails beside a real nsqd
DEFAULT_PORTS = {4150, 4151, 4152, 4160, 4161}


def unsafe_listener(address: str) -> str | None:
    """Why a test server must not listen on ``address`` (None: it may): only on
    loopback, never on a wildcard address or one of Go's default ports."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None  # a unix socket's path
    if host.strip("[]") not in ("127.0.0.1", "::1"):
        return f"listens on {address}, not on loopback"
    if int(port) in DEFAULT_PORTS:
        return f"listens on {address}, a default port (another nsqd may hold it)"
    return None


def command(name: str) -> list[str]:
    """The console script next to this Python (what `pip install` made)."""
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    found = shutil.which(name)
    if found:
        return [found]
    if name == "twistd":
        return [sys.executable, "-m", "twisted"]
    module = {"nsqd": "nsqd_tw", "nsqlookupd": "lookupd_tw"}[name]
    return [sys.executable, "-m", module]


class ServerProcess:
    def __init__(
        self,
        name: str,
        *args: str,
        cwd: str | None = None,
        argv: list[str] | None = None,
        stdout: bool = False,
        preexec_fn: Any = None,
    ) -> None:
        """Start ``name`` with ``args``; log lines are read from stderr (or stdout).
        ``preexec_fn`` runs in the child before exec (e.g. to ignore a signal)."""
        self.name = name
        self.preexec_fn = preexec_fn
        self.use_stdout = stdout
        self.argv = argv if argv is not None else [*command(name), *args]
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self.addresses: dict[str, str] = {}
        self.unsafe: list[str] = []  # listeners a test must not use (see unsafe_listener)
        self._drain: threading.Thread | None = None

    def start(self, wait_for: tuple[str, ...] = ("TCP", "HTTP"), timeout: float = 15.0) -> ServerProcess:
        out, err = (subprocess.PIPE, subprocess.STDOUT) if self.use_stdout else (subprocess.DEVNULL, subprocess.PIPE)
        self.proc = subprocess.Popen(
            self.argv, cwd=self.cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=self.preexec_fn
        )
        self.stream = self.proc.stdout if self.use_stdout else self.proc.stderr
        assert self.stream is not None
        fd = self.stream.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        while not all(k in self.addresses for k in wait_for):
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise RuntimeError(f"{self.name} did not start: {self.lines}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait()
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.lines}")
            buf += chunk
            *complete, buf = buf.split(b"\n")
            for raw in complete:
                self._line(raw.decode(errors="replace"))
        self._drain = threading.Thread(target=self._drain_stderr, args=(buf,), daemon=True)
        self._drain.start()
        return self

    def _line(self, line: str) -> None:
        self.lines.append(line)
        m = _LISTEN.search(line)
        if m:
            self.addresses[m.group(1)] = m.group(2)
            why = unsafe_listener(m.group(2))
            if why is not None:
                self.unsafe.append(f"{self.name} {m.group(1)} {why}")

    def _drain_stderr(self, pending: bytes) -> None:
        stream = self.stream
        buf = pending
        for chunk in iter(lambda: stream.read1(65536), b""):
            buf += chunk
            *complete, buf = buf.split(b"\n")
            for raw in complete:
                self._line(raw.decode(errors="replace"))

    def port(self, kind: str = "TCP") -> int:
        return int(self.addresses[kind].rsplit(":", 1)[1])

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        if self._drain is not None:
            self._drain.join(timeout)
        return code

    def stop(self) -> int:
        self.signal(signal.SIGTERM)
        return self.wait()

    def kill(self) -> None:
        """Kill the server (a test's cleanup); then fail if it listened where a
        test must not (beside a running nsqd, that test would fail)."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        if self.unsafe:
            raise AssertionError("; ".join(self.unsafe))


def call(proc: ServerProcess, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP request to ``proc``'s HTTP port (blocking): status and body."""
    import http.client

    host, port = proc.addresses["HTTP"].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def replication_status(proc: ServerProcess) -> dict[str, Any]:
    """``GET /replication`` of ``proc`` ({} when it does not answer 200)."""
    import json

    try:
        code, body = call(proc, "GET", "/replication")
    except OSError:
        return {}
    return dict(json.loads(body)) if code == 200 else {}


def secret_dir(case: Any) -> tuple[str, str]:
    """A fresh directory for a test of a replication pair, and the pair's secret file in it."""
    path = os.path.abspath(case.mktemp())
    os.makedirs(path)
    secret = os.path.join(path, "secret")
    with open(secret, "w") as f:
        f.write("the pair's secret\n")
    return path, secret


def rss_mb(pid: int) -> float:
    """The resident memory (VmRSS) of process ``pid``, in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def eventually(check: Any, timeout: float = 60.0, step: float = 0.1) -> Any:
    """Poll ``check()`` (which may return a Deferred) on the reactor until it is true;
    a Deferred that fires with that value.

    The timeout only bounds a failing test; a passing one waits as long as its
    condition takes, so keep it generous for a machine running other suites.
    """
    from twisted.internet import defer, reactor
    from twisted.internet.task import deferLater

    @defer.inlineCallbacks
    def poll() -> Any:
        deadline = reactor.seconds() + timeout
        while True:
            ok = yield defer.maybeDeferred(check)
            if ok:
                return ok
            if reactor.seconds() >= deadline:
                raise AssertionError("condition not met in time")
            yield deferLater(reactor, step, lambda: None)

    return poll()


def storm(address: str, clients: int, request: bytes, answered: bytes, deadline: float = 30.0) -> list[float | None]:
    """Connect ``clients`` sockets at once, send ``request`` on each, and time (from
    the start) until the answer holds ``answered``; None for those never answered."""
    host, _, port = address.rpartition(":")
    sel = selectors.DefaultSelector()
    started = time.monotonic()
    times: list[float | None] = [None] * clients
    got = [b""] * clients
    socks = []
    for i in range(clients):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex((host, int(port)))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            continue
        socks.append(s)
        sel.register(s, selectors.EVENT_WRITE, i)
    pending = len(socks)
    end = started + deadline
    while pending and time.monotonic() < end:
        for key, events in sel.select(timeout=max(0.0, end - time.monotonic())):
            s, i = key.fileobj, key.data
            assert isinstance(s, socket.socket)
            if events & selectors.EVENT_WRITE:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    sel.unregister(s)
                    pending -= 1
                    continue
                s.sendall(request)
                sel.modify(s, selectors.EVENT_READ, i)
                continue
            try:
                chunk = s.recv(65536)
            except OSError:
                chunk = b""
            got[i] += chunk
            if answered in got[i]:
                times[i] = time.monotonic() - started
            if answered in got[i] or not chunk:
                sel.unregister(s)
                pending -= 1
    for s in socks:
        s.close()
    sel.close()
    return times
