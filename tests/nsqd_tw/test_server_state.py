"""What belongs to a server instance, not to the process: the log level and line
throttle, the HTTP routes, the GC pause timer."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from typing import Any

from treq.testing import StubTreq
from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial import unittest

from lookupd_tw.http_api import LookupdHTTPAPI
from lookupd_tw.nsqlookupd import NSQLookupd
from lookupd_tw.options import NSQLookupdOptions
from nsq_service.memstats import GCPauses
from nsqd_tw.http.api import NSQDHTTPAPI
from tests.helpers import make_nsqd


class LogLevelPerServerTests(unittest.TestCase):
    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def texts(self) -> list[str]:
        return [formatEvent(e) for e in self.events if e.get("log_namespace", "").startswith(("nsqd_tw", "lookupd_tw"))]

    @defer.inlineCallbacks
    def test_two_servers_keep_their_own_levels(self) -> Any:
        chatty = make_nsqd(log_level="debug")
        quiet = make_nsqd(log_level="error")
        lookupd = NSQLookupd(NSQLookupdOptions(log_level="warn"))
        for name, server in (("chatty", chatty), ("quiet", quiet), ("lookupd", lookupd)):
            server.log.debug("{name} debug", name=name)
            server.log.warn("{name} warn", name=name)
        self.assertEqual(self.texts(), ["chatty debug", "chatty warn", "lookupd warn"])

        # PUT /config/log_level changes that server's level only
        treq = StubTreq(NSQDHTTPAPI(quiet).resource())
        resp = yield treq.put("http://nsqd/config/log_level", b"debug")
        self.assertEqual(resp.code, 200)
        self.assertEqual((yield resp.content()), b"1")
        resp = yield StubTreq(LookupdHTTPAPI(lookupd).resource()).put("http://lookupd/config/log_level", b"error")
        self.assertEqual(resp.code, 200)
        del self.events[:]
        for name, server in (("chatty", chatty), ("quiet", quiet), ("lookupd", lookupd)):
            server.log.debug("{name} debug", name=name)
            server.log.warn("{name} warn", name=name)
        self.assertEqual(self.texts(), ["chatty debug", "chatty warn", "quiet debug", "quiet warn"])
        self.assertEqual((chatty.opts.log_level, quiet.opts.log_level), ("debug", "debug"))

    def test_the_line_throttle_is_per_server(self) -> None:
        a, b = make_nsqd(), make_nsqd()
        limit = a.log_gate.throttle.limit
        for _ in range(limit + 5):
            a.log.error("flood")
        b.log.error("flood")
        self.assertEqual(self.texts().count("flood"), limit + 1)


class RoutesPerInstanceTests(unittest.TestCase):
    def test_each_api_has_its_own_router(self) -> None:
        nsqd = make_nsqd()
        one, two = NSQDHTTPAPI(nsqd), NSQDHTTPAPI(nsqd)
        self.assertIsNot(one.router, two.router)
        self.assertIsNot(one.router.app, two.router.app)
        self.assertEqual(one.router.routes, two.router.routes)
        self.assertIn("/pub", one.router.routes)
        lookupd = LookupdHTTPAPI(NSQLookupd(NSQLookupdOptions()))
        self.assertNotIn("/pub", lookupd.router.routes)
        self.assertIn("/debug/pprof", lookupd.router.routes)


class GCPausesTests(unittest.TestCase):
    def test_importing_the_servers_adds_no_gc_callback(self) -> None:
        code = (
            "import gc; n = len(gc.callbacks)\n"
            "import nsqd_tw.tap, nsqd_tw.http.api, nsqd_tw.http.stats, nsqd_tw.http.statsd, nsqd_tw.http.metrics\n"
            "import lookupd_tw.tap, lookupd_tw.http_api, nsq_service.web, nsq_service.memstats\n"
            "import twisted.plugins.nsqd_tw_plugin, twisted.plugins.lookupd_tw_plugin\n"
            "assert len(gc.callbacks) == n, gc.callbacks\n"
        )
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        subprocess.run([sys.executable, "-c", code], check=True, cwd=root)

    def test_installed_while_running(self) -> None:
        before = list(gc.callbacks)
        pauses = GCPauses()
        pauses.startService()
        self.assertEqual(len(gc.callbacks), len(before) + 1)
        gc.collect()
        self.assertTrue(pauses.pauses)
        pauses.stopService()
        self.assertEqual(gc.callbacks, before)

    def test_nsqd_times_gc_pauses_and_nsqlookupd_does_not(self) -> None:
        from lookupd_tw.tap import makeService as lookupd_service
        from nsqd_tw.options import NSQDOptions
        from nsqd_tw.tap import makeService as nsqd_service

        data = tempfile.mkdtemp()
        nsqd = nsqd_service(NSQDOptions(data_path=data, node_id=1), MemoryReactorClock())
        self.assertIsInstance(nsqd.getServiceNamed("gc-pauses"), GCPauses)
        lookupd = lookupd_service(NSQLookupdOptions(), MemoryReactorClock())
        self.assertFalse([s for s in lookupd if isinstance(s, GCPauses)])


class TickerTests(unittest.TestCase):
    """The tap's timers (queue scan, disk sync): at start, then every interval, until stopped."""

    def test_runs_at_start_every_interval_and_stops(self) -> None:
        from twisted.internet.task import Clock

        from nsqd_tw.tap import Ticker

        clock, calls = Clock(), []
        t = Ticker(0.1, lambda: calls.append(clock.seconds()), clock, "queue-scan")
        t.startService()
        clock.pump([0.1, 0.1])
        t.stopService()
        clock.pump([0.1, 0.1])
        self.assertEqual((t.name, len(calls)), ("queue-scan", 3))

    def test_a_failure_is_logged(self) -> None:
        from twisted.internet.task import Clock

        from nsqd_tw.tap import Ticker

        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        t = Ticker(0.1, lambda: 1 / 0, Clock(), "disk-sync")
        t.startService()
        self.assertIn("disk-sync stopped", [formatEvent(e) for e in events])
        self.flushLoggedErrors(ZeroDivisionError)
