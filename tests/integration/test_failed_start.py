"""A start that fails writes nothing: nsqd as a process, under ``nsqd`` and ``twistd nsqd``.

Go nsqd exits with one FATAL line and leaves the data path as it found it. A
second nsqd refused by the data-path lock must not rewrite the running node's
``nsqd.dat``, and neither may a corrupt ``nsqd.dat``, a read-only data path or
a port in use.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import socket
import subprocess
import time

import treq
from twisted.internet import defer
from twisted.trial import unittest

from tests.integration.procs import ServerProcess, command

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")
METADATA = b'{"topics":[{"name":"kept","paused":true,"channels":[{"name":"c","paused":true}]}],"version":"1.3.0"}'


class FailedStartTests(unittest.TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.dat = os.path.join(self.dir, "nsqd.dat")

    def write_metadata(self, data: bytes = METADATA) -> None:
        with open(self.dat, "wb") as f:
            f.write(data)

    def metadata(self) -> bytes:
        with open(self.dat, "rb") as f:
            return f.read()

    def run_nsqd(self, *args: str, argv: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        argv = argv if argv is not None else [*command("nsqd"), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)

    def assertFailedCleanly(self, out: subprocess.CompletedProcess[str], fatal: str) -> None:
        """Exit 1 after exactly one FATAL line, which says ``fatal``; nothing else went wrong."""
        self.assertEqual(out.returncode, 1, out.stderr)
        fatals = [line for line in out.stderr.splitlines() if " FATAL: " in line]
        self.assertEqual(len(fatals), 1, out.stderr)
        self.assertIn(f"FATAL: {fatal}", fatals[0])
        self.assertNotIn("NSQ: bye", out.stderr)
        self.assertNotIn("Traceback", out.stderr)
        self.assertTrue(out.stderr.rstrip("\n").endswith(fatals[0]), "the FATAL line is the last one")
        self.assertEqual(glob.glob(os.path.join(self.dir, "*.tmp")), [])

    @defer.inlineCallbacks
    def test_a_refused_second_nsqd_leaves_the_running_nodes_metadata(self):
        first = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.dir).start()
        self.addCleanup(first.kill)
        http = first.addresses["HTTP"]
        paths = ("/topic/create?topic=t1", "/channel/create?topic=t1&channel=c1", "/channel/pause?topic=t1&channel=c1")
        for path in paths:
            resp = yield treq.post(f"http://{http}{path}", persistent=False)
            self.assertEqual(resp.code, 200)
            yield resp.content()
        before = self.metadata()  # pause answers once nsqd.dat is on disk
        self.assertIn(b'"name":"c1","paused":true', before)

        out = self.run_nsqd(*LOOPBACK, "--data-path", self.dir)
        self.assertFailedCleanly(
            out,
            f"failed to instantiate nsqd - failed to lock data-path: cannot flock directory {self.dir} - "
            "resource temporarily unavailable (possibly in use by another instance of nsqd)",
        )
        self.assertEqual(self.metadata(), before)

        # the first node stops and starts again: its topics, channels and pause states are there
        self.assertEqual(first.stop(), 0)
        again = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.dir).start()
        self.addCleanup(again.kill)
        resp = yield treq.get(f"http://{again.addresses['HTTP']}/stats?format=json&topic=t1", persistent=False)
        stats = json.loads((yield resp.content()))
        channels = stats["topics"][0]["channels"]
        self.assertEqual([(c["channel_name"], c["paused"]) for c in channels], [("c1", True)])

    def test_a_corrupt_nsqd_dat_is_left_byte_identical(self) -> None:
        self.write_metadata(b'{"topics":[{"name":"a"')
        out = self.run_nsqd(*LOOPBACK, "--data-path", self.dir)
        self.assertFailedCleanly(
            out, f"failed to load metadata - failed to parse metadata in {self.dat} - unexpected end of JSON input"
        )
        self.assertEqual(self.metadata(), b'{"topics":[{"name":"a"')

    def test_an_nsqd_dat_that_is_not_a_file_is_refused(self) -> None:
        """A named pipe in nsqd.dat's place blocked the start in open() (Go: before
        listening; nsq-tw: after, deaf to SIGTERM): refused with one FATAL line."""
        os.mkfifo(self.dat)
        out = self.run_nsqd(*LOOPBACK, "--data-path", self.dir)
        self.assertFailedCleanly(
            out,
            f"failed to load metadata - failed to read metadata from {self.dat} - nsqd.dat is a named pipe, "
            "not a regular file",
        )
        os.remove(self.dat)
        os.mkdir(self.dat)
        out = self.run_nsqd(*LOOPBACK, "--data-path", self.dir)
        self.assertFailedCleanly(
            out,
            f"failed to load metadata - failed to read metadata from {self.dat} - nsqd.dat is a directory, "
            "not a regular file",
        )

    def test_go_json_texts_for_a_corrupt_nsqd_dat(self) -> None:
        cases = [
            (b"{]", "invalid character ']' looking for beginning of object key string"),
            (b'{"topics":5,"version":"1.3.0"}', "json: cannot unmarshal number into Go struct field "),
            (b"[" * 5000, "unexpected end of JSON input"),
        ]
        for data, text in cases:
            self.write_metadata(data)
            out = self.run_nsqd(*LOOPBACK, "--data-path", self.dir)
            self.assertFailedCleanly(out, f"failed to load metadata - failed to parse metadata in {self.dat} - {text}")
            self.assertEqual(self.metadata(), data)

    def test_a_read_only_data_path_writes_nothing(self) -> None:
        self.write_metadata()
        argv = [*command("nsqd"), *LOOPBACK, "--data-path", self.dir]
        d = shlex.quote(self.dir)
        script = f"mount --bind {d} {d} && mount -o remount,ro,bind {d} && exec {shlex.join(argv)}"
        ns = ["unshare", "-m", "--propagation", "private"] if os.geteuid() == 0 else ["unshare", "-U", "-r", "-m"]
        out = self.run_nsqd(argv=[*ns, "sh", "-c", script])
        self.assertFailedCleanly(out, f"failed to persist metadata - open {self.dat}.")
        self.assertRegex(out.stderr, r"nsqd\.dat\.\d+\.tmp: read-only file system")
        self.assertEqual(self.metadata(), METADATA)

    def test_a_port_in_use_writes_nothing(self) -> None:
        self.write_metadata()
        busy = socket.socket()
        self.addCleanup(busy.close)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        addr = "127.0.0.1:%d" % busy.getsockname()[1]
        out = self.run_nsqd("-tcp-address", addr, "-http-address", "127.0.0.1:0", "--data-path", self.dir)
        in_use = f"listen tcp {addr}: bind: address already in use"
        self.assertFailedCleanly(out, f"failed to instantiate nsqd - listen ({addr}) failed - {in_use}")
        self.assertEqual(self.metadata(), METADATA)
        self.assertEqual(sorted(os.listdir(self.dir)), ["nsqd.dat"])

    @defer.inlineCallbacks
    def test_twistd_refused_by_the_lock_writes_nothing(self):
        first = ServerProcess("nsqd", *LOOPBACK, "--data-path", self.dir).start()
        self.addCleanup(first.kill)
        resp = yield treq.get(f"http://{first.addresses['HTTP']}/ping", persistent=False)
        self.assertEqual((yield resp.content()), b"OK")  # started: nsqd.dat is written
        before = self.metadata()
        argv = [*command("twistd"), "-n", "--pidfile=", "--logfile=-", "nsqd", *LOOPBACK, "--data-path", self.dir]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertNotIn("Traceback", out.stdout + out.stderr)
        self.assertNotIn("NSQ: bye", out.stdout + out.stderr)
        self.assertIn("failed to instantiate nsqd - failed to lock data-path", out.stdout + out.stderr)
        self.assertEqual(self.metadata(), before)
        self.assertEqual(first.stop(), 0)


class EarlySignalTests(unittest.TestCase):
    """Signals sent the moment the listening lines appear still stop nsqd cleanly."""

    timeout = 120

    def start(self, **kw) -> ServerProcess:
        path = self.mktemp()
        os.makedirs(path)
        proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", path, **kw).start()
        self.addCleanup(proc.kill)
        return proc

    def test_sigterm_and_sigint_right_after_listening(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT) * 5:
            proc = self.start()  # returns as soon as the HTTP line is read
            proc.signal(sig)
            self.assertEqual(proc.wait(), 0, (sig, proc.lines))
            self.assertTrue(any("NSQ: bye" in line for line in proc.lines), proc.lines)

    def test_a_signal_during_start_stops_once_started(self) -> None:
        """A signal sent while nsqd is still starting (after its first line) is
        not lost and does not kill it halfway: it stops cleanly once started."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            path = self.mktemp()
            os.makedirs(path)
            proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", path)
            self.addCleanup(proc.kill)
            proc.start(wait_for=())
            deadline = time.monotonic() + 30
            while not any(" INFO: ID: " in line for line in proc.lines):
                self.assertLess(time.monotonic(), deadline, proc.lines)
                time.sleep(0.001)
            proc.signal(sig)
            self.assertEqual(proc.wait(), 0, (sig, proc.lines))
            self.assertTrue(any("NSQ: bye" in line for line in proc.lines), proc.lines)

    def test_a_second_signal_is_ignored(self) -> None:
        """As Go's: the first SIGTERM/SIGINT stops nsqd; more while it stops change nothing."""
        for first, second in ((signal.SIGINT, signal.SIGTERM), (signal.SIGTERM, signal.SIGTERM)):
            proc = self.start()
            proc.signal(first)
            for _ in range(5):
                proc.signal(second)
            self.assertEqual(proc.wait(), 0, proc.lines)
            self.assertFalse([line for line in proc.lines if "FATAL" in line or "Traceback" in line], proc.lines)
            self.assertTrue(any("NSQ: bye" in line for line in proc.lines), proc.lines)

    def test_signals_until_the_very_end_are_ignored(self) -> None:
        """A signal that arrives while the process exits (scripts/run forwards
        Ctrl-C as SIGTERM; a terminal sends SIGINT too) must not kill it: Python
        restores the default action of its handled signals as it finalizes."""
        for name, extra in (("nsqd", ["--data-path"]), ("nsqlookupd", [])):
            for _ in range(3):
                args = [*LOOPBACK, *extra]
                if extra:
                    path = self.mktemp()
                    os.makedirs(path)
                    args.append(path)
                proc = ServerProcess(name, *args).start()
                self.addCleanup(proc.kill)
                proc.signal(signal.SIGINT)
                assert proc.proc is not None
                while proc.proc.poll() is None:
                    proc.signal(signal.SIGTERM)
                    time.sleep(0.0002)
                self.assertEqual(proc.wait(), 0, (name, proc.lines))
                self.assertFalse([line for line in proc.lines if "Traceback" in line], proc.lines)

    def test_a_second_signal_under_twistd(self) -> None:
        path = self.mktemp()
        os.makedirs(path)
        argv = [*command("twistd"), "-n", "--pidfile=", "--logfile=-", "nsqd", *LOOPBACK, "--data-path", path]
        proc = ServerProcess("twistd", argv=argv, stdout=True).start()
        self.addCleanup(proc.kill)
        proc.signal(signal.SIGINT)
        for _ in range(5):
            proc.signal(signal.SIGTERM)
        self.assertIn(proc.wait(), (0, -signal.SIGINT), "twistd re-raises the first signal")
        self.assertFalse([line for line in proc.lines if "Traceback" in line], proc.lines)
        self.assertTrue(any("NSQ: bye" in line for line in proc.lines), proc.lines)

    def test_sigint_stops_nsqd_that_inherited_it_ignored(self) -> None:
        proc = self.start(preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        proc.signal(signal.SIGINT)
        self.assertEqual(proc.wait(), 0, proc.lines)
        self.assertTrue(any("NSQ: bye" in line for line in proc.lines), proc.lines)
