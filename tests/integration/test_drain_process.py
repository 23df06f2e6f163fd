"""Draining nsqd as a process: SIGTERM under --sigterm-mode drain (``nsqd`` and
``twistd nsqd``), PUT /config/drain, and the stops that cut a drain short."""

from __future__ import annotations

import json
import os
import signal

import treq
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from nsq_client.twisted_client import Consumer
from tests.integration import draintest
from tests.integration.procs import ServerProcess, eventually

MESSAGES = 200_000
CHANNELS = [{"name": "drain", "paused": False, "channels": [{"name": "ch", "paused": False}]}]


class SigtermDrainTests(unittest.TestCase):
    """The whole scenario of :mod:`tests.integration.draintest`, with 200,000 messages."""

    timeout = 300

    @defer.inlineCallbacks
    def check(self, twistd: bool):
        r = yield deferToThread(draintest.run, MESSAGES, 2, twistd, lambda line: None)
        self.assertTrue(r["refused"]["tcp"].endswith("E_PUB_FAILED PUB failed nsqd is draining"), r["refused"])
        self.assertEqual(r["refused"]["http"], '503 {"message":"DRAINING"}')
        self.assertEqual(r["refused"]["ping"], "503 NOK - nsqd is draining")
        self.assertGreater(r["left_when_refusing"], 0, "refused while the backlog was still there")
        self.assertEqual((r["unique_delivered"], r["consumer_errors"]), (MESSAGES, []))
        self.assertEqual(r["exit_code"], 0)
        self.assertEqual(r["queue_files"], [])
        self.assertEqual(r["metadata_topics"], CHANNELS)
        self.assertIn("DRAIN: started by SIGTERM", r["drain_lines"][0])
        self.assertIn("DRAIN: done in", r["drain_lines"][-1])

    def test_nsqd(self):
        return self.check(twistd=False)

    def test_twistd_nsqd(self):
        return self.check(twistd=True)


class DrainProcessTests(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)

    def start(self, *args: str) -> ServerProcess:
        proc = draintest.start_nsqd(self.dir, False, *args)
        self.addCleanup(proc.kill)
        self.http = f"http://{proc.addresses['HTTP']}"
        return proc

    @defer.inlineCallbacks
    def call(self, method: str, path: str, body: bytes | None = None):
        resp = yield treq.request(method, self.http + path, data=body, persistent=False)
        return resp.code, (yield resp.content())

    @defer.inlineCallbacks
    def backlog(self, n: int):
        yield self.call("POST", "/topic/create?topic=drain")
        yield self.call("POST", "/channel/create?topic=drain&channel=ch")
        code, _ = yield self.call("POST", "/mpub?topic=drain", b"\n".join(b"m%d" % i for i in range(n)))
        self.assertEqual(code, 200)

    def exited(self, proc: ServerProcess):
        assert proc.proc is not None
        return eventually(lambda: proc.proc.poll() is not None).addCallback(lambda _: proc.wait())

    def logged(self, proc: ServerProcess, text: str):
        return eventually(lambda: any(text in line for line in proc.lines))

    @defer.inlineCallbacks
    def test_put_config_drain(self):
        proc = self.start()
        yield self.backlog(1000)
        self.assertEqual((yield self.call("PUT", "/config/drain", b"true")), (200, b"true"))
        self.assertEqual((yield self.call("GET", "/ping")), (503, b"NOK - nsqd is draining"))
        self.assertEqual((yield self.call("POST", "/pub?topic=drain", b"x")), (503, b'{"message":"DRAINING"}'))
        _, info = yield self.call("GET", "/info")
        self.assertEqual(list(json.loads(info).items())[-1], ("draining", True))
        got: set[bytes] = set()
        port = proc.port()
        consumer = yield Consumer.connect(reactor, "127.0.0.1", port, "drain", "ch", lambda m: got.add(m.id), 100)
        self.addCleanup(consumer.close)
        self.assertEqual((yield self.exited(proc)), 0)
        self.assertEqual(len(got), 1000)
        self.assertEqual(draintest.queue_files(self.dir), [])
        self.assertTrue(any("NSQ: bye" in line for line in proc.lines))

    @defer.inlineCallbacks
    def cut_short(self, stop):
        """A drain nobody consumes, stopped by ``stop(proc)``: everything is kept (durable mode)."""
        proc = self.start("--sigterm-mode", "drain", "--mem-queue-size", "0", "--sync-every", "1")
        yield self.backlog(1000)
        proc.signal(signal.SIGTERM)
        yield eventually(lambda: self.call("GET", "/config/drain").addCallback(lambda r: r == (200, b"true")))
        proc.signal(signal.SIGTERM)
        yield self.logged(proc, "DRAIN: SIGTERM during the drain changes nothing")
        self.assertEqual((yield self.call("GET", "/ping"))[0], 503, "still draining")
        yield stop(proc)
        self.assertEqual((yield self.exited(proc)), 0)
        self.assertNotEqual(draintest.queue_files(self.dir), [])

        again = self.start()
        _, body = yield self.call("GET", "/stats?format=json&topic=drain&channel=ch")
        self.assertEqual(json.loads(body)["topics"][0]["channels"][0]["depth"], 1000)
        self.assertNotIn("draining", json.loads(body))
        again.signal(signal.SIGTERM)
        self.assertEqual((yield self.exited(again)), 0, "--sigterm-mode shutdown (the default) stops at once")

    def test_sigint_during_a_drain_stops_and_keeps_everything(self):
        return self.cut_short(lambda proc: proc.signal(signal.SIGINT))

    @defer.inlineCallbacks
    def test_put_config_shutdown_during_a_drain_stops_and_keeps_everything(self):
        @defer.inlineCallbacks
        def shutdown(proc: ServerProcess):
            self.assertEqual((yield self.call("PUT", "/config/shutdown", b"true")), (200, b"true"))

        yield self.cut_short(shutdown)
