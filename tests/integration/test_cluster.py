"""One nsqlookupd, three nsqd, consumers that only know the lookupd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import treq
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from nsq_client.twisted_client import LookupdConsumer
from tests.integration.procs import ServerProcess, command, eventually

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0")
START_TIMEOUT = 60.0  # a process start on a machine running other suites


@defer.inlineCallbacks
def get_json(url: str):
    resp = yield treq.get(url, persistent=False)
    body = yield resp.content()
    return json.loads(body)


@defer.inlineCallbacks
def post(url: str, data: bytes = b""):
    resp = yield treq.post(url, data, persistent=False)
    body = yield resp.content()
    assert resp.code == 200, (url, resp.code, body)
    return body


class _Cluster:
    """One nsqlookupd and three nsqd, as processes.

    Nothing here depends on how fast the machine is: nsqd PINGs its lookupds every
    15 s, so the inactive-producer timeout is either the default 300 s (no node
    ever drops out) or, where a test wants a frozen node to drop out, 30 s, twice
    the PING interval so that a live node under load does not; tombstones last an
    hour, longer than any test.
    """

    timeout = 300
    inactive_producer_timeout = "300s"

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.lookupd = ServerProcess(
            "nsqlookupd",
            *LOOPBACK,
            "--broadcast-address",
            "127.0.0.1",
            "--inactive-producer-timeout",
            self.inactive_producer_timeout,
            "--tombstone-lifetime",
            "1h",
            cwd=self.dir,
        ).start(timeout=START_TIMEOUT)
        self.addCleanup(self.lookupd.kill)
        self.lookupd_http = f"http://{self.lookupd.addresses['HTTP']}"
        self.nodes = [self.start_nsqd(i) for i in range(3)]

    def start_nsqd(self, i: int, tcp: str = "127.0.0.1:0", http: str = "127.0.0.1:0") -> ServerProcess:
        path = os.path.join(self.dir, f"nsqd{i}")
        os.makedirs(path, exist_ok=True)
        proc = ServerProcess(
            "nsqd",
            "-tcp-address",
            tcp,
            "-http-address",
            http,
            "--data-path",
            path,
            "--broadcast-address",
            "127.0.0.1",
            "--lookupd-tcp-address",
            self.lookupd.addresses["TCP"],
        ).start(timeout=START_TIMEOUT)
        self.addCleanup(proc.kill)
        return proc

    def producers(self, topic: str):
        return get_json(f"{self.lookupd_http}/lookup?topic={topic}").addCallback(
            lambda data: sorted(p["tcp_port"] for p in data["producers"])
        )


class InactiveNodeTests(_Cluster, unittest.TestCase):
    inactive_producer_timeout = "30s"

    @defer.inlineCallbacks
    def test_discover_drain_lose_a_node_and_get_it_back(self):
        yield eventually(lambda: get_json(f"{self.lookupd_http}/nodes").addCallback(lambda d: len(d["producers"]) == 3))
        for i, node in enumerate(self.nodes):
            yield post(
                f"http://{node.addresses['HTTP']}/mpub?topic=cluster", b"\n".join(b"n%d-%d" % (i, j) for j in range(10))
            )
        ports = sorted(n.port() for n in self.nodes)
        # each nsqd REGISTERs the new topic with the lookupd after answering the MPUB
        yield eventually(lambda: self.producers("cluster").addCallback(lambda p: p == ports))

        got: list[bytes] = []
        consumer = LookupdConsumer(
            reactor,
            [self.lookupd.addresses["HTTP"]],
            "cluster",
            "c",
            lambda m: got.append(m.body),
            max_in_flight=50,
            poll_interval=0.3,
        )
        yield consumer.start()
        self.addCleanup(consumer.stop)
        yield eventually(lambda: len(got) == 30)
        self.assertEqual(sorted(got), sorted(b"n%d-%d" % (i, j) for i in range(3) for j in range(10)))

        # a node that stops answering drops out after --inactive-producer-timeout
        frozen = self.nodes[2]
        frozen.signal(signal.SIGSTOP)
        self.addCleanup(frozen.signal, signal.SIGCONT)
        live = sorted(n.port() for n in self.nodes[:2])
        yield eventually(lambda: self.producers("cluster").addCallback(lambda p: p == live), timeout=120)
        for node in self.nodes[:2]:
            yield post(f"http://{node.addresses['HTTP']}/pub?topic=cluster", b"more from %d" % node.port())
        yield eventually(lambda: len(got) == 32)

        # killed and restarted on its ports and data path, it registers again
        tcp, http = frozen.addresses["TCP"], frozen.addresses["HTTP"]
        frozen.kill()
        self.nodes[2] = self.start_nsqd(2, tcp, http)
        yield eventually(lambda: self.producers("cluster").addCallback(lambda p: p == ports))
        yield post(f"http://{http}/pub?topic=cluster", b"back again")
        yield eventually(lambda: b"back again" in got)


class ClusterTests(_Cluster, unittest.TestCase):
    @defer.inlineCallbacks
    def test_tombstone_keeps_consumers_away(self):
        for node in self.nodes:
            yield post(f"http://{node.addresses['HTTP']}/topic/create?topic=tomb")
        yield eventually(lambda: self.producers("tomb").addCallback(lambda p: len(p) == 3))
        victim = self.nodes[0]
        yield post(f"{self.lookupd_http}/topic/tombstone?topic=tomb&node=127.0.0.1:{victim.port('HTTP')}")
        self.assertNotIn(victim.port(), (yield self.producers("tomb")))
        consumer = LookupdConsumer(
            reactor, [self.lookupd.addresses["HTTP"]], "tomb", "c", lambda m: None, poll_interval=0.5
        )
        yield consumer.start()
        self.addCleanup(consumer.stop)
        yield eventually(lambda: len(consumer.consumers) == 2)
        self.assertNotIn(("127.0.0.1", victim.port()), consumer.consumers)
        nodes = yield get_json(f"{self.lookupd_http}/nodes")
        tombstones = {n["tcp_port"]: n["tombstones"] for n in nodes["producers"]}
        self.assertEqual(tombstones[victim.port()], [True])

    @defer.inlineCallbacks
    def test_pynsq_reader_with_only_the_lookupd_address(self):
        for i, node in enumerate(self.nodes):
            yield post(
                f"http://{node.addresses['HTTP']}/mpub?topic=py", b"\n".join(b"p%d-%d" % (i, j) for j in range(5))
            )
        yield eventually(lambda: self.producers("py").addCallback(lambda p: len(p) == 3))
        script = Path(__file__).with_name("pynsq_lookupd.py")
        out = yield deferToThread(
            subprocess.run,
            [sys.executable, str(script), self.lookupd.addresses["HTTP"], "py", "15"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        self.assertEqual(sorted(json.loads(out.stdout)), sorted(f"p{i}-{j}" for i in range(3) for j in range(5)))


class LookupdCommandTests(unittest.TestCase):
    def test_version(self) -> None:
        out = subprocess.run([*command("nsqlookupd"), "--version"], capture_output=True, text=True, check=True)
        self.assertRegex(out.stdout, r"^nsqlookupd v1\.3\.0 \(built w/python3\.\d+\.\d+\)\n$")

    def test_twistd_nsqlookupd(self) -> None:
        path = self.mktemp()
        os.makedirs(path)
        argv = [
            *command("twistd"),
            "-n",
            "--pidfile=",
            "--logfile=-",
            "nsqlookupd",
            "--tcp-address",
            "127.0.0.1:0",
            "--http-address",
            "127.0.0.1:0",
        ]
        proc = ServerProcess("twistd", argv=argv, cwd=path, stdout=True).start(timeout=START_TIMEOUT)
        self.addCleanup(proc.kill)
        self.assertIn(proc.stop(), (0, -signal.SIGTERM))
