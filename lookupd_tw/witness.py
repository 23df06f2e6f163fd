"""The witness of replication pairs (beyond Go's nsqlookupd): when it last heard
from each pair's primary, and which epoch it stands for.

A primary of an nsq-tw replication pair (docs/replication.md) heartbeats its
nsqlookupds every third of its lease: ``POST /witness/heartbeat``. A majority of
them answering ``ok`` to a heartbeat sent at *t* lets it acknowledge publishes
alone (its standby unreachable) until *t* + lease. Its standby, cut off from it,
promotes itself only once a majority of them *grant* its claim
(``POST /witness/claim``): they have not heard from the primary for more than its
lease plus a margin, by their own monotonic clocks. A granted claim reserves the
pair for the claimer for a while: the old primary's heartbeats are not answered
``ok`` meanwhile, and the claimer's first heartbeat at its new epoch makes it the
holder; from then on the old primary is answered ``deposed``. So the two
majorities share a witness, and no node acknowledges after another took over.

What a witness knows lives in memory: one that (re)starts answers ``starting``
for a lease plus the margin, long enough to hear from the live primaries first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.web.server import Request

from nsq_service.web import HTTPError, route

MARGIN = 1.0  # seconds beyond a lease that a claim waits (message delays, clock rates)
RESERVE = 10.0  # seconds a granted claim holds the pair for its claimer
MAX_PAIRS = 10_000  # pairs one witness keeps (a pair not heard from for a day is forgotten first)
FORGET_AFTER = 86_400.0
MAX_LEASE = 3600.0
MAX_EPOCH = 1 << 53


@dataclass
class Holder:
    """A pair's primary as this witness knows it."""

    epoch: int
    node: str
    address: str
    lease: float
    heard: float  # monotonic seconds
    claimer: tuple[str, int] | None = None  # (node, epoch) that holds a reservation
    reserved_until: float = 0.0

    def json(self, now: float) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "node": self.node,
            "address": self.address,
            "heard_ms": int((now - self.heard) * 1000),
            "lease_ms": int(self.lease * 1000),
        }


class Witness:
    """The pairs this nsqlookupd witnesses; ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.pairs: dict[str, Holder] = {}

    def _warming(self, now: float, lease: float) -> bool:
        return now - self.started < lease + MARGIN

    def heartbeat(self, pair: str, node: str, epoch: int, address: str, lease: float) -> tuple[str, Holder]:
        """The primary ``node`` at ``epoch`` is alive: ``ok`` (it may count this
        toward its lease), ``starting`` (this witness has not been up long enough),
        ``reserved`` (a claimer holds the pair for now) or ``deposed`` (a newer
        primary: the holder returned says which)."""
        now = self.clock()
        holder = self.pairs.get(pair)
        if holder is not None and holder.claimer is not None and now < holder.reserved_until:
            if (node, epoch) == holder.claimer:  # the claimer promoted itself: it holds the pair now
                holder = self.pairs[pair] = Holder(epoch, node, address, lease, now)
                return ("starting" if self._warming(now, lease) else "ok"), holder
            if epoch <= holder.epoch:
                return "reserved", holder
        if holder is None or epoch > holder.epoch:
            if holder is None and not self._room(now):
                return "starting", Holder(epoch, node, address, lease, now)
            holder = self.pairs[pair] = Holder(epoch, node, address, lease, now)
        elif epoch == holder.epoch and node == holder.node:
            holder.heard, holder.address, holder.lease = now, address, lease
            holder.claimer = None
        else:
            return "deposed", holder
        return ("starting" if self._warming(now, lease) else "ok"), holder

    def claim(self, pair: str, node: str, epoch: int, address: str, lease: float) -> tuple[str, Holder | None]:
        """A standby ``node`` wants to be the primary at ``epoch``: ``granted`` when
        the holder has been silent for more than its lease plus the margin (the
        pair is then reserved for the claimer), else ``alive``, ``stale`` (an epoch
        not above the holder's), ``reserved`` (another claim is under way) or
        ``starting``."""
        now = self.clock()
        holder = self.pairs.get(pair)
        if self._warming(now, max(lease, holder.lease if holder is not None else 0.0)):
            return "starting", holder
        if holder is not None:
            if holder.node == node and holder.epoch == epoch:
                holder.heard = now
                return "granted", holder
            if epoch <= holder.epoch:
                return "stale", holder
            if now - holder.heard <= holder.lease + MARGIN:
                return "alive", holder
            if holder.claimer is not None and now < holder.reserved_until and holder.claimer != (node, epoch):
                return "reserved", holder  # another claim is under way
        elif not self._room(now):
            return "starting", None
        else:
            holder = self.pairs[pair] = Holder(-1, "", "", lease, now - lease - MARGIN - 1.0)
        holder.claimer, holder.reserved_until = (node, epoch), now + RESERVE
        return "granted", holder

    def release(self, pair: str, node: str, epoch: int) -> None:
        """A claimer that did not get a majority gives its reservations back."""
        holder = self.pairs.get(pair)
        if holder is not None and holder.claimer == (node, epoch):
            holder.claimer = None
            holder.reserved_until = 0.0

    def _room(self, now: float) -> bool:
        if len(self.pairs) < MAX_PAIRS:
            return True
        old = [p for p, h in self.pairs.items() if now - h.heard > FORGET_AFTER]
        for p in old:
            del self.pairs[p]
        return len(self.pairs) < MAX_PAIRS


def _witness_args(params: dict[str, list[str]]) -> tuple[str, str, int, str, float]:
    """pair, node, epoch, address, lease (seconds) of a witness request, or 400."""

    def text(name: str, most: int) -> str:
        if name not in params:
            raise HTTPError(400, f"MISSING_ARG_{name.upper()}")
        value = params[name][0]
        if not value or len(value) > most or not value.isprintable():
            raise HTTPError(400, f"INVALID_ARG_{name.upper()}")
        return value

    def number(name: str, low: int, high: int) -> int:
        value = text(name, 20)
        if not value.isdigit() or not low <= int(value) <= high:
            raise HTTPError(400, f"INVALID_ARG_{name.upper()}")
        return int(value)

    pair = text("pair", 64)
    node = text("node", 64)
    epoch = number("epoch", 0, MAX_EPOCH)
    address = text("address", 255) if "address" in params else ""
    lease = number("lease_ms", 1, int(MAX_LEASE * 1000)) / 1000
    return pair, node, epoch, address, lease


class WitnessRoutes:
    """``/witness/heartbeat``, ``/witness/claim``, ``/witness/release`` and
    ``GET /witness``: a mixin of nsqlookupd's HTTP API (``self.lookupd.witness``)."""

    lookupd: Any
    query: Callable[[Request], dict[str, list[str]]]  # GoHTTPAPI's

    @route("/witness/heartbeat", "POST")
    def witness_heartbeat(self, request: Request) -> dict[str, Any]:
        pair, node, epoch, address, lease = _witness_args(self.query(request))
        witness: Witness = self.lookupd.witness
        status, holder = witness.heartbeat(pair, node, epoch, address, lease)
        return {"status": status, **holder.json(witness.clock())}

    @route("/witness/claim", "POST")
    def witness_claim(self, request: Request) -> dict[str, Any]:
        pair, node, epoch, address, lease = _witness_args(self.query(request))
        witness: Witness = self.lookupd.witness
        status, holder = witness.claim(pair, node, epoch, address, lease)
        doc: dict[str, Any] = {"status": status}
        if holder is not None and holder.epoch >= 0:
            doc.update(holder.json(witness.clock()))
        return doc

    @route("/witness/release", "POST")
    def witness_release(self, request: Request) -> dict[str, Any]:
        pair, node, epoch, _, _ = _witness_args({"lease_ms": ["1"], **self.query(request)})
        self.lookupd.witness.release(pair, node, epoch)
        return {"status": "released"}

    @route("/witness", "GET")
    def witness_pairs(self, request: Request) -> dict[str, Any]:
        witness: Witness = self.lookupd.witness
        now = witness.clock()
        pairs = [{"pair": p, **h.json(now)} for p, h in sorted(witness.pairs.items()) if h.epoch >= 0]
        return {"up_ms": int((now - witness.started) * 1000), "pairs": pairs}
