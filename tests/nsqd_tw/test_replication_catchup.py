"""Catch-up (beyond Go): a standby that joins late or comes back gets the
primary's queues, then the stream; until it is in sync the primary says it is
degraded and, with --replication-required, refuses publishes."""

from __future__ import annotations

import errno
import json
import os
from typing import Any

from treq.testing import StubTreq
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial import unittest

from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE
from nsqd_tw.core import nsqd as nsqd_module
from nsqd_tw.core import replica as replica_module
from nsqd_tw.core.replica import STATE_FILE, SYNCED_FILE, StandbyApply
from nsqd_tw.http.api import NSQDHTTPAPI
from nsqd_tw.replication import catchup
from nsqd_tw.replication import standby as standby_module
from nsqd_tw.storage.files import PathError
from tests.helpers import FakeClient, make_nsqd
from tests.nsqd_tw.replicas import ReplicaPair, held, live
from tests.nsqd_tw.test_replication import consume

OK = (FRAME_TYPE_RESPONSE, b"OK")


def linked_late(pair: ReplicaPair) -> None:
    """Start the primary with no replica, then point it at the standby."""
    pair.standby.start()
    pair.primary.opts["replica"] = ""
    pair.primary.start()


def link(pair: ReplicaPair) -> None:
    pair.primary.repl.state.peer = pair.standby.address
    pair.primary.repl.pairing.dial()


def pub(pair: ReplicaPair, body: bytes = b"x", settle: bool = True) -> list[tuple[int, bytes]]:
    """PUB ``body`` to t through a new client of the primary: the frames it got
    (once the pair has settled, if ``settle``)."""
    client = FakeClient(pair.primary.nsqd)
    client.command(b"PUB", "t", body=body)
    if settle:
        pair.settle()
    return client.frames()


def refused(state: str) -> list[tuple[int, bytes]]:
    """What a --replication-required primary answers a PUB while its standby is ``state``."""
    why = b"E_PUB_FAILED PUB failed replication: standby 127.0.0.1:4250 is %s (--replication-required)"
    return [(FRAME_TYPE_ERROR, why % state.encode())]


def http(nsqd: object, method: str, url: str, body: bytes = b"") -> tuple[int, bytes]:
    """A request to ``nsqd``'s HTTP API in memory: status and body."""
    stub = StubTreq(NSQDHTTPAPI(nsqd).resource())  # type: ignore[arg-type]
    d = stub.request(method, "http://n" + url, data=body)
    stub.flush()
    resp = d.result  # type: ignore[attr-defined]
    content = resp.content()
    stub.flush()
    return resp.code, content.result


class RequiredTests(unittest.TestCase):
    def test_publishes_are_refused_until_the_standby_is_in_sync(self) -> None:
        pair = ReplicaPair(primary_opts={"replication_required": True})
        pair.primary.start()
        pair.settle()
        primary = pair.primary.nsqd
        self.assertEqual(pub(pair, settle=False), refused("disconnected"))
        self.assertEqual(http(primary, "POST", "/pub?topic=t", b"x"), (503, b'{"message":"REPLICA_NOT_IN_SYNC"}'))
        self.assertEqual(primary.topics["t"].depth(), 0)  # refused before anything is stored
        pair.standby.start()
        pair.advance(1.0)
        self.assertEqual(pair.primary.state, "in_sync")
        self.assertEqual(pub(pair), [OK])


class CatchingUpTests(unittest.TestCase):
    def setUp(self) -> None:
        # a snapshot of small frames that waits, once begun, for the test to send them
        self.patch(catchup, "SNAPSHOT_FRAMES_PER_TURN", 1)
        self.patch(catchup, "SNAPSHOT_CHUNK", 4096)
        start = catchup.SnapshotSender.start

        def start_held(sender: catchup.SnapshotSender) -> None:
            start(sender)
            sender.pauseProducing()

        self.patch(catchup.SnapshotSender, "start", start_held)

    def send(self, pair: ReplicaPair, frames: int) -> None:
        """Let the snapshot send ``frames`` more frames, and move them."""
        sender = pair.primary.repl.primary.snapshot
        assert sender is not None
        for _ in range(frames):
            sender.paused = False
            sender._pump()
            sender.paused = True
        pair.settle()

    def finish(self, pair: ReplicaPair) -> None:
        """Let the snapshot go to its end."""
        pair.settle()
        sender = pair.primary.repl.primary.snapshot
        if sender is not None:
            sender.resumeProducing()
        pair.settle()

    def start_with_backlog(self, pair: ReplicaPair, n: int = 200) -> list[bytes]:
        """Start the pair with the primary not linked yet and ``n`` messages queued
        in its t:c (about 1 KiB each: many snapshot frames); their IDs."""
        linked_late(pair)
        primary = pair.primary.nsqd
        primary.get_topic("t").get_channel("c")
        primary.publish("t", [b"%04d" % i + b"." * 1000 for i in range(n)])
        return [m.id for m in held(pair.primary.channel("t", "c"))]

    def begin_snapshot(self, pair: ReplicaPair, frames: int = 10) -> None:
        """Link the primary to its standby and let the snapshot send its first ``frames`` frames."""
        link(pair)
        pair.settle()
        self.send(pair, frames)

    def test_publishes_and_fins_during_the_snapshot(self) -> None:
        pair = ReplicaPair()
        ids = self.start_with_backlog(pair)
        consumer = consume(pair.primary.nsqd, "t", "c", rdy=0)
        self.begin_snapshot(pair)
        self.assertEqual(pair.primary.state, "catching_up")
        self.assertEqual(pair.standby.state, "catching_up")
        self.assertTrue(pair.primary.repl.status()["degraded"])
        # a publish is answered at once (on this node only); a consumer finishes messages
        # the snapshot has not sent yet
        self.assertEqual(pub(pair, b"during", settle=False), [OK])
        consumer.command(b"RDY", "5")
        finished = consumer.messages()
        for msg in finished:
            consumer.command(b"FIN", msg.id)
        self.finish(pair)
        self.assertEqual(pair.primary.state, "in_sync")
        self.assertEqual(pair.standby.state, "in_sync")
        standby = pair.standby.channel("t", "c")
        expect = sorted(set(ids) - {m.id for m in finished})
        got = live(standby)
        self.assertEqual(len(got), len(expect) + 1)
        self.assertTrue(set(expect) <= set(got))
        self.assertEqual(sorted(live(standby)), sorted(m.id for m in held(pair.primary.channel("t", "c"))))

    def test_with_replication_required_they_are_refused_meanwhile(self) -> None:
        pair = ReplicaPair()
        self.start_with_backlog(pair)
        pair.primary.repl.primary.required = True  # from now on: --replication-required
        self.begin_snapshot(pair)
        self.assertEqual(pair.primary.state, "catching_up")
        self.assertEqual(pub(pair, settle=False), refused("catching_up"))
        self.finish(pair)
        self.assertEqual(pub(pair), [OK])

    def test_the_snapshot_waits_while_the_socket_is_backed_up(self) -> None:
        pair = ReplicaPair()
        self.start_with_backlog(pair, 50)
        self.begin_snapshot(pair, 4)
        sender = pair.primary.repl.primary.snapshot
        assert sender is not None
        sender.resumeProducing()
        sender.pauseProducing()  # what the transport says when its buffer is full
        sent = pair.primary.repl.primary.sent
        pair.advance(1.0)
        self.assertEqual(pair.primary.repl.primary.sent, sent)
        self.assertEqual(pair.primary.state, "catching_up")
        sender.resumeProducing()  # drained
        pair.settle()
        self.assertEqual(pair.primary.state, "in_sync")
        self.assertEqual(len(held(pair.standby.channel("t", "c"))), 50)

    def test_a_queue_emptied_during_the_snapshot_is_not_sent_on(self) -> None:
        pair = ReplicaPair()
        self.start_with_backlog(pair)
        self.begin_snapshot(pair)
        pair.primary.channel("t", "c").empty()
        self.finish(pair)
        self.assertEqual(pair.primary.state, "in_sync")
        self.assertEqual(held(pair.standby.channel("t", "c")), [])

    def test_a_deleted_and_recreated_channel_gets_only_the_new_ones(self) -> None:
        pair = ReplicaPair()
        self.start_with_backlog(pair)
        self.begin_snapshot(pair)
        topic = pair.primary.nsqd.topics["t"]
        topic.delete_existing_channel("c")
        topic.get_channel("c")
        pair.primary.nsqd.publish("t", [b"new"])
        self.finish(pair)
        self.assertEqual([m.body for m in held(pair.standby.channel("t", "c"))], [b"new"])

    def test_a_durable_primarys_messages_in_flight_are_sent(self) -> None:
        durable = {"backend_factory": None, "mem_queue_size": 0, "sync_every": 1}
        pair = ReplicaPair(primary_opts=durable, standby_opts=durable)
        ids = self.start_with_backlog(pair, 20)
        consumer = consume(pair.primary.nsqd, "t", "c", rdy=5)
        self.assertEqual(len(consumer.messages()), 5)
        link(pair)
        self.finish(pair)
        self.assertEqual(pair.primary.state, "in_sync")
        self.assertEqual(sorted(live(pair.standby.channel("t", "c"))), sorted(ids))


class FallingBehindTests(unittest.TestCase):
    def test_a_standby_that_cannot_hold_the_stream_drops_the_link(self) -> None:
        pair = ReplicaPair(standby_opts={"backend_factory": None, "mem_queue_size": 0, "max_disk_bytes": 4096})
        pair.start()
        pair.primary.nsqd.get_topic("t").get_channel("c")
        pair.settle()
        self.assertEqual(pub(pair, b"x" * 8000), [OK])  # held by the primary, acknowledged alone
        self.assertIn(pair.primary.state, ("disconnected", "catching_up"))
        self.assertEqual(pair.primary.nsqd.topics["t"].channels["c"].depth(), 1)
        self.assertFalse(pair.standby.repl.state.synced)  # not promotable as it is


def no_space(*args: Any, **kwargs: Any) -> Any:
    raise PathError("write", "(the disk)", OSError(errno.ENOSPC, "No space left on device"))


class FullDiskTests(unittest.TestCase):
    """A standby whose disk is full: it tells its primary at once, which goes
    degraded and links again later and later; it never reads itself as synced
    after a restart; it logs a line, never a traceback (trial fails a test
    that logs one)."""

    def setUp(self) -> None:
        self.pair = ReplicaPair().start()
        self.pair.primary.nsqd.get_topic("t")
        self.pair.settle()
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def full(self) -> list[Any]:
        """Nothing the standby writes fits any more: queues, replication.json,
        nsqd.dat (until the patches returned are restored)."""
        patches = [self.patch(standby_module, "free_bytes", lambda path: 0)]
        for method in ("publish", "topic_records", "channel_records"):
            patches.append(self.patch(StandbyApply, method, no_space))
        patches.append(self.patch(replica_module, "write_atomic", no_space))
        patches.append(self.patch(nsqd_module, "write_atomic", no_space))
        self.pair.advance(standby_module.LOOK_EVERY)  # as the standby sees it
        return patches

    def lines(self, text: str) -> list[str]:
        return [line for e in self.events if text in (line := formatEvent(e))]

    def snapshots(self) -> int:
        return len(self.lines("sending its snapshot"))

    def test_a_state_that_cannot_be_saved_is_said_without_a_traceback(self) -> None:
        pair = self.pair
        pair.standby.repl.link.fail("cut")
        pair.settle()
        pair.primary.repl.state.epoch = 3  # the standby must save the new epoch when they link again
        self.full()
        pair.advance(3.0)
        self.assertFalse(pair.standby.repl.state.synced)
        self.assertTrue(self.lines("cannot write replication.json"))
        self.assertFalse([e for e in self.events if e.get("log_failure") is not None], "no traceback")

    def test_the_primary_is_told_at_once_goes_degraded_and_backs_off(self) -> None:
        pair = self.pair
        self.full()
        self.assertEqual(pub(pair, b"x"), [OK])  # held here, acknowledged alone
        status = pair.primary.repl.status()
        self.assertEqual((status["state"], status["degraded"]), ("disconnected", True))
        self.assertIn("no space left on device", status["standby_error"].lower())
        told = self.lines("cannot store what it is sent")
        self.assertEqual(len(told), 1, told)  # one line on the primary
        self.assertIn("linking again in 1s", told[0])
        self.assertEqual(len(self.lines("REPLICATION: cannot store what primary")), 1)  # one on the standby
        self.assertEqual(self.lines("link to primary"), [])
        linked, clock = self.snapshots(), pair.net.reactor
        failed_at = clock.seconds()
        for wait in (1, 2, 4, 8, 16, 30, 30):  # each attempt fails on the snapshot (the topic holds x)
            pair.advance(failed_at + wait - 0.05 - clock.seconds())
            self.assertEqual(self.snapshots(), linked)
            pair.advance(0.1)
            self.assertEqual(self.snapshots(), linked + 1, wait)
            linked += 1
            failed_at += wait
        self.assertEqual(pair.primary.state, "disconnected")

    def test_once_it_has_room_again_it_catches_up(self) -> None:
        pair = self.pair
        patches = self.full()
        pub(pair, b"x")
        for patch in patches:
            patch.restore()
        pair.advance(1.1)
        self.assertEqual(pair.primary.state, "in_sync")
        self.assertNotIn("standby_error", pair.primary.repl.status())
        self.assertTrue(pair.standby.repl.state.synced)
        self.assertEqual([m.body for m in pair.standby.nsqd.topics["t"].queued()], [b"x"])

    def test_restarted_on_the_full_disk_it_is_not_synced(self) -> None:
        pair = self.pair
        self.full()
        pub(pair, b"x")
        path = pair.standby.data_path
        with open(os.path.join(path, STATE_FILE)) as f:
            self.assertTrue(json.load(f)["synced"])  # could not be written...
        self.assertFalse(os.path.exists(os.path.join(path, SYNCED_FILE)))  # ...but this is gone
        pair.standby.kill()
        pair.primary.kill()
        pair.standby.start()
        self.assertFalse(pair.standby.repl.state.synced)
        self.assertEqual(http(pair.standby.nsqd, "POST", "/replication/promote")[0], 409)

    def test_a_snapshot_it_cannot_say_is_whole_does_not_make_it_in_sync(self) -> None:
        pair = self.pair
        self.patch(replica_module, "write_atomic", no_space)
        self.patch(standby_module, "free_bytes", lambda path: 0)
        link = pair.primary.repl.link
        assert link is not None
        link.transport.loseConnection()
        pair.advance(1.0)  # linked again: BEGIN, ..., END, which it cannot write down
        self.assertNotEqual(pair.primary.state, "in_sync")
        self.assertFalse(pair.standby.repl.state.synced)
        self.assertIn("no space left on device", pair.primary.repl.status()["standby_error"].lower())


class FullDiskStartTests(unittest.TestCase):
    def test_a_node_of_a_pair_starts_on_a_full_disk(self) -> None:
        pair = ReplicaPair(standby_opts={"backend_factory": None}).start()
        pair.standby.kill()
        self.patch(replica_module, "write_atomic", no_space)
        self.patch(nsqd_module, "write_atomic", no_space)
        pair.standby.start()
        self.assertEqual(pair.standby.repl.state.role, "standby")
        self.assertTrue(pair.standby.nsqd.running)


class ReportingTests(unittest.TestCase):
    def test_stats_and_metrics_show_the_pair(self) -> None:
        pair = ReplicaPair().start()
        _, body = http(pair.primary.nsqd, "GET", "/stats?format=json")
        stats = json.loads(body)
        self.assertEqual(list(stats)[-1], "replication")
        self.assertEqual(
            {k: stats["replication"][k] for k in ("role", "epoch", "peer", "state", "degraded")},
            {"role": "primary", "epoch": 0, "peer": "127.0.0.1:4250", "state": "in_sync", "degraded": False},
        )
        _, text = http(pair.primary.nsqd, "GET", "/stats")
        self.assertIn(
            b"\nReplication: primary (epoch 0), standby 127.0.0.1:4250 in_sync, lag 0 msgs 0 bytes 0ms\n", text
        )
        _, metrics = http(pair.primary.nsqd, "GET", "/metrics")
        for line in (
            b"nsq_replication_primary 1.0",
            b'nsq_replication_state{state="in_sync"} 1.0',
            b"nsq_replication_degraded 0.0",
            b"nsq_replication_lag_messages 0.0",
        ):
            self.assertIn(line, metrics)
        _, metrics = http(pair.standby.nsqd, "GET", "/metrics")
        self.assertIn(b"nsq_replication_primary 0.0", metrics)
        pair.standby.kill()
        _, text = http(pair.primary.nsqd, "GET", "/stats")
        self.assertIn(b"standby 127.0.0.1:4250 disconnected - DEGRADED", text)

    def test_nothing_changes_without_replication(self) -> None:
        nsqd = make_nsqd()
        _, body = http(nsqd, "GET", "/stats?format=json")
        self.assertNotIn("replication", json.loads(body))
        _, text = http(nsqd, "GET", "/stats")
        self.assertNotIn(b"Replication", text)
        _, metrics = http(nsqd, "GET", "/metrics")
        self.assertNotIn(b"nsq_replication", metrics)
