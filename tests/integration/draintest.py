"""Drain test: a backlog, two consumers, SIGTERM under ``--sigterm-mode drain``.

    python -m tests.integration.draintest --messages 200000 [--twistd] [-- NSQD FLAGS]

nsqd (a process, on loopback port 0) gets a backlog of MPUBs on topic ``drain``,
channel ``ch``; two consumers subscribe and FIN everything they get; then nsqd
gets SIGTERM. As soon as ``/ping`` says it drains, a PUB over TCP and a
``POST /pub`` must be refused; the consumers must get every message; nsqd must
exit by itself, leaving ``nsqd.dat`` and no queue file. :func:`run` returns
what happened and how long it took; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from nsq_client.blocking import Connection, ConnectOptions, TLSConfig
from nsq_wire.errors import NSQError
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, HEARTBEAT
from nsq_wire.message import ID_OFFSET, MSG_ID_LENGTH
from tests.integration.procs import ServerProcess, command

TOPIC = "drain"
CHANNEL = "ch"
BATCH = 1000  # messages per MPUB
RDY = 500


def http(address: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """One request to nsqd's HTTP port: (status, body), errors included."""
    req = urllib.request.Request(f"http://{address}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def answer(response: tuple[int, bytes]) -> str:
    """An HTTP answer as one line: ``503 {"message":"DRAINING"}``."""
    return f"{response[0]} {response[1].decode(errors='replace')}"


def wait_for(check: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")
        time.sleep(0.01)


def connection(port: int) -> Connection:
    return Connection(f"127.0.0.1:{port}", ConnectOptions(TLSConfig())).open()


class Consumers:
    """Threads that SUB with RDY and FIN every message until nsqd closes them."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.lock = threading.Lock()
        self.ids: set[bytes] = set()
        self.delivered = 0
        self.errors: list[bytes] = []
        self.subscribed = threading.Barrier(count + 1)
        self.threads = [threading.Thread(target=self._consume, daemon=True) for _ in range(count)]
        for t in self.threads:
            t.start()

    def _consume(self) -> None:
        conn = connection(self.port)
        conn.subscribe(TOPIC, CHANNEL)
        conn.rdy(RDY)
        self.subscribed.wait()
        try:
            while True:
                ids = []
                for frame_type, data in conn.read_frames():
                    if frame_type == FRAME_TYPE_MESSAGE:
                        ids.append(data[ID_OFFSET : ID_OFFSET + MSG_ID_LENGTH])
                    elif frame_type == FRAME_TYPE_RESPONSE and data == HEARTBEAT:
                        conn.send(b"NOP\n")
                    elif frame_type == FRAME_TYPE_ERROR:
                        with self.lock:
                            self.errors.append(data)
                conn.fin(ids)
                with self.lock:
                    self.ids.update(ids)
                    self.delivered += len(ids)
        except (NSQError, OSError):
            pass  # nsqd stopped
        finally:
            conn.close()

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)


def publish_backlog(port: int, messages: int) -> None:
    conn = connection(port)
    try:
        bodies = [b"%0100d" % i for i in range(messages)]
        conn.publish(TOPIC, [bodies[i : i + BATCH] for i in range(0, messages, BATCH)])
    finally:
        conn.close()


def refused_pub(port: int) -> str:
    """What a PUB over TCP gets while nsqd drains (the error frame's text)."""
    conn = connection(port)
    try:
        conn.send(b"PUB %s\n" % TOPIC.encode() + (1).to_bytes(4, "big") + b"x")
        return conn.read_response().decode()
    except NSQError as e:
        return str(e)
    finally:
        conn.close()


def queue_files(data: str) -> list[str]:
    return sorted(f for f in os.listdir(data) if ".diskqueue." in f)


def start_nsqd(data: str, twistd: bool, *args: str) -> ServerProcess:
    flags = ["--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--data-path", data, *args]
    if twistd:
        argv = [*command("twistd"), "-n", "--pidfile=", "--logfile=-", "nsqd", *flags]
        return ServerProcess("twistd", argv=argv, cwd=data, stdout=True).start()
    return ServerProcess("nsqd", *flags, cwd=data).start()


def run(
    messages: int = 200_000, consumers: int = 2, twistd: bool = False, log: Any = print, nsqd_args: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The whole scenario; what it saw, as a dict (see the module docstring).
    ``nsqd_args``: more flags for nsqd (``--mem-queue-size 0 --sync-every 1``)."""
    data = tempfile.mkdtemp(prefix="nsq-drain-")
    proc = start_nsqd(data, twistd, "--sigterm-mode", "drain", *nsqd_args)
    try:
        port, address = proc.port(), proc.addresses["HTTP"]
        http(address, "POST", f"/topic/create?topic={TOPIC}")
        http(address, "POST", f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
        started = time.monotonic()
        publish_backlog(port, messages)
        published = time.monotonic() - started
        log(f"published {messages} messages in {published:.2f}s")
        group = Consumers(port, consumers)
        group.subscribed.wait(30)
        sigterm_at = time.monotonic()
        proc.signal(signal.SIGTERM)
        wait_for(lambda: http(address, "GET", "/ping")[0] == 503, "/ping to answer 503")
        refused = {
            "tcp": refused_pub(port),
            "http": answer(http(address, "POST", f"/pub?topic={TOPIC}", b"x")),
            "ping": answer(http(address, "GET", "/ping")),
        }
        left_at_refusal = messages - len(group.ids)
        code = proc.wait(timeout=600)
        drained = time.monotonic() - sigterm_at
        group.join(30)
        with open(os.path.join(data, "nsqd.dat")) as f:
            metadata = json.load(f)
        result = {
            "messages": messages,
            "publish_seconds": round(published, 3),
            "drain_seconds": round(drained, 3),
            "drain_msgs_per_second": round(messages / drained),
            "left_when_refusing": left_at_refusal,
            "unique_delivered": len(group.ids),
            "delivered": group.delivered,
            "consumer_errors": [e.decode() for e in group.errors],
            "refused": refused,
            "exit_code": code,
            "queue_files": queue_files(data),
            "metadata_topics": metadata["topics"],
            "drain_lines": [line for line in proc.lines if "DRAIN:" in line],
        }
        log(f"drained in {drained:.2f}s ({result['drain_msgs_per_second']} msgs/s), exit {code}")
        return result
    finally:
        proc.kill()
        shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--twistd", action="store_true", help="run twistd nsqd instead of nsqd")
    parser.add_argument("nsqd_args", nargs="*", help="more nsqd flags, after --")
    args = parser.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    result = run(args.messages, args.consumers, args.twistd, log, tuple(args.nsqd_args))
    print(json.dumps(result, indent=2))
    ok = result["exit_code"] == 0 and result["unique_delivered"] == args.messages and not result["queue_files"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
