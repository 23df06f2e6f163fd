"""Shared bits of the bench tools: flags, raw V2 sockets, worker processes."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nsq_wire.commands import encode_command
from nsq_wire.compression import DeflateCodec, SnappyCodec
from nsq_wire.frames import MAGIC_V2
from nsq_wire.gofmt import parse_duration

FRAME = struct.Struct(">ii")

# the PYTHONPATH this bench run started with: importing the tests package (for its
# certificates or process helpers) puts the work tree on PYTHONPATH for every process
# started after it, and a server the bench starts must run the install it was given
_STARTED_PYTHONPATH = os.environ.get("PYTHONPATH")


def server_env() -> dict[str, str]:
    """The environment to start a server in: this one, with the PYTHONPATH the bench
    run started with."""
    env = dict(os.environ)
    if _STARTED_PYTHONPATH is None:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = _STARTED_PYTHONPATH
    return env


def base_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    p.add_argument("--nsqd-tcp-address", "-nsqd-tcp-address", default="127.0.0.1:4150")
    p.add_argument("--topic", "-topic", default="sub_bench")
    p.add_argument("--size", "-size", type=int, default=200, help="size of messages")
    p.add_argument("--runfor", "-runfor", type=parse_duration, default=10.0, help="duration of time to run")
    p.add_argument("--workers", "-workers", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    p.add_argument("--tls", action="store_true", help="upgrade to TLS (certificates are not verified)")
    p.add_argument("--snappy", action="store_true", help="negotiate snappy compression")
    p.add_argument("--deflate", action="store_true", help="negotiate deflate compression")
    return p


FEATURES: dict[str, bool] = {}  # set from the flags by the tools: tls_v1, snappy, deflate


def features(args: argparse.Namespace) -> dict[str, bool]:
    return {"tls_v1": args.tls, "snappy": args.snappy, "deflate": args.deflate}


class CompressedSocket:
    """A blocking socket (plain or TLS) with a negotiated stream codec."""

    def __init__(self, sock: socket.socket, codec: SnappyCodec | DeflateCodec) -> None:
        self.sock = sock
        self.codec = codec

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(self.codec.encode(data))

    def recv(self, n: int) -> bytes:
        while True:
            raw = self.sock.recv(n)
            if not raw:
                return b""
            out = b"".join(self.codec.decode(raw))
            if out:
                return out

    def settimeout(self, t: float | None) -> None:
        self.sock.settimeout(t)

    def close(self) -> None:
        self.sock.close()


class TLSSocket:
    """A blocking socket carrying TLS through memory BIOs, for the bench clients.

    ``recv`` decrypts every record one read of the socket brought, as a reader of
    a plain socket gets all of it: Python's ``SSLSocket.recv`` gives one record
    (16 KiB) a call, so a client reading through it made a round of work (and a
    write of its FINs) per record, and paid for that itself. The bytes on the wire
    are the same.
    """

    _RECORD = 1 << 14  # the most plaintext one record holds

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_hostname: str) -> None:
        self.sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self._in, self._out, server_side=False, server_hostname=server_hostname)
        # what one read of the socket brings, and the plaintext its records hold: kept between reads
        self._raw = bytearray()
        self._plain = bytearray()
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill(1 << 16):
                    raise ConnectionError("closed by nsqd during the TLS handshake") from None
        self._flush()

    def _flush(self) -> None:
        data = self._out.read()
        if data:
            self.sock.sendall(data)

    def _fill(self, n: int) -> bool:
        if len(self._raw) < n:
            self._raw = bytearray(n)
        got = self.sock.recv_into(self._raw, n)
        if not got:
            return False
        self._in.write(memoryview(self._raw)[:got])
        return True

    def sendall(self, data: bytes) -> None:
        self.tls.write(data)
        self._flush()

    def recv(self, n: int) -> bytes:
        plain = self._plain
        pos = 0
        while True:
            if len(plain) - pos < self._RECORD:  # room for one more record
                plain = self._plain = plain + bytearray(max(len(plain), n, self._RECORD))
            try:
                got = self.tls.read(self._RECORD, memoryview(plain)[pos:])
            except ssl.SSLWantReadError:  # the records that arrived are used up
                if pos or not self._fill(n):
                    break
                continue
            except ssl.SSLZeroReturnError:
                break
            if not got:  # the peer's close_notify
                break
            pos += got
        self._flush()  # a read can make output of its own (a key update's answer)
        return bytes(plain[:pos])

    def settimeout(self, t: float | None) -> None:
        self.sock.settimeout(t)

    def close(self) -> None:
        try:
            self.tls.unwrap()
        except ssl.SSLError:
            pass
        try:
            self._flush()
        except OSError:
            pass
        self.sock.close()


def connect(address: str, user_agent: str, feats: dict[str, bool] | None = None) -> Any:
    """A V2 connection after IDENTIFY and the upgrades asked for."""
    feats = FEATURES if feats is None else feats
    host, _, port = address.rpartition(":")
    s: Any = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ident = {"client_id": user_agent, "hostname": user_agent, "user_agent": user_agent}
    if any(feats.values()):
        ident.update(feature_negotiation=True, **feats)
    s.sendall(MAGIC_V2 + encode_command(b"IDENTIFY", body=json.dumps(ident).encode()))
    if not any(feats.values()):
        expect_ok(s)
        return s
    buf = bytearray()
    _ft, data = read_frame(s, buf)
    agreed = json.loads(data)
    if agreed.get("tls_v1"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        s = TLSSocket(s, ctx, host)
        buf = bytearray()  # what follows the TLS OK (a compressed OK) stays in it
        expect_ok(s, buf)
    for name in ("snappy", "deflate"):
        if agreed.get(name):
            codec = SnappyCodec() if name == "snappy" else DeflateCodec(agreed.get("deflate_level", 6))
            s = CompressedSocket(s, codec)
            rest = bytes(buf)
            buf = bytearray(b"".join(codec.decode(rest))) if rest else bytearray()
            expect_ok(s, buf)
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


def process_cpu(pid: int) -> float:
    """A process's CPU time so far (user + system), seconds, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_sleeps(pid: int) -> int:
    """How often a process's threads have waited for something (their voluntary
    context switches so far, from /proc): a single-threaded server's reactor
    sleeping with nothing to do, so per message it shows a pipeline that stalls."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


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
    procs = [mp.Process(target=_worker, args=(target, args, ready, results, runfor, FEATURES)) for _ in range(workers)]
    for p in procs:
        p.start()
    ready.wait()
    start = time.perf_counter()
    try:
        counts = [results.get(timeout=runfor + 60) for _ in procs]
    except Exception:
        for p in procs:
            p.kill()
        raise SystemExit(f"{name}: a worker failed (see above)") from None
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


def _worker(target: Callable[..., int], args: tuple, ready, results, runfor: float, feats: dict) -> None:  # type: ignore[no-untyped-def]
    FEATURES.update(feats)
    results.put(target(*args, ready=ready, runfor=runfor))
