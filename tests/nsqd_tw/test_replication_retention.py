"""Retained logs on a replication pair (beyond Go, docs/replication.md "Retained
logs"): the standby's log is a copy of its primary's, segment for segment; a new
link's snapshot sends only what the standby lacks; a deposed primary keeps what it
shares with the new one; a rewind goes on on a promoted standby."""

from __future__ import annotations

import os
from typing import Any

from twisted.trial import unittest

from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.replication import wire
from nsqd_tw.storage import mirror
from nsqd_tw.storage.retained import RetainedLog
from tests.helpers import FakeClient
from tests.nsqd_tw.replicas import Node, ReplicaPair

DISK = {"backend_factory": None, "retention": 3600.0, "max_bytes_per_file": 4096}


def retained_pair(**standby_opts: Any) -> ReplicaPair:
    pair = ReplicaPair(primary_opts=dict(DISK), standby_opts={**DISK, **standby_opts})
    pair.start()
    return pair


def publish(
    pair: ReplicaPair, n: int, topic: str = "t", start: int = 0, size: int = 100, batch: int = 10
) -> list[bytes]:
    """``n`` messages published to the primary in MPUBs of ``batch``; their bodies."""
    bodies = [b"%06d " % i + b"x" * (size - 7) for i in range(start, start + n)]
    for i in range(0, n, batch):
        pair.primary.nsqd.publish(topic, bodies[i : i + batch])
        pair.settle()
    return bodies


def relink(pair: ReplicaPair, node: Node, kill: bool = False) -> None:
    """``node`` stopped (or killed) and started again; the pair linked again."""
    node.kill() if kill else node.stop()
    node.start()
    pair.advance(2.0)


def log_of(node: Node, topic: str = "t") -> RetainedLog:
    log = node.nsqd.topics[topic].retained
    assert log is not None
    return log


def files(node: Node, topic: str = "t") -> dict[str, bytes]:
    """The retained segments of ``topic`` in ``node``'s data path, by name."""
    out = {}
    for name in sorted(os.listdir(node.data_path)):
        if name.startswith(f"{topic}.retained.") and name.endswith(".dat") and "meta" not in name:
            with open(os.path.join(node.data_path, name), "rb") as f:
                out[name] = f.read()
    return out


def same_logs(test: unittest.TestCase, a: Node, b: Node, topic: str = "t") -> None:
    """b's log is a's, segment for segment: numbers, identities, summaries, bytes."""
    la, lb = log_of(a, topic), log_of(b, topic)
    test.assertEqual(
        [(s.num, s.uid, s.size, s.count, s.first_ts, s.max_ts) for s in lb.segments],
        [(s.num, s.uid, s.size, s.count, s.first_ts, s.max_ts) for s in la.segments],
    )
    test.assertEqual((lb.messages, lb.bytes, lb.horizon_ns), (la.messages, la.bytes, la.horizon_ns))
    test.assertEqual(files(b, topic), files(a, topic))


class SentFrames:
    """The frames a primary sends from now on, by type."""

    def __init__(self, node: Node) -> None:
        self.kinds: list[int] = []
        self.bytes = 0
        primary = node.repl.primary
        send = primary._send

        def record(data: bytes, now: bool = False, ops: int = 1) -> None:
            self.kinds.append(data[4])
            if data[4] == wire.SEGMENT:
                self.bytes += len(data)
            send(data, now, ops)

        primary._send = record  # type: ignore[method-assign]


class MirrorTests(unittest.TestCase):
    def test_the_standby_log_is_the_primary_log_segment_for_segment(self) -> None:
        pair = retained_pair()
        publish(pair, 200)  # 24 KiB: six segments of 4 KiB
        pair.primary.nsqd.publish("t", [b"later"], delay=60.0)  # a DPUB is retained as published
        pair.settle()
        self.assertGreater(len(log_of(pair.primary).segments), 5)
        same_logs(self, pair.primary, pair.standby)

    def test_segments_the_primary_deletes_go_on_the_standby_too(self) -> None:
        pair = retained_pair()
        publish(pair, 100)
        pair.primary.nsqd.topics["t"].own_settings = {"retention_bytes": 6000}
        pair.primary.nsqd.topics["t"].apply_policies()
        publish(pair, 10, start=100)  # trims to 6000 bytes
        primary = log_of(pair.primary)
        self.assertLess(primary.bytes, 6000)
        same_logs(self, pair.primary, pair.standby)
        pair.advance(3600 + 600)  # every segment aged out on the primary
        pair.primary.nsqd.retention.check_retention(pair.net.reactor.seconds())
        pair.settle()
        self.assertEqual(primary.messages, 0)
        self.assertEqual(log_of(pair.standby).messages, 0)
        self.assertEqual(log_of(pair.standby).horizon_ns, primary.horizon_ns)

    def test_the_standby_ages_out_nothing_itself(self) -> None:
        pair = retained_pair()
        publish(pair, 50)
        pair.primary.stop()  # gone: nobody tells the standby to delete
        pair.advance(7200)
        pair.standby.nsqd.retention.check_retention(pair.net.reactor.seconds())
        self.assertEqual(log_of(pair.standby).messages, 50)

    def test_a_snapshot_does_not_retain_the_queues_it_sends_again(self) -> None:
        pair = retained_pair()
        publish(pair, 100)  # no channel: the topic holds them, the snapshot sends them
        relink(pair, pair.standby)
        self.assertEqual(pair.standby.state, "in_sync")
        self.assertEqual(log_of(pair.standby).messages, 100)
        same_logs(self, pair.primary, pair.standby)


class CatchUpTests(unittest.TestCase):
    def test_a_restarted_standby_is_sent_only_what_it_lacks(self) -> None:
        pair = retained_pair()
        publish(pair, 200)
        pair.standby.stop()
        publish(pair, 30, start=200)  # degraded meanwhile: 3 KiB the standby lacks
        sent = SentFrames(pair.primary)
        pair.standby.start()
        pair.advance(2.0)
        self.assertEqual(pair.standby.state, "in_sync")
        same_logs(self, pair.primary, pair.standby)
        self.assertLess(sent.bytes, 4096, "the segment it lacked, not the 24 KiB it had")
        self.assertIn(wire.SEGMENT_END, sent.kinds)

    def test_a_standby_that_lost_its_log_gets_it_all(self) -> None:
        pair = retained_pair()
        publish(pair, 200)
        pair.standby.stop()
        for name in files(pair.standby):
            os.remove(os.path.join(pair.standby.data_path, name))
        pair.standby.start()
        pair.advance(2.0)
        same_logs(self, pair.primary, pair.standby)
        pair.primary.nsqd.publish("t", [b"after"])
        pair.settle()
        same_logs(self, pair.primary, pair.standby)

    def test_a_standby_that_was_killed_gets_its_last_segment_again_whole(self) -> None:
        pair = retained_pair()
        publish(pair, 205)
        relink(pair, pair.standby, kill=True)  # its segment being written has no index: a new identity at its start
        same_logs(self, pair.primary, pair.standby)

    def test_segments_deleted_while_they_are_sent_are_not_sent(self) -> None:
        pair = retained_pair()
        publish(pair, 200)
        pair.standby.stop()
        for name in files(pair.standby):
            os.remove(os.path.join(pair.standby.data_path, name))
        primary = log_of(pair.primary)
        attach = pair.primary.repl.primary.attach

        def attach_then_trim(link: Any) -> None:
            attach(link)
            primary.trim(primary.bytes // 2)  # half the log deleted as the snapshot begins

        pair.primary.repl.primary.attach = attach_then_trim  # type: ignore[method-assign]
        pair.standby.start()
        pair.advance(2.0)
        self.assertEqual(pair.standby.state, "in_sync")
        same_logs(self, pair.primary, pair.standby)
        self.assertEqual([f for f in os.listdir(pair.standby.data_path) if f.endswith(mirror.PART)], [])


class FailoverTests(unittest.TestCase):
    def test_a_deposed_primary_keeps_what_it_shares_with_the_new_one(self) -> None:
        pair = retained_pair()
        publish(pair, 200)
        old, new = pair.primary, pair.standby
        shared = {s.num: s.uid for s in log_of(old).segments}
        old.kill()
        new.repl.promote(force=True)
        pair.settle()
        publish_to(new.nsqd, 20)
        # the old primary went on alone a moment: what it took alone goes when it rejoins
        old.start()
        pair.settle()
        self.assertEqual(old.repl.state.role, "standby")
        self.assertEqual(old.state, "in_sync")
        same_logs(self, new, old)
        kept = {s.num for s in log_of(old).segments if shared.get(s.num) == s.uid}
        self.assertGreaterEqual(len(kept), len(shared) - 1, "all but the one being written at the kill")

    def test_what_a_deposed_primary_took_alone_is_cut(self) -> None:
        pair = retained_pair()
        publish(pair, 30)
        pair.standby.stop()
        publish(pair, 5, start=30)  # alone: the standby is away
        old, new = pair.primary, pair.standby
        old.kill()
        new.start()
        new.repl.promote(force=True)
        pair.settle()
        old.start()
        pair.settle()
        self.assertEqual(old.repl.state.role, "standby")
        same_logs(self, new, old)
        self.assertEqual(log_of(old).messages, 30)

    def test_a_rewind_goes_on_on_the_promoted_standby(self) -> None:
        pair = retained_pair()
        pair.primary.nsqd.get_topic("t").get_channel("c")
        bodies = publish(pair, 20000, size=20, batch=500)  # more than a rewind queues at once
        channel = pair.primary.channel("t", "c")
        channel.empty()
        pair.settle()
        pair.primary.nsqd.retention.start_rewind(channel, None)
        pair.settle()
        state = pair.standby.nsqd.retention.replicated_rewinds[("t", "c")]
        self.assertEqual(state["from"], list(channel.rewind.reader.position))  # type: ignore[union-attr]
        pair.primary.kill()
        pair.standby.repl.promote(force=True)
        pair.settle()
        got = take(pair, pair.standby.nsqd, "c", 20000)
        self.assertEqual(got, bodies, "in publish order, once each")


def publish_to(nsqd: NSQD, n: int) -> None:
    for i in range(n):
        nsqd.publish("t", [b"new %d" % i])


def take(pair: ReplicaPair, nsqd: NSQD, channel: str, n: int) -> list[bytes]:
    """The bodies of the first ``n`` messages a consumer of t/``channel`` gets, each FINed."""
    client = FakeClient(nsqd)
    client.sub("t", channel, rdy=100)
    got: list[bytes] = []
    for _ in range(1000):
        msgs = client.messages()
        for msg in msgs:
            got.append(msg.body)
            client.command(b"FIN", msg.id.decode())
        pair.settle()
        if len(got) >= n or not msgs:
            break
    return got


class OutOfStepTests(unittest.TestCase):
    def test_a_copy_out_of_step_says_so_and_is_made_whole_by_the_next_snapshot(self) -> None:
        pair = retained_pair()
        publish(pair, 25)
        log_of(pair.standby)._active.size -= 1  # type: ignore[union-attr]  # a write it missed, say
        errors = []
        fail = pair.standby.repl.standby_side.link.fail  # type: ignore[union-attr]

        def failed(why: str, tell: bool = True) -> None:
            errors.append(why)
            fail(why, tell)

        pair.standby.repl.standby_side.link.fail = failed  # type: ignore[union-attr,method-assign]
        pair.primary.nsqd.publish("t", [b"one more"])
        pair.settle()
        self.assertEqual(len(errors), 1)
        self.assertIn("standby cannot store what it is sent - segment", errors[0])
        self.assertEqual(pair.primary.state, "disconnected")
        pair.advance(2.0)  # the primary links again after a second
        self.assertEqual(pair.primary.state, "in_sync")
        same_logs(self, pair.primary, pair.standby)

    def test_a_standby_without_the_primary_retention_keeps_no_history(self) -> None:
        pair = ReplicaPair(primary_opts=dict(DISK), standby_opts={"backend_factory": None}).start()
        publish(pair, 20)
        self.assertIsNone(pair.standby.nsqd.topics["t"].retained)
        self.assertEqual(pair.standby.nsqd.topics["t"].depth(), 20)
        self.assertEqual(pair.standby.state, "in_sync")

    def test_a_standby_that_retains_what_its_primary_does_not_keeps_nothing(self) -> None:
        pair = ReplicaPair(primary_opts={"backend_factory": None}, standby_opts=dict(DISK)).start()
        publish(pair, 20)
        self.assertEqual(log_of(pair.standby).messages, 0)
        self.assertEqual(pair.standby.nsqd.topics["t"].depth(), 20)

    def test_the_history_of_a_topic_the_primary_no_longer_retains_goes(self) -> None:
        pair = retained_pair()
        publish(pair, 20)
        pair.standby.stop()
        topic = pair.primary.nsqd.topics["t"]
        topic.own_settings = {"retention": 0.0}  # opted out of the node's default
        topic.apply_policies()
        self.assertIsNone(topic.retained)
        pair.standby.start()
        pair.advance(2.0)
        self.assertEqual(pair.standby.state, "in_sync")
        self.assertIsNone(pair.standby.nsqd.topics["t"].retained)
        self.assertEqual(files(pair.standby), {})


class ResumeTests(unittest.TestCase):
    def test_a_segment_half_received_when_the_link_is_lost_is_finished_from_where_it_stopped(self) -> None:
        big = {**DISK, "max_bytes_per_file": 1 << 20}
        pair = ReplicaPair(primary_opts=dict(big), standby_opts=dict(big)).start()
        publish(pair, 10000, batch=500)  # a segment of 1 MiB, four chunks of a snapshot
        pair.standby.stop()
        for name in files(pair.standby):
            os.remove(os.path.join(pair.standby.data_path, name))
        chunks = []
        pair.standby.start()
        apply = pair.standby.repl  # the link's StandbySide is made when it links: watch its frames there
        established = apply.established

        def watch(link: Any) -> None:
            established(link)
            side = pair.standby.repl.standby_side
            if side is None:
                return
            data = side.apply.segment_data

            def segment_data(*args: Any) -> None:
                if len(chunks) < 2:  # lost after two chunks of the first segment: what follows never came
                    chunks.append(args[2])
                    data(*args)
                    if len(chunks) == 2:
                        link.transport.loseConnection()

            side.apply.segment_data = segment_data  # type: ignore[method-assign]
            side.apply.segment_done = lambda doc: None  # type: ignore[method-assign]

        apply.established = watch  # type: ignore[method-assign]
        while len(chunks) < 2:
            pair.advance(0.1)
        apply.established = established  # type: ignore[method-assign]
        self.assertEqual(chunks, [0, 256 * 1024])
        parts = [f for f in os.listdir(pair.standby.data_path) if f.endswith(mirror.PART)]
        self.assertEqual(len(parts), 1, "what arrived of it is kept")
        sent = SentFrames(pair.primary)
        pair.advance(2.0)
        self.assertEqual(pair.standby.state, "in_sync")
        same_logs(self, pair.primary, pair.standby)
        whole = sum(s.size for s in log_of(pair.primary).segments)
        self.assertLess(sent.bytes, whole - 2 * 256 * 1024 + 4096, "the rest, not the two chunks again")
        self.assertEqual([f for f in os.listdir(pair.standby.data_path) if f.endswith(mirror.PART)], [])


class GapTests(unittest.TestCase):
    def test_a_segment_missing_on_the_primary_is_a_gap_on_its_standby_too(self) -> None:
        pair = retained_pair()
        publish(pair, 200)
        pair.primary.stop()
        os.remove(log_of(pair.primary).data_file(2))
        pair.primary.start()
        pair.advance(2.0)
        self.assertEqual(pair.standby.state, "in_sync")
        same_logs(self, pair.primary, pair.standby)
        self.assertEqual(log_of(pair.standby).faults.gaps, log_of(pair.primary).faults.gaps)
        self.assertEqual([(g.first, g.last) for g in log_of(pair.standby).faults.gaps], [(2, 2)])


class SharedBudgetTests(unittest.TestCase):
    def test_copies_a_rewind_gives_back_are_read_again_on_the_promoted_standby(self) -> None:
        pair = retained_pair()
        topic = pair.primary.nsqd.get_topic("t")
        names = ["a", *(f"c{k}" for k in range(7))]
        for name in names:
            topic.get_channel(name)
        bodies = publish(pair, 20000, size=20, batch=500)
        for name in names:
            pair.primary.channel("t", name).empty()
        pair.settle()
        retention = pair.primary.nsqd.retention
        a = pair.primary.channel("t", "a")
        retention.start_rewind(a, None)
        pair.settle()
        held = len(a.memory)
        for name in names[1:]:  # 8 rewinding: a keeps a smaller share, gives the rest back
            retention.start_rewind(pair.primary.channel("t", name), None)
        pair.settle()
        self.assertLess(len(a.memory), held)
        state = pair.standby.nsqd.retention.replicated_rewinds[("t", "a")]
        self.assertEqual(state["from"], list(a.rewind.reader.position))  # type: ignore[union-attr]
        pair.primary.kill()
        pair.standby.repl.promote(force=True)
        pair.settle()
        self.assertEqual(take(pair, pair.standby.nsqd, "a", 20000), bodies, "every copy once, in order")
