"""--replication-mode: in sync mode a publish is answered once the standby holds
it (fsynced there in durable mode), pipelined and acknowledged a read at a time;
in async mode at once, with the lag bounded and reported."""

from __future__ import annotations

import errno
import os
from typing import Any

from treq.testing import StubTreq
from twisted.trial import unittest

from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE
from nsqd_tw.core.message import Message
from nsqd_tw.core.replica import StandbyApply
from nsqd_tw.core.topic import StandbyError
from nsqd_tw.http.api import NSQDHTTPAPI
from nsqd_tw.replication import link as link_module
from nsqd_tw.replication import standby as standby_module
from nsqd_tw.replication import wire
from nsqd_tw.replication.link import Link
from nsqd_tw.replication.standby import StandbySide
from nsqd_tw.storage.syncer import NEVER_BY_COUNT
from tests.helpers import FakeClient, make_nsqd
from tests.nsqd_tw.replicas import HeldSyncs, ReplicaPair, held

OK = (FRAME_TYPE_RESPONSE, b"OK")
DURABLE = {"backend_factory": None, "mem_queue_size": 0, "sync_every": 1}


def run_syncs(pair: ReplicaPair, syncs: HeldSyncs) -> None:
    """Let the held fsyncs run, and the ones they lead to, moving bytes in between."""
    pair.settle()
    while syncs.release():
        pair.settle()


def turns(pair: ReplicaPair, n: int = 2) -> None:
    """Run ``n`` reactor turns without moving a byte between the nodes."""
    for _ in range(n):
        pair.net.reactor.advance(0)


def cut(pair: ReplicaPair) -> None:
    """The standby goes away with what is on the wire: the primary drops the link."""
    pair.net.pumps.clear()
    pair.standby.up = False
    link = pair.primary.repl.link
    assert link is not None
    link.abort("cut by the test")
    pair.settle()


def mpub(*bodies: bytes) -> bytes:
    out = len(bodies).to_bytes(4, "big")
    for b in bodies:
        out += len(b).to_bytes(4, "big") + b
    return out


class SyncModeTests(unittest.TestCase):
    def test_pub_mpub_and_dpub_are_answered_once_the_standby_holds_them(self) -> None:
        pair = ReplicaPair().start()
        pair.primary.nsqd.get_topic("t").get_channel("c")
        pair.settle()
        client = FakeClient(pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"one")
        client.command(b"MPUB", "t", body=mpub(b"two", b"three"))
        client.command(b"DPUB", "t", "5000", body=b"four")
        self.assertEqual(client.frames(), [])  # nothing has reached the standby yet
        pair.settle()
        self.assertEqual(client.frames(), [OK, OK, OK])
        self.assertEqual(len(held(pair.standby.channel("t", "c"))), 4)

    def test_http_publishes_wait_too(self) -> None:
        pair = ReplicaPair().start()
        treq = StubTreq(NSQDHTTPAPI(pair.primary.nsqd).resource())
        pub = treq.post("http://n/pub?topic=t", data=b"hello")
        mpub_ = treq.post("http://n/mpub?topic=t", data=b"a\nb")
        treq.flush()
        self.assertNoResult(pub)
        self.assertNoResult(mpub_)
        pair.settle()
        treq.flush()
        for d in (pub, mpub_):
            resp = self.successResultOf(d)
            self.assertEqual((resp.code, self.successResultOf(resp.content())), (200, b"OK"))
        self.assertEqual(len(pair.standby.nsqd.topics["t"].queued()), 3)

    def test_publishes_are_pipelined_and_one_ack_answers_a_read(self) -> None:
        pair = ReplicaPair().start()
        acks = pair.primary.acks()
        clients = [FakeClient(pair.primary.nsqd) for _ in range(10)]
        for i, client in enumerate(clients):
            for j in range(5):
                client.command(b"PUB", "t", body=b"%d-%d" % (i, j))
        pair.settle()
        for client in clients:
            self.assertEqual(client.frames(), [OK] * 5)
        self.assertEqual(len(acks), 1, acks)  # every publish of that turn arrived in one read
        self.assertEqual(len(pair.standby.nsqd.topics["t"].queued()), 50)

    def test_a_durable_standby_acknowledges_once_fsynced(self) -> None:
        pair = ReplicaPair(standby_opts=DURABLE)
        syncs = pair.standby.run_blocking = HeldSyncs()
        pair.standby.start()
        pair.primary.start()
        run_syncs(pair, syncs)  # the snapshot's
        self.assertEqual(pair.primary.state, "in_sync")
        client = FakeClient(pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"x")
        client.command(b"PUB", "t", body=b"y")
        pair.settle()
        self.assertEqual(client.frames(), [])  # on the standby's disk, not yet fsynced
        self.assertEqual(len(syncs.waiting), 1)  # both in one fsync
        run_syncs(pair, syncs)
        self.assertEqual(client.frames(), [OK, OK])

    def test_a_durable_primary_answers_once_both_hold_it(self) -> None:
        pair = ReplicaPair(primary_opts=DURABLE)
        syncs = pair.primary.run_blocking = HeldSyncs()
        pair.start()
        run_syncs(pair, syncs)
        client = FakeClient(pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"x")
        pair.settle()
        self.assertEqual(client.frames(), [])  # the standby holds it; this node's fsync waits
        run_syncs(pair, syncs)
        self.assertEqual(client.frames(), [OK])
        client.command(b"PUB", "t", body=b"y")
        turns(pair)
        self.assertEqual(syncs.release(), 1)
        self.assertEqual(client.frames(), [])  # fsynced here; the standby has not answered
        pair.settle()
        self.assertEqual(client.frames(), [OK])

    def test_a_lost_standby_answers_the_publishes_waiting_for_it(self) -> None:
        pair = ReplicaPair().start()
        client = FakeClient(pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"x")
        cut(pair)
        self.assertEqual(client.frames(), [OK])  # held here: acknowledged alone, degraded
        self.assertEqual(pair.primary.state, "disconnected")

    def test_with_replication_required_they_fail_and_stay_held(self) -> None:
        pair = ReplicaPair(primary_opts={"replication_required": True}).start()
        client = FakeClient(pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"x")
        cut(pair)
        self.assertEqual(
            client.frames(),
            [
                (
                    FRAME_TYPE_ERROR,
                    b"E_PUB_FAILED PUB failed replication: standby 127.0.0.1:4250 lost before it held the message",
                )
            ],
        )
        self.assertEqual(len(pair.primary.nsqd.topics["t"].queued()), 1)  # a retry is a duplicate, never a loss


class AcksFirstTests(unittest.TestCase):
    def test_a_publish_takes_in_the_acks_that_arrived_before_its_own_work(self) -> None:
        pair = ReplicaPair().start()
        topic = pair.primary.nsqd.get_topic("t")
        pair.settle()
        first, second = FakeClient(pair.primary.nsqd), FakeClient(pair.primary.nsqd)
        link = pair.primary.repl.primary.link
        assert link is not None
        seen: list[object] = []

        def poll() -> None:  # the standby's ACK of the first publish has arrived meanwhile
            pair.settle()
            seen.append((first.frames(), topic.message_count))

        self.patch(link, "poll", poll)
        first.command(b"PUB", "t", body=b"one")
        self.assertEqual(seen, [], "nothing waited: nothing to take in")
        second.command(b"PUB", "t", body=b"two")
        self.assertEqual(seen, [([OK], 1)], "the first is answered before the second is stored")
        pair.settle()
        self.assertEqual(second.frames(), [OK])

    def test_a_link_that_ends_as_it_is_polled_refuses_the_publish_when_required(self) -> None:
        pair = ReplicaPair(primary_opts={"replication_required": True}).start()
        first, second = FakeClient(pair.primary.nsqd), FakeClient(pair.primary.nsqd)
        link = pair.primary.repl.primary.link
        assert link is not None
        self.patch(link, "poll", lambda: link.abort("gone as it was polled"))
        first.command(b"PUB", "t", body=b"one")
        second.command(b"PUB", "t", body=b"two")
        self.assertEqual(
            second.frames(),
            [
                (
                    FRAME_TYPE_ERROR,
                    b"E_PUB_FAILED PUB failed replication: standby 127.0.0.1:4250 is disconnected"
                    b" (--replication-required)",
                )
            ],
        )
        self.assertEqual(pair.primary.nsqd.topics["t"].depth(), 1)  # the first, held: never the second

    def test_in_async_mode_nothing_waits_and_nothing_is_polled(self) -> None:
        pair = ReplicaPair(primary_opts={"replication_mode": "async"}).start()
        link = pair.primary.repl.primary.link
        assert link is not None
        polled: list[bool] = []
        self.patch(link, "poll", lambda: polled.append(True))
        client = FakeClient(pair.primary.nsqd)
        for i in range(3):
            client.command(b"PUB", "t", body=b"%d" % i)
        self.assertEqual((client.frames(), polled), ([OK] * 3, []))

    def test_link_poll_reads_what_arrived_into_the_link(self) -> None:
        link = Link(_Clock(), dialer=True)  # type: ignore[arg-type]
        got: list[bytes] = []
        self.patch(link, "dataReceived", got.append)
        arrived = [wire.ack(1), None]
        self.patch(link_module, "read_now", lambda transport: arrived.pop(0))
        link.poll()
        link.poll()  # nothing more: nothing fed
        self.assertEqual(got, [wire.ack(1)])
        link.closed = True
        arrived.append(wire.ack(2))
        link.poll()
        self.assertEqual(got, [wire.ack(1)])


class AsyncModeTests(unittest.TestCase):
    def test_publishes_are_answered_at_once_and_the_lag_is_reported(self) -> None:
        pair = ReplicaPair(primary_opts={"replication_mode": "async"}).start()
        client = FakeClient(pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"x" * 100)
        client.command(b"MPUB", "t", body=mpub(b"a", b"b"))
        self.assertEqual(client.frames(), [OK, OK])
        pair.net.reactor.advance(0.25)
        lag = pair.primary.repl.status()["lag"]
        self.assertEqual((lag["messages"], lag["ms"]), (3, 250))
        self.assertGreaterEqual(lag["operations"], 2)  # and the topic's creation
        self.assertGreater(lag["bytes"], 100 + 2 * 26)
        pair.settle()
        self.assertEqual(pair.primary.repl.status()["lag"], {"operations": 0, "messages": 0, "bytes": 0, "ms": 0})
        self.assertEqual(len(pair.standby.nsqd.topics["t"].queued()), 3)

    def test_past_the_lag_bound_publishes_wait_for_the_standby(self) -> None:
        pair = ReplicaPair(primary_opts={"replication_mode": "async", "replication_max_lag": 3}).start()
        pair.primary.nsqd.get_topic("t")
        pair.settle()
        client = FakeClient(pair.primary.nsqd)
        for i in range(5):
            client.command(b"PUB", "t", body=b"%d" % i)
            client.command(b"NOP")  # one PUB per batch
        self.assertEqual(client.frames(), [OK] * 3)
        pair.settle()
        self.assertEqual(client.frames(), [OK] * 2)


class ByteBoundTests(unittest.TestCase):
    """--replication-max-lag-bytes: past it a publish waits for the standby in
    either mode, and its producer is not read from meanwhile, so that what the
    primary holds for a standby that is behind stays bounded."""

    def pair(self, mode: str) -> tuple[ReplicaPair, FakeClient]:
        pair = ReplicaPair(primary_opts={"replication_mode": mode, "replication_max_lag_bytes": 3000}).start()
        pair.primary.nsqd.get_topic("t")
        pair.settle()
        return pair, FakeClient(pair.primary.nsqd)

    def test_in_async_mode_publishes_past_the_bound_wait_for_the_standby(self) -> None:
        pair, client = self.pair("async")
        for i in range(5):
            client.command(b"PUB", "t", body=b"%d" % i * 1000)  # about 1,050 bytes on the link each
            client.command(b"NOP")  # one PUB per batch
        self.assertEqual(client.frames(), [OK] * 2)  # a third would leave more than 3,000 bytes unacknowledged
        self.assertGreater(pair.primary.repl.status()["lag"]["bytes"], 3000)
        pair.settle()
        self.assertEqual(client.frames(), [OK] * 3)
        self.assertEqual(pair.primary.repl.status()["lag"]["bytes"], 0)

    def test_the_producer_is_not_read_from_while_its_publish_waits_for_the_bound(self) -> None:
        for mode in ("async", "sync"):
            pair, client = self.pair(mode)
            client.command(b"PUB", "t", body=b"x" * 1000)
            client.command(b"NOP")
            self.assertEqual(client.transport.producerState, "producing")
            client.command(b"MPUB", "t", body=mpub(b"y" * 1000, b"z" * 1000))
            self.assertEqual(client.transport.producerState, "paused", mode)
            pair.settle()
            self.assertEqual(client.frames(), [OK, OK])
            self.assertEqual(client.transport.producerState, "producing", mode)

    def test_a_durable_primary_holds_its_producer_too(self) -> None:
        pair = ReplicaPair(primary_opts={**DURABLE, "replication_max_lag_bytes": 3000})
        syncs = pair.primary.run_blocking = HeldSyncs()
        pair.start()
        run_syncs(pair, syncs)
        client = FakeClient(pair.primary.nsqd)
        client.command(b"MPUB", "t", body=mpub(b"y" * 2000, b"z" * 2000))
        self.assertEqual(client.transport.producerState, "paused")
        run_syncs(pair, syncs)
        self.assertEqual((client.frames(), client.transport.producerState), ([OK], "producing"))


class _Link:
    """What a StandbySide writes to its link, in order with what it applies."""

    def __init__(self, events: list[object]) -> None:
        self.events = events
        self.closed = False

    def send(self, data: bytes) -> None:
        self.events.append(("send", data))

    def send_now(self, data: bytes) -> None:
        self.events.append(("send_now", data))

    def fail(self, why: str, tell: bool = True) -> None:
        self.events.append(("fail", why))
        self.closed = True


class _Service:
    peer_address = "127.0.0.1:4150"

    def __init__(self, nsqd: object) -> None:
        self.nsqd = nsqd
        self.log = nsqd.log  # type: ignore[attr-defined]

    def diverged(self) -> None:
        pass


def no_space(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


class AckOnReceiptTests(unittest.TestCase):
    """A standby that is not durable acknowledges a read as it arrives while it
    has room to spare (the fast path), else once it has applied it; what it
    cannot store reaches the primary as an ERROR that no ACK covers."""

    def side(self, free: int = 1 << 40, fail_at: int = 0) -> tuple[StandbySide, list[object], Any]:
        """A standby's side whose data path has ``free`` bytes free; the
        ``fail_at``-th publish it applies (from 1) fails for want of space."""
        self.patch(standby_module, "free_bytes", lambda path: free)
        nsqd = make_nsqd()
        events: list[object] = []
        side = StandbySide(_Service(nsqd), _Link(events))  # type: ignore[arg-type]
        publish = side.apply.publish

        def applying(topic: str, records: list[bytes], delay: float = 0.0) -> None:
            events.append("apply")
            if len([e for e in events if e == "apply"]) == fail_at:
                no_space()
            publish(topic, records, delay)

        side.apply.publish = applying  # type: ignore[method-assign]
        return side, events, nsqd

    def read(self, side: StandbySide, nsqd: Any, *counts: int) -> None:
        """One read bringing a PUB of each of ``counts`` messages."""
        reader = wire.FrameReader()
        for n in counts:
            reader.feed(wire.pub("t", [Message(nsqd.guid.new_id(), b"m", nsqd.now_ns()).encode() for _ in range(n)]))
        while (item := reader.next()) is not None:
            side.frame(*item)
        side.read_done()

    def test_not_durable_the_ack_is_on_the_wire_before_the_operations_are_applied(self) -> None:
        side, events, nsqd = self.side()
        reader = wire.FrameReader()
        records = [Message(nsqd.guid.new_id(), b"m%d" % i, nsqd.now_ns()).encode() for i in range(3)]
        reader.feed(wire.pub("t", records[:2]) + wire.pub("t", records[2:]))
        while (item := reader.next()) is not None:
            side.frame(*item)
        self.assertEqual(events, [], "held as received: nothing applied or acknowledged within the read")
        side.read_done()
        self.assertEqual(events, [("send_now", wire.ack(2)), "apply", "apply"])
        self.assertEqual(nsqd.topics["t"].depth(), 3)
        self.assertEqual((side.applied, side.confirmed), (2, 2))

    def test_without_room_to_spare_it_acknowledges_what_it_applied(self) -> None:
        side, events, nsqd = self.side(free=standby_module.HEADROOM)
        self.read(side, nsqd, 2, 1)
        self.assertEqual(events, ["apply", "apply", ("send_now", wire.ack(2))])
        self.assertEqual(nsqd.topics["t"].depth(), 3)

    def test_after_a_failed_write_it_applies_first(self) -> None:
        side, events, nsqd = self.side()
        nsqd.set_health(OSError(errno.EIO, "Input/output error"))
        self.read(side, nsqd, 1)
        self.assertEqual(events, ["apply", ("send_now", wire.ack(1))])

    def test_what_it_cannot_store_is_an_error_no_ack_covers(self) -> None:
        side, events, nsqd = self.side(free=standby_module.HEADROOM, fail_at=2)
        self.read(side, nsqd, 1, 1, 1)
        acks = [e for e in events if isinstance(e, tuple) and e[1][4:5] == bytes((wire.ACK,))]
        self.assertEqual(acks, [("send_now", wire.ack(1))])  # the first, stored; never the second
        errors = [
            wire.json_payload(e[1][5:]) for e in events if isinstance(e, tuple) and e[1][4:5] == bytes((wire.ERROR,))
        ]
        self.assertEqual(len(errors), 1, events)
        self.assertEqual(errors[0]["code"], wire.APPLY_FAILED)
        self.assertIn("No space left on device", errors[0]["error"])
        self.assertEqual(events[-1][0], "fail")  # type: ignore[index]
        self.assertEqual(nsqd.topics["t"].depth(), 1)
        self.assertEqual(side.applied, 1)


class StoredOnlyTests(unittest.TestCase):
    def test_with_replication_required_a_publish_the_standby_cannot_store_fails(self) -> None:
        pair = ReplicaPair(primary_opts={"replication_required": True}).start()
        pair.primary.nsqd.get_topic("t")
        pair.settle()
        self.patch(standby_module, "free_bytes", lambda path: 0)  # the standby's disk is full
        self.patch(StandbyApply, "publish", no_space)
        pair.advance(standby_module.LOOK_EVERY)  # as the standby sees it
        client = FakeClient(pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"x")
        pair.settle()
        self.assertEqual(
            client.frames(),
            [
                (
                    FRAME_TYPE_ERROR,
                    b"E_PUB_FAILED PUB failed replication: standby 127.0.0.1:4250 lost before it held the message",
                )
            ],
        )
        self.assertEqual(pair.primary.nsqd.topics["t"].depth(), 1)  # held here: a retry is a duplicate
        status = pair.primary.repl.status()
        self.assertEqual((status["state"], status["degraded"]), ("disconnected", True))
        self.assertIn("no space left on device", status["standby_error"].lower())


class StandbySyncCadenceTests(unittest.TestCase):
    def test_a_standby_not_durable_fsyncs_its_queues_on_the_tick_only_until_promoted(self) -> None:
        data = os.path.abspath(self.mktemp())
        os.makedirs(data)
        nsqd = make_nsqd(backend_factory=None, data_path=data, sync_every=2500)
        nsqd.set_standby(StandbyError("127.0.0.1:4150", 1))
        topic = nsqd.get_topic("t", replicated=True)
        channel = topic.get_channel("c", replicated=True)
        self.assertEqual({topic.backend.sync_every, channel.backend.sync_every}, {NEVER_BY_COUNT})
        nsqd.set_standby(None)
        self.assertEqual({topic.backend.sync_every, channel.backend.sync_every}, {2500})
        nsqd.set_standby(StandbyError("127.0.0.1:4150", 2))
        self.assertEqual({topic.backend.sync_every, channel.backend.sync_every}, {NEVER_BY_COUNT})

    def test_a_durable_standby_keeps_sync_every(self) -> None:
        data = os.path.abspath(self.mktemp())
        os.makedirs(data)
        nsqd = make_nsqd(**DURABLE, data_path=data)
        nsqd.set_standby(StandbyError("127.0.0.1:4150", 1))
        self.assertEqual(nsqd.get_topic("t", replicated=True).backend.sync_every, 1)


class _Descriptor:
    """A TCP transport as the reactor writes it: doWrite puts the buffer on the wire."""

    connected = True
    disconnecting = False

    def __init__(self) -> None:
        self.buffer: list[bytes] = []
        self.wire: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.buffer.append(data)

    def doWrite(self) -> None:
        self.wire += self.buffer
        self.buffer = []


class _Wrapper:
    """A TLS transport over it: no doWrite of its own."""

    def __init__(self, transport: _Descriptor) -> None:
        self.transport = transport

    def write(self, data: bytes) -> None:
        self.transport.write(data)


class _Clock:
    def now(self) -> float:
        return 0.0


class LinkSendNowTests(unittest.TestCase):
    def test_send_now_puts_it_on_the_wire_at_once_behind_what_was_sent(self) -> None:
        for wrapped in (False, True):
            tcp = _Descriptor()
            link = Link(_Clock(), dialer=True)  # type: ignore[arg-type]
            link.transport = _Wrapper(tcp) if wrapped else tcp
            link.send(wire.ack(3))
            self.assertEqual(tcp.wire, [])
            link.send_now(wire.ack(4))
            self.assertEqual(tcp.wire, [wire.ack(3), wire.ack(4)])
            link.closed = True
            link.send_now(wire.ack(5))  # closed: nothing more
            self.assertEqual(tcp.wire + tcp.buffer, [wire.ack(3), wire.ack(4)])
