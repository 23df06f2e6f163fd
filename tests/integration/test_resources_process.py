"""nsqd and nsqlookupd processes against resource abuse: the open files limit,
accept() failures when it is reached, and HTTP clients that drip their request."""

from __future__ import annotations

import os
import re
import resource
import select
import socket
import sys
import time
from pathlib import Path

from twisted.trial import unittest

from tests.integration.procs import ServerProcess, command

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")

# run the command with RLIMIT_NOFILE set, as the same process (exec keeps the pid)
_WITH_NOFILE = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execvp(sys.argv[3], sys.argv[3:])"
)


def with_nofile(soft: int, hard: int, argv: list[str]) -> list[str]:
    return [sys.executable, "-c", _WITH_NOFILE, str(soft), str(hard), *argv]


def open_files_limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open files line")


def ping(port: int) -> bytes:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return out
            out += chunk
    finally:
        s.close()


def wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class ProcessTestCase(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)

    def start(self, name: str, argv: list[str]) -> ServerProcess:
        proc = ServerProcess(name, argv=argv, cwd=self.dir).start()
        self.addCleanup(proc.kill)
        return proc


class OpenFilesLimitTests(ProcessTestCase):
    def check_raised(self, name: str, *args: str) -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard <= 256:
            raise unittest.SkipTest(f"needs a finite hard RLIMIT_NOFILE above 256 (is {hard})")
        proc = self.start(name, with_nofile(256, hard, [*command(name), *LOOPBACK, *args]))
        assert proc.proc is not None
        self.assertEqual(open_files_limit(proc.proc.pid), (hard, hard))

    def test_nsqd_raises_the_soft_limit_to_the_hard_one(self) -> None:
        self.check_raised("nsqd", "--data-path", self.dir)

    def test_nsqlookupd_raises_the_soft_limit_to_the_hard_one(self) -> None:
        self.check_raised("nsqlookupd")


class AcceptFailureTests(ProcessTestCase):
    def test_out_of_file_descriptors_is_logged_and_recovered_from(self) -> None:
        limit = 64
        proc = self.start("nsqd", with_nofile(limit, limit, [*command("nsqd"), *LOOPBACK, "--data-path", self.dir]))
        assert proc.proc is not None
        tcp, http = proc.port("TCP"), proc.port("HTTP")
        failed = re.compile(r"ERROR: TCP: accept\(\) failed.* - EMFILE \(too many open files\), open files limit")
        held: list[socket.socket] = []
        try:
            # V2 clients that say nothing after the magic hold a descriptor each
            for _ in range(limit * 2):
                s = socket.create_connection(("127.0.0.1", tcp), timeout=5)
                s.sendall(b"  V2")
                held.append(s)
                if any(failed.search(line) for line in proc.lines):
                    break
                time.sleep(0.01)
            wait_for(lambda: any(failed.search(line) for line in proc.lines), 30, "the accept() failure line")
            line = next(line for line in proc.lines if failed.search(line))
            self.assertIn(f"limit (soft RLIMIT_NOFILE) {limit}", line)
        finally:
            for s in held:
                s.close()

        # descriptors freed: new clients are served again
        def serves() -> bool:
            try:
                return ping(http).endswith(b"\r\n\r\nOK")
            except OSError:
                return False

        wait_for(serves, 30, "/ping to answer again")
        self.assertEqual(proc.proc.poll(), None)


class SlowlorisTests(ProcessTestCase):
    def dripping_clients_are_closed(self, name: str, *args: str) -> None:
        proc = self.start(name, [*command(name), *LOOPBACK, *args])
        http = proc.port("HTTP")
        socks = []
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", http), timeout=5)
            s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Drip: ")
            s.setblocking(False)
            socks.append(s)
        open_ = set(socks)
        # a byte a second resets an idle timer; the header deadline (10 s) must still
        # close them. Two minutes at most, to fail rather than hang.
        deadline = time.monotonic() + 120
        served_meanwhile = False
        while open_ and time.monotonic() < deadline:
            for s in list(open_):
                try:
                    s.send(b"a")
                except OSError:
                    pass
            ready, _, _ = select.select(list(open_), [], [], 1.0)
            for s in ready:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    open_.discard(s)
                else:
                    self.fail(f"an answer to an unfinished request: {data!r}")
            if not served_meanwhile and open_:
                self.assertTrue(ping(http).endswith(b"\r\n\r\nOK"))
                served_meanwhile = True
        for s in socks:
            s.close()
        self.assertEqual(len(open_), 0, "dripping connections still open")
        self.assertTrue(served_meanwhile)
        self.assertTrue(ping(http).endswith(b"\r\n\r\nOK"))

    def test_nsqd(self) -> None:
        self.dripping_clients_are_closed("nsqd", "--data-path", self.dir)

    def test_nsqlookupd(self) -> None:
        self.dripping_clients_are_closed("nsqlookupd")
