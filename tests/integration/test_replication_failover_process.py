"""Replication failover between nsqd processes under load (docs/replication.md):
kill -9 of the primary, automatic then manual promotion, the old primary back as
a standby, a link cut by a proxy. Producers over TCP (PUB, MPUB) and HTTP move to
the other node when theirs fails; a pynsq consumer follows through nsqlookupd.
Every body that got OK must be delivered; duplicates and the time from a kill to
the first delivery from the other node are reported (not asserted: figures)."""

from __future__ import annotations

import json
import os
import time

from twisted.trial import unittest

from tests.integration.failover_load import Consumer, Proxy, Publishers, wait_until
from tests.integration.procs import ServerProcess, call, secret_dir
from tests.integration.procs import replication_status as status

LOOPBACK = ("--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--broadcast-address", "127.0.0.1")
LOAD = 3.0  # seconds of load between the steps of a scenario


class Probes:
    """One PUB to each of ``nodes`` at a time over HTTP, noting when each accepted it."""

    def __init__(self, **nodes: ServerProcess) -> None:
        self.nodes = nodes
        self.accepted: dict[str, list[float]] = {name: [] for name in nodes}

    def once(self) -> None:
        for name, node in self.nodes.items():
            try:
                if call(node, "POST", "/pub?topic=probe", b"p")[0] == 200:
                    self.accepted[name].append(time.monotonic())
            except OSError:
                pass

    def until(self, deadline: float, interval: float) -> None:
        """Probe every ``interval`` seconds until ``deadline`` (``time.monotonic()``)."""
        while time.monotonic() < deadline:
            self.once()
            time.sleep(interval)


class PairCase(unittest.TestCase):
    """A pair of nsqd processes and their nsqlookupd (its witness): the helpers."""

    timeout = 300

    def setUp(self) -> None:
        self.dir, self.secret = secret_dir(self)
        self.lookupd = self.server("nsqlookupd", *LOOPBACK)
        self.figures: list[str] = []

    def server(self, name: str, *args: str, data: str = "") -> ServerProcess:
        cwd = os.path.join(self.dir, data or name)
        os.makedirs(cwd, exist_ok=True)
        extra = ("--data-path", cwd) if name == "nsqd" else ()
        proc = ServerProcess(name, *args, *extra, cwd=cwd).start()
        self.addCleanup(proc.kill)
        return proc

    def nsqd(
        self, data: str, *args: str, tcp: str = "127.0.0.1:0", http_: str = "127.0.0.1:0", lookupd: str = ""
    ) -> ServerProcess:
        """An nsqd of the pair on the data path ``data``, registered with ``lookupd``
        (the test's nsqlookupd by default)."""
        return self.server(
            "nsqd",
            "--tcp-address",
            tcp,
            "--http-address",
            http_,
            "--broadcast-address",
            "127.0.0.1",
            "--lookupd-tcp-address",
            lookupd or self.lookupd.addresses["TCP"],
            "--replication-secret-file",
            self.secret,
            *args,
            data=data,
        )

    def standby(self, promote_after: str, *args: str) -> ServerProcess:
        """Node b, a standby that promotes itself ``promote_after`` its primary is gone."""
        return self.nsqd("b", "--replication-role", "standby", "--promote-after", promote_after, *args)

    def wait_in_sync(self, node: ServerProcess) -> None:
        """The standby ``node`` is caught up with its primary (within 30 s)."""
        self.assertTrue(wait_until(lambda: status(node).get("state") == "in_sync", 30))

    def report(self, text: str) -> None:
        self.figures.append(text)
        print(f"\n    {text}", end="")

    def failover_time(self, consumer: Consumer, killed_at: float, node: ServerProcess) -> None:
        """Wait (30 s at most) for the consumer to get a message from ``node`` after
        the kill at ``killed_at``; report how long it took."""
        self.assertTrue(wait_until(lambda: consumer.first_from(node.addresses["TCP"], killed_at) is not None, 30))
        first = consumer.first_from(node.addresses["TCP"], killed_at)
        if first is not None:
            self.report(f"kill -9 to the first delivery from {node.addresses['TCP']}: {first - killed_at:.2f}s")


class FailoverProcessTests(PairCase):
    def test_kill_the_primary_under_load_twice_nothing_acknowledged_is_lost(self) -> None:
        b = self.standby("1s")
        a = self.nsqd("a", "--replica", b.addresses["TCP"])
        self.wait_in_sync(b)
        consumer = Consumer(self.lookupd.addresses["HTTP"])
        self.addCleanup(consumer.stop)
        load = Publishers([a.addresses["TCP"], b.addresses["TCP"]], [a.addresses["HTTP"], b.addresses["HTTP"]])
        load.start()
        self.addCleanup(load.finish)
        time.sleep(LOAD)  # load on the pair

        # 1. kill -9 the primary: the standby promotes itself (--promote-after, a's lease run out, the witness agrees)
        a_ports = (a.addresses["TCP"], a.addresses["HTTP"])
        killed = time.monotonic()
        a.kill()
        self.assertTrue(wait_until(lambda: status(b).get("role") == "primary", 30))
        self.report(f"kill -9 to automatic promotion: {time.monotonic() - killed:.2f}s")
        self.failover_time(consumer, killed, b)
        time.sleep(LOAD)

        # 2. the old primary comes back on its data path: a standby of b, caught up
        a = self.nsqd("a", "--replica", b.addresses["TCP"], tcp=a_ports[0], http_=a_ports[1])
        self.wait_in_sync(a)
        self.assertEqual((status(a)["role"], status(a)["epoch"]), ("standby", 1))
        self.assertEqual(call(a, "POST", "/pub?topic=failover", b"x")[0], 503)
        time.sleep(LOAD)

        # 3. kill -9 the new primary: a is promoted by hand
        killed = time.monotonic()
        b.kill()
        self.assertTrue(
            wait_until(lambda: call(a, "POST", "/replication/promote")[0] == 200, 30),
        )
        self.report(
            f"kill -9 to manual promotion (polling POST /replication/promote): {time.monotonic() - killed:.2f}s"
        )
        self.assertEqual(status(a)["epoch"], 2)
        self.failover_time(consumer, killed, a)
        time.sleep(LOAD)

        load.finish()
        acked = set(load.acked)
        self.assertTrue(wait_until(lambda: not consumer.missing(acked), 90), f"{len(consumer.missing(acked))} lost")
        self.report(
            f"{len(acked)} acknowledged ({dict(load.acked_by)}), 0 lost, {consumer.duplicates()} delivered twice"
        )
        self.assertEqual(consumer.missing(acked), set())

    def test_a_cut_link_never_makes_two_primaries(self) -> None:
        b = self.standby("1s")
        proxy = Proxy(b.addresses["TCP"])
        self.addCleanup(proxy.close)
        a = self.nsqd("a", "--replica", proxy.address)
        self.wait_in_sync(b)
        probes = Probes(a=a, b=b)
        accepted = probes.accepted
        probes.once()
        proxy.cut()  # both alive, the link between them gone; a still reaches the lookupd
        cut = time.monotonic()
        probes.until(cut + 4.0, 0.05)  # four times --promote-after
        self.assertEqual(status(b)["role"], "standby")
        self.assertEqual(status(b)["state"], "disconnected")
        self.assertEqual(accepted["b"], [])
        self.assertGreater(len(accepted["a"]), 10)  # degraded, acknowledging alone
        self.assertTrue(status(a)["degraded"])

        proxy.restore()
        self.wait_in_sync(b)
        self.assertEqual((status(a)["role"], status(b)["role"]), ("primary", "standby"))
        _, body = call(b, "GET", "/stats?format=json&topic=probe")
        # what a acknowledged alone reached b with the new link's snapshot
        self.assertEqual(json.loads(body)["topics"][0]["depth"], len(accepted["a"]))
