"""nsqd as a real process: flags, log lines, signals, restarts, bad clients."""

import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import time
import zlib

import treq
from twisted.internet import defer, reactor
from twisted.trial import unittest

from nsq_client.twisted_client import Consumer, connect
from nsq_wire.commands import encode_command
from tests.certs import make_certs
from tests.integration.procs import ServerProcess, command

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")
OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


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


SNAPPY_OK = b"\xff\x06\x00\x00sNaPpY\x01\x0e\x00\x00\x26\x98\x2b\xcf" + OK_FRAME


def identify(port: int, **fields: bool) -> tuple[socket.socket, bytes]:
    """A connection that sent IDENTIFY, and its first read."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(10)
    s.sendall(b"  V2" + encode_command(b"IDENTIFY", body=json.dumps({"feature_negotiation": True, **fields}).encode()))
    return s, s.recv(65536)


def whole_frame(s: socket.socket, data: bytes) -> bytes:
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        data += s.recv(65536)
    return data


class IdentifyWritesTests(ProcessTestCase):
    """The write boundaries a client sees after IDENTIFY negotiates compression.

    Without TLS, Go writes IDENTIFY's answer and the first compressed frame in two
    writes, and an asyncio client parses the answer from its first read: nsqd sends
    the answer alone and the compressed OK once its reactor has slept, so the first
    read of a client that is not descheduled in between holds the answer only. With
    TLS, the TLS OK and the compressed OK share one TLS record (pynsq 0.9.1 on
    tornado 6.1 copes only with that)."""

    def test_without_tls_the_first_read_is_the_answer_alone(self) -> None:
        port = self.start(*LOOPBACK).port()
        for codec in ("snappy", "deflate"):
            alone = 0
            for _ in range(50):
                s, first = identify(port, **{codec: True})
                data = whole_frame(s, first)
                size = 4 + struct.unpack(">i", data[:4])[0]
                answer, rest = data[:size], data[size:]
                alone += first == answer
                self.assertTrue(json.loads(answer[8:])[codec])
                while len(rest) < (len(SNAPPY_OK) if codec == "snappy" else 11):
                    rest += s.recv(65536)
                s.close()
                if codec == "snappy":
                    self.assertEqual(rest, SNAPPY_OK)
                else:
                    self.assertEqual(zlib.decompressobj(-15).decompress(rest), OK_FRAME)
            # A client descheduled for longer than ANSWER_ALONE reads both
            # writes at once (as it would from Go); one write would never
            # come apart, so a first read of the answer alone shows two.
            self.assertGreater(alone, 0, codec)

    def test_with_tls_the_tls_ok_and_the_compressed_ok_are_one_record(self) -> None:
        files = make_certs(os.path.abspath(self.mktemp_dir()))
        tls = ("--tls-cert", files.cert, "--tls-key", files.key, "-https-address", "127.0.0.1:0")
        port = self.start(*LOOPBACK, *tls).port()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # as clients force
        for codec in ("snappy", "deflate"):
            s, first = identify(port, tls_v1=True, **{codec: True})
            answer = whole_frame(s, first)
            self.assertEqual(len(answer), 4 + struct.unpack(">i", answer[:4])[0], "nothing more before TLS")
            with ctx.wrap_socket(s) as t:
                record = t.recv(65536)  # one TLS record's plaintext
            self.assertEqual(record[:10], OK_FRAME)
            if codec == "snappy":
                self.assertEqual(record[10:], SNAPPY_OK)
            else:
                self.assertEqual(zlib.decompressobj(-15).decompress(record[10:]), OK_FRAME)


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
