"""Measure how nsqd's HTTP side copes with two abuses (issue 11, items 7 and 8).

``refuse``: POST /pub with a huge body (Content-Length or chunked) sent as fast as the
server takes it; prints when the answer came, what it was, how many bytes the client got
to send, how many bytes the server read (``rchar`` of /proc/PID/io) and its peak RSS.

``slowloris``: N connections dripping one header byte every few seconds against nsqd
started with a soft RLIMIT_NOFILE (1024 by default, the hard limit left as is); prints
how many are still open over time and whether a fresh HTTP /ping and a fresh TCP PUB
get through meanwhile.

    .venv/bin/python bench/http_hardening.py refuse [--chunked] [--size 314572800]
    .venv/bin/python bench/http_hardening.py slowloris [--conns 1100] [--drip 5] [--watch 40]

Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

DEFAULT_NSQD = str(Path(sys.executable).parent / "nsqd")


def start_nsqd(nsqd: str, data: str, soft_nofile: int | None = None) -> tuple[subprocess.Popen[bytes], int, int]:
    def limit() -> None:
        if soft_nofile is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft_nofile, hard))

    proc = subprocess.Popen(
        [nsqd, "--http-address", "127.0.0.1:0", "--tcp-address", "127.0.0.1:0", "--data-path", data],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        preexec_fn=limit,
    )
    assert proc.stderr is not None
    ports: dict[str, int] = {}
    lines: list[str] = []
    while len(ports) < 2:
        line = proc.stderr.readline().decode(errors="replace")
        if not line:
            raise SystemExit(f"nsqd exited: {lines}")
        lines.append(line)
        m = re.search(r"(TCP|HTTP): listening on \S+:(\d+)", line)
        if m:
            ports[m.group(1)] = int(m.group(2))

    def drain() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            text = raw.decode(errors="replace")
            if "ERROR" in text or "WARNING" in text:
                sys.stdout.write("  nsqd: " + text)

    threading.Thread(target=drain, daemon=True).start()
    return proc, ports["HTTP"], ports["TCP"]


def wchar(pid: int) -> int:
    """Bytes the process wrote with write(2) and friends (files, not sockets' send)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def server_read(server_port: int, client_port: int) -> int | None:
    """Bytes the server's socket received minus those still queued unread (``ss -ti``)."""
    out = subprocess.run(
        ["ss", "-tinH", "src", f"127.0.0.1:{server_port}", "dst", f"127.0.0.1:{client_port}"],
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r"bytes_received:(\d+)", out)
    if not m:
        return None
    recv_q = int(out.split()[0]) if out.split()[0].isdigit() else int(out.split()[1])
    return int(m.group(1)) - recv_q


def status(pid: int, key: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return "?"


def deleted_files(pid: int) -> int:
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).endswith("(deleted)"):
                n += 1
        except OSError:
            pass
    return n


def refuse(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as data:
        proc, http_port, _ = start_nsqd(args.nsqd, data)
        try:
            time.sleep(0.5)
            before = wchar(proc.pid)
            sock = socket.create_connection(("127.0.0.1", http_port))
            if args.chunked:
                head = b"POST /pub?topic=big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            else:
                head = b"POST /pub?topic=big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % args.size
            chunk = b"x" * 65536
            piece = b"10000\r\n" + chunk + b"\r\n" if args.chunked else chunk
            sock.sendall(head)
            start = time.monotonic()
            sock.setblocking(False)
            sel = selectors.DefaultSelector()
            sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            sent = 0
            got_in: int | None = None
            answer = b""
            answered_at = None
            tmp_seen = 0
            pending = memoryview(piece)
            deadline = start + args.timeout
            while time.monotonic() < deadline:
                events = sel.select(1.0)
                tmp_seen = max(tmp_seen, deleted_files(proc.pid))
                for _, mask in events:
                    if mask & selectors.EVENT_READ:
                        try:
                            data_in = sock.recv(65536)
                        except (ConnectionResetError, BlockingIOError):
                            data_in = b""
                        if answered_at is None and data_in:
                            answered_at = time.monotonic()
                            got_in = server_read(http_port, sock.getsockname()[1])
                        answer += data_in
                        if not data_in:
                            deadline = 0
                    if mask & selectors.EVENT_WRITE and answered_at is None and sent < args.size:
                        try:
                            n = sock.send(pending)
                        except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                            n = 0
                        sent += n
                        pending = pending[n:] if n < len(pending) else memoryview(piece)
                        if sent >= args.size:
                            if args.chunked:
                                sock.setblocking(True)
                                sock.sendall(b"0\r\n\r\n")
                                sock.setblocking(False)
                            sel.modify(sock, selectors.EVENT_READ)
                if answered_at is not None and b"\r\n\r\n" in answer:
                    if answered_at is not None and time.monotonic() - answered_at > 1.0:
                        break
            time.sleep(0.2)
            spooled = wchar(proc.pid) - before
            status_line = answer.split(b"\r\n", 1)[0].decode(errors="replace")
            body = answer.partition(b"\r\n\r\n")[2][:80]
            took = (answered_at - start) if answered_at else float("nan")
            mode = "chunked" if args.chunked else f"Content-Length: {args.size}"
            print(f"POST /pub ({mode}), --max-msg-size default 1048576")
            print(f"  answer: {status_line!r} {body!r} after {took:.3f}s")
            print(f"  client sent {sent / 1e6:.1f} MB of body before the answer")
            shown = "socket already closed" if got_in is None else f"{got_in / 1e6:.3f} MB"
            print(f"  server had read from the socket when it answered: {shown} (ss -ti)")
            print(f"  server wrote {spooled / 1e6:.1f} MB to files (wchar); temp files seen open: {tmp_seen}")
            print(f"  server peak RSS {status(proc.pid, 'VmHWM')}")
            sock.close()
        finally:
            proc.terminate()
            proc.wait()


def probe_http(port: int) -> str:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = s.recv(4096)
        s.close()
        return "ok" if b" 200 " in out and out.endswith(b"OK") else f"bad {out[:40]!r}"
    except OSError as e:
        return f"failed ({e.__class__.__name__})"


def probe_tcp(port: int) -> str:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
        s.sendall(b"  V2PUB slowloris_probe\n\x00\x00\x00\x01x")
        out = s.recv(4096)
        s.close()
        return "ok" if out.endswith(b"OK") else f"bad {out[:40]!r}"
    except OSError as e:
        return f"failed ({e.__class__.__name__})"


def slowloris(args: argparse.Namespace) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.conns + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.conns + 100), hard))
    with tempfile.TemporaryDirectory() as data:
        proc, http_port, tcp_port = start_nsqd(args.nsqd, data, args.soft)
        try:
            print(f"nsqd soft RLIMIT_NOFILE at start {args.soft}; now: {limits(proc.pid)}")
            opened: dict[socket.socket, float] = {}
            refused = 0
            for _ in range(args.conns):
                try:
                    s = socket.create_connection(("127.0.0.1", http_port), timeout=5)
                    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Drip: ")
                    s.setblocking(False)
                    opened[s] = time.monotonic()
                except OSError:
                    refused += 1
            start = time.monotonic()
            print(f"  {len(opened)} connections opened in {start - min(opened.values(), default=start):.1f}s")
            open_ = dict(opened)
            held: list[float] = []  # seconds each closed connection was open
            last_drip = start
            report_at = [0, 5, 9, 11, 15, 20, 30, 40, 60, 90, 120]
            while True:
                now = time.monotonic()
                if now - last_drip >= args.drip:
                    last_drip = now
                    for s in list(open_):
                        try:
                            s.send(b"a")
                        except OSError:
                            pass
                for s in list(open_):
                    try:
                        got = s.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        got = b""
                    if not got:
                        held.append(now - open_.pop(s))
                        s.close()
                t = now - start
                if report_at and t >= report_at[0]:
                    report_at.pop(0)
                    print(
                        f"  t={t:5.1f}s open={len(open_):5d} closed={len(held):5d} "
                        f"(of which within 1 s of connecting: {sum(1 for h in held if h < 1)}) "
                        f"connect failed={refused}  new /ping: {probe_http(http_port)}  "
                        f"new TCP PUB: {probe_tcp(tcp_port)}"
                    )
                if t > args.watch or not report_at:
                    break
                time.sleep(0.2)
            late = [h for h in held if h >= 1]
            if late:
                print(f"  {len(late)} closed by the server after {min(late):.1f}..{max(late):.1f}s open")
            if open_:
                print(f"  {len(open_)} still open after {args.watch:g}s")
            for s in open_:
                s.close()
        finally:
            proc.terminate()
            proc.wait()


def limits(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return " ".join(line.split()[3:5]) + " (soft hard)"
    return "?"


def main(argv: Any = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nsqd", default=DEFAULT_NSQD, help="the nsqd command")
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("refuse")
    r.add_argument("--size", type=int, default=314572800)
    r.add_argument("--chunked", action="store_true")
    r.add_argument("--timeout", type=float, default=120.0)
    s = sub.add_parser("slowloris")
    s.add_argument("--conns", type=int, default=1100)
    s.add_argument("--drip", type=float, default=5.0)
    s.add_argument("--soft", type=int, default=1024)
    s.add_argument("--watch", type=float, default=40.0)
    args = p.parse_args(argv)
    refuse(args) if args.what == "refuse" else slowloris(args)


if __name__ == "__main__":
    main()
