"""Load for the replication failover tests: publishers over TCP (PUB, MPUB) and
HTTP that move to the other node of the pair when theirs fails or refuses, and a
pynsq consumer through nsqlookupd; every body that got OK is remembered, every
delivery counted, with the node it came from and when.
"""

from __future__ import annotations

import collections
import http.client
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench._common import read_frame

TOPIC = "failover"


def _read_frame(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """The next frame from nsqd (``buf``: what was read past the last one), heartbeats answered."""
    while True:
        ft, data = read_frame(sock, buf)
        if ft == 0 and data == b"_heartbeat_":
            sock.sendall(b"NOP\n")
            continue
        return ft, data


class Publishers:
    """``tcp``/``http``: the pair's addresses; each publisher keeps to one node until
    it fails, then tries the other. ``pace``: seconds between publishes of one publisher."""

    def __init__(self, tcp: list[str], http: list[str], pace: float = 0.004) -> None:
        self.tcp = tcp
        self.http = http
        self.pace = pace
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: set[str] = set()
        self.acked_by: collections.Counter[str] = collections.Counter()  # node -> OKs
        # node -> when each OK was read, and the bodies it acknowledged
        self.oks: dict[str, list[tuple[float, list[str]]]] = collections.defaultdict(list)
        self.refused = 0
        self.threads = [
            threading.Thread(target=self._tcp, args=("pub", 1), daemon=True),
            threading.Thread(target=self._tcp, args=("mpub", 10), daemon=True),
            threading.Thread(target=self._http, daemon=True),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _ok(self, node: str, bodies: list[str]) -> None:
        with self.lock:
            self.acked.update(bodies)
            self.acked_by[node] += len(bodies)
            self.oks[node].append((time.monotonic(), bodies))

    def last_ok(self, node: str) -> float | None:
        with self.lock:
            oks = self.oks.get(node)
            return max(t for t, _ in oks) if oks else None

    def acked_after(self, node: str, after: float) -> list[str]:
        """The bodies whose OK from ``node`` was read at ``after`` (monotonic) or later."""
        with self.lock:
            return [b for t, bodies in self.oks.get(node, ()) if t >= after for b in bodies]

    def _tcp(self, name: str, batch: int) -> None:
        node = 0
        seq = 0
        sock: socket.socket | None = None
        buf = bytearray()
        pending: list[str] = []
        while not self.stop.is_set():
            if not pending:
                pending = [f"{name}-{seq + i}" for i in range(batch)]
                seq += batch
            try:
                if sock is None:
                    host, port = self.tcp[node].rsplit(":", 1)
                    sock = socket.create_connection((host, int(port)), timeout=5)
                    sock.settimeout(10)
                    sock.sendall(b"  V2")
                    buf = bytearray()
                if batch == 1:
                    body = pending[0].encode()
                    sock.sendall(b"PUB %s\n" % TOPIC.encode() + struct.pack(">i", len(body)) + body)
                else:
                    parts = [struct.pack(">i", len(pending))]
                    for b in pending:
                        parts.append(struct.pack(">i", len(b)) + b.encode())
                    data = b"".join(parts)
                    sock.sendall(b"MPUB %s\n" % TOPIC.encode() + struct.pack(">i", len(data)) + data)
                ft, data = _read_frame(sock, buf)
                if ft == 0 and data == b"OK":
                    self._ok(self.tcp[node], pending)
                    pending = []
                    time.sleep(self.pace)
                    continue
                with self.lock:
                    self.refused += 1
                raise ConnectionError(data.decode(errors="replace"))
            except OSError:
                if sock is not None:
                    sock.close()
                sock = None
                node = 1 - node  # the other one may be the primary now
                time.sleep(0.05)
        if sock is not None:
            sock.close()

    def _http(self) -> None:
        node = 0
        seq = 0
        body = ""
        while not self.stop.is_set():
            if not body:
                body = f"http-{seq}"
                seq += 1
            host, port = self.http[node].rsplit(":", 1)
            try:
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                conn.request("POST", f"/pub?topic={TOPIC}", body=body.encode())
                resp = conn.getresponse()
                answer = resp.read()
                conn.close()
                if resp.status == 200 and answer == b"OK":
                    self._ok(self.http[node], [body])
                    body = ""
                    time.sleep(self.pace)
                    continue
                with self.lock:
                    self.refused += 1
            except OSError:
                pass
            node = 1 - node
            time.sleep(0.05)


class Consumer:
    """pynsq, discovering the pair through nsqlookupd: every delivery as (time, node, body),
    and each body's timestamp (when the nsqd that took its publish took it)."""

    def __init__(self, lookupd_http: str) -> None:
        script = Path(__file__).with_name("pynsq_failover.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), lookupd_http, TOPIC],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.lock = threading.Lock()
        self.deliveries: list[tuple[float, str, str]] = []
        self.counts: collections.Counter[str] = collections.Counter()
        self.published: dict[str, int] = {}  # body -> the message's timestamp, ns since the epoch
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            node, body, timestamp = line.decode().rstrip("\n").split(" ")
            with self.lock:
                self.deliveries.append((time.monotonic(), node, body))
                self.counts[body] += 1
                self.published.setdefault(body, int(timestamp))

    def missing(self, acked: set[str]) -> set[str]:
        with self.lock:
            return {b for b in acked if b not in self.counts}

    def first_from(self, node: str, after: float) -> float | None:
        """When the first message from ``node`` arrived after ``after`` (monotonic)."""
        with self.lock:
            return next((t for t, n, _ in self.deliveries if n == node and t >= after), None)

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.counts.values() if n > 1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(15)


def wait_until(check, timeout: float, step: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``check()`` (from a thread, not the reactor) until true or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step)
    return bool(check())


class Proxy:
    """A TCP proxy the test controls: :meth:`cut` closes every connection through
    it and refuses new ones until :meth:`restore`; :meth:`blackhole` drops every
    byte silently, closing nothing and holding new connections unanswered (a host
    that vanished), until :meth:`restore`."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.open = True
        self.silent = False
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            if self.silent:
                with self.lock:
                    self.conns.append(client)  # held, never answered
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self.silent:
                    dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.open = False
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def blackhole(self) -> None:
        self.silent = True

    def restore(self) -> None:
        self.open = True
        if self.silent:  # the connections held meanwhile are useless: close them
            self.silent = False
            self.cut()
            self.open = True

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.server.close()
