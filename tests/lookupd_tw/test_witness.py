"""The witness of replication pairs (lookupd_tw.witness): heartbeats, claims, reservations, over HTTP too."""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial import unittest

from lookupd_tw.http_api import LookupdHTTPAPI
from lookupd_tw.nsqlookupd import NSQLookupd
from lookupd_tw.options import NSQLookupdOptions
from lookupd_tw.witness import MARGIN, RESERVE, Witness

LEASE = 5.0


class WitnessTests(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.witness = Witness(self.clock.seconds)
        self.clock.advance(LEASE + MARGIN)  # up long enough to answer

    def beat(self, node: str = "P", epoch: int = 0) -> str:
        return self.witness.heartbeat("pair", node, epoch, f"{node}:4150", LEASE)[0]

    def claim(self, node: str = "S", epoch: int = 1) -> str:
        return self.witness.claim("pair", node, epoch, f"{node}:4150", LEASE)[0]

    def test_a_live_primary_is_not_taken_over(self) -> None:
        self.assertEqual(self.beat(), "ok")
        self.clock.advance(LEASE)
        self.assertEqual(self.claim(), "alive")
        self.assertEqual(self.beat(), "ok")

    def test_a_silent_primary_is_taken_over_and_then_deposed(self) -> None:
        self.assertEqual(self.beat(), "ok")
        self.clock.advance(LEASE + MARGIN + 0.1)
        self.assertEqual(self.claim(), "granted")
        self.assertEqual(self.beat(), "reserved", "the old primary gets no lease while the claim stands")
        self.assertEqual(self.beat("S", 1), "ok", "the claimer's first heartbeat makes it the holder")
        self.assertEqual(self.beat(), "deposed")
        status, holder = self.witness.heartbeat("pair", "P", 0, "P:4150", LEASE)
        self.assertEqual((status, holder.node, holder.epoch, holder.address), ("deposed", "S", 1, "S:4150"))

    def test_a_claim_not_followed_up_lapses(self) -> None:
        self.beat()
        self.clock.advance(LEASE + MARGIN + 0.1)
        self.assertEqual(self.claim(), "granted")
        self.clock.advance(RESERVE)
        self.assertEqual(self.beat(), "ok", "the old primary is back: the reservation ran out")
        self.assertEqual(self.claim(), "alive")

    def test_a_claim_given_back(self) -> None:
        self.beat()
        self.clock.advance(LEASE + MARGIN + 0.1)
        self.assertEqual(self.claim(), "granted")
        self.witness.release("pair", "S", 1)
        self.assertEqual(self.beat(), "ok")

    def test_stale_and_competing_claims(self) -> None:
        self.beat("P", 3)
        self.clock.advance(LEASE + MARGIN + 0.1)
        self.assertEqual(self.claim("S", 3), "stale")
        self.assertEqual(self.claim("S", 4), "granted")
        self.assertEqual(self.claim("S", 4), "granted", "the same claim again")
        self.assertEqual(self.claim("T", 4), "reserved", "another claim is under way")
        self.assertEqual(self.claim("T", 5), "reserved")

    def test_two_primaries_at_one_epoch_the_second_is_deposed(self) -> None:
        self.assertEqual(self.beat("P", 2), "ok")
        self.assertEqual(self.beat("Q", 2), "deposed")
        self.assertEqual(self.beat("Q", 1), "deposed")

    def test_a_witness_that_just_started_answers_starting(self) -> None:
        witness = Witness(self.clock.seconds)
        self.assertEqual(witness.heartbeat("pair", "P", 0, "", LEASE)[0], "starting")
        self.assertEqual(witness.claim("pair", "S", 1, "", LEASE)[0], "starting")
        self.clock.advance(LEASE + MARGIN)
        self.assertEqual(witness.heartbeat("pair", "P", 0, "", LEASE)[0], "ok")
        self.assertEqual(witness.claim("pair", "S", 1, "", LEASE)[0], "alive", "it heard the primary meanwhile")

    def test_never_heard_of_and_up_long_enough_a_claim_is_granted(self) -> None:
        self.assertEqual(self.claim(), "granted")


class HTTPTests(unittest.TestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        lookupd = NSQLookupd(NSQLookupdOptions(), self.clock, witness_clock=self.clock.seconds)
        self.clock.advance(LEASE + MARGIN)
        self.treq = StubTreq(LookupdHTTPAPI(lookupd).resource())

    def call(self, method: str, url: str) -> tuple[int, Any]:
        d = self.treq.request(method, "http://l" + url)
        self.treq.flush()
        resp = d.result  # type: ignore[attr-defined]
        content = resp.content()
        self.treq.flush()
        return resp.code, json.loads(content.result)

    def test_routes(self) -> None:
        args = "pair=ab12&node=P&epoch=0&address=p:4150&lease_ms=5000"
        code, doc = self.call("POST", "/witness/heartbeat?" + args)
        self.assertEqual((code, doc["status"], doc["node"], doc["epoch"], doc["heard_ms"]), (200, "ok", "P", 0, 0))
        self.clock.advance(7)
        code, doc = self.call("POST", "/witness/claim?pair=ab12&node=S&epoch=1&address=s:4150&lease_ms=5000")
        self.assertEqual((code, doc["status"], doc["heard_ms"]), (200, "granted", 7000))
        code, doc = self.call("GET", "/witness")
        self.assertEqual([p["pair"] for p in doc["pairs"]], ["ab12"])
        code, doc = self.call("POST", "/witness/release?pair=ab12&node=S&epoch=1")
        self.assertEqual((code, doc), (200, {"status": "released"}))

    def test_bad_arguments_are_400(self) -> None:
        for query, message in [
            ("node=P&epoch=0&lease_ms=5000", "MISSING_ARG_PAIR"),
            ("pair=a&node=P&epoch=-1&lease_ms=5000", "INVALID_ARG_EPOCH"),
            ("pair=a&node=P&epoch=0&lease_ms=0", "INVALID_ARG_LEASE_MS"),
            ("pair=" + "a" * 65 + "&node=P&epoch=0&lease_ms=5000", "INVALID_ARG_PAIR"),
            ("pair=a&node=P&epoch=99999999999999999999&lease_ms=5000", "INVALID_ARG_EPOCH"),
        ]:
            code, doc = self.call("POST", "/witness/heartbeat?" + query)
            self.assertEqual((code, doc), (400, {"message": message}), query)

    def test_get_is_405_on_the_posts(self) -> None:
        code, _ = self.call("GET", "/witness/heartbeat?pair=a&node=P&epoch=0&lease_ms=5000")
        self.assertEqual(code, 405)
