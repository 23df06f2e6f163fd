"""Failover (beyond Go): a standby promoted (POST /replication/promote, or by itself
after --promote-after when no nsqlookupd lists its primary) serves what its primary
held; a former primary that comes back sees the higher epoch and rejoins as its standby."""

from __future__ import annotations

import json

from treq.testing import StubTreq
from twisted.internet import defer
from twisted.trial import unittest

from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE
from nsqd_tw.http.api import NSQDHTTPAPI
from tests.helpers import FakeClient
from tests.nsqd_tw.replicas import ReplicaPair, held, live
from tests.nsqd_tw.test_replication import consume
from tests.nsqd_tw.test_replication_catchup import http

OK = (FRAME_TYPE_RESPONSE, b"OK")
DISK = {"backend_factory": None}


def promote(node: object, force: bool = False, within: float = 30.0) -> tuple[int, dict]:
    """POST /replication/promote on ``node``, letting time pass (its pair's clock)
    until it is answered: a promotion waits out the lease its standby granted."""
    pair = node.pair  # type: ignore[attr-defined]
    stub = StubTreq(NSQDHTTPAPI(node.nsqd).resource())  # type: ignore[attr-defined]
    d = stub.request("POST", "http://n/replication/promote" + ("?force=true" if force else ""))
    for _ in range(int(within * 10)):
        stub.flush()
        if d.called and not isinstance(d.result, defer.Deferred):  # type: ignore[attr-defined]
            break
        pair.advance(0.1)
    resp = d.result  # type: ignore[attr-defined]
    content = resp.content()
    stub.flush()
    return resp.code, json.loads(content.result)


class ManualPromotionTests(unittest.TestCase):
    def test_a_standby_linked_to_its_primary_is_not_promoted(self) -> None:
        pair = ReplicaPair().start()
        code, body = promote(pair.standby)
        self.assertEqual((code, body["message"]), (409, "PRIMARY_CONNECTED"))
        code, body = promote(pair.primary)
        self.assertEqual((code, body["message"]), (409, "ALREADY_PRIMARY"))
        self.assertEqual(pair.standby.repl.state.role, "standby")

    def test_promoted_it_serves_what_the_primary_held_and_nothing_finished(self) -> None:
        pair = ReplicaPair().start()
        primary = pair.primary.nsqd
        consumer = consume(primary, "t", "c", rdy=3)
        primary.publish("t", [b"%d" % i for i in range(6)])
        first = consumer.messages()  # 3 in flight
        consumer.command(b"FIN", first[0].id)
        consumer.command(b"REQ", first[1].id, "30000")
        pair.settle()
        pair.primary.kill()
        self.assertEqual(pair.standby.state, "disconnected")
        self.assertTrue(pair.standby.lookup.paused)

        code, status = promote(pair.standby)
        self.assertEqual(code, 200)
        self.assertEqual((status["role"], status["epoch"], status["state"]), ("primary", 1, "disconnected"))
        with open(f"{pair.standby.data_path}/replication.json") as f:
            self.assertEqual(json.load(f)["epoch"], 1)
        self.assertFalse(pair.standby.lookup.paused)  # registers with its lookupds
        new = pair.standby.nsqd
        self.assertIsNone(new.standby)
        consumer = consume(new, "t", "c", rdy=10)
        got = consumer.messages()
        # the one in flight there and the three never delivered, at once; the finished one never
        self.assertEqual(sorted(m.body for m in got), [b"2", b"3", b"4", b"5"])
        pair.advance(31.0)
        new.queue_scan()
        [later] = consumer.messages()  # the one requeued for 30 s, at its time
        self.assertEqual((later.body, later.attempts), (b"1", 2))
        client = FakeClient(new)
        client.command(b"PUB", "t", body=b"after")
        self.assertEqual(client.frames(), [OK])  # alone, degraded

    def test_publishes_a_standby_appended_framed_are_served_once_promoted(self) -> None:
        disk = {**DISK, "mem_queue_size": 2}
        pair = ReplicaPair(primary_opts=disk, standby_opts=disk).start()
        primary = pair.primary.nsqd
        consumer = consume(primary, "t", "c", rdy=0)
        pair.settle()
        backend = pair.standby.channel("t", "c").backend
        framed: list[int] = []
        put_framed = backend.put_framed
        self.patch(backend, "put_framed", lambda batch: framed.append(batch.count) or put_framed(batch))
        primary.publish("t", [b"%02d" % i for i in range(2)])
        primary.publish("t", [b"%02d" % i for i in range(2, 40)])  # memory full there: one write
        pair.settle()
        self.assertEqual(framed, [38])
        consumer.command(b"RDY", "5")
        for msg in consumer.messages():
            consumer.command(b"FIN", msg.id)
        pair.settle()
        pair.primary.kill()
        self.assertEqual(promote(pair.standby)[0], 200)
        consumer = consume(pair.standby.nsqd, "t", "c", rdy=100)
        got = [m.body for m in consumer.messages()]
        self.assertEqual(sorted(got), [b"%02d" % i for i in range(5, 40)])

    def test_a_standby_not_in_sync_needs_force(self) -> None:
        pair = ReplicaPair().start()
        pair.standby.repl.diverged()
        pair.primary.kill()
        code, body = promote(pair.standby)
        self.assertEqual((code, body["message"]), (409, "NOT_IN_SYNC"))
        code, body = promote(pair.standby, force=True)
        self.assertEqual((code, body["role"]), (200, "primary"))

    def test_a_forced_promotion_while_linked_demotes_the_primary_when_they_meet(self) -> None:
        pair = ReplicaPair().start()
        code, _ = promote(pair.standby, force=True)
        self.assertEqual(code, 200)
        pair.advance(3.0)
        # the old primary dialed again, met epoch 1 and is now its standby
        self.assertEqual(pair.primary.repl.state.role, "standby")
        self.assertEqual(pair.primary.repl.state.epoch, 1)
        self.assertEqual(pair.standby.state, "in_sync")
        self.assertEqual(pair.primary.state, "in_sync")
        client = FakeClient(pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"x")
        self.assertEqual(
            client.frames(),
            [(FRAME_TYPE_ERROR, b"E_PUB_FAILED PUB failed this nsqd is a standby (primary 127.0.0.1:4250, epoch 1)")],
        )


class FormerPrimaryTests(unittest.TestCase):
    def test_the_old_primary_rejoins_as_standby_and_a_second_failover_loses_nothing(self) -> None:
        pair = ReplicaPair(primary_opts=DISK, standby_opts=DISK).start()
        a, b = pair.primary, pair.standby
        consume(a.nsqd, "t", "c", rdy=0)
        a.nsqd.publish("t", [b"before"])
        pair.settle()
        a.kill()
        self.assertEqual(promote(b)[0], 200)
        b.nsqd.publish("t", [b"while a was down"])

        a.start()  # the same data path: epoch 0, primary, what it held when killed
        self.assertIsNotNone(a.nsqd.standby)  # starting: it waits to hear from its replica
        client = FakeClient(a.nsqd)
        client.command(b"PUB", "t", body=b"too early")
        [(kind, data)] = client.frames()
        self.assertEqual(kind, FRAME_TYPE_ERROR)
        self.assertIn(b"this nsqd is starting: waiting to reach its replica 127.0.0.1:4250", data)
        self.assertEqual(http(a.nsqd, "POST", "/pub?topic=t", b"x")[0], 503)
        self.assertEqual(json.loads(http(a.nsqd, "POST", "/pub?topic=t", b"x")[1])["message"], "STARTING")
        pair.advance(3.0)
        self.assertEqual((a.repl.state.role, a.repl.state.epoch), ("standby", 1))
        self.assertTrue(a.lookup.paused)
        self.assertEqual(b.state, "in_sync")
        self.assertEqual(sorted(m.body for m in held(a.channel("t", "c"))), [b"before", b"while a was down"])

        b.nsqd.publish("t", [b"after a rejoined"])
        pair.settle()
        b.kill()
        self.assertEqual(promote(a)[0], 200)
        self.assertEqual(a.repl.state.epoch, 2)
        consumer = consume(a.nsqd, "t", "c", rdy=10)
        self.assertEqual(
            sorted(m.body for m in consumer.messages()), [b"after a rejoined", b"before", b"while a was down"]
        )

    def test_a_primary_whose_replica_is_down_serves_once_it_cannot_reach_it(self) -> None:
        pair = ReplicaPair()
        pair.primary.start()
        pair.settle()  # the dial is refused at once
        self.assertIsNone(pair.primary.nsqd.standby)
        client = FakeClient(pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"x")
        self.assertEqual(client.frames(), [OK])
        self.assertEqual(pair.primary.repl.status()["degraded"], True)

    def test_a_primary_that_hears_nothing_serves_after_the_timeout(self) -> None:
        pair = ReplicaPair()
        pair.standby.start()
        pair.net.pumps.clear()
        pair.primary.start()
        pair.net.pumps.clear()  # the connection is made; nothing comes back
        self.assertIsNotNone(pair.primary.nsqd.standby)
        pair.net.reactor.advance(5.1)
        self.assertIsNone(pair.primary.nsqd.standby)


class AutomaticPromotionTests(unittest.TestCase):
    """--promote-after, with the lease and the witness (an nsq-tw nsqlookupd at
    127.0.0.1:4161, tests.nsqd_tw.replicas.Witnesses); --replication-timeout 5s:
    the lease, waited out with a margin of 1s."""

    def setUp(self) -> None:
        self.pair = ReplicaPair(standby_opts={"promote_after": 2.0})
        self.pair.start()
        self.witness = self.pair.witnesses.witnesses["127.0.0.1:4161"]
        self.wait(2.0)  # the first PING, heartbeat and witness list
        self.assertEqual(self.pair.standby.repl.state.lookupd, ["127.0.0.1:4161"])
        self.assertEqual(self.pair.standby.repl.state.lease, 5.0)

    def wait(self, seconds: float) -> None:
        for _ in range(round(seconds * 10)):
            self.pair.advance(0.1)

    def role(self, node: object) -> str:
        return node.repl.state.role  # type: ignore[attr-defined,no-any-return]

    def pub(self, node: object) -> list[tuple[int, bytes]]:
        client = FakeClient(node.nsqd)  # type: ignore[attr-defined]
        client.command(b"PUB", "t", body=b"x")
        return client.frames()

    def test_the_primary_tells_its_lookupds_as_it_learns_them(self) -> None:
        self.pair.primary.lookup.addresses = ["127.0.0.1:4161", "127.0.0.1:4163"]
        self.pair.primary.lookup.identified()  # a lookupd answered IDENTIFY
        self.pair.settle()
        state = self.pair.standby.repl.state
        self.assertEqual((state.lookupd, state.witnesses), (["127.0.0.1:4161", "127.0.0.1:4163"], 2))

    def test_after_a_kill_it_takes_over_once_the_lease_ran_out(self) -> None:
        self.pair.primary.kill()
        self.wait(5.5)  # past --promote-after, not past the lease and its margin
        self.assertEqual(self.role(self.pair.standby), "standby")
        self.wait(1.5)
        self.assertEqual(self.role(self.pair.standby), "primary")
        self.assertEqual(self.pair.standby.repl.state.epoch, 1)
        self.assertIsNone(self.pair.standby.nsqd.standby)
        self.assertEqual(self.pair.witnesses.witnesses["127.0.0.1:4161"].pairs[self.pair.standby.repl.pair].epoch, 1)
        self.assertEqual(self.pub(self.pair.standby), [OK], "alone, on the witness's lease")

    def test_a_cut_link_with_the_primary_alive_promotes_no_one(self) -> None:
        self.pair.net.pumps.clear()
        self.pair.standby.up = False  # the primary cannot reach it; it still reaches its witness
        self.wait(12.0)
        self.assertEqual(self.pair.standby.state, "disconnected")
        self.assertEqual(self.role(self.pair.standby), "standby")
        self.assertEqual(self.pub(self.pair.primary), [OK], "one node accepts, degraded, on the witness's lease")

    def test_a_primary_cut_off_from_standby_and_witnesses_acknowledges_nothing_after_its_lease(self) -> None:
        self.pair.witnesses.down.add("127.0.0.1:4161")
        self.pair.net.pumps.clear()
        self.pair.standby.up = False
        client = FakeClient(self.pair.primary.nsqd)
        client.command(b"PUB", "t", body=b"x")
        self.assertEqual(client.frames(), [], "sync: it waits for the standby")
        self.wait(5.5)  # the link is dropped, silent for --replication-timeout; the lease has run out
        [(kind, data)] = client.frames()
        self.assertEqual(kind, FRAME_TYPE_ERROR, "not acknowledged alone without a lease")
        self.assertIn(b"no lease", data)
        [(kind, data)] = self.pub(self.pair.primary)
        self.assertEqual(kind, FRAME_TYPE_ERROR)
        self.assertIn(b"E_PUB_FAILED PUB failed replication: no lease", data)
        self.assertEqual(
            json.loads(http(self.pair.primary.nsqd, "POST", "/pub?topic=t", b"x")[1])["message"], "REPLICA_NO_LEASE"
        )
        self.pair.witnesses.down.clear()  # the standby reaches the witness first: it takes over
        self.wait(2.0)
        self.assertEqual((self.role(self.pair.standby), self.pair.standby.repl.state.epoch), ("primary", 1))
        [(kind, data)] = self.pub(self.pair.primary)
        self.assertEqual(kind, FRAME_TYPE_ERROR, "deposed, or already the new primary's standby")

    def test_a_paused_primary_acknowledges_nothing_once_replaced(self) -> None:
        primary = self.pair.primary
        consume(primary.nsqd, "t", "c", rdy=0)
        client = FakeClient(primary.nsqd)
        client.command(b"PUB", "t", body=b"held")
        self.pair.settle()
        self.assertEqual(client.frames(), [OK])  # sync: the standby holds it
        # SIGSTOP: nothing of the primary runs; what producers send waits in its sockets
        primary.repl._tick.stop()
        self.pair.net.pumps.clear()
        self.pair.standby.up = False
        primary.up = False  # nothing reaches it either
        self.wait(8.0)
        self.assertEqual(self.role(self.pair.standby), "primary")
        # SIGCONT: the publishes that came while it was stopped are read: none is acknowledged
        primary.up = True
        client.command(b"PUB", "t", body=b"after the takeover")
        self.assertEqual(client.frames(), [], "sent to its standby: it waits for the ACK")
        primary.repl._tick.start(primary.repl._tick_interval, now=True)  # the link is found silent: dropped
        self.pair.settle()
        [(kind, data)] = client.frames()
        self.assertEqual(kind, FRAME_TYPE_ERROR, "its lease ran out while it was stopped")
        self.assertIn(b"no lease", data)
        self.assertIsNotNone(primary.repl.deposed_by, "its witness says who took over")
        self.assertIn(b"no longer the primary", b"".join(d for _, d in self.pub(primary)))
        self.pair.standby.up = True
        self.wait(5.0)  # it dials the new primary and becomes its standby
        self.assertEqual((self.role(primary), primary.repl.state.epoch), ("standby", 1))

    def test_no_takeover_without_the_witness(self) -> None:
        self.pair.witnesses.down.add("127.0.0.1:4161")
        self.pair.primary.kill()
        self.wait(12.0)
        self.assertEqual(self.role(self.pair.standby), "standby")
        self.pair.witnesses.down.clear()
        self.wait(1.0)
        self.assertEqual(self.role(self.pair.standby), "primary")

    def test_a_witness_that_just_started_grants_nothing_yet(self) -> None:
        self.pair.primary.kill()
        self.wait(3.0)
        self.pair.witnesses.add("127.0.0.1:4161", up_for=0.0)  # restarted: it forgot the pair
        self.wait(5.0)
        self.assertEqual(self.role(self.pair.standby), "standby", "the witness is still starting (a lease and 1s)")
        self.wait(1.5)
        self.assertEqual(self.role(self.pair.standby), "primary")

    def test_promoted_its_channels_drop_what_the_primary_finished(self) -> None:
        consumer = consume(self.pair.primary.nsqd, "t", "c", rdy=50)
        self.pair.primary.nsqd.publish("t", [b"%02d" % i for i in range(50)])
        msgs = consumer.messages()
        for msg in msgs[::2]:
            consumer.command(b"FIN", msg.id)
        self.pair.settle()
        standby = self.pair.standby.channel("t", "c")
        self.assertEqual(len(live(standby)), 25)
        self.pair.primary.kill()
        self.wait(8.0)
        consumer = consume(self.pair.standby.nsqd, "t", "c", rdy=100)
        self.assertEqual(sorted(m.body for m in consumer.messages()), [b"%02d" % i for i in range(1, 50, 2)])


class GoLookupdTests(unittest.TestCase):
    def test_gos_nsqlookupd_is_no_witness_and_says_so_once(self) -> None:
        from twisted.logger import LogLevel

        from tests.nsqd_tw.test_replication import Logged

        log = Logged(self)
        pair = ReplicaPair(standby_opts={"promote_after": 1.0})
        pair.witnesses.go.add("127.0.0.1:4161")
        pair.start()
        for _ in range(100):
            pair.advance(0.1)
        lines = log.lines("REPLICATION: nsqlookupd 127.0.0.1:4161 cannot witness a failover", LogLevel.error)
        self.assertEqual(len(lines), 1)
        self.assertEqual(pair.primary.repl.lease.witness_until(), 0.0, "no lease from it")
        pair.primary.kill()
        for _ in range(150):
            pair.advance(0.1)
        self.assertEqual(pair.standby.repl.state.role, "standby", "no takeover on Go's nsqlookupd's word")
