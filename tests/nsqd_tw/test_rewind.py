"""Retention and rewinds in nsqd: the retained log of a topic, a channel's rewind, restarts, budgets."""

from __future__ import annotations

import json
import os
from urllib.parse import quote

from twisted.trial import unittest

from nsqd_tw.core import rewind as rewind_module
from nsqd_tw.core.channel import Channel
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.core.retention import RewindError
from nsqd_tw.core.settings import SettingsError
from nsqd_tw.storage.errors import DiskBudgetFull
from nsqd_tw.storage.retained import SinceTooOld
from tests.helpers import make_nsqd
from tests.nsqd_tw.test_channel import FakeConsumer
from tests.nsqd_tw.test_storage import StorageTestCase

SECOND = 1_000_000_000


class RetentionTestCase(StorageTestCase):
    def setUp(self) -> None:
        super().setUp()
        self._cid = 0
        self.finished: dict[int, int] = {}

    def publish(self, n: NSQD, topic: str, count: int, start: int = 0, batch: int = 10) -> list[bytes]:
        """``count`` messages ``m<i>``, ``batch`` to a publish, one second apart; their IDs."""
        ids = []
        for at in range(start, start + count, batch):
            n.publish(topic, [b"m%d" % i for i in range(at, min(at + batch, start + count))])
            n.reactor.advance(1)
        for t in n.topics[topic].channels.values():
            ids += [m.id for m in t.queued()]
        return ids

    def consumer(self, channel: Channel, rdy: int = 2500) -> FakeConsumer:
        self._cid += 1
        c = FakeConsumer(self._cid, rdy=rdy)
        channel.add_client(c)
        channel.kick()
        return c

    def drain(self, n: NSQD, channel: Channel, c: FakeConsumer) -> list[bytes]:
        """Let reactor turns pass, FINing what ``c`` gets, until nothing more comes."""
        bodies: list[bytes] = []
        seen = self.finished.get(c.id, 0)  # what earlier drains FINed
        for _ in range(1000):
            n.reactor.advance(0)
            got = c.got[seen:]
            if not got and not channel.memory and (channel.rewind is None or channel.rewind.done):
                break
            seen += len(got)
            for m in got:
                bodies.append(m.body)
                channel.finish_message(c.id, m.id)
                c.finished()
            channel.kick()
        self.finished[c.id] = seen
        return bodies

    def settle(self, n: NSQD) -> None:
        for _ in range(5):
            n.reactor.advance(0)

    def retained_files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.dir) if ".retained." in f)


class RetentionTests(RetentionTestCase):
    def test_off_by_default(self) -> None:
        n = self.start(mem_queue_size=0)
        n.publish("t", [b"x"])
        n.reactor.advance(1)
        self.assertIsNone(n.topics["t"].retained)
        self.assertEqual(self.retained_files(), [])
        with self.assertRaises(RewindError):
            n.retention.start_rewind(n.topics["t"].get_channel("c"), None)

    def test_every_publish_is_retained_whatever_the_channels_do(self) -> None:
        n = self.start(retention=3600.0)
        topic = n.get_topic("t")
        channel = topic.get_channel("c")
        c = self.consumer(channel)
        n.publish("t", [b"a", b"b"])
        n.publish("t", [b"later"], delay=5)
        n.publish_to(topic, [b"c"])
        self.assertEqual(self.drain(n, channel, c), [b"a", b"b", b"c"])
        log = topic.retained
        assert log is not None
        self.assertEqual((log.messages, channel.depth()), (4, 0))
        self.assertEqual(self.retained_files(), ["t.retained.000000.dat", "t.retained.meta.dat"])

    def test_settings_turn_it_on_and_off_per_topic(self) -> None:
        n = self.start()
        topic = n.get_topic("t")
        topic.update_settings({"retention": 60.0})
        self.assertIsNotNone(topic.retained)
        n.publish("t", [b"x"])
        n.reactor.advance(0)
        topic.update_settings({"retention": None})
        self.assertIsNone(topic.retained)
        n.reactor.advance(0)
        self.assertEqual(self.retained_files(), [], "turned off: its files are deleted")
        with self.assertRaises(SettingsError):
            topic.update_settings({"retention": 60.0}, topic.get_channel("c"))
        with self.assertRaises(SettingsError):
            n.get_topic("e#ephemeral").update_settings({"retention_bytes": 100})

    def test_a_node_default_and_a_topic_that_opts_out(self) -> None:
        n = self.start(retention_bytes=1 << 20)
        self.assertIsNotNone(n.get_topic("t").retained)
        self.assertIsNone(n.get_topic("e#ephemeral").retained)
        other = n.get_topic("u")
        other.update_settings({"retention_bytes": 0})
        self.assertIsNone(other.retained)

    def test_age_out_deletes_segments_within_a_scan(self) -> None:
        n = self.start(retention=10.0, mem_queue_size=0)
        topic = n.get_topic("t")
        self.consumer(topic.get_channel("c"))
        self.publish(n, "t", 40, batch=4)  # 10 publishes, 1 s apart; a segment per 1.25 s
        log = topic.retained
        assert log is not None
        self.assertGreaterEqual(len(log.segments), 5)
        n.queue_scan()
        kept = len(log.segments)
        n.reactor.advance(5)
        n.queue_scan()
        self.assertLess(len(log.segments), kept)
        self.assertGreaterEqual(log.earliest_ts or 0, n.now_ns() - 11 * SECOND, "none older than 10 s + a segment")
        n.reactor.advance(10)
        n.queue_scan()
        n.reactor.advance(0)
        self.assertEqual((log.messages, log.bytes, n.disk_budget.used), (0, 0, 0))
        self.assertEqual(self.retained_files(), ["t.retained.meta.dat"])

    def test_retention_bytes_bounds_the_log(self) -> None:
        n = self.start(retention_bytes=4000)
        self.publish(n, "t", 200, batch=5)  # 48-byte records
        log = n.topics["t"].retained
        assert log is not None
        self.assertLessEqual(log.bytes, 4000)
        self.assertGreater(log.bytes, 3000)

    def test_the_disk_budget_deletes_retained_segments_before_refusing(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=0, max_disk_bytes=20_000)
        self.consumer(n.get_topic("t").get_channel("read"))  # finishes all: the log holds only retained copies
        for i in range(1000):
            n.publish("t", [b"%07d" % i])  # 37 bytes each on disk
        log = n.topics["t"].retained
        assert log is not None
        self.assertLess(log.messages, 1000)
        self.assertGreater(log.messages, 0)
        self.assertLessEqual(n.disk_budget.used, 20_000)

    def test_what_a_channel_owes_is_copied_before_its_segment_goes(self) -> None:
        # a channel nobody reads keeps its backlog as runs of the retained log: evicting a
        # segment for the disk budget moves its records to the channel's disk queue first
        n = self.start(retention=3600.0, mem_queue_size=0, max_disk_bytes=20_000)
        slow = n.get_topic("t").get_channel("slow")
        accepted = 0
        with self.assertRaises(DiskBudgetFull):
            for i in range(1000):
                n.publish("t", [b"%07d" % i])
                accepted += 1
        log = n.topics["t"].retained
        assert log is not None
        self.assertEqual(log.messages, 0, "every retained segment went before the publish was refused")
        self.assertEqual(slow.depth(), accepted, "and nothing the channel owed was lost")
        self.assertLessEqual(n.disk_budget.used, 20_000)
        bodies = [m.body for m in slow.peek(accepted)]
        self.assertEqual(bodies, [b"%07d" % i for i in range(accepted)])


class RewindTests(RetentionTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.n = self.start(retention=3600.0)
        self.topic = self.n.get_topic("t")
        self.channel = self.topic.get_channel("c")
        self.c = self.consumer(self.channel)

    def test_the_channel_gets_again_what_was_published_since(self) -> None:
        n = self.n
        first = n.now_ns()
        self.publish(n, "t", 100)
        done = self.drain(n, self.channel, self.c)
        self.assertEqual(len(done), 100)
        ids = [m.id for m in self.c.got]
        since = first + 5 * SECOND  # the 6th publish: messages 50...
        n.retention.start_rewind(self.channel, since)
        self.drain(n, self.channel, self.c)
        again = self.c.got[100:]
        self.assertEqual([m.body for m in again], [b"m%d" % i for i in range(50, 100)])
        self.assertEqual([m.id for m in again], ids[50:], "the original IDs")
        self.assertEqual({m.timestamp for m in again[:10]}, {since}, "and timestamps")
        self.assertEqual({m.attempts for m in again}, {1}, "new deliveries")
        self.assertIsNone(self.channel.rewind)

    def test_what_is_queued_is_delivered_too(self) -> None:
        n = self.n
        self.c.ready_count = 0
        self.publish(n, "t", 20)
        n.retention.start_rewind(self.channel, None)
        n.publish("t", [b"live"])
        self.c.ready_count = 5  # each FINed before its copy comes
        self.channel.kick()
        bodies = self.drain(n, self.channel, self.c)
        self.assertEqual(bodies, [b"m%d" % i for i in range(20)] * 2 + [b"live"])

    def test_a_copy_is_not_delivered_while_its_message_is_in_flight(self) -> None:
        n = self.n
        self.c.ready_count = 0
        self.publish(n, "t", 20)
        n.retention.start_rewind(self.channel, None)
        self.c.ready_count = 100
        self.channel.kick()
        self.assertEqual([m.body for m in self.c.got], [b"m%d" % i for i in range(20)])
        self.assertEqual(self.channel.duplicate_count, 20)
        self.assertEqual(self.drain(n, self.channel, self.c), [b"m%d" % i for i in range(20)])
        self.assertFalse(self.channel.copies, "nothing of the rewind left: back to the plain path")

    def test_a_rewind_feeds_the_channel_only_as_it_has_room(self) -> None:
        n = self.n
        self.c.ready_count = 0
        for k in range(40):
            n.publish("t", [b"%05d" % i for i in range(k * 1000, k * 1000 + 1000)])
        self.channel.empty()
        n.retention.start_rewind(self.channel, None)
        for _ in range(50):
            n.reactor.advance(0)
        most = rewind_module.ROOM_MESSAGES + rewind_module.FEED_MESSAGES
        self.assertLessEqual(len(self.channel.memory), most)
        self.assertEqual(self.channel.rewind.left, 40_000 - len(self.channel.memory))
        self.c.ready_count = 2500
        self.channel.kick()
        bodies = self.drain(n, self.channel, self.c)
        self.assertEqual(bodies, [b"%05d" % i for i in range(40_000)], "all of them, in publish order")

    def test_a_second_rewind_replaces_the_first(self) -> None:
        n = self.n
        first = n.now_ns()
        self.publish(n, "t", 20_000, batch=1000)
        self.drain(n, self.channel, self.c)
        self.c.ready_count = 0
        n.retention.start_rewind(self.channel, None)
        queued = len(self.channel.memory)  # its first batch: that stays queued
        second = n.retention.start_rewind(self.channel, first + 10 * SECOND)
        self.assertIs(self.channel.rewind, second)
        self.assertEqual((second.left + second.queued, second.since_ns), (10_000, first + 10 * SECOND))
        self.c.ready_count = 2500
        self.channel.kick()
        bodies = self.drain(n, self.channel, self.c)
        self.assertEqual(bodies, [b"m%d" % i for i in range(queued)] + [b"m%d" % i for i in range(10_000, 20_000)])

    def test_since_before_the_horizon_is_refused_with_the_earliest_time(self) -> None:
        n = self.n
        horizon = self.topic.retained.horizon_ns
        with self.assertRaises(SinceTooOld) as cm:
            n.retention.start_rewind(self.channel, horizon - 1)
        self.assertEqual(cm.exception.horizon_ns, horizon)
        n.retention.start_rewind(self.channel, horizon)  # nothing retained yet: nothing to do
        self.assertIsNone(self.channel.rewind)

    def test_a_new_channel_from_the_retained_past(self) -> None:
        n = self.n
        first = n.now_ns()
        self.publish(n, "t", 30)
        fresh = n.retention.create_channel_since(self.topic, "fresh", first + SECOND)
        n.publish("t", [b"live"])
        c = self.consumer(fresh)
        self.assertEqual(self.drain(n, fresh, c), [b"m%d" % i for i in range(10, 30)] + [b"live"])

    def test_stats_keys(self) -> None:
        from nsqd_tw.http.stats import get_stats

        n = self.n
        first = n.now_ns()
        self.c.ready_count = 0
        self.publish(n, "t", 12_000, batch=1000)
        n.retention.start_rewind(self.channel, first + SECOND)
        stats = get_stats(n)["topics"][0]
        self.assertEqual(list(stats)[-2:], ["settings", "retained"])
        self.assertEqual(
            stats["retained"],
            {
                "messages": 12_000,
                "bytes": 10 * 32 + 90 * 33 + 900 * 34 + 9000 * 35 + 2000 * 36,
                "segments": 1,
                "earliest_timestamp": first,
                "available_since": self.topic.retained.horizon_ns,
            },
        )
        channel = stats["channels"][0]
        self.assertEqual(list(channel)[-2:], ["dropped_count", "rewind"], "a channel has no retention settings")
        self.assertEqual(
            channel["rewind"],
            {"since": first + SECOND, "messages_left": 11_000, "messages_queued": 0, "copies_dropped": 0},
            "the channel holds 12,000 already: no room for any yet",
        )


class RestartTests(RetentionTestCase):
    def test_the_retained_log_and_a_rewind_survive_a_clean_restart(self) -> None:
        n = self.start(retention=3600.0)
        first = n.now_ns()
        self.publish(n, "t", 12_000, batch=1000)
        channel = n.topics["t"].get_channel("c")
        n.reactor.advance(0)
        n.retention.start_rewind(channel, first + SECOND)  # 11,000 to queue again, a few thousand at a time
        n.reactor.advance(0)
        self.assertLess(len(channel.memory), 11_000)
        self.stop(n)
        with open(os.path.join(self.dir, "nsqd.dat")) as f:
            entry = json.load(f)["topics"][0]["channels"][0]
        self.assertEqual(entry["rewind"]["since"], first + SECOND)
        n = self.start(retention=3600.0)
        channel = n.topics["t"].channels["c"]
        c = self.consumer(channel)
        bodies = self.drain(n, channel, c)
        self.assertEqual(len(bodies), 23_000, "what was queued, and the rewind to its end")
        self.assertEqual(sorted(set(bodies)), sorted(b"m%d" % i for i in range(12_000)))

    def test_after_a_kill_the_log_is_there_and_a_rewind_starts_over(self) -> None:
        n = self.start(retention=3600.0, mem_queue_size=0, sync_every=1)
        first = n.now_ns()
        self.publish(n, "t", 30)
        channel = n.topics["t"].get_channel("c")
        c = self.consumer(channel)
        self.drain(n, channel, c)
        n.retention.start_rewind(channel, first + SECOND)
        self.settle(n)  # nsqd.dat written (POST /channel/rewind answers then)
        self.crash(n)
        n = self.start(retention=3600.0, mem_queue_size=0, sync_every=1)
        self.assertEqual(n.topics["t"].retained.messages, 30)
        channel = n.topics["t"].channels["c"]
        c = self.consumer(channel)
        self.assertEqual(self.drain(n, channel, c), [b"m%d" % i for i in range(10, 30)])
        n.retention.start_rewind(channel, first)
        self.assertEqual(self.drain(n, channel, c), [b"m%d" % i for i in range(30)])


class RestartOrderTests(RetentionTestCase):
    """A rewind carried across a clean stop goes on in publish order (docs/replay.md)."""

    def take(self, n: NSQD, channel: Channel, c: FakeConsumer, count: int) -> list[bytes]:
        """What ``c`` gets, each FINed, until ``count`` came; then it takes nothing more."""
        bodies: list[bytes] = []
        for _ in range(1000):
            n.reactor.advance(0)
            if len(c.got) >= count:
                c.ready_count = 0
            for m in c.got[len(bodies) :]:
                bodies.append(m.body)
                channel.finish_message(c.id, m.id)
                c.finished()
            if not c.ready_count:
                return bodies
            channel.kick()
        self.fail("not as many came")

    def rewound(self, **flags: object) -> tuple[NSQD, Channel, list[bytes]]:
        n = self.start(retention=3600.0, **flags)
        self.publish(n, "t", 12_000, batch=1000)
        channel = n.topics["t"].get_channel("c")
        n.reactor.advance(0)
        channel.empty()
        n.retention.start_rewind(channel, None)
        return n, channel, [b"m%d" % i for i in range(12_000)]

    def restarted(self, **flags: object) -> tuple[NSQD, Channel, FakeConsumer]:
        n = self.start(retention=3600.0, **flags)
        channel = n.topics["t"].channels["c"]
        return n, channel, self.consumer(channel, rdy=100)

    def check_order(self, taken: int = 3000, **flags: object) -> tuple[list[bytes], dict[str, object]]:
        n, channel, published = self.rewound(**flags)
        first = self.take(n, channel, self.consumer(channel, rdy=100), taken)
        self.assertGreater(len(channel.memory), 0, "copies queued in memory at the stop")
        self.stop(n)
        state = self.metadata()["topics"][0]["channels"][0]["rewind"]
        n, channel, c = self.restarted(**flags)
        self.assertEqual(channel.backend.depth(), 0, "its copies were not saved: read again")
        rest = self.drain(n, channel, c)
        self.assertEqual(first + rest, published, "each once, in publish order across the restart")
        return first, state

    def test_copies_in_memory_at_a_clean_stop_are_read_again_not_saved(self) -> None:
        first, state = self.check_order()

        def offset(k: int) -> int:  # of the k-th record (in the one segment): 4-byte size, 26-byte header, body
            return sum(4 + 26 + len(b"m%d" % i) for i in range(k))

        self.assertEqual(
            state,
            {"since": None, "from": [0, offset(len(first)), len(first)], "to": [0, offset(12_000), 12_000]},
            "nsqd.dat: after a kill, it is read again from the first copy not delivered",
        )

    def test_the_same_in_durable_mode(self) -> None:
        self.check_order(mem_queue_size=0, sync_every=1)

    def test_the_same_with_batches_across_segments(self) -> None:
        # 1,000 messages a segment (a publish), 2,500 a batch: the first copy not delivered is
        # in the middle of a segment, in a batch read from three
        first, state = self.check_order(3350, max_bytes_per_file=20_000)
        self.assertEqual((len(first), state["from"][0], state["from"][2]), (3400, 3, 400))
        self.assertEqual(len([f for f in self.retained_files() if f.endswith(".idx")]), 12)

    def test_a_copy_in_flight_at_the_stop_comes_again(self) -> None:
        n, channel, published = self.rewound()
        c = self.consumer(channel, rdy=100)
        first = self.take(n, channel, c, 2900)
        c.ready_count = 100
        channel.kick()
        first += [m.body for m in c.got[2900:]]  # not finished: in flight at the stop
        self.assertEqual(len(first), 3000)
        self.stop(n)
        n, channel, c = self.restarted()
        rest = self.drain(n, channel, c)
        again = [b for b in rest if b in first]
        self.assertEqual(again, first[-100:], "the ones in flight come again (from the disk queue, in turns)")
        self.assertEqual(first + [b for b in rest if b not in again], published, "the others once, in order")


class BudgetTests(RetentionTestCase):
    """What all rewinds together hold in memory and read in a reactor turn (rewind.RewindBudget)."""

    def setUp(self) -> None:
        super().setUp()
        self.n = self.start(retention=3600.0)
        self.topic = self.n.get_topic("t")
        self.published = [b"%05d" % i + b"x" * 995 for i in range(20_000)]  # 1 KiB records
        for k in range(0, 20_000, 1000):
            self.n.publish("t", self.published[k : k + 1000])
        self.topic.empty()

    def rewind(self, name: str) -> Channel:
        channel = self.topic.get_channel(name)
        self.n.retention.start_rewind(channel, None)
        return channel

    def held(self, channels: list[Channel]) -> tuple[int, int]:
        return sum(len(c.memory) for c in channels), sum(c.memory_bytes for c in channels)

    def test_channels_rewinding_together_hold_their_share_of_the_budget(self) -> None:
        n = self.n
        channels = []
        for k in range(16):
            channels.append(self.rewind(f"c{k}"))
            for _ in range(20):
                n.reactor.advance(0)
            messages, size = n.retention.budget.share
            for c in channels:
                self.assertLessEqual((len(c.memory), c.memory_bytes), (messages, size + 1024), "a record over at most")
            held, held_bytes = self.held(channels)
            self.assertLessEqual(held, rewind_module.BUDGET_MESSAGES)
            self.assertLessEqual(held_bytes, rewind_module.BUDGET_BYTES + 1024 * len(channels))
        self.assertEqual(n.retention.budget.share, (1250, 1 << 20))
        self.assertEqual({len(c.memory) > 500 for c in channels}, {True}, "each its share")
        for c in channels:  # what each gave back comes again in its turn: all of it, once, in order
            self.assertEqual(self.drain(n, c, self.consumer(c)), self.published)

    def test_a_rewind_that_ends_gives_its_share_to_the_others(self) -> None:
        n = self.n
        a, b = self.rewind("a"), self.rewind("b")
        n.reactor.advance(0)
        for c in (a, b):  # 4 MiB each (ROOM_BYTES), fed again once 1 MiB is free
            self.assertTrue(3 << 20 <= c.memory_bytes <= (4 << 20) + 1000, c.memory_bytes)
        channels = [self.rewind(f"c{k}") for k in range(6)]
        n.reactor.advance(0)
        for c in (a, b, *channels):  # 8 rewind: 2 MiB each, fed again once 1 MiB is free
            self.assertTrue(1 << 20 <= c.memory_bytes <= (2 << 20) + 1000, c.memory_bytes)
        for c in channels:
            c.empty()  # their rewinds end
        n.reactor.advance(0)
        for c in (a, b):
            self.assertTrue(3 << 20 <= c.memory_bytes <= (4 << 20) + 1000, c.memory_bytes)
        self.assertEqual(self.drain(n, a, self.consumer(a)), self.published)

    def test_a_standby_drops_the_copies_given_back(self) -> None:
        """A replication primary ships the copies it feeds; those a channel gives back
        (read again later, shipped again then) are finished on the standby."""
        n = self.n
        shipped: dict[str, list[bytes]] = {"fed": [], "gone": []}

        class Shipper:
            def fed(self, channel: Channel, records: list[bytes]) -> None:
                if channel.name == "a":
                    shipped["fed"] += [r[10:26] for r in records]

            def gone(self, channel: Channel, ids: list[bytes]) -> None:
                if channel.name == "a":
                    shipped["gone"] += list(ids)

            def __getattr__(self, name: str) -> object:
                return lambda *args, **kw: None

        a = self.rewind("a")
        n.reactor.advance(0)
        held = [m.id for m in a.queued()]
        n.shipper = Shipper()
        channels = [self.rewind(f"c{k}") for k in range(7)]  # 8 rewind: a keeps 2 MiB
        kept = [m.id for m in a.queued()]
        self.assertEqual(kept, held[: len(kept)])
        self.assertTrue(sorted(shipped["gone"]) == held[len(kept) :], "the last ones given back (IDs grow)")
        for c in channels:
            c.empty()  # a's share grows again: it reads them again
        n.reactor.advance(0)
        self.assertTrue(shipped["fed"][: len(held) - len(kept)] == held[len(kept) :], "shipped again, in order")
        self.assertEqual(self.drain(n, a, self.consumer(a)), self.published)

    def test_one_reactor_turn_feeds_a_few_batches_whatever_the_number_of_rewinds(self) -> None:
        n = self.n
        budget = n.retention.budget
        channels = [self.rewind(f"c{k}") for k in range(16)]
        turns: list[int] = []  # how many messages each reactor turn of the feeding read
        turn = budget._turn

        def one_turn() -> None:
            before = sum(c.message_count for c in channels)
            turn()
            turns.append(sum(c.message_count for c in channels) - before)

        budget._turn = one_turn  # type: ignore[method-assign]
        consumers = [self.consumer(c, rdy=10_000) for c in channels]
        for _ in range(10_000):
            if sum(len(c.got) for c in consumers) >= 16 * 20_000:
                break
            n.reactor.advance(0)
            for c, consumer in zip(channels, consumers, strict=True):
                for m in consumer.got[self.finished.get(consumer.id, 0) :]:
                    c.finish_message(consumer.id, m.id)
                    consumer.finished()
                self.finished[consumer.id] = len(consumer.got)
            for c in channels:
                c.kick()
        for consumer in consumers:
            self.assertEqual([m.body for m in consumer.got], self.published)
        self.assertGreater(len(turns), 16 * 20_000 // rewind_module.TURN_MESSAGES)
        self.assertLessEqual(max(turns), rewind_module.TURN_MESSAGES)


class ReleaseTests(RetentionTestCase):
    """Once the rewinds are over, the free memory of the C heap is given back (malloc_trim)."""

    def setUp(self) -> None:
        super().setUp()
        from nsqd_tw.core import retention

        self.released: list[float] = []
        self.patch(retention.memstats, "release_free_memory", lambda: self.released.append(self.n.now()))
        self.n = self.start(retention=3600.0)
        self.publish(self.n, "t", 100)
        self.channel = self.n.topics["t"].get_channel("c")
        self.channel.empty()

    def tick(self, seconds: float) -> None:
        self.n.reactor.advance(seconds)
        self.n.retention.check_retention(self.n.now())

    def test_once_the_copies_of_the_last_rewind_are_delivered(self) -> None:
        n = self.n
        a = n.retention.start_rewind(self.channel, None)
        other = n.topics["t"].get_channel("other")
        n.retention.start_rewind(other, None)
        self.assertIsNone(self.channel.rewind, "read to its end at once: 100 copies queued")
        self.assertIsNotNone(a)
        self.tick(1)
        self.assertEqual(self.released, [], "another rewind is not over")
        other.empty()  # it ends
        self.tick(1)
        self.assertEqual(self.released, [], "copies are still queued")
        self.assertEqual(len(self.drain(n, self.channel, self.consumer(self.channel))), 100)
        self.tick(1)
        self.assertEqual(self.released, [n.now()])
        self.tick(20)
        self.assertEqual(len(self.released), 1, "once")

    def test_at_the_latest_ten_seconds_after_the_last_rewind_ended(self) -> None:
        n = self.n
        n.retention.start_rewind(self.channel, None)
        ended = n.now()
        for _ in range(12):
            self.tick(1)
        self.assertEqual(self.released, [ended + 10], "its copies are still queued: no consumer")


class HTTPTests(unittest.TestCase):
    """The routes, in memory (StubTreq); the retained log on disk."""

    def setUp(self) -> None:
        from treq.testing import StubTreq

        from nsqd_tw.http.api import NSQDHTTPAPI

        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.nsqd = make_nsqd(data_path=self.dir, retention=3600.0)
        self.treq = StubTreq(NSQDHTTPAPI(self.nsqd).resource())
        self.first = self.nsqd.now_ns()
        self.topic = self.nsqd.get_topic("t")
        self.channel = self.topic.get_channel("c")
        for k in range(5):
            self.nsqd.publish("t", [b"m%d" % k])
            self.nsqd.reactor.advance(1)

    def call(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        d = self.treq.request(method, "http://nsqd" + path, data=body)
        resp = self.successResultOf(d)
        return resp.code, self.successResultOf(resp.content())

    def test_rewind(self) -> None:
        since_ms = (self.first + 2 * SECOND) // 1_000_000
        code, body = self.call("POST", f"/channel/rewind?topic=t&channel=c&since={since_ms}")
        answer = {"topic": "t", "channel": "c", "since": since_ms * 1_000_000, "messages": 3}
        self.assertEqual((code, json.loads(body)), (200, answer))
        self.assertEqual(len(self.channel.memory), 5 + 3)

    def test_since_as_rfc3339_and_earliest(self) -> None:
        from nsq_wire.gofmt import rfc3339_nano

        for since, n in [
            (rfc3339_nano(self.first + 3 * SECOND), 2),
            ("2023-11-14T22:13:24+00:00", 1),  # first + 4 s
            ("2023-11-14T23:13:24.000000001+01:00", 0),  # just after it
            ("earliest", 5),
        ]:
            code, body = self.call("POST", f"/channel/rewind?topic=t&channel=c&since={quote(since)}")
            self.assertEqual((code, json.loads(body).get("messages")), (200, n), (since, body))

    def test_errors(self) -> None:
        horizon = self.topic.retained.horizon_ns
        self.assertEqual(horizon, self.first)
        for path, code, message in [
            ("/channel/rewind?topic=t&channel=c", 400, "MISSING_ARG_SINCE"),
            ("/channel/rewind?topic=t&channel=c&since=yesterday", 400, "INVALID_ARG_SINCE"),
            ("/channel/rewind?topic=t&channel=c&since=-5", 400, "INVALID_ARG_SINCE"),
            ("/channel/rewind?topic=t&channel=nope&since=1", 404, "CHANNEL_NOT_FOUND"),
            ("/channel/rewind?topic=nope&channel=c&since=1", 404, "TOPIC_NOT_FOUND"),
            ("/channel/rewind?channel=c&since=1", 400, "MISSING_ARG_TOPIC"),
        ]:
            self.assertEqual(self.call("POST", path), (code, b'{"message":"%s"}' % message.encode()), path)
        code, body = self.call("POST", f"/channel/rewind?topic=t&channel=c&since={horizon // 1_000_000 - 1}")
        self.assertEqual(
            (code, json.loads(body)),
            (
                400,
                {
                    "message": "SINCE_TOO_OLD: messages are retained from 2023-11-14T22:13:20Z on",
                    "earliest": "2023-11-14T22:13:20Z",
                    "earliest_ms": horizon // 1_000_000,
                },
            ),
        )
        self.topic.update_settings({"retention": 0.0})  # "0s": none, whatever the flag says
        self.assertEqual(
            self.call("POST", "/channel/rewind?topic=t&channel=c&since=earliest"), (400, b'{"message":"NO_RETENTION"}')
        )

    def test_create_since(self) -> None:
        code, _ = self.call("POST", f"/channel/create?topic=t&channel=new&since={(self.first + SECOND) // 10**6}")
        self.assertEqual(code, 200)
        new = self.topic.channels["new"]
        self.assertEqual([m.body for m in new.queued()], [b"m1", b"m2", b"m3", b"m4"])
        self.assertEqual(self.call("POST", "/channel/create?topic=t&channel=new&since=earliest")[0], 200)
        self.assertEqual(len(new.memory), 4, "an existing channel: nothing changes, as Go's create")
        code, _ = self.call("POST", "/channel/create?topic=t&channel=old&since=1000")
        self.assertEqual(code, 400)
        self.assertNotIn("old", self.topic.channels, "refused before it is made")

    def test_stats_and_metrics(self) -> None:
        _, body = self.call("GET", "/stats?format=json&topic=t")
        topic = json.loads(body)["topics"][0]
        self.assertEqual(topic["retained"]["messages"], 5)
        self.assertEqual(topic["settings"]["retention"], "1h0m0s")
        _, text = self.call("GET", "/metrics")
        self.assertIn(b'nsq_topic_retained_messages{topic="t"} 5.0', text)
        self.assertIn(b'nsq_queue_setting{channel="",setting="retention_seconds",topic="t"} 3600.0', text)

    def test_settings(self) -> None:
        code, body = self.call("PUT", "/topic/settings?topic=u", b'{"retention": "2h", "retention_bytes": 1000000}')
        self.assertEqual(code, 404)
        self.nsqd.get_topic("u").get_channel("c")
        code, body = self.call("PUT", "/topic/settings?topic=u", b'{"retention": "2h", "retention_bytes": 1000000}')
        doc = json.loads(body)
        self.assertEqual((code, doc["settings"]), (200, {"retention": "2h0m0s", "retention_bytes": 1000000}))
        self.assertIsNotNone(self.nsqd.topics["u"].retained)
        code, body = self.call("PUT", "/channel/settings?topic=u&channel=c", b'{"retention": "2h"}')
        self.assertEqual(code, 400)
        self.assertIn(b"retention is a topic setting", body)


class CleanStopTests(RetentionTestCase):
    def test_a_rewind_done_but_not_delivered_is_not_read_again_after_a_clean_stop(self) -> None:
        n = self.start(retention=3600.0)
        self.publish(n, "t", 30)
        channel = n.topics["t"].get_channel("c")
        n.reactor.advance(0)
        channel.empty()
        n.retention.start_rewind(channel, None)  # read to its end at once: its 30 copies queued
        self.assertIsNone(channel.rewind)
        self.assertEqual(channel.rewind_state()["from"], [0, 0, 0], "a kill now would read it again")
        self.stop(n)
        with open(os.path.join(self.dir, "nsqd.dat")) as f:
            entry = json.load(f)["topics"][0]["channels"][0]
        self.assertEqual(entry["rewind"], {}, "a clean stop saved the copies: nothing to read again")
        n = self.start(retention=3600.0)
        channel = n.topics["t"].channels["c"]
        c = self.consumer(channel)
        self.assertEqual(self.drain(n, channel, c), [b"m%d" % i for i in range(30)])
