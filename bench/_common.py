"""Shared bits of the bench tools: flags, raw V2 sockets, worker processes."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsqd_tw.options import parse_duration
from nsqd_tw.wire import MAGIC_V2, encode_command

FRAME = struct.Struct(">ii")


def base_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    p.add_argument("--nsqd-tcp-address", "-nsqd-tcp-address", default="127.0.0.1:4150")
    p.add_argument("--topic", "-topic", default="sub_bench")
    p.add_argument("--size", "-size", type=int, default=200, help="size of messages")
    p.add_argument("--runfor", "-runfor", type=parse_duration, default=10.0, help="duration of time to run")
    p.add_argument("--workers", "-workers", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    return p


def connect(address: str, user_agent: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = json.dumps({"client_id": user_agent, "hostname": user_agent, "user_agent": user_agent}).encode()
    s.sendall(MAGIC_V2 + encode_command(b"IDENTIFY", body=body))
    expect_ok(s)
    return s


def read_frame(s: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    while True:
        if len(buf) >= 8:
            size, ft = FRAME.unpack_from(buf)
            if len(buf) >= 4 + size:
                data = bytes(buf[8 : 4 + size])
                del buf[: 4 + size]
                return ft, data
        chunk = s.recv(1 << 16)
        if not chunk:
            raise ConnectionError("closed by nsqd")
        buf += chunk


def expect_ok(s: socket.socket, buf: bytearray | None = None) -> None:
    ft, data = read_frame(s, bytearray() if buf is None else buf)
    if ft != 0 or data != b"OK":
        raise RuntimeError(f"unexpected frame {ft} {data[:200]!r}")


def run_workers(
    name: str, target: Callable[..., int], args: tuple, workers: int, runfor: float, size: int, as_json: bool
) -> dict:
    """Start workers, release them together, report msg/s, MB/s and µs/op."""
    ready = mp.Barrier(workers + 1)
    results: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_worker, args=(target, args, ready, results, runfor)) for _ in range(workers)]
    for p in procs:
        p.start()
    ready.wait()
    start = time.perf_counter()
    counts = [results.get() for _ in procs]
    duration = time.perf_counter() - start
    for p in procs:
        p.join()
    total = sum(counts)
    report = {
        "tool": name,
        "duration_s": round(duration, 3),
        "messages": total,
        "msg_per_s": round(total / duration, 1),
        "mb_per_s": round(total * size / duration / 1024 / 1024, 3),
        "us_per_op": round(duration * 1e6 / total, 3) if total else None,
    }
    if as_json:
        print(json.dumps(report))
    else:
        print(
            f"[{name}] duration: {duration:.3f}s - {report['mb_per_s']:.3f}mb/s - "
            f"{report['msg_per_s']:.3f}ops/s - {report['us_per_op']}us/op"
        )
    return report


def _worker(target: Callable[..., int], args: tuple, ready, results, runfor: float) -> None:  # type: ignore[no-untyped-def]
    results.put(target(*args, ready=ready, runfor=runfor))
