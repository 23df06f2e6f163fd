"""Listening first: nsqd and nsqlookupd as processes accept connections before
they load Twisted, and serve them once started.

Client harnesses start a server and connect after a short sleep; a connection
that arrives during the start must wait in the listen backlog, not be refused.
To see that without timing anything, the servers run with a ``sitecustomize``
that holds the first import of Twisted until the test opens a FIFO: whatever
the server does before that (parse its flags, listen), it has done.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import subprocess
import sys
import time

from twisted.internet import defer
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from nsq_wire.commands import auth as auth_command
from nsq_wire.commands import identify, pub
from nsq_wire.frames import MAGIC_V2
from nsq_wire.v1 import MAGIC_V1
from tests.integration.procs import ServerProcess, command
from tests.nsqd_tw.test_security import AuthServer, certs

_GATE = '''
import os
import sys


class _HoldTwisted:
    """Wait for the test before the first import of Twisted."""

    def find_spec(self, name, path=None, target=None):
        if name == "twisted" or name.startswith("twisted."):
            sys.meta_path.remove(self)
            with open(os.environ["NSQ_TEST_TWISTED_GATE"], "rb") as gate:
                gate.read()
        return None


sys.meta_path.insert(0, _HoldTwisted())
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HeldStart:
    """A server started with Twisted held back until :meth:`release`."""

    def __init__(self, case: unittest.TestCase, name: str, *args: str) -> None:
        where = os.path.abspath(case.mktemp())
        os.makedirs(where)
        with open(os.path.join(where, "sitecustomize.py"), "w") as f:
            f.write(_GATE)
        self.gate = os.path.join(where, "gate")
        os.mkfifo(self.gate)
        env = dict(os.environ, NSQ_TEST_TWISTED_GATE=self.gate)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [*command(name), *args],
            cwd=where,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        case.addCleanup(self.kill)
        self.released = False

    def release(self) -> None:
        """Let the server import Twisted (the FIFO's reader is opened first)."""
        if not self.released:
            self.released = True
            fd = os.open(self.gate, os.O_WRONLY)  # waits for the server to open it: it is at the gate
            os.close(fd)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        if not self.released:  # a server killed at the gate never opens the FIFO
            self.released = True
        self.proc.wait()
        assert self.proc.stderr is not None
        self.proc.stderr.close()

    def stderr_until(self, *needles: str, timeout: float = 60.0) -> list[str]:
        """The server's log lines up to the one that contains each of ``needles``."""
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        lines: list[str] = []
        buf = b""
        deadline = time.monotonic() + timeout
        while not all(any(n in line for line in lines) for n in needles):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {needles} in {lines}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"exited {self.proc.wait()}: {lines} {buf!r}")
            buf += chunk
            *complete, buf = buf.split(b"\n")
            lines += [raw.decode(errors="replace") for raw in complete]
        return lines


def connect_when_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> socket.socket:
    """Connect to 127.0.0.1:``port``, trying again while it is refused (the
    server is still starting), until it is accepted."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except ConnectionRefusedError:
            if proc.poll() is not None:
                raise AssertionError(f"exited {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise AssertionError(f"127.0.0.1:{port} never accepted a connection") from None
            select.select([], [], [], 0.002)  # a connect that is refused comes back at once
            continue
        s.settimeout(timeout)
        return s


def read_all(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def http_ping(s: socket.socket) -> bytes:
    s.sendall(b"GET /ping HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    while chunk := s.recv(4096):
        answer += chunk
    return answer


class ListenFirstTests(unittest.TestCase):
    timeout = 120

    def assert_serving(self, held: HeldStart, pinger: socket.socket, tcp: int, http: int) -> None:
        """/ping answered on the early connection, and the ports logged as Go logs them."""
        answer = http_ping(pinger)
        self.assertTrue(answer.startswith(b"HTTP/1.0 200 OK\r\n"), answer)
        self.assertTrue(answer.endswith(b"\r\n\r\nOK"), answer)
        lines = held.stderr_until("TCP: listening on", "HTTP: listening on")
        listening = [line.split(" INFO: ", 1)[1] for line in lines if ": listening on " in line]
        self.assertEqual(listening, [f"TCP: listening on 127.0.0.1:{tcp}", f"HTTP: listening on 127.0.0.1:{http}"])

    def test_nsqd_accepts_before_loading_twisted_and_serves_once_started(self) -> None:
        tcp, http = free_port(), free_port()
        data = os.path.abspath(self.mktemp())
        os.makedirs(data)
        held = HeldStart(
            self, "nsqd", "-tcp-address", f"127.0.0.1:{tcp}", "-http-address", f"127.0.0.1:{http}", "-data-path", data
        )
        producer = connect_when_listening(tcp, held.proc)
        self.addCleanup(producer.close)
        pinger = connect_when_listening(http, held.proc)
        self.addCleanup(pinger.close)
        # both accepted while the server waits at its first import of Twisted: the
        # bytes sent now are read once it is up
        producer.sendall(MAGIC_V2 + pub("early", b"published before nsqd was up"))
        held.release()
        self.assertEqual(read_all(producer, 10), b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
        self.assert_serving(held, pinger, tcp, http)
        # every later connection is accepted too: the socket was taken over, not closed and bound again
        for port in (tcp, http):
            socket.create_connection(("127.0.0.1", port), timeout=30).close()

    def test_nsqlookupd_accepts_before_loading_twisted_and_serves_once_started(self) -> None:
        tcp, http = free_port(), free_port()
        held = HeldStart(self, "nsqlookupd", "-tcp-address", f"127.0.0.1:{tcp}", "-http-address", f"127.0.0.1:{http}")
        peer = connect_when_listening(tcp, held.proc)
        self.addCleanup(peer.close)
        pinger = connect_when_listening(http, held.proc)
        self.addCleanup(pinger.close)
        peer.sendall(MAGIC_V1 + b"PING\n")
        held.release()
        size = struct.unpack(">i", read_all(peer, 4))[0]
        self.assertEqual(read_all(peer, size), b"OK")
        self.assert_serving(held, pinger, tcp, http)

    def test_a_port_in_use_fails_as_before(self) -> None:
        """The listening sockets bound first change nothing of a failed bind: Go's
        text, and for nsqd after the data path was checked."""
        busy = socket.socket()
        self.addCleanup(busy.close)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        addr = "127.0.0.1:%d" % busy.getsockname()[1]
        in_use = f"listen ({addr}) failed - listen tcp {addr}: bind: address already in use"
        data = os.path.abspath(self.mktemp())
        os.makedirs(data)
        for name, args, fatal in (
            ("nsqd", ("-http-address", addr, "-data-path", data), f"failed to instantiate nsqd - {in_use}"),
            ("nsqlookupd", ("-tcp-address", addr), f"failed to instantiate nsqlookupd - {in_use}"),
        ):
            out = subprocess.run(
                [*command(name), "-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0", *args],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn(f"FATAL: {fatal}", out.stderr)

    def test_a_locked_data_path_is_reported_before_a_port_in_use(self) -> None:
        data = os.path.abspath(self.mktemp())
        os.makedirs(data)
        first = ServerProcess(
            "nsqd", "-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0", "-data-path", data
        ).start()
        self.addCleanup(first.kill)
        taken = first.addresses["TCP"]
        out = subprocess.run(
            [*command("nsqd"), "-tcp-address", taken, "-http-address", "127.0.0.1:0", "-data-path", data],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        self.assertEqual(out.returncode, 1, out.stderr)
        fatal = [line for line in out.stderr.splitlines() if " FATAL: " in line]
        self.assertEqual(len(fatal), 1, out.stderr)
        self.assertIn("failed to instantiate nsqd - failed to lock data-path: ", fatal[0])
        self.assertIn("(possibly in use by another instance of nsqd)", fatal[0])


class WithoutTLSTests(unittest.TestCase):
    """Without --tls-cert, nsqd starts without pyOpenSSL (nsq_service.runtime.import_reactor)."""

    timeout = 120

    @defer.inlineCallbacks
    def test_an_https_auth_server_is_still_asked(self):
        auth = AuthServer()
        url = auth.listen(tls=True)
        self.addCleanup(auth.port.stopListening)
        auth.response = {
            "ttl": 3600,
            "identity": "alice",
            "authorizations": [{"topic": "^granted$", "channels": [".*"], "permissions": ["publish"]}],
        }
        proc = ServerProcess(
            "nsqd",
            *("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0"),
            *("-auth-http-address", url, "-tls-root-ca-file", certs().ca),
            cwd=os.path.abspath(self.mktemp()),
        )
        os.makedirs(proc.cwd)  # type: ignore[arg-type]
        proc.start()
        self.addCleanup(proc.kill)
        with open(f"/proc/{proc.proc.pid}/maps") as f:  # type: ignore[union-attr]
            self.assertNotIn("cryptography", f.read(), "pyOpenSSL loaded at start")

        def exchange() -> list[bytes]:
            with socket.create_connection(("127.0.0.1", proc.port()), timeout=30) as s:
                s.sendall(MAGIC_V2 + identify({"feature_negotiation": True}) + auth_command(b"secret"))
                answers = [read_frame(s), read_frame(s)]
                s.sendall(pub("granted", b"x"))
                answers.append(read_frame(s))
                return answers

        identified, authed, published = yield deferToThread(exchange)
        self.assertTrue(json.loads(identified)["auth_required"])
        self.assertEqual(json.loads(authed)["identity"], "alice")
        self.assertEqual(published, b"OK")
        self.assertEqual(auth.queries[0]["secret"], "secret")


def read_frame(s: socket.socket) -> bytes:
    size = struct.unpack(">i", read_all(s, 4))[0]
    return read_all(s, size)[4:]


if sys.platform != "linux":  # os.mkfifo and the listen backlog as on Linux
    del ListenFirstTests


IMPORTS = """
import sys
from nsq_service.runtime import import_reactor
reactor = import_reactor(False)
from lookupd_tw.http_api import LookupdHTTPAPI
from lookupd_tw.nsqlookupd import NSQLookupd
from lookupd_tw.options import NSQLookupdOptions
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.http.api import NSQDHTTPAPI
from nsqd_tw.options import NSQDOptions
NSQDHTTPAPI(NSQD(NSQDOptions(data_path=sys.argv[1]), reactor))
LookupdHTTPAPI(NSQLookupd(NSQLookupdOptions(), reactor))
print(sorted(m for m in ("OpenSSL", "werkzeug.serving", "werkzeug.test", "klein._form", "klein._session",
             "nsqd_tw.replication.primary") if m in sys.modules))
import klein, werkzeug
print(klein.Klein is sys.modules["klein._app"].Klein, werkzeug.Client.__module__, klein.Plating.__module__)
"""


class KleinImportTests(unittest.TestCase):
    def test_the_apis_load_klein_without_its_extras_and_the_rest_still_imports(self) -> None:
        """The HTTP APIs are Klein apps, imported without Klein's forms and sessions,
        werkzeug's server and test client, pyOpenSSL or the replication link
        (nsq_service.runtime.import_klein); importing Klein and werkzeug whole later
        still gives all of them."""
        data = self.mktemp()
        os.makedirs(data)
        out = subprocess.run([sys.executable, "-c", IMPORTS, data], capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.splitlines(), ["[]", "True werkzeug.test klein._plating"], out.stderr)
