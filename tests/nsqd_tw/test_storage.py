"""nsqd with disk queues: metadata, the data-path lock, overflow, shutdown, durable mode."""

from __future__ import annotations

import json
import os

from twisted.trial import unittest

from nsq_service.options import StartError
from nsq_wire.commands import encode_command, mpub
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE
from nsqd_tw.core.metadata import ChannelMeta, TopicMeta, encode_metadata
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.storage import records, syncer
from tests.helpers import FakeClient, make_nsqd
from tests.nsqd_tw.test_channel import FakeConsumer

_pwrite = os.pwrite


class StorageTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.running: list[NSQD] = []

    def tearDown(self) -> None:
        for n in self.running:
            if n.running:
                n.stopService()

    def start(self, **kw) -> NSQD:
        kw.setdefault("data_path", self.dir)
        n = make_nsqd(backend_factory=None, **kw)
        n.privilegedStartService()
        n.startService()
        self.running.append(n)
        return n

    def stop(self, n: NSQD) -> None:
        self.successResultOf(n.stopService())

    def crash(self, n: NSQD) -> None:
        """Abandon n as a killed process would: nothing flushed, lock released."""
        n.running = False
        n.dirlock.unlock()

    def metadata(self) -> dict:
        with open(os.path.join(self.dir, "nsqd.dat")) as f:
            return json.load(f)

    def publish(self, n: NSQD, topic: str, bodies: list[bytes], delay: float = 0.0) -> None:
        n.publish(topic, bodies, delay)
        n.reactor.advance(0)


class MetadataTests(StorageTestCase):
    def test_written_at_start_in_gos_shape(self) -> None:
        self.start()
        with open(os.path.join(self.dir, "nsqd.dat"), "rb") as f:
            self.assertEqual(f.read(), b'{"topics":null,"version":"1.3.0"}')

    def test_changes_are_persisted(self) -> None:
        n = self.start()
        t = n.get_topic("t")
        t.get_channel("c").pause()
        t.get_channel("e#ephemeral")
        n.get_topic("x#ephemeral")
        n.get_topic("empty")
        n.reactor.advance(0)
        with open(os.path.join(self.dir, "nsqd.dat"), "rb") as f:
            self.assertEqual(
                f.read(),
                b'{"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":true}]},'
                b'{"name":"empty","paused":false,"channels":null}],"version":"1.3.0"}',
            )
        n.delete_existing_topic("t")
        n.reactor.advance(0)
        self.assertEqual([t["name"] for t in self.metadata()["topics"]], ["empty"])

    def test_every_change_reaches_nsqd_dat(self) -> None:
        """Each topic's entry is kept encoded between changes; whatever changed, the
        file written is what the topics and channels are at that moment."""
        n = self.start()

        def expect() -> bytes:
            topics = [
                TopicMeta(
                    t.name, t.paused, [ChannelMeta(c.name, c.paused) for c in t.channels.values() if not c.ephemeral]
                )
                for t in n.topics.values()
                if not t.ephemeral
            ]
            return encode_metadata(topics, "1.3.0")

        t = n.get_topic("t")
        u = n.get_topic("u")
        steps = [
            lambda: t.get_channel("c"),
            lambda: u.get_channel("d"),
            lambda: t.get_channel("c").pause(),
            lambda: t.pause(),
            lambda: t.get_channel("e#ephemeral"),
            lambda: t.get_channel("c").unpause(),
            lambda: t.get_channel("f"),
            lambda: t.delete_existing_channel("c"),
            lambda: u.unpause() or u.get_channel("d").pause(),
            lambda: n.delete_existing_topic("t"),
            lambda: n.get_topic("t").get_channel("c"),
        ]
        for i, step in enumerate(steps):
            step()
            n.reactor.advance(0)
            with open(os.path.join(self.dir, "nsqd.dat"), "rb") as f:
                self.assertEqual(f.read(), expect(), f"after step {i}")
        self.assertEqual(
            self.metadata()["topics"],
            [
                {"name": "u", "paused": False, "channels": [{"name": "d", "paused": True}]},
                {"name": "t", "paused": False, "channels": [{"name": "c", "paused": False}]},
            ],
        )

    def test_changes_in_one_turn_share_one_write(self) -> None:
        n = self.start()
        writes = []
        self.patch(syncer, "write_atomic", lambda path, data: writes.append((path, data)))
        t = n.get_topic("t")
        for i in range(100):
            t.get_channel(f"c{i}")
        n.reactor.advance(0)
        n.reactor.advance(0)
        (data,) = [d for path, d in writes if path.endswith("nsqd.dat")]
        self.assertEqual([c["name"] for c in json.loads(data)["topics"][0]["channels"]], [f"c{i}" for i in range(100)])

    def test_loaded_at_start(self) -> None:
        with open(os.path.join(self.dir, "nsqd.dat"), "w") as f:
            json.dump(
                {
                    "topics": [
                        {"name": "a", "paused": True, "channels": [{"name": "c1", "paused": True}, {"name": "c2"}]},
                        {"name": "bad name!", "paused": False, "channels": None},
                    ],
                    "version": "1.2.1",
                },
                f,
            )
        n = self.start()
        self.assertEqual(list(n.topics), ["a"])
        a = n.topics["a"]
        self.assertEqual((a.paused, a.channels["c1"].paused, a.channels["c2"].paused), (True, True, False))
        self.assertEqual(self.metadata()["version"], "1.3.0")

    def test_unparsable_metadata_is_fatal(self) -> None:
        with open(os.path.join(self.dir, "nsqd.dat"), "w") as f:
            f.write("{not json")
        e = self.assertRaises(StartError, self.start)
        self.assertEqual(
            str(e),
            f"failed to load metadata - failed to parse metadata in {self.dir}/nsqd.dat - "
            "invalid character 'n' looking for beginning of object key string",
        )

    def test_data_path_lock(self) -> None:
        self.start()
        e = self.assertRaises(StartError, self.start)
        self.assertEqual(
            str(e),
            f"failed to instantiate nsqd - failed to lock data-path: cannot flock directory {self.dir} - "
            "resource temporarily unavailable "
            "(possibly in use by another instance of nsqd)",
        )

    def test_missing_data_path(self) -> None:
        e = self.assertRaises(StartError, self.start, data_path=self.dir + "/nope")
        self.assertEqual(
            str(e),
            f"failed to instantiate nsqd - failed to lock data-path: open {self.dir}/nope: no such file or directory",
        )


class OverflowTests(StorageTestCase):
    def test_past_mem_queue_size_goes_to_disk(self) -> None:
        n = self.start(mem_queue_size=5)
        ch = n.get_topic("t").get_channel("c")
        self.publish(n, "t", [b"%d" % i for i in range(12)])
        self.assertEqual((len(ch.memory), ch.backend.depth()), (5, 7))
        self.assertTrue(os.path.exists(os.path.join(self.dir, "t:c.diskqueue.000000.dat")))

    def test_mem_queue_size_zero_sends_everything_through_disk(self) -> None:
        n = self.start(mem_queue_size=0)
        ch = n.get_topic("t").get_channel("c")
        c = FakeConsumer(1, rdy=10)
        ch.add_client(c)
        self.publish(n, "t", [b"a", b"b"])
        self.assertEqual(len(ch.memory), 0)
        self.assertEqual([m.body for m in c.got], [b"a", b"b"])

    def test_ephemeral_never_touches_disk(self) -> None:
        n = self.start(mem_queue_size=2)
        n.get_topic("e#ephemeral").get_channel("c#ephemeral")
        n.get_topic("t").get_channel("c#ephemeral")
        self.publish(n, "e#ephemeral", [b"x"] * 5)
        self.publish(n, "t", [b"x"] * 5)
        self.stop(n)
        self.assertEqual([f for f in os.listdir(self.dir) if "ephemeral" in f], [])


class ShutdownTests(StorageTestCase):
    def test_clean_shutdown_keeps_memory_in_flight_and_deferred(self) -> None:
        n = self.start(mem_queue_size=100)
        ch = n.get_topic("t").get_channel("c")
        c = FakeConsumer(1, rdy=3)
        ch.add_client(c)
        self.publish(n, "t", [b"%d" % i for i in range(10)])
        self.publish(n, "t", [b"later"], delay=30.0)
        self.assertEqual((len(c.got), len(ch.memory), len(ch.deferred)), (3, 7, 1))
        n.publish("held", [b"h1", b"h2"])  # a topic with no channel holds them
        self.stop(n)

        again = self.start(mem_queue_size=100)
        again.reactor.advance(0)
        ch = again.topics["t"].channels["c"]
        c = FakeConsumer(1, rdy=100)
        ch.add_client(c)
        ch.kick()
        self.assertEqual(sorted(m.body for m in c.got), sorted(b"%d" % i for i in range(10)))
        self.assertEqual(again.topics["held"].depth(), 2)
        # the deferred message keeps its deliver-at time (30 s after it was published)
        again.reactor.advance(29)
        again.queue_scan()
        self.assertNotIn(b"later", [m.body for m in c.got])
        again.reactor.advance(2)
        again.queue_scan()
        self.assertIn(b"later", [m.body for m in c.got])

    def test_topic_backlog_survives(self) -> None:
        n = self.start(mem_queue_size=3)
        n.publish("t", [b"%d" % i for i in range(10)])
        self.stop(n)
        again = self.start(mem_queue_size=3)
        ch = again.topics["t"].get_channel("c")
        again.reactor.advance(0)
        self.assertEqual(ch.depth(), 10)


class DurableTests(StorageTestCase):
    opts = {"mem_queue_size": 0, "sync_every": 1}

    def test_publish_waits_for_the_sync(self) -> None:
        n = self.start(**self.opts)
        self.assertTrue(n.durable)
        d = n.publish("t", [b"x"])
        self.assertNoResult(d)
        n.reactor.advance(0)
        self.assertIsNone(self.successResultOf(d))

    def test_pub_answers_after_the_sync(self) -> None:
        n = self.start(**self.opts)
        p = FakeClient(n)
        p.command(b"PUB", "t", body=b"x")
        p.command(b"NOP")
        self.assertEqual(p.transport.value(), b"")
        self.assertEqual(p.frames(), [(FRAME_TYPE_RESPONSE, b"OK")])

    def test_delivered_not_finished_survives_a_crash(self) -> None:
        n = self.start(**self.opts)
        ch = n.get_topic("t").get_channel("c")
        c = FakeConsumer(1, rdy=2)
        ch.add_client(c)
        self.publish(n, "t", [b"%d" % i for i in range(5)])
        self.assertEqual([m.body for m in c.got], [b"0", b"1"])
        ch.finish_message(1, c.got[0].id)
        n.reactor.advance(0)
        self.crash(n)

        again = self.start(**self.opts)
        ch = again.topics["t"].channels["c"]
        c2 = FakeConsumer(1, rdy=10)
        ch.add_client(c2)
        ch.kick()
        self.assertEqual([m.body for m in c2.got], [b"1", b"2", b"3", b"4"])

    def test_dpub_and_topic_backlog_survive_a_crash(self) -> None:
        n = self.start(**self.opts)
        self.publish(n, "held", [b"a", b"b"])
        n.get_topic("t").get_channel("c")
        self.publish(n, "t", [b"soon"], delay=10.0)
        self.crash(n)
        again = self.start(**self.opts)
        self.assertEqual(again.topics["held"].depth(), 2)
        ch = again.topics["t"].channels["c"]
        c = FakeConsumer(1, rdy=10)
        ch.add_client(c)
        ch.kick()
        self.assertEqual(c.got, [], "still deferred after the restart")
        again.reactor.advance(11)
        again.queue_scan()
        self.assertEqual([m.body for m in c.got], [b"soon"])

    def test_clean_restart_reads_each_message_once(self) -> None:
        n = self.start(**self.opts)
        ch = n.get_topic("t").get_channel("c")
        c = FakeConsumer(1, rdy=2)
        ch.add_client(c)
        self.publish(n, "t", [b"%d" % i for i in range(4)])
        ch.finish_message(1, c.got[1].id)  # 0 stays in flight, 1 is done
        self.stop(n)
        again = self.start(**self.opts)
        ch = again.topics["t"].channels["c"]
        c2 = FakeConsumer(1, rdy=10)
        ch.add_client(c2)
        ch.kick()
        self.assertEqual(sorted(m.body for m in c2.got), [b"0", b"2", b"3"])


class FaultTests(StorageTestCase):
    def test_failed_write_turns_health_and_pub_fails_then_recovers(self) -> None:
        n = self.start(mem_queue_size=0)
        n.get_topic("t").get_channel("c")
        p = FakeClient(n)
        self.assertEqual(p.pub("t", b"before"), (FRAME_TYPE_RESPONSE, b"OK"))

        def full(fd, data, offset):
            raise OSError(28, "No space left on device")

        self.patch(records.os, "pwrite", full)
        p.command(b"PUB", "t", body=b"lost?")
        self.assertEqual(
            p.frames(), [(FRAME_TYPE_ERROR, b"E_PUB_FAILED PUB failed [Errno 28] No space left on device")]
        )
        self.assertTrue(p.disconnected)
        self.assertEqual(n.get_health(), "NOK - [Errno 28] No space left on device")

        self.patch(records.os, "pwrite", _pwrite)
        p2 = FakeClient(n)
        self.assertEqual(p2.pub("t", b"after"), (FRAME_TYPE_RESPONSE, b"OK"))
        self.assertEqual(n.get_health(), "OK")
        ch = n.topics["t"].channels["c"]
        c = FakeConsumer(1, rdy=10)
        ch.add_client(c)
        ch.kick()
        self.assertEqual([m.body for m in c.got], [b"before", b"after"])

    def fail_writes_to(self, queue_name: str) -> None:
        """Writes to one queue's files fail as on a full disk; the others succeed."""

        def pwrite(fd, data, offset):
            if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(queue_name + ".diskqueue."):
                raise OSError(28, "No space left on device")
            return _pwrite(fd, data, offset)

        self.patch(records.os, "pwrite", pwrite)

    def drained(self, n: NSQD, topic: str, channel: str) -> list[bytes]:
        c = FakeConsumer(99, rdy=100)
        ch = n.topics[topic].channels[channel]
        ch.add_client(c)
        ch.kick()
        return [m.body for m in c.got]

    def test_a_failed_mpub_reaches_no_channel(self) -> None:
        """One channel's write fails: the MPUB is refused and no channel keeps any of it."""
        n = self.start(mem_queue_size=0)
        topic = n.get_topic("t")
        topic.get_channel("a")
        topic.get_channel("b")
        p = FakeClient(n)
        self.assertEqual(p.mpub("t", [b"1", b"2"]), (FRAME_TYPE_RESPONSE, b"OK"))
        self.fail_writes_to("t:b")
        p2 = FakeClient(n)
        p2.send(mpub("t", [b"x", b"y", b"z"]))
        self.assertEqual(p2.frames()[0][1][:29], b"E_MPUB_FAILED MPUB failed [Er")
        self.patch(records.os, "pwrite", _pwrite)
        self.assertEqual(topic.channels["a"].depth(), 2)
        self.assertEqual(self.drained(n, "t", "a"), [b"1", b"2"])
        self.assertEqual(self.drained(n, "t", "b"), [b"1", b"2"])

    def test_a_failed_mpub_leaves_no_part_in_memory(self) -> None:
        """Room in memory for part of a batch: a failed write of the rest takes that part back."""
        n = self.start(mem_queue_size=5)
        n.get_topic("t").get_channel("c")
        p = FakeClient(n)
        self.assertEqual(p.mpub("t", [b"1", b"2", b"3"]), (FRAME_TYPE_RESPONSE, b"OK"))
        self.fail_writes_to("t:c")
        p2 = FakeClient(n)
        p2.send(mpub("t", [b"w", b"x", b"y", b"z"]))
        self.assertEqual(p2.frames()[0][0], FRAME_TYPE_ERROR)
        self.patch(records.os, "pwrite", _pwrite)
        self.assertEqual(self.drained(n, "t", "c"), [b"1", b"2", b"3"])

    def test_a_failed_mpub_to_a_topic_without_channels_is_not_held(self) -> None:
        n = self.start(mem_queue_size=2)
        n.get_topic("t")
        self.fail_writes_to("t")
        p = FakeClient(n)
        p.send(mpub("t", [b"w", b"x", b"y"]))
        self.assertEqual(p.frames()[0][0], FRAME_TYPE_ERROR)
        self.patch(records.os, "pwrite", _pwrite)
        self.assertEqual(n.topics["t"].depth(), 0)
        n.topics["t"].get_channel("c")
        n.reactor.advance(0)
        self.assertEqual(self.drained(n, "t", "c"), [])


class MemoryBudgetTests(StorageTestCase):
    """--mem-queue-bytes: past a topic's or channel's budget in bytes, messages go to disk."""

    def test_past_the_budget_messages_go_to_disk(self) -> None:
        n = self.start(mem_queue_bytes=100)
        ch = n.get_topic("t").get_channel("c")
        self.publish(n, "t", [b"%040d" % i for i in range(5)])
        self.assertEqual((len(ch.memory), ch.memory_bytes, ch.backend.depth()), (2, 80, 3))
        self.assertEqual(ch.backend.queued_bytes, 3 * (4 + 26 + 40))
        c = FakeConsumer(1, rdy=10)
        ch.add_client(c)
        ch.kick()
        self.assertEqual(sorted(m.body for m in c.got), [b"%040d" % i for i in range(5)])
        self.assertEqual((ch.memory_bytes, ch.backend.queued_bytes), (0, 0))

    def test_a_topic_holds_by_bytes_too(self) -> None:
        n = self.start(mem_queue_bytes=50)
        topic = n.get_topic("t")
        self.publish(n, "t", [b"x" * 30, b"y" * 30, b"z" * 10])
        self.assertEqual((len(topic.memory), topic.memory_bytes, topic.backend.depth()), (2, 40, 1))

    def test_requeued_messages_keep_to_it(self) -> None:
        n = self.start(mem_queue_bytes=60)
        ch = n.get_topic("t").get_channel("c")
        c = FakeConsumer(1, rdy=10)
        ch.add_client(c)
        self.publish(n, "t", [b"a" * 40, b"b" * 40])
        self.assertEqual(len(c.got), 2)
        for m in c.got:
            ch.requeue_message(1, m.id, 0)
        self.assertEqual((ch.memory_bytes, ch.backend.depth()), (40, 1))

    def test_shown_in_stats(self) -> None:
        from nsqd_tw.http.stats import get_stats

        n = self.start(mem_queue_bytes=100)
        n.get_topic("t").get_channel("c")
        self.publish(n, "t", [b"%040d" % i for i in range(3)])
        (t,) = get_stats(n)["topics"]
        self.assertEqual((t["channels"][0]["memory_bytes"], t["channels"][0]["backend_bytes"]), (80, 70))


class DiskBudgetTests(StorageTestCase):
    """--max-disk-bytes: past it publishes are refused, nothing acknowledged is lost."""

    def test_publishes_past_the_budget_are_refused_clearly(self) -> None:
        n = self.start(mem_queue_size=0, max_disk_bytes=1000)
        n.get_topic("t").get_channel("c")
        p = FakeClient(n)
        for i in range(7):  # 130 bytes a record: 7 fit
            self.assertEqual(p.pub("t", b"%0100d" % i), (FRAME_TYPE_RESPONSE, b"OK"))
        text = "disk budget full: 910 of 1000 bytes (--max-disk-bytes) queued, 130 more asked"
        self.assertEqual(p.pub("t", b"%0100d" % 7), (FRAME_TYPE_ERROR, f"E_PUB_FAILED PUB failed {text}".encode()))
        self.assertEqual(n.get_health(), f"NOK - {text}")
        p2 = FakeClient(n)
        p2.send(mpub("t", [b"m", b"n"]))
        self.assertEqual(p2.frames(), [(FRAME_TYPE_RESPONSE, b"OK")], "what still fits goes in")
        p3 = FakeClient(n)
        p3.send(mpub("t", [b"%0100d" % i for i in range(3)]))
        self.assertEqual(p3.frames()[0][1][:36], b"E_MPUB_FAILED MPUB failed disk budge")

        c = FakeConsumer(1, rdy=100)
        ch = n.topics["t"].channels["c"]
        ch.add_client(c)
        ch.kick()
        self.assertEqual(len(c.got), 9, "everything acknowledged, nothing of the refused MPUB")
        self.assertEqual(n.disk_budget.used, 0)
        p4 = FakeClient(n)
        self.assertEqual(p4.pub("t", b"room again"), (FRAME_TYPE_RESPONSE, b"OK"))
        self.assertEqual(n.get_health(), "OK")

    def test_pipelined_pubs_are_refused_one_by_one(self) -> None:
        """PUBs read together and stored as one batch: the batch does not fit, yet every
        PUB before the budget runs out is stored and answered OK, as one by one."""
        n = self.start(mem_queue_size=0, max_disk_bytes=1000)
        n.get_topic("t").get_channel("c")
        p = FakeClient(n)
        p.send(b"".join(encode_command(b"PUB", "t", body=b"%0100d" % i) for i in range(9)))
        text = "disk budget full: 910 of 1000 bytes (--max-disk-bytes) queued, 130 more asked"
        ok = (FRAME_TYPE_RESPONSE, b"OK")
        self.assertEqual(p.frames(), [ok] * 7 + [(FRAME_TYPE_ERROR, f"E_PUB_FAILED PUB failed {text}".encode())])
        self.assertTrue(p.disconnected)
        c = FakeConsumer(1, rdy=100)
        ch = n.topics["t"].channels["c"]
        ch.add_client(c)
        ch.kick()
        self.assertEqual([m.body for m in c.got], [b"%0100d" % i for i in range(7)])

    def test_durable_mode_counts_until_finished(self) -> None:
        n = self.start(mem_queue_size=0, sync_every=1, max_disk_bytes=300)
        ch = n.get_topic("t").get_channel("c")
        self.publish(n, "t", [b"%0100d" % i for i in range(2)])
        c = FakeConsumer(1, rdy=10)
        ch.add_client(c)
        ch.kick()
        self.assertEqual(n.disk_budget.used, 260, "read but not finished: still on disk")
        ch.finish_message(1, c.got[0].id)
        self.assertEqual(n.disk_budget.used, 130)

    def test_a_clean_stop_writes_what_memory_holds_whatever_the_budget(self) -> None:
        n = self.start(mem_queue_size=5, max_disk_bytes=200)
        n.get_topic("t").get_channel("c")
        self.publish(n, "t", [b"%0100d" % i for i in range(5)])  # in memory
        self.stop(n)
        again = self.start(mem_queue_size=5, max_disk_bytes=200)
        c = FakeConsumer(1, rdy=10)
        ch = again.topics["t"].channels["c"]
        ch.add_client(c)
        ch.kick()
        self.assertEqual(sorted(m.body for m in c.got), [b"%0100d" % i for i in range(5)])

    def test_messages_coming_back_are_kept_when_disk_and_memory_are_full(self) -> None:
        n = self.start(mem_queue_size=1, max_disk_bytes=130)
        ch = n.get_topic("t").get_channel("c")
        c = FakeConsumer(1, rdy=3)
        ch.add_client(c)
        for i in range(5):  # 3 in flight, then memory (1 message) and disk (1 record) are full
            self.publish(n, "t", [b"%0100d" % i])
        self.assertEqual((len(c.got), len(ch.memory), ch.backend.depth()), (3, 1, 1))
        for m in c.got:
            ch.requeue_message(1, m.id, 0)
        self.assertEqual(ch.depth(), 5, "requeued ones are kept in memory rather than lost")


class HTTPStorageTests(StorageTestCase):
    def api(self, n: NSQD):
        from treq.testing import StubTreq

        from nsqd_tw.http.api import NSQDHTTPAPI

        return StubTreq(NSQDHTTPAPI(n).resource())

    def test_pause_answers_after_nsqd_dat_is_written(self) -> None:
        n = self.start()
        n.get_topic("t")
        n.reactor.advance(0)
        api = self.api(n)
        d = api.post("http://nsqd/topic/pause?topic=t")
        self.assertNoResult(d)
        n.reactor.advance(0)
        api.flush()
        self.assertEqual(self.successResultOf(d).code, 200)
        self.assertTrue(self.metadata()["topics"][0]["paused"])

    def test_durable_pub_answers_after_the_sync(self) -> None:
        n = self.start(mem_queue_size=0, sync_every=1)
        api = self.api(n)
        d = api.post("http://nsqd/pub?topic=t", data=b"x")
        self.assertNoResult(d)
        n.reactor.advance(0)
        api.flush()
        self.assertEqual(self.successResultOf(d).code, 200)

    def test_a_sub_that_creates_is_answered_before_nsqd_dat_is_snapshotted(self) -> None:
        """The snapshot of the metadata grows with the topics: the OK does not wait for it."""
        n = self.start()
        seen: list[bytes] = []
        snapshot = n.metadata

        def metadata() -> bytes:
            seen.append(c.transport.value())
            return snapshot()

        self.patch(n, "metadata", metadata)
        c = FakeClient(n)
        c.send(b"SUB new c\n")
        self.assertEqual(c.frames(), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(len(seen), 1, "persisted")
        self.assertTrue(seen[0].endswith(b"OK"), "the OK was written before the snapshot was taken")

    def test_durable_pipelined_pubs_answer_after_the_sync(self) -> None:
        n = self.start(mem_queue_size=0, sync_every=1)
        n.get_topic("t").get_channel("c")
        p = FakeClient(n)
        p.send(b"".join(encode_command(b"PUB", "t", body=b"%d" % i) for i in range(3)) + b"NOP\n")
        self.assertEqual(p.frames(), [(FRAME_TYPE_RESPONSE, b"OK")] * 3)
        self.assertEqual(n.topics["t"].channels["c"].depth(), 3)

        def broken(fd: int) -> None:
            raise OSError(5, "Input/output error")

        self.patch(syncer.os, "fsync", broken)
        p.send(b"".join(encode_command(b"PUB", "t", body=b"%d" % i) for i in range(3)))
        self.assertEqual(p.frames(), [(FRAME_TYPE_ERROR, b"E_PUB_FAILED PUB failed [Errno 5] Input/output error")])
        self.assertTrue(p.disconnected)

    def test_pub_fails_with_503_when_the_disk_does(self) -> None:
        n = self.start(mem_queue_size=0)
        n.get_topic("t").get_channel("c")

        def full(fd, data, offset):
            raise OSError(28, "No space left on device")

        self.patch(records.os, "pwrite", full)
        resp = self.successResultOf(self.api(n).post("http://nsqd/pub?topic=t", data=b"x"))
        self.assertEqual(resp.code, 503)
        self.assertEqual(self.successResultOf(resp.content()), b'{"message":"EXITING"}')
