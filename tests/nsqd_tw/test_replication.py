"""Replication (beyond Go): a primary streams to its standby over the link; the
standby keeps the same queues, serves no one, and refuses clearly."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from treq.testing import StubTreq
from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.trial import unittest

from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, MAGIC_V2
from nsqd_tw.core.replica import STATE_FILE, SYNCED_FILE, ReplicaState, StandbyApply
from nsqd_tw.core.topic import StandbyError
from nsqd_tw.http.api import NSQDHTTPAPI
from nsqd_tw.replication import wire
from nsqd_tw.replication.pairing import decide
from tests.helpers import FakeClient
from tests.nsqd_tw.replicas import Node, RawLink, ReplicaPair, held, live

DURABLE = {"backend_factory": None, "mem_queue_size": 0, "sync_every": 1}


def consume(nsqd: object, topic: str, channel: str, rdy: int = 100) -> FakeClient:
    client = FakeClient(nsqd)  # type: ignore[arg-type]
    client.command(b"SUB", topic, channel)
    assert client.frames() == [(FRAME_TYPE_RESPONSE, b"OK")]
    client.command(b"RDY", str(rdy))
    return client


class LinkTests(unittest.TestCase):
    def test_the_primary_dials_its_standby_and_both_are_in_sync(self) -> None:
        pair = ReplicaPair().start()
        self.assertEqual(pair.primary.state, "in_sync")
        self.assertEqual(pair.standby.state, "in_sync")
        self.assertIs(pair.primary.nsqd.shipper, pair.primary.repl.primary)
        self.assertIsNone(pair.primary.nsqd.standby)
        refusal = pair.standby.nsqd.standby
        assert refusal is not None
        self.assertEqual(str(refusal), "this nsqd is a standby (primary 127.0.0.1:4150, epoch 0)")
        status = pair.primary.repl.status()
        self.assertEqual(
            {k: status[k] for k in ("role", "epoch", "peer", "state", "mode")},
            {"role": "primary", "epoch": 0, "peer": "127.0.0.1:4250", "state": "in_sync", "mode": "sync"},
        )
        self.assertEqual(status["lag"], {"operations": 0, "messages": 0, "bytes": 0, "ms": 0})

    def test_roles_and_epochs_are_persisted(self) -> None:
        pair = ReplicaPair().start()
        with open(os.path.join(pair.standby.data_path, STATE_FILE)) as f:
            doc = json.load(f)
        self.assertEqual(
            (doc["role"], doc["epoch"], doc["peer"], doc["synced"]), ("standby", 0, "127.0.0.1:4150", True)
        )
        with open(os.path.join(pair.primary.data_path, STATE_FILE)) as f:
            doc = json.load(f)
        self.assertEqual((doc["role"], doc["peer"]), ("primary", "127.0.0.1:4250"))
        self.assertNotEqual(doc["node"], pair.standby.repl.state.node)

    def test_synced_is_said_by_replication_json_and_a_marker_file_both(self) -> None:
        """The marker is created once a snapshot arrived whole and removed before
        replication.json says otherwise: removing a file needs no free space."""
        pair = ReplicaPair(standby_opts=DURABLE).start()
        path = pair.standby.data_path
        marker = os.path.join(path, SYNCED_FILE)
        self.assertTrue(os.path.exists(marker))
        self.assertTrue(ReplicaState.load(path, "standby").synced)
        os.remove(marker)
        self.assertFalse(ReplicaState.load(path, "standby").synced)
        with open(marker, "w"):
            pass
        pair.standby.repl.diverged()
        self.assertFalse(os.path.exists(marker))
        with open(os.path.join(path, STATE_FILE)) as f:
            self.assertFalse(json.load(f)["synced"])
        with open(marker, "w"):
            pass
        self.assertFalse(ReplicaState.load(path, "standby").synced)  # replication.json says not
        self.assertFalse(os.path.exists(os.path.join(pair.primary.data_path, SYNCED_FILE)))

    def test_a_new_snapshot_removes_the_marker_until_it_ends(self) -> None:
        pair = ReplicaPair(standby_opts=DURABLE).start()
        marker = os.path.join(pair.standby.data_path, SYNCED_FILE)
        present: list[bool] = []
        apply = StandbyApply.topic_records

        def topic_records(self: StandbyApply, *args: Any) -> None:
            present.append(os.path.exists(marker))
            apply(self, *args)

        self.patch(StandbyApply, "topic_records", topic_records)
        pair.primary.nsqd.publish("t", [b"held"])
        pair.settle()
        assert pair.primary.repl.link is not None
        pair.primary.repl.link.transport.loseConnection()
        pair.advance(1.0)
        self.assertEqual((present, pair.standby.state), ([False], "in_sync"))
        self.assertTrue(os.path.exists(marker))

    def test_a_standby_not_durable_is_synced_after_a_restart_only_if_it_stopped_cleanly(self) -> None:
        """Its memory queues die with its process: killed, it was not synced any more."""
        pair = ReplicaPair(standby_opts={"backend_factory": None}).start()
        marker = os.path.join(pair.standby.data_path, SYNCED_FILE)
        self.assertTrue(pair.standby.repl.state.synced)
        self.assertFalse(os.path.exists(marker))  # while it runs
        pair.primary.nsqd.publish("t", [b"in its memory"])
        pair.settle()
        pair.standby.stop()  # what it holds goes to disk
        self.assertTrue(os.path.exists(marker))
        pair.primary.kill()
        pair.standby.start()
        self.assertTrue(pair.standby.repl.state.synced)
        self.assertFalse(os.path.exists(marker))
        self.assertEqual(pair.standby.nsqd.topics["t"].depth(), 1)  # written to disk as it stopped
        pair.standby.kill()
        pair.standby.start()
        self.assertFalse(pair.standby.repl.state.synced)

    def test_a_durable_standby_killed_is_still_synced(self) -> None:
        pair = ReplicaPair(standby_opts=DURABLE).start()
        pair.primary.nsqd.publish("t", [b"on its disk"])
        pair.settle()
        pair.standby.kill()
        pair.primary.kill()
        pair.standby.start()
        self.assertTrue(pair.standby.repl.state.synced)

    def test_a_wrong_secret_gets_nothing(self) -> None:
        pair = ReplicaPair()
        pair.primary.secret = b"not the secret"
        pair.start()
        pair.primary.nsqd.publish("t", [b"hello"])
        pair.settle()
        self.assertEqual(pair.primary.state, "disconnected")
        self.assertEqual(pair.standby.state, "disconnected")
        self.assertNotIn("t", pair.standby.nsqd.topics)
        self.assertIsNone(pair.standby.repl.link)

    def test_a_link_refused_before_it_is_established_is_dialed_again(self) -> None:
        pair = ReplicaPair()
        pair.primary.secret = b"not the secret"
        pair.start()
        self.assertEqual(pair.primary.state, "disconnected")
        pair.primary.repl.secret = pair.standby.secret  # fixed: the next attempt gets through
        pair.advance(3.0)
        self.assertEqual(pair.primary.state, "in_sync")

    def test_the_link_magic_on_a_node_without_replication_is_a_bad_protocol(self) -> None:
        pair = ReplicaPair().start()
        client = FakeClient(pair.primary.nsqd, magic=False)  # a V2Factory with no other magic
        client.send(wire.MAGIC)
        self.assertEqual(client.frames(), [(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL")])
        self.assertTrue(client.disconnected)

    def test_a_node_dialing_itself_refuses(self) -> None:
        pair = ReplicaPair()
        pair.primary.opts["replica"] = pair.primary.address
        pair.start()
        self.assertEqual(pair.primary.state, "disconnected")

    def test_who_is_primary_on_a_link(self) -> None:
        self.assertEqual(decide((0, "primary"), (0, "standby")), "me")
        self.assertEqual(decide((0, "standby"), (0, "primary")), "peer")
        self.assertEqual(decide((1, "primary"), (2, "primary")), "peer")
        self.assertEqual(decide((3, "standby"), (2, "primary")), None)  # a stale primary is no one's
        self.assertEqual(decide((2, "primary"), (2, "primary")), None)
        self.assertEqual(decide((2, "standby"), (2, "standby")), None)

    def test_a_lost_link_is_dialed_again_and_starts_with_a_new_snapshot(self) -> None:
        pair = ReplicaPair().start()
        pair.primary.nsqd.publish("t", [b"one"])
        pair.settle()
        assert pair.primary.repl.link is not None
        pair.primary.repl.link.transport.loseConnection()
        pair.settle()
        self.assertEqual(pair.primary.state, "disconnected")
        pair.primary.nsqd.publish("t", [b"two"])  # acknowledged alone (no --replication-required)
        pair.advance(1.0)
        self.assertEqual(pair.primary.state, "in_sync")
        topic = pair.standby.nsqd.topics["t"]
        self.assertEqual(sorted(m.body for m in topic.queued()), [b"one", b"two"])

    def test_a_silent_link_is_dropped(self) -> None:
        pair = ReplicaPair().start()
        link = pair.standby.repl.link
        assert link is not None
        pair.net.pumps.clear()  # nothing moves any more, both ways
        pair.standby.up = False  # and the primary cannot connect again
        pair.advance(7.0)
        self.assertTrue(link.closed)
        self.assertEqual(pair.standby.state, "disconnected")
        self.assertEqual(pair.primary.state, "disconnected")
        pair.standby.up = True  # reachable again: linked again
        pair.advance(3.0)
        self.assertEqual(pair.standby.state, "in_sync")
        self.assertIsNot(pair.standby.repl.link, link)


class StreamTests(unittest.TestCase):
    def setUp(self) -> None:
        self.pair = ReplicaPair().start()
        self.primary, self.standby = self.pair.primary.nsqd, self.pair.standby.nsqd

    def test_publishes_arrive_with_their_ids_timestamps_and_bodies(self) -> None:
        consumer = consume(self.primary, "events", "archive", rdy=0)
        client = FakeClient(self.primary)
        client.command(b"PUB", "events", body=b"one")
        client.command(b"MPUB", "events", body=b"\x00\x00\x00\x02\x00\x00\x00\x03two\x00\x00\x00\x05three")
        self.pair.settle()
        self.assertEqual(client.frames(), [(FRAME_TYPE_RESPONSE, b"OK")] * 2)
        self.assertEqual(
            [(m.id, m.timestamp, m.body) for m in held(self.pair.standby.channel("events", "archive"))],
            [(m.id, m.timestamp, m.body) for m in held(self.pair.primary.channel("events", "archive"))],
        )
        self.assertEqual(len(held(self.pair.standby.channel("events", "archive"))), 3)
        consumer.lose()

    def test_a_topic_without_channels_holds_them_there_too(self) -> None:
        self.primary.publish("held", [b"a", b"b"])
        self.pair.settle()
        self.assertEqual([m.body for m in self.standby.topics["held"].queued()], [b"a", b"b"])

    def test_dpub_is_deferred_on_the_standby(self) -> None:
        consume(self.primary, "t", "c", rdy=0)
        self.primary.publish("t", [b"later"], delay=30.0)
        self.pair.settle()
        channel = self.pair.standby.channel("t", "c")
        [msg] = channel.deferred.values()
        self.assertEqual(msg.body, b"later")
        self.assertAlmostEqual(msg.pri, self.primary.now() + 30.0, delta=0.2)

    def test_finished_messages_leave_the_standby(self) -> None:
        consumer = consume(self.primary, "t", "c", rdy=10)
        self.primary.publish("t", [b"%d" % i for i in range(5)])
        delivered = consumer.messages()
        self.assertEqual(len(delivered), 5)
        self.pair.settle()
        self.assertEqual(len(live(self.pair.standby.channel("t", "c"))), 5)  # in flight there: queued here
        for msg in reversed(delivered[1:]):  # out of order: counted until the head goes
            consumer.command(b"FIN", msg.id)
        self.pair.settle()
        standby = self.pair.standby.channel("t", "c")
        self.assertEqual(live(standby), [delivered[0].id])
        consumer.command(b"FIN", delivered[0].id)
        self.pair.settle()
        self.assertEqual(held(standby), [])
        self.assertEqual(standby.skips, {})

    def test_a_requeued_message_keeps_its_attempts_and_delay(self) -> None:
        consumer = consume(self.primary, "t", "c", rdy=1)
        self.primary.publish("t", [b"x"])
        [msg] = consumer.messages()
        consumer.command(b"REQ", msg.id, "20000")
        self.pair.settle()
        standby = self.pair.standby.channel("t", "c")
        self.assertEqual(live(standby), [msg.id])
        [copy] = standby.deferred.values()
        self.assertEqual((copy.id, copy.attempts, copy.body), (msg.id, 1, b"x"))
        self.assertAlmostEqual(copy.pri, self.primary.now() + 20.0, delta=0.2)
        # due, delivered again, requeued at once, then finished: nothing left anywhere
        self.pair.advance(21.0)
        self.primary.queue_scan()
        [again] = consumer.messages()
        self.assertEqual(again.attempts, 2)
        consumer.command(b"REQ", again.id, "0")
        [third] = consumer.messages()
        self.pair.settle()
        self.assertEqual(live(standby), [msg.id])
        self.assertEqual(max(m.attempts for m in held(standby)), 2)
        consumer.command(b"FIN", third.id)
        self.pair.settle()
        self.assertEqual(live(standby), [])

    def test_a_timed_out_message_and_a_gone_consumer_stay_held(self) -> None:
        consumer = consume(self.primary, "t", "c", rdy=2)
        self.primary.publish("t", [b"a", b"b"])
        first, second = consumer.messages()
        self.pair.advance(61.0)  # --msg-timeout 60s
        self.pair.settle()
        standby = self.pair.standby.channel("t", "c")
        self.assertEqual(sorted(live(standby)), sorted([first.id, second.id]))
        consumer.lose()
        self.pair.settle()
        self.assertEqual(sorted(live(standby)), sorted([first.id, second.id]))

    def test_topic_and_channel_changes_follow(self) -> None:
        primary = self.primary
        consumer = consume(primary, "t", "c", rdy=0)
        primary.get_topic("t").get_channel("other")
        primary.publish("t", [b"1", b"2"])
        primary.topics["t"].pause()
        primary.topics["t"].channels["c"].pause()
        primary.topics["t"].update_settings({"max_age": 60.0})
        primary.topics["t"].update_settings({"max_attempts": 3}, primary.topics["t"].channels["c"])
        self.pair.settle()
        topic = self.standby.topics["t"]
        self.assertTrue(topic.paused)
        self.assertTrue(topic.channels["c"].paused)
        self.assertEqual(topic.own_settings, {"max_age": 60.0})
        self.assertEqual(topic.channels["c"].own_settings, {"max_attempts": 3})
        primary.topics["t"].channels["other"].empty()
        primary.topics["t"].unpause()
        self.pair.settle()
        self.assertFalse(topic.paused)
        self.assertEqual(held(topic.channels["other"]), [])
        self.assertEqual(len(held(topic.channels["c"])), 2)
        primary.topics["t"].delete_existing_channel("other")
        self.pair.settle()
        self.assertEqual(sorted(topic.channels), ["c"])
        consumer.lose()
        primary.delete_existing_topic("t")
        self.pair.settle()
        self.assertNotIn("t", self.standby.topics)

    def test_ephemeral_topics_are_not_replicated(self) -> None:
        consume(self.primary, "t#ephemeral", "c", rdy=0)
        self.primary.publish("t#ephemeral", [b"gone"])
        self.pair.settle()
        self.assertNotIn("t#ephemeral", self.standby.topics)

    def test_expired_messages_leave_the_standby_as_the_primary_drops_them(self) -> None:
        consume(self.primary, "t", "c", rdy=0)
        self.primary.topics["t"].update_settings({"max_age": 5.0})
        self.primary.publish("t", [b"old"])
        self.pair.settle()
        self.pair.advance(7.0)
        self.primary.queue_scan()  # the TTL sweep
        self.pair.settle()
        self.assertEqual(held(self.pair.primary.channel("t", "c")), [])
        self.assertEqual(live(self.pair.standby.channel("t", "c")), [])


class SnapshotTests(unittest.TestCase):
    def test_a_standby_linked_late_gets_everything_the_primary_holds(self) -> None:
        pair = ReplicaPair()
        pair.standby.start()
        pair.primary.opts["replica"] = ""  # not linked yet: --replica set later
        pair.primary.opts["replication_secret_file"] = "x"
        pair.primary.start()
        primary = pair.primary.nsqd
        primary.publish("held", [b"h1", b"h2"])
        consumer = consume(primary, "t", "c", rdy=1)
        primary.get_topic("t").get_channel("idle")
        primary.publish("t", [b"a", b"b", b"c"])
        primary.publish("t", [b"d"], delay=120.0)
        primary.topics["t"].channels["idle"].pause()
        [in_flight] = consumer.messages()
        self.assertEqual(pair.primary.state, "disconnected")

        pair.primary.repl.state.peer = pair.standby.address
        pair.primary.repl.pairing.dial()
        pair.settle()
        self.assertEqual(pair.primary.state, "in_sync")
        standby = pair.standby.nsqd
        self.assertEqual(sorted(standby.topics), ["held", "t"])
        self.assertEqual(sorted(m.body for m in standby.topics["held"].queued()), [b"h1", b"h2"])
        for name in ("c", "idle"):
            self.assertEqual(
                [(m.id, m.body) for m in held(pair.standby.channel("t", name))],
                [(m.id, m.body) for m in held(pair.primary.channel("t", name))],
            )
        self.assertTrue(standby.topics["t"].channels["idle"].paused)
        [deferred] = pair.standby.channel("t", "c").deferred.values()
        self.assertEqual(deferred.body, b"d")
        consumer.command(b"FIN", in_flight.id)
        pair.settle()
        self.assertNotIn(in_flight.id, live(pair.standby.channel("t", "c")))

    def test_a_standby_drops_what_it_held_before_the_snapshot(self) -> None:
        pair = ReplicaPair()
        pair.standby.start()
        StandbyApply(pair.standby.nsqd).publish("stale", [b"x" * 26])
        self.assertIn("stale", pair.standby.nsqd.topics)
        pair.primary.start()
        pair.settle()
        self.assertNotIn("stale", pair.standby.nsqd.topics)

    def test_disk_queues_are_sent_from_their_files(self) -> None:
        pair = ReplicaPair(
            primary_opts={"backend_factory": None, "mem_queue_size": 2},
            standby_opts={"backend_factory": None, "mem_queue_size": 2},
        )
        pair.standby.start()
        pair.primary.opts["replica"] = ""
        pair.primary.start()
        primary = pair.primary.nsqd
        primary.get_topic("t").get_channel("c")
        primary.publish("t", [b"m%03d" % i for i in range(50)])
        channel = pair.primary.channel("t", "c")
        self.assertGreater(channel.backend.depth(), 40)
        pair.primary.repl.state.peer = pair.standby.address
        pair.primary.repl.pairing.dial()
        pair.settle()
        self.assertEqual(pair.primary.state, "in_sync")
        got = pair.standby.channel("t", "c")
        self.assertEqual(sorted(m.body for m in held(got)), [b"m%03d" % i for i in range(50)])
        self.assertGreater(got.backend.depth(), 40)
        # a consumer on the primary finishes them all: the standby's disk queue empties too
        consumer = consume(primary, "t", "c", rdy=100)
        for _ in range(5):
            for msg in consumer.messages():
                consumer.command(b"FIN", msg.id)
            pair.settle()
        self.assertEqual(channel.depth(), 0)
        self.assertEqual(got.depth(), 0)
        self.assertEqual(got.skips, {})


class FramedAppendTests(unittest.TestCase):
    """A standby whose channels keep no more in memory appends a PUB's records
    to their disk queues as they came: one write each."""

    def setUp(self) -> None:
        disk = {"backend_factory": None, "mem_queue_size": 2}
        self.pair = ReplicaPair(primary_opts=disk, standby_opts=disk).start()
        self.primary = self.pair.primary.nsqd
        for name in ("a", "b"):
            self.primary.get_topic("t").get_channel(name)
        self.pair.settle()
        self.appended: list[int] = []
        standby = self.pair.standby.nsqd
        for name in ("a", "b"):
            backend = standby.topics["t"].channels[name].backend
            self.patch(backend, "put_framed", self.recording(backend.put_framed))

    def recording(self, put_framed: Any) -> Any:
        def put(batch: Any) -> Any:
            self.appended.append(batch.count)
            return put_framed(batch)

        return put

    def test_once_memory_is_full_each_channel_takes_a_publish_in_one_write(self) -> None:
        self.primary.publish("t", [b"m%03d" % i for i in range(2)])  # fills memory (2) one by one
        self.pair.settle()
        self.assertEqual(self.appended, [])
        self.primary.publish("t", [b"m%03d" % i for i in range(2, 50)])
        self.pair.settle()
        self.assertEqual(self.appended, [48, 48])
        standby = self.pair.standby.nsqd
        for name in ("a", "b"):
            got = self.pair.standby.channel("t", name)
            self.assertEqual(
                [(m.id, m.timestamp, m.body) for m in held(got)],
                [(m.id, m.timestamp, m.body) for m in held(self.pair.primary.channel("t", name))],
            )
            self.assertEqual(got.message_count, 50)
        self.assertEqual((standby.topics["t"].message_count, standby.topics["t"].message_bytes), (50, 200))

    def test_finished_ones_leave_its_disk_queues(self) -> None:
        self.primary.publish("t", [b"m%03d" % i for i in range(20)])
        self.pair.settle()
        consumer = consume(self.primary, "t", "a", rdy=100)
        for _ in range(3):
            for msg in consumer.messages():
                consumer.command(b"FIN", msg.id)
            self.pair.settle()
        self.assertEqual(self.pair.standby.channel("t", "a").depth(), 0)
        self.assertEqual(self.pair.standby.channel("t", "b").depth(), 20)

    def test_not_while_a_channel_has_room_in_memory_or_the_topic_is_paused(self) -> None:
        standby = self.pair.standby.nsqd
        self.primary.publish("t", [b"x1", b"x2"])
        self.pair.settle()
        self.pair.standby.channel("t", "b").memory.popleft()  # room in one channel
        self.primary.publish("t", [b"x3", b"x4"])
        self.pair.settle()
        self.primary.get_topic("t").pause()
        self.pair.settle()
        self.primary.publish("t", [b"x5"])
        self.pair.settle()
        self.assertEqual(self.appended, [])
        self.assertEqual(standby.topics["t"].depth(), 1)

    def test_a_failed_write_takes_it_back_from_every_channel_and_fails_the_link(self) -> None:
        self.primary.publish("t", [b"x1", b"x2"])
        self.pair.settle()
        standby = self.pair.standby.nsqd
        backend = standby.topics["t"].channels["b"].backend

        def full(batch: Any) -> Any:
            raise OSError(28, "No space left on device")

        self.patch(backend, "put_framed", full)
        self.primary.publish("t", [b"x3", b"x4"])
        self.pair.settle()
        self.assertEqual([standby.topics["t"].channels[c].depth() for c in ("a", "b")], [2, 2])
        self.assertIsNotNone(standby.health_error)
        self.assertNotEqual(self.pair.primary.state, "in_sync")


class StandbyRefusalTests(unittest.TestCase):
    def setUp(self) -> None:
        self.pair = ReplicaPair().start()
        self.pair.primary.nsqd.get_topic("t").get_channel("c")
        self.pair.settle()
        self.standby = self.pair.standby.nsqd

    def test_producers_are_refused_naming_the_primary(self) -> None:
        for verb, command in (
            (b"PUB", lambda c: c.command(b"PUB", "t", body=b"x")),
            (b"MPUB", lambda c: c.command(b"MPUB", "new", body=b"\x00\x00\x00\x01\x00\x00\x00\x01x")),
            (b"DPUB", lambda c: c.command(b"DPUB", "t", "10", body=b"x")),
        ):
            client = FakeClient(self.standby)
            command(client)
            self.assertEqual(
                client.frames(),
                [
                    (
                        FRAME_TYPE_ERROR,
                        b"E_%s_FAILED %s failed this nsqd is a standby (primary 127.0.0.1:4150, epoch 0)"
                        % (verb, verb),
                    )
                ],
            )
        self.assertNotIn("new", self.standby.topics)

    def test_consumers_are_refused(self) -> None:
        for topic, channel in (("t", "c"), ("t", "new"), ("new", "c")):
            client = FakeClient(self.standby)
            client.command(b"SUB", topic, channel)
            self.assertEqual(
                client.frames(),
                [
                    (
                        FRAME_TYPE_ERROR,
                        b"E_SUB_FAILED SUB failed this nsqd is a standby (primary 127.0.0.1:4150, epoch 0)",
                    )
                ],
            )
        self.assertEqual(sorted(self.standby.topics["t"].channels), ["c"])

    def test_http_changes_are_refused_and_ping_keeps_it_out_of_rotation(self) -> None:
        treq = StubTreq(NSQDHTTPAPI(self.standby).resource())

        def call(method: str, url: str) -> tuple[int, bytes]:
            resp = self.successResultOf(treq.request(method, "http://n" + url, data=b"x"))
            return resp.code, self.successResultOf(resp.content())

        refused = (503, b'{"message":"STANDBY","primary":"127.0.0.1:4151","epoch":0}')
        self.assertEqual(call("POST", "/pub?topic=t"), refused)
        self.assertEqual(call("POST", "/topic/pause?topic=t"), refused)
        self.assertEqual(call("POST", "/channel/empty?topic=t&channel=c"), refused)
        self.assertEqual(call("PUT", "/topic/settings?topic=t"), refused)
        self.assertEqual(call("GET", "/ping"), (503, b"NOK - standby of 127.0.0.1:4150 (epoch 0)"))
        code, body = call("GET", "/replication")
        self.assertEqual((code, json.loads(body)["role"], json.loads(body)["state"]), (200, "standby", "in_sync"))
        self.assertEqual(call("GET", "/topic/settings?topic=t")[0], 200)

    def test_a_primary_answers_404_for_replication_without_it(self) -> None:
        from tests.helpers import make_nsqd

        treq = StubTreq(NSQDHTTPAPI(make_nsqd()).resource())
        resp = self.successResultOf(treq.get("http://n/replication"))
        self.assertEqual(resp.code, 404)

    def test_the_refusal_is_a_standby_error(self) -> None:
        self.assertIsInstance(self.standby.standby, StandbyError)
        self.assertRaises(StandbyError, self.standby.publish, "t", [b"x"])
        self.assertEqual(MAGIC_V2, b"  V2")


class Logged:
    """The log events of a test, as ``(level, text)``."""

    def __init__(self, case: unittest.TestCase) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        case.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def lines(self, text: str, level: LogLevel | None = None) -> list[str]:
        out = [formatEvent(e) for e in self.events if level is None or e.get("log_level") == level]
        return [line for line in out if text in line]


class HandshakeLimitTests(unittest.TestCase):
    """Before it has authenticated, a link may send a small HELLO within
    --replication-timeout, and only a few may wait at once."""

    def setUp(self) -> None:
        self.log = Logged(self)
        self.pair = ReplicaPair().start()
        self.standby = self.pair.standby
        self.linked = self.standby.repl.link

    def assert_undisturbed(self) -> None:
        """The standby's link to its primary is the one it had, in sync, and streams."""
        self.assertIs(self.standby.repl.link, self.linked)
        self.pair.primary.nsqd.publish("after", [b"x"])
        self.pair.settle()
        self.assertEqual([m.body for m in self.standby.nsqd.topics["after"].queued()], [b"x"])

    def test_a_frame_header_over_64_kib_is_refused_at_once_and_nothing_after_it_is_kept(self) -> None:
        raw = RawLink(self.standby)
        raw.send(wire.MAGIC + struct.pack(">IB", wire.MAX_FRAME, wire.HELLO) + b"\0" * 4096)
        why = "bad frame - a frame of 67108864 bytes, over the limit of 65536"
        self.assertEqual(raw.errors(), [why])
        self.assertTrue(raw.closed)
        raw.send(b"\0" * 65536)
        self.assertEqual(raw.link.reader.buffered, 0)
        self.assertNotIn(raw.link, self.standby.repl.links)
        [line] = self.log.lines("before authentication", LogLevel.error)
        self.assertEqual(
            line, f"REPLICATION: refused a link before authentication (the last from {raw.link.address}) - {why}"
        )
        self.assert_undisturbed()

    def test_a_hello_nested_too_deep_is_refused_in_one_line(self) -> None:
        raw = RawLink(self.standby)
        raw.send(wire.MAGIC + wire.frame(wire.HELLO, b"[" * 30_000 + b"]" * 30_000))
        self.assertEqual(raw.errors(), ["bad frame - payload nested deeper than 32"])
        self.assertTrue(raw.closed)
        self.assertEqual(len(self.log.lines("before authentication")), 1)
        self.assertEqual([e for e in self.log.events if "log_failure" in e], [])
        self.assert_undisturbed()

    def test_the_handshake_must_end_within_the_timeout_however_it_drips(self) -> None:
        raw = RawLink(self.standby)
        raw.send(wire.MAGIC + struct.pack(">IB", 2000, wire.HELLO))
        for _ in range(9):  # a byte every half second: never silent
            self.pair.advance(0.5)
            raw.send(b"\0")
        self.assertFalse(raw.closed)
        self.pair.advance(0.6)
        self.assertTrue(raw.closed)
        self.assertEqual(raw.errors(), ["no handshake in 5s"])
        self.assertEqual(len(self.log.lines("no handshake in 5s", LogLevel.error)), 1)
        self.assertNotIn(raw.link, self.standby.repl.links)
        self.assert_undisturbed()

    def test_at_most_four_links_wait_for_authentication(self) -> None:
        raws = [RawLink(self.standby) for _ in range(6)]
        for raw in raws:
            raw.send(wire.MAGIC)
        self.assertEqual([raw.closed for raw in raws], [False] * 4 + [True] * 2)
        why = "too many links awaiting authentication (at most 4 at once)"
        self.assertEqual([raw.errors() for raw in raws[4:]], [[why], [why]])
        self.assertEqual(
            self.log.lines("too many links", LogLevel.warn),
            [f"REPLICATION: refused a link (the last from 127.0.0.1:{raws[4].transport.getPeer().port}): {why}"],
        )
        self.pair.advance(10.0)  # the rest of the refusals in one line
        self.assertEqual(len(self.log.lines("too many links")), 2)
        self.assertIn("refused a link (the last from", self.log.lines("too many links")[1])
        self.assertTrue(all(raw.closed for raw in raws))  # cut at the deadline
        # the primary's link came through meanwhile, or comes through now: in sync
        self.assertEqual(self.standby.state, "in_sync")

    def test_the_primary_waits_for_a_place_while_strangers_hold_them(self) -> None:
        raws = [RawLink(self.standby) for _ in range(4)]
        for raw in raws:
            raw.send(wire.MAGIC)
        assert self.linked is not None
        self.linked.transport.loseConnection()  # the primary's link fails: it dials again, and waits
        self.pair.advance(3.0)
        self.assertEqual(self.pair.primary.state, "disconnected")
        self.assertTrue(self.log.lines("too many links awaiting authentication"))
        self.pair.advance(4.0)  # the strangers are cut at 5s; the primary's next attempt gets in
        self.assertTrue(all(raw.closed for raw in raws))
        self.assertEqual(self.pair.primary.state, "in_sync")

    def test_once_authenticated_a_link_takes_frames_up_to_64_mib(self) -> None:
        for link in (self.pair.primary.repl.link, self.standby.repl.link):
            assert link is not None
            self.assertEqual(link.reader.max_frame, wire.MAX_FRAME)
        raw = RawLink(self.standby)
        raw.send(wire.MAGIC)
        self.assertEqual(raw.link.reader.max_frame, wire.MAX_HELLO)


class PeerIdentityTests(unittest.TestCase):
    """Once authenticated, a node keeps to the peer of its pair (its node ID in
    replication.json): a standby follows its primary, a primary takes no other
    dialer as its standby."""

    def setUp(self) -> None:
        self.log = Logged(self)

    def node_file(self, node: Node) -> dict[str, Any]:
        with open(os.path.join(node.data_path, STATE_FILE)) as f:
            return dict(json.load(f))

    def test_each_node_records_its_peer_node(self) -> None:
        pair = ReplicaPair().start()
        p, s = pair.primary.repl.state.node, pair.standby.repl.state.node
        self.assertEqual(self.node_file(pair.primary)["peer_node"], s)
        self.assertEqual(self.node_file(pair.standby)["peer_node"], p)

    def test_a_file_without_the_peer_node_loads_and_the_next_link_records_it(self) -> None:
        pair = ReplicaPair()
        with open(os.path.join(pair.standby.data_path, STATE_FILE), "w") as f:
            json.dump({"node": "s" * 32, "role": "standby", "epoch": 2, "peer": "127.0.0.1:4150", "synced": True}, f)
        state = ReplicaState.load(pair.standby.data_path, "primary")
        self.assertEqual((state.node, state.epoch, state.peer_node), ("s" * 32, 2, ""))
        with open(os.path.join(pair.primary.data_path, STATE_FILE), "w") as f:
            json.dump({"node": "p" * 32, "role": "primary", "epoch": 2, "peer": "127.0.0.1:4250"}, f)
        pair.start()
        self.assertEqual(pair.standby.state, "in_sync")
        self.assertEqual(self.node_file(pair.standby)["peer_node"], "p" * 32)
        self.assertEqual(self.node_file(pair.primary)["peer_node"], "s" * 32)

    def test_a_second_primary_is_refused_and_the_standby_keeps_its_primary(self) -> None:
        pair = ReplicaPair().start()
        primary, standby = pair.primary, pair.standby
        consume(primary.nsqd, "t", "c", rdy=0)
        primary.nsqd.publish("t", [b"a", b"b"])
        pair.settle()
        linked = standby.repl.link
        intruder = pair.add(Node(pair, 4350, "primary", replica=standby.address)).start()
        pair.settle()
        pair.advance(6.0)  # it tries again and again
        # the witness knows the pair's primary (the same secret is the same pair): the intruder is deposed there
        self.assertIn("no longer the primary", str(intruder.nsqd.standby))
        self.assertIs(standby.repl.link, linked)
        self.assertEqual(standby.state, "in_sync")
        self.assertEqual(sorted(m.body for m in held(standby.channel("t", "c"))), [b"a", b"b"])
        self.assertEqual(
            (standby.repl.state.peer, standby.repl.state.peer_node), (primary.address, primary.repl.state.node)
        )
        self.assertEqual(intruder.state, "disconnected")
        refusal = (
            f"refusing primary 127.0.0.1:4350 (node {intruder.repl.state.node}, epoch 0): this standby follows "
            f"primary 127.0.0.1:4150 (node {primary.repl.state.node}, epoch 0); to move it to another primary, stop "
            "it and remove replication.json"
        )
        lines = self.log.lines("REPLICATION: refusing primary", LogLevel.error)
        self.assertEqual(lines[0], f"REPLICATION: {refusal}")
        self.assertEqual(len(lines), 1)  # within 10 s: one line; the count of the others after
        told = self.log.lines(f"REPLICATION: 127.0.0.1:4250 refused the link - {refusal}", LogLevel.error)
        self.assertGreater(len(told), 3)  # the intruder, at each attempt
        pair.advance(5.0)
        lines = self.log.lines("REPLICATION: refusing primary", LogLevel.error)
        self.assertEqual(len(lines), 2)
        self.assertRegex(lines[1], r"\(\d+ attempts\) in the last 10s$")
        primary.nsqd.publish("t", [b"c"])
        pair.settle()
        self.assertEqual(sorted(m.body for m in held(standby.channel("t", "c"))), [b"a", b"b", b"c"])

        # the primary killed, the standby promoted: it takes the intruder as its standby no more
        primary.kill()
        standby.repl.promote()
        pair.advance(3.0)
        self.assertEqual(len(self.log.lines("REPLICATION: refusing standby 127.0.0.1:4350", LogLevel.error)), 1)
        self.assertEqual(standby.state, "disconnected")
        self.assertEqual(intruder.repl.state.role, "standby")  # at a lower epoch: it serves no more
        self.assertEqual(sorted(m.body for m in held(standby.channel("t", "c"))), [b"a", b"b", b"c"])

    def test_a_new_primary_of_the_pair_at_a_higher_epoch_is_followed(self) -> None:
        pair = ReplicaPair().start()
        newer = pair.add(Node(pair, 4350, "primary", replica=pair.standby.address))
        os.makedirs(newer.data_path, exist_ok=True)
        ReplicaState("n" * 32, "primary", 3, pair.standby.address).save(newer.data_path)
        newer.start()
        pair.settle()
        newer.nsqd.publish("u", [b"from the new primary"])
        pair.advance(3.0)
        state = pair.standby.repl.state
        self.assertEqual((state.peer, state.peer_node, state.epoch), (newer.address, "n" * 32, 3))
        self.assertEqual(pair.standby.state, "in_sync")
        self.assertNotIn("t", pair.standby.nsqd.topics)
        self.assertEqual([m.body for m in pair.standby.nsqd.topics["u"].queued()], [b"from the new primary"])

    def test_a_primary_takes_no_other_dialer_as_its_standby(self) -> None:
        pair = ReplicaPair()
        os.makedirs(pair.primary.data_path, exist_ok=True)
        ReplicaState("p" * 32, "primary", 1, pair.standby.address).save(pair.primary.data_path)
        pair.start()
        consume(pair.primary.nsqd, "t", "c", rdy=0)
        pair.primary.nsqd.publish("t", [b"a"])
        pair.settle()
        linked = pair.primary.repl.link
        # another node with the secret names this primary as its replica
        stranger = pair.add(Node(pair, 4350, "primary", replica=pair.primary.address)).start()
        pair.advance(3.0)
        self.assertIs(pair.primary.repl.link, linked)
        self.assertEqual(pair.primary.state, "in_sync")
        self.assertTrue(
            self.log.lines(
                f"refusing standby 127.0.0.1:4350 (node {stranger.repl.state.node}, epoch 0)", LogLevel.error
            )
        )
        # the stranger met a primary at a higher epoch: it serves no more beside it, and got nothing from it
        self.assertIsNone(stranger.repl.link)
        self.assertEqual((stranger.repl.state.role, stranger.repl.state.epoch), ("standby", 1))
        self.assertIsNotNone(stranger.nsqd.standby)
        self.assertEqual(stranger.nsqd.topics, {})
        pair.primary.nsqd.publish("t", [b"b"])
        pair.settle()
        self.assertEqual(sorted(m.body for m in held(pair.standby.channel("t", "c"))), [b"a", b"b"])

    def test_a_stale_primary_refused_by_a_standby_at_a_higher_epoch_stops_serving(self) -> None:
        pair = ReplicaPair()
        os.makedirs(pair.standby.data_path, exist_ok=True)
        ReplicaState("s" * 32, "standby", 3, "127.0.0.1:4999", peer_node="o" * 32).save(pair.standby.data_path)
        pair.start()
        node = pair.primary.repl.state.node
        [line] = self.log.lines("REPLICATION: refusing primary", LogLevel.error)
        self.assertEqual(
            line,
            f"REPLICATION: refusing primary 127.0.0.1:4150 (node {node}, epoch 0): this standby follows primary "
            f"127.0.0.1:4999 (node {'o' * 32}, epoch 3); to move it to another primary, stop it and remove "
            "replication.json",
        )
        self.assertEqual((pair.primary.repl.state.role, pair.primary.repl.state.epoch), ("standby", 3))
        self.assertIsNotNone(pair.primary.nsqd.standby)
        self.assertEqual(pair.standby.repl.state.peer_node, "o" * 32)

    def test_a_primary_dialing_its_replica_takes_a_replaced_host_with_a_warning(self) -> None:
        pair = ReplicaPair().start()
        old = pair.standby.repl.state.node
        pair.standby.kill()
        replaced = pair.add(Node(pair, 4250, "standby")).start()  # a new host, its data path empty
        pair.advance(3.0)
        self.assertEqual(pair.primary.state, "in_sync")
        new = replaced.repl.state.node
        self.assertEqual(pair.primary.repl.state.peer_node, new)
        self.assertEqual(self.node_file(pair.primary)["peer_node"], new)
        [line] = self.log.lines("is another node than the standby", LogLevel.warn)
        self.assertIn(f"(node {new}, was {old})", line)
