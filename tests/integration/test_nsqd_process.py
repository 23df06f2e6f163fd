"""nsqd as a real process: flags, log lines, signals, restarts, bad clients."""

import signal
import socket
import struct
import subprocess
import time

import treq
from twisted.internet import defer, reactor
from twisted.trial import unittest

from nsq_client.twisted_client import Consumer, connect
from tests.integration.procs import ServerProcess, command

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")


class ProcessTestCase(unittest.TestCase):
    timeout = 60

    def start(self, *args: str, **kw) -> ServerProcess:
        proc = ServerProcess("nsqd", *args, cwd=self.mktemp_dir(), **kw).start()
        self.addCleanup(proc.kill)
        return proc

    def mktemp_dir(self) -> str:
        import os

        path = self.mktemp()
        os.makedirs(path)
        return path


class CommandLineTests(ProcessTestCase):
    def test_version(self) -> None:
        out = subprocess.run([*command("nsqd"), "--version"], capture_output=True, text=True, check=True)
        self.assertRegex(out.stdout, r"^nsqd v1\.3\.0 \(built w/python3\.\d+\.\d+\)\n$")

    def test_bad_flag_exits_2(self) -> None:
        out = subprocess.run([*command("nsqd"), "-no-such-flag"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 2)

    def test_bad_node_id_is_fatal(self) -> None:
        out = subprocess.run([*command("nsqd"), *LOOPBACK, "--node-id", "5000"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 1)
        self.assertRegex(
            out.stderr,
            r"\[nsqd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} FATAL: failed to instantiate nsqd - "
            r"--node-id must be \[0,1024\)",
        )

    def test_port_in_use_is_fatal(self) -> None:
        first = self.start(*LOOPBACK)
        tcp = first.addresses["TCP"]
        out = subprocess.run(
            [*command("nsqd"), "-tcp-address", tcp, "-http-address", "127.0.0.1:0"], capture_output=True, text=True
        )
        self.assertEqual(out.returncode, 1)
        self.assertIn(f"FATAL: failed to instantiate nsqd - listen ({tcp}) failed", out.stderr)


class LifecycleTests(ProcessTestCase):
    def test_log_lines(self) -> None:
        proc = self.start(*LOOPBACK, "--verbose")
        self.assertRegex(proc.addresses["TCP"], r"^127\.0\.0\.1:\d+$")
        self.assertRegex(proc.addresses["HTTP"], r"^127\.0\.0\.1:\d+$")
        self.assertTrue(any(" INFO: nsqd v1.3.0 (built w/python" in line for line in proc.lines), proc.lines)
        self.assertTrue(any(line.startswith("[nsqd] ") for line in proc.lines))

    @defer.inlineCallbacks
    def test_ping_soon_after_start(self):
        started = time.monotonic()
        proc = self.start(*LOOPBACK)
        resp = yield treq.get(f"http://{proc.addresses['HTTP']}/ping", persistent=False)
        self.assertEqual((resp.code, (yield resp.content())), (200, b"OK"))
        self.assertLess(time.monotonic() - started, 3.0, "clients wait at most 2-3 s for /ping")

    @defer.inlineCallbacks
    def test_publish_consume_then_sigterm(self):
        proc = self.start(*LOOPBACK)
        port = proc.port()
        done: defer.Deferred = defer.Deferred()
        got = []

        def handle(msg):
            got.append(msg.body)
            if len(got) == 3:
                done.callback(None)

        consumer = yield Consumer.connect(reactor, "127.0.0.1", port, "t", "c", handle, max_in_flight=10)
        producer = yield connect(reactor, "127.0.0.1", port)
        yield producer.pub("t", b"a")
        yield producer.mpub("t", [b"b", b"c"])
        yield done
        self.assertEqual(sorted(got), [b"a", b"b", b"c"])
        yield consumer.close()
        producer.close()
        yield producer.closed_d
        proc.signal(signal.SIGTERM)
        self.assertEqual(proc.wait(), 0)
        self.assertTrue(any("NSQ: bye" in line for line in proc.lines))

    def test_sigint_is_clean(self) -> None:
        proc = self.start(*LOOPBACK)
        proc.signal(signal.SIGINT)
        self.assertEqual(proc.wait(), 0)

    @defer.inlineCallbacks
    def test_restart_on_same_ports_after_kill(self):
        proc = self.start(*LOOPBACK)
        tcp, http = proc.addresses["TCP"], proc.addresses["HTTP"]
        producer = yield connect(reactor, "127.0.0.1", proc.port())
        yield producer.pub("t", b"x")
        proc.kill()
        yield producer.closed_d
        again = self.start("-tcp-address", tcp, "-http-address", http)
        self.assertEqual((again.addresses["TCP"], again.addresses["HTTP"]), (tcp, http))
        producer = yield connect(reactor, "127.0.0.1", again.port())
        self.assertEqual((yield producer.pub("t", b"y")), b"OK")
        producer.close()
        yield producer.closed_d

    @defer.inlineCallbacks
    def test_garbage_client_does_not_disturb_others(self):
        proc = self.start(*LOOPBACK)
        port = proc.port()
        producer = yield connect(reactor, "127.0.0.1", port)
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        s.settimeout(5)
        data = b""
        while chunk := s.recv(100):
            data += chunk
        s.close()
        self.assertEqual(data, struct.pack(">ii", 18, 1) + b"E_BAD_PROTOCOL")
        self.assertEqual((yield producer.pub("t", b"still fine")), b"OK")
        producer.close()
        yield producer.closed_d


class TwistdTests(ProcessTestCase):
    @defer.inlineCallbacks
    def test_twistd_nsqd(self):
        argv = [
            *command("twistd"),
            "-n",
            "--pidfile=",
            "--logfile=-",
            "nsqd",
            "--tcp-address",
            "127.0.0.1:0",
            "--http-address",
            "127.0.0.1:0",
        ]
        proc = ServerProcess("twistd", argv=argv, cwd=self.mktemp_dir(), stdout=True).start()
        self.addCleanup(proc.kill)
        producer = yield connect(reactor, "127.0.0.1", proc.port())
        self.assertEqual((yield producer.pub("t", b"via twistd")), b"OK")
        producer.close()
        yield producer.closed_d
        code = proc.stop()
        # twistd re-raises the terminating signal after a clean shutdown
        self.assertIn(code, (0, -signal.SIGTERM))
        self.assertTrue(any("NSQ: bye" in line for line in proc.lines), proc.lines)
