"""Crash test for durable mode: load, kill -9 at random moments, restart, drain.

    python -m tests.integration.crashtest --kills 20

Publishers send PUB and MPUB with unique bodies and remember every body nsqd
answered OK; consumers FIN everything they get. nsqd (with --mem-queue-size=0
--sync-every=1) is SIGKILLed at random moments and restarted on the same
ports and data path. At the end the consumers drain, and the result says how
many acknowledged messages were never delivered (must be 0) and how many were
delivered more than once.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time

from tests.integration.procs import ServerProcess

FRAME = struct.Struct(">ii")
TOPIC = "crash"
CHANNEL = "ch"


def _frames(sock: socket.socket, buf: bytearray):  # type: ignore[no-untyped-def]
    while True:
        while len(buf) >= 8:
            size, ft = FRAME.unpack_from(buf)
            if len(buf) < 4 + size:
                break
            data = bytes(buf[8 : 4 + size])
            del buf[: 4 + size]
            yield ft, data
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    s.sendall(b"  V2")
    return s


class Load:
    def __init__(self, port: int, publishers: int, consumers: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.stop_publishing = threading.Event()
        self.lock = threading.Lock()
        self.acked: set[bytes] = set()
        self.seen: collections.Counter[bytes] = collections.Counter()
        self.threads = [threading.Thread(target=self._publish, args=(i,), daemon=True) for i in range(publishers)]
        self.threads += [threading.Thread(target=self._consume, daemon=True) for _ in range(consumers)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _publish(self, n: int) -> None:
        seq = 0
        rng = random.Random(n)
        while not self.stop_publishing.is_set():
            try:
                s = _connect(self.port)
            except OSError:
                time.sleep(0.02)
                continue
            buf = bytearray()
            frames = _frames(s, buf)
            try:
                while not self.stop_publishing.is_set():
                    count = rng.choice((1, 1, 5, 20))
                    bodies = [b"p%d-%d" % (n, seq + i) for i in range(count)]
                    seq += count
                    if count == 1:
                        s.sendall(b"PUB %s\n" % TOPIC.encode() + struct.pack(">I", len(bodies[0])) + bodies[0])
                    else:
                        payload = struct.pack(">I", count) + b"".join(struct.pack(">I", len(b)) + b for b in bodies)
                        s.sendall(b"MPUB %s\n" % TOPIC.encode() + struct.pack(">I", len(payload)) + payload)
                    ft, data = next(frames)
                    while ft == 0 and data == b"_heartbeat_":
                        s.sendall(b"NOP\n")
                        ft, data = next(frames)
                    if ft == 0 and data == b"OK":
                        with self.lock:
                            self.acked.update(bodies)
                    else:
                        raise ConnectionError(data)
            except (OSError, ConnectionError, StopIteration):
                pass
            finally:
                s.close()

    def _consume(self) -> None:
        while not self.stop.is_set():
            try:
                s = _connect(self.port)
                s.sendall(b"SUB %s %s\nRDY 50\n" % (TOPIC.encode(), CHANNEL.encode()))
            except OSError:
                time.sleep(0.02)
                continue
            s.settimeout(0.5)
            buf = bytearray()
            frames = _frames(s, buf)
            try:
                while not self.stop.is_set():
                    try:
                        ft, data = next(frames)
                    except TimeoutError:
                        continue
                    if ft == 2:
                        with self.lock:
                            self.seen[data[26:]] += 1
                        s.sendall(b"FIN " + data[10:26] + b"\n")
                    elif ft == 0 and data == b"_heartbeat_":
                        s.sendall(b"NOP\n")
                    elif ft == 1:
                        raise ConnectionError(data)
            except (OSError, ConnectionError, StopIteration):
                pass
            finally:
                s.close()


def run(kills: int = 20, seed: int | None = None, publishers: int = 2, consumers: int = 2, log=print) -> dict:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    stats: dict = {}
    data = tempfile.mkdtemp(prefix="nsq-crash-")
    # a message in flight to a consumer that went away unnoticed comes back at its
    # timeout: 5 s, so the drain below (60 s) always outlasts it, even on a busy machine
    args = ["--mem-queue-size", "0", "--sync-every", "1", "--msg-timeout", "5s", "--data-path", data]
    args += ["--log-level", "warn"]
    # each start binds new ports (port 0): the ports of a killed nsqd may be taken
    # by another process before the restart binds them
    proc = ServerProcess("nsqd", "-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0", *args[:-2])
    proc.start()
    load = Load(proc.port(), publishers, consumers)
    load.start()
    try:
        for k in range(kills):
            time.sleep(rng.uniform(0.2, 1.2))
            proc.kill()
            log(f"kill {k + 1}/{kills}: {len(load.acked)} acknowledged, {len(load.seen)} seen so far")
            proc = ServerProcess("nsqd", "-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0", *args[:-2])
            proc.start()
            load.port = proc.port()  # the clients reconnect there
        load.stop_publishing.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with load.lock:
                missing = load.acked - set(load.seen)
            if not missing:
                break
            time.sleep(0.1)
        stats = _channel_stats(proc.addresses["HTTP"])
    finally:
        load.stop.set()
        load.stop_publishing.set()
        for t in load.threads:
            t.join(5)
        code = proc.stop()
        shutil.rmtree(data, ignore_errors=True)
    with load.lock:
        lost = load.acked - set(load.seen)
        delivered = sum(load.seen.values())
        duplicates = delivered - len(load.seen)
        return {
            "kills": kills,
            "acknowledged": len(load.acked),
            "delivered": delivered,
            "unique_delivered": len(load.seen),
            "lost": len(lost),
            "duplicates": duplicates,
            "duplicate_rate": round(duplicates / max(1, len(load.seen)), 4),
            "final_exit_code": code,
            "lost_sample": sorted(x.decode() for x in lost)[:10],
            # where the channel stood when the drain ended: what nsqd still holds is not lost
            "channel_at_end": stats,
        }


def _channel_stats(http: str) -> dict:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{http}/stats?format=json&topic={TOPIC}", timeout=10) as resp:
            data = json.loads(resp.read())
    except OSError as e:
        return {"error": str(e)}
    for t in data.get("topics") or []:
        for c in t["channels"]:
            keys = ("depth", "backend_depth", "in_flight_count", "deferred_count", "client_count")
            return {"topic_depth": t["depth"], **{k: c[k] for k in keys}}
    return {}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--publishers", type=int, default=2)
    p.add_argument("--consumers", type=int, default=2)
    a = p.parse_args()
    result = run(a.kills, a.seed, a.publishers, a.consumers, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
