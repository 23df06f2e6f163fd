"""Draining (beyond Go, nsqio/nsq#1302): nsqd takes nothing new and stops once empty."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from treq.testing import StubTreq
from twisted.internet import defer
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial import unittest

from nsq_service.listen import Bound, ServerService
from nsq_service.serving import StopSignals
from nsq_wire.commands import encode_command, mpub
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE
from nsqd_tw.core.channel import Channel
from nsqd_tw.core.drain import CHECK_INTERVAL, PROGRESS_INTERVAL
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.core.topic import DrainingError
from nsqd_tw.http.api import NSQDHTTPAPI
from tests.helpers import FakeClient, make_nsqd
from tests.nsqd_tw.test_channel import FakeConsumer
from tests.nsqd_tw.test_storage import StorageTestCase

DRAINING = b"nsqd is draining"


def fin_all(channel: Channel, c: FakeConsumer) -> None:
    """FIN every message ``c`` holds in flight, as its connection would."""
    for msg_id in list({m.id: m for m in c.got if m.id in channel.in_flight}):
        channel.finish_message(c.id, msg_id)
        c.finished()
    channel.kick()


class DrainTestCase(unittest.TestCase):
    """An nsqd on a Clock whose stop requests are counted, its DRAIN lines kept."""

    opts: dict[str, Any] = {}

    def setUp(self) -> None:
        self.use(**self.opts)
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def make(self, **kw: Any) -> NSQD:
        nsqd = make_nsqd(**kw)
        nsqd.stops = []  # type: ignore[attr-defined]
        nsqd.request_stop = lambda: nsqd.stops.append(nsqd.now())  # type: ignore[attr-defined]
        return nsqd

    def use(self, **kw: Any) -> None:
        self.nsqd = self.make(**kw)
        self.clock = self.nsqd.reactor

    @property
    def stops(self) -> list[float]:
        return self.nsqd.stops  # type: ignore[attr-defined, no-any-return]

    def lines(self) -> list[str]:
        return [text for e in self.events if (text := formatEvent(e)).startswith("DRAIN")]

    def consumer(self, topic: str = "t", channel: str = "c", rdy: int = 100, cid: int = 1) -> FakeConsumer:
        c = FakeConsumer(cid, rdy=rdy)
        self.nsqd.get_topic(topic).get_channel(channel).add_client(c)
        return c

    def fin(self, c: FakeConsumer, channel: str = "c") -> None:
        fin_all(self.nsqd.topics["t"].channels[channel], c)

    def advance(self, seconds: float) -> None:
        """Let time pass check by check (the queue scan with it)."""
        end = self.clock.seconds() + seconds
        while self.clock.seconds() < end - 1e-9:
            self.clock.advance(min(CHECK_INTERVAL, end - self.clock.seconds()))
            self.nsqd.queue_scan()


class DrainStateTests(DrainTestCase):
    def test_refuses_new_messages_topics_and_channels(self) -> None:
        topic = self.nsqd.get_topic("t")
        channel = topic.get_channel("c")
        self.nsqd.start_drain("test")
        self.assertTrue(self.nsqd.draining)
        for call in (
            lambda: self.nsqd.publish("t", [b"x"]),
            lambda: self.nsqd.publish("t", [b"x"], delay=1.0),
            lambda: self.nsqd.get_topic("new"),
            lambda: topic.get_channel("new"),
        ):
            e = self.assertRaises(DrainingError, call)
            self.assertEqual(str(e), "nsqd is draining")
        self.assertEqual(list(self.nsqd.topics), ["t"])
        self.assertEqual(list(topic.channels), ["c"])
        self.assertIs(self.nsqd.get_topic("t"), topic)  # what exists is served as before
        self.assertIs(topic.get_channel("c"), channel)
        self.assertEqual(topic.message_count, 0)

    def test_stops_once_every_message_is_finished(self) -> None:
        c = self.consumer(rdy=2)
        self.nsqd.publish("t", [b"%d" % i for i in range(5)])
        self.nsqd.start_drain("test")
        self.assertEqual(
            self.lines(),
            [
                "DRAIN: started by test: refusing new messages, topics and channels; 5 messages "
                "(depth 3, in flight 2, deferred 0) left; stopping when every queue is empty"
            ],
        )
        for _ in range(2):
            self.advance(CHECK_INTERVAL)
            self.assertEqual(self.stops, [])
            self.fin(c)
        self.advance(CHECK_INTERVAL)
        self.assertEqual(self.stops, [])
        self.fin(c)
        self.assertEqual(len(c.got), 5)
        self.advance(CHECK_INTERVAL)
        self.assertEqual(len(self.stops), 1)
        self.assertEqual(self.lines()[-1], "DRAIN: done in 2s: every topic and channel is empty")
        self.advance(10)
        self.assertEqual(len(self.stops), 1, "asked to stop once")

    def test_an_empty_nsqd_stops_at_the_first_check(self) -> None:
        self.nsqd.get_topic("t").get_channel("c")
        self.nsqd.start_drain("test")
        self.assertEqual(self.stops, [], "the answer to PUT /config/drain goes out first")
        self.advance(CHECK_INTERVAL)
        self.assertEqual(len(self.stops), 1)

    def test_requeued_and_deferred_messages_are_waited_for(self) -> None:
        c = self.consumer()
        self.nsqd.publish("t", [b"now"])
        self.nsqd.publish("t", [b"later"], delay=20.0)
        self.nsqd.start_drain("test")
        ch = self.nsqd.topics["t"].channels["c"]
        ch.requeue_message(c.id, c.got[0].id, 5.0)
        c.requeued()
        self.advance(19)
        self.assertEqual(self.stops, [])
        self.assertEqual([m.body for m in c.got], [b"now", b"now"])
        self.fin(c)
        self.advance(2)
        self.assertEqual([m.body for m in c.got], [b"now", b"now", b"later"])
        self.assertEqual(self.stops, [])
        self.fin(c)
        self.advance(CHECK_INTERVAL)
        self.assertEqual(len(self.stops), 1)

    def test_a_message_that_times_out_is_delivered_again(self) -> None:
        c = self.consumer()
        c.msg_timeout = 3.0
        self.nsqd.publish("t", [b"x"])
        self.nsqd.start_drain("test")
        self.advance(4)
        self.assertEqual(len(c.got), 2)
        self.assertEqual(self.stops, [])
        self.fin(c)
        self.advance(CHECK_INTERVAL)
        self.assertEqual(len(self.stops), 1)

    def test_progress_is_logged(self) -> None:
        c = self.consumer(rdy=10)
        self.nsqd.publish("t", [b"x"] * 100)
        self.nsqd.start_drain("test")
        for _ in range(5):
            self.fin(c)
            self.advance(1)
        self.assertEqual(
            self.lines()[1:],
            ["DRAIN: 50 messages (depth 40, in flight 10, deferred 0) left after 5s; 10 msgs/s finished"],
        )

    def test_what_blocks_a_drain_is_named_when_nothing_moves(self) -> None:
        self.consumer("t", "c")
        self.nsqd.topics["t"].get_channel("idle")  # no consumer
        self.nsqd.get_topic("held")  # no channel
        self.nsqd.publish("t", [b"a"])
        self.nsqd.publish("held", [b"b", b"c"])
        self.nsqd.start_drain("test")
        self.advance(PROGRESS_INTERVAL)
        self.assertEqual(
            self.lines()[1:],
            [
                "DRAIN: 4 messages (depth 3, in flight 1, deferred 0) left after 5s; 0 msgs/s finished",
                "DRAIN: CHANNEL(t:c): 1 messages (depth 0, in flight 1, deferred 0)",
                "DRAIN: CHANNEL(t:idle): 1 messages (depth 1, in flight 0, deferred 0) - no consumer",
                "DRAIN: TOPIC(held): 2 messages (depth 2, in flight 0, deferred 0) - no channel",
            ],
        )

    def test_timeout_stops_anyway_and_names_what_is_left(self) -> None:
        self.use(drain_timeout=3.0)
        c = self.consumer()
        self.nsqd.publish("t", [b"x"])
        self.nsqd.publish("t", [b"y"], delay=60.0)
        self.nsqd.start_drain("test")
        self.assertIn("or after --drain-timeout 3s", self.lines()[0])
        self.fin(c)
        self.advance(2.5)
        self.assertEqual(self.stops, [])
        self.advance(CHECK_INTERVAL)
        self.assertEqual(len(self.stops), 1)
        self.assertEqual(
            self.lines()[-2:],
            [
                "DRAIN: --drain-timeout 3s passed with 1 messages (depth 0, in flight 0, deferred 1) left; "
                "stopping, they stay on disk",
                "DRAIN: CHANNEL(t:c): 1 messages (depth 0, in flight 0, deferred 1)",
            ],
        )

    def test_a_drain_cannot_be_undone_or_started_twice(self) -> None:
        self.nsqd.get_topic("t").get_channel("c")
        self.nsqd.publish("t", [b"x"])
        self.nsqd.start_drain("PUT /config/drain")
        drain = self.nsqd.drain
        self.nsqd.start_drain("PUT /config/drain")
        self.assertIs(self.nsqd.drain, drain)
        self.assertEqual(self.lines()[-1], "DRAIN: already draining (PUT /config/drain changes nothing)")

    def test_sigterm_in_shutdown_mode_stops(self) -> None:
        self.assertFalse(self.nsqd.sigterm())
        self.assertFalse(self.nsqd.draining)
        self.nsqd.start_drain("PUT /config/drain")
        self.assertFalse(self.nsqd.sigterm(), "--sigterm-mode shutdown: SIGTERM stops, drain or not")

    def test_sigterm_in_drain_mode_drains_and_a_second_one_is_logged(self) -> None:
        self.use(sigterm_mode="drain")
        self.nsqd.get_topic("t").get_channel("c")
        self.nsqd.publish("t", [b"x"])
        self.assertTrue(self.nsqd.sigterm())
        self.assertTrue(self.nsqd.draining)
        self.assertTrue(self.lines()[0].startswith("DRAIN: started by SIGTERM"))
        drain = self.nsqd.drain
        self.assertTrue(self.nsqd.sigterm())
        self.assertIs(self.nsqd.drain, drain)
        self.assertEqual(
            self.lines()[-1],
            "DRAIN: SIGTERM during the drain changes nothing (SIGINT or PUT /config/shutdown stops now)",
        )

    def test_a_stop_during_a_drain_ends_its_checks(self) -> None:
        self.consumer()
        self.nsqd.publish("t", [b"x"])
        self.nsqd.startService()
        self.nsqd.start_drain("test")
        self.nsqd.stopService()  # SIGINT, PUT /config/shutdown
        self.nsqd.topics["t"].channels["c"].in_flight.clear()
        self.advance(10)
        self.assertEqual(self.stops, [])

    def test_the_cluster_may_still_create_a_new_topics_channels(self) -> None:
        """A topic made just before the drain gets the channels nsqlookupd knows of:
        what it holds can then be drained."""
        answer: defer.Deferred[list[str]] = defer.Deferred()
        self.nsqd.set_channel_source(lambda topic: answer)
        self.nsqd.publish("t", [b"x"])
        self.nsqd.start_drain("test")
        answer.callback(["c"])
        self.assertEqual(list(self.nsqd.topics["t"].channels), ["c"])


class DrainTCPTests(DrainTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.nsqd.get_topic("t").get_channel("c")
        self.nsqd.start_drain("test")

    def test_publishes_are_refused_as_go_refuses_a_failed_put(self) -> None:
        for verb, data in (
            ("PUB", encode_command(b"PUB", "t", body=b"x")),
            ("PUB", encode_command(b"PUB", "new", body=b"x")),
            ("MPUB", mpub("t", [b"x", b"y"])),
            ("MPUB", mpub("new", [b"x", b"y"])),
            ("DPUB", encode_command(b"DPUB", "t", b"100", body=b"x")),
        ):
            client = FakeClient(self.nsqd)
            client.send(data)
            error = f"E_{verb}_FAILED {verb} failed nsqd is draining".encode()
            self.assertEqual(client.frames(), [(FRAME_TYPE_ERROR, error)])
            self.assertTrue(client.disconnected, "E_PUB_FAILED is fatal, as in Go")
        self.assertEqual(list(self.nsqd.topics), ["t"])
        self.assertEqual(self.nsqd.topics["t"].message_count, 0)

    def test_sub_to_an_existing_channel_is_served_a_new_one_refused(self) -> None:
        self.assertEqual(FakeClient(self.nsqd).sub("t", "c"), (FRAME_TYPE_RESPONSE, b"OK"))
        for topic, channel in (("t", "new"), ("new", "c"), ("t", "new#ephemeral")):
            client = FakeClient(self.nsqd)
            self.assertEqual(
                client.sub(topic, channel), (FRAME_TYPE_ERROR, b"E_SUB_FAILED SUB failed nsqd is draining")
            )
            self.assertTrue(client.disconnected)
        self.assertEqual(list(self.nsqd.topics), ["t"])
        self.assertEqual(list(self.nsqd.topics["t"].channels), ["c"])


class DrainHTTPTests(DrainTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.api = NSQDHTTPAPI(self.nsqd, Bound(tcp=("127.0.0.1", 4150), http=("127.0.0.1", 4151)))
        self.treq = StubTreq(self.api.resource())

    @defer.inlineCallbacks
    def call(self, method: str, path: str, body: bytes = b""):
        resp = yield self.treq.request(method, "http://nsqd" + path, data=body)
        return resp.code, (yield resp.content())

    @defer.inlineCallbacks
    def test_nothing_changes_until_a_drain(self):
        self.assertEqual((yield self.call("GET", "/ping")), (200, b"OK"))
        self.assertEqual((yield self.call("GET", "/config/drain")), (200, b"false"))
        _, body = yield self.call("GET", "/info")
        self.assertNotIn("draining", json.loads(body))
        _, body = yield self.call("GET", "/stats?format=json")
        self.assertNotIn("draining", json.loads(body))
        _, body = yield self.call("GET", "/metrics")
        self.assertIn(b"\nnsq_draining 0.0\n", body)

    @defer.inlineCallbacks
    def test_put_config_drain(self):
        self.nsqd.get_topic("t").get_channel("c")
        self.nsqd.publish("t", [b"x"])
        self.assertEqual((yield self.call("PUT", "/config/drain", b"true")), (200, b"true"))
        self.assertTrue(self.nsqd.draining)
        self.assertTrue(self.lines()[0].startswith("DRAIN: started by PUT /config/drain"))
        self.assertEqual((yield self.call("GET", "/config/drain")), (200, b"true"))
        self.assertEqual((yield self.call("PUT", "/config/drain", b"true")), (200, b"true"))
        for body, code in ((b"false", 400), (b"soon", 400), (b"", 413)):
            self.assertEqual((yield self.call("PUT", "/config/drain", body))[0], code, body)
        self.assertTrue(self.nsqd.draining, "a drain cannot be undone")

    @defer.inlineCallbacks
    def test_while_draining(self):
        self.nsqd.get_topic("t").get_channel("c")
        self.nsqd.start_drain("test")
        self.assertEqual((yield self.call("GET", "/ping")), (503, b"NOK - nsqd is draining"))
        draining = b'{"message":"DRAINING"}'
        for path, body in (
            ("/pub?topic=t", b"x"),
            ("/pub?topic=t&defer=100", b"x"),
            ("/pub?topic=new", b"x"),
            ("/mpub?topic=t", b"x\ny"),
            ("/topic/create?topic=new", b""),
            ("/channel/create?topic=t&channel=new", b""),
        ):
            self.assertEqual((yield self.call("POST", path, body)), (503, draining), path)
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c", "/channel/pause?topic=t&channel=c"):
            self.assertEqual((yield self.call("POST", path)), (200, b""), path)
        _, body = yield self.call("GET", "/info")
        info = json.loads(body)
        self.assertEqual((list(info)[-2:], info["draining"]), (["max_deflate_level", "draining"], True))
        _, body = yield self.call("GET", "/stats?format=json")
        stats = json.loads(body)
        self.assertEqual((list(stats)[-2:], stats["draining"]), (["producers", "draining"], True))
        _, body = yield self.call("GET", "/metrics")
        self.assertIn(b"\nnsq_draining 1.0\n", body)

    @defer.inlineCallbacks
    def test_put_config_shutdown(self):
        self.assertEqual((yield self.call("GET", "/config/shutdown")), (200, b"true"), "not started: not running")
        self.nsqd.startService()
        self.addCleanup(self.nsqd.stopService)
        self.assertEqual((yield self.call("GET", "/config/shutdown")), (200, b"false"))
        self.assertEqual((yield self.call("PUT", "/config/shutdown", b"false")), (400, b'{"message":"INVALID_VALUE"}'))
        self.assertEqual((yield self.call("PUT", "/config/shutdown", b"true")), (200, b"true"))
        self.assertEqual(self.stops, [], "asked once the answer is written")
        self.clock.advance(0)
        self.assertEqual(len(self.stops), 1)


class DrainStorageTests(StorageTestCase):
    """What a drained nsqd leaves on disk: nsqd.dat, no queue files."""

    def queue_files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.dir) if ".diskqueue." in f)

    def run_drain(self, n: NSQD, consumers: list[FakeConsumer]) -> None:
        """Drain ``n`` to its stop, its consumers FINing what they get."""
        n.request_stop = lambda: self.stop(n)
        n.start_drain("test")
        for _ in range(100):
            if not n.running:
                return
            for c in consumers:
                fin_all(n.topics["t"].channels[c.channel_name], c)  # type: ignore[attr-defined]
            n.reactor.advance(CHECK_INTERVAL)
            n.queue_scan()
        self.fail("the drain did not end")

    def consume(self, n: NSQD, channel: str, cid: int) -> FakeConsumer:
        c = FakeConsumer(cid, rdy=1000)
        c.channel_name = channel  # type: ignore[attr-defined]
        n.get_topic("t").get_channel(channel).add_client(c)
        return c

    def check_no_queue_files_after_a_drain(self, **opts: Any) -> None:
        n = self.start(**opts)
        consumers = [self.consume(n, "c", 1), self.consume(n, "d", 2)]
        self.publish(n, "t", [b"%d" % i for i in range(100)])
        self.publish(n, "t", [b"later"], delay=1.0)
        self.assertNotEqual(self.queue_files(), [])
        self.run_drain(n, consumers)
        self.assertEqual([len({m.id for m in c.got}) for c in consumers], [101, 101])
        self.assertEqual(self.queue_files(), [])
        channels = [{"name": c, "paused": False} for c in "cd"]
        self.assertEqual(self.metadata()["topics"], [{"channels": channels, "name": "t", "paused": False}])
        self.assertEqual(n.exit_code, 0)

    def test_a_drained_nsqd_leaves_no_queue_files(self) -> None:
        self.check_no_queue_files_after_a_drain(mem_queue_size=10)

    def test_a_drained_durable_nsqd_leaves_no_queue_files(self) -> None:
        self.check_no_queue_files_after_a_drain(mem_queue_size=0, sync_every=1)

    def test_what_a_timeout_leaves_is_kept_for_the_next_start(self) -> None:
        n = self.start(mem_queue_size=10, drain_timeout=2.0)
        self.consume(n, "c", 1)  # never FINs: its message is in flight at the stop
        finishing = self.consume(n, "fin", 2)
        self.publish(n, "t", [b"x"])
        n.get_topic("d").get_channel("c")
        self.publish(n, "d", [b"later"], delay=3600.0)
        self.run_drain(n, [finishing])
        self.assertEqual({f.split(".")[0] for f in self.queue_files()}, {"t:c", "d:c"})
        again = self.start(mem_queue_size=10)
        left = {f"{t.name}:{c.name}": c.depth() for t in again.topics.values() for c in t.channels.values()}
        self.assertEqual(left, {"t:c": 1, "t:fin": 0, "d:c": 1})


class StopSignalsTests(unittest.TestCase):
    """SIGTERM and SIGINT under both front ends (nsq_service.serving.StopSignals)."""

    def setUp(self) -> None:
        self.calls: list[Any] = []
        reactor = self

        class FakeReactor:
            def sigInt(self, signum: int, frame: Any) -> None:
                reactor.calls.append("sigInt")

            def sigTerm(self, signum: int, frame: Any) -> None:
                reactor.calls.append("sigTerm")

            def callFromThread(self, fn: Any) -> None:
                reactor.calls.append(fn.__name__)

            def stop(self) -> None:
                pass

        self.signals = StopSignals(FakeReactor())
        self.top = ServerService("failed", "[nsqd] ")
        self.drains: list[int] = []
        self.top.on_sigterm = lambda: self.drains.append(1) is None
        self.signals.serve(self.top)

    def test_sigterm_taken_by_the_server_then_sigint_stops(self) -> None:
        self.signals.handler(signal.SIGTERM, None)
        self.signals.handler(signal.SIGTERM, None)
        self.assertEqual((self.drains, self.calls), ([1, 1], []))
        self.signals.handler(signal.SIGINT, None)
        self.signals.handler(signal.SIGINT, None)
        self.signals.handler(signal.SIGTERM, None)
        self.assertEqual((self.drains, self.calls), ([1, 1], ["sigInt"]))

    def test_sigterm_the_server_does_not_take_stops(self) -> None:
        self.top.on_sigterm = lambda: False
        self.signals.handler(signal.SIGTERM, None)
        self.assertEqual(self.calls, ["sigTerm"])

    def test_the_server_stops_the_process_as_a_signal_would(self) -> None:
        self.top.stop_process()
        self.top.stop_process()
        self.signals.handler(signal.SIGINT, None)
        self.assertEqual(self.calls, ["stop"])

    def test_without_a_front_end_the_services_stop(self) -> None:
        top = ServerService("failed", "[nsqd] ")
        top.startService()
        top.stop_process()
        self.assertFalse(top.running)
