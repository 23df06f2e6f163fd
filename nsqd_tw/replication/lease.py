"""Leases (beyond Go): when a primary may acknowledge on its own, and when its
standby may take over (docs/replication.md, "Failover").

A primary holds a *lease* of ``--replication-timeout`` (L) from two sources:

- its standby: every ``PING`` carries the primary's monotonic clock when it was
  sent, and every ``ACK`` echoes the last one received; an echo of a ``PING``
  sent at *t* is a lease until *t* + L, since the standby never takes over
  before L plus a margin after the last ``PING`` it received;
- its witnesses (nsq-tw's nsqlookupds, ``lookupd_tw.witness``): a majority of
  them answering ``ok`` to heartbeats sent at or after *t* is a lease until
  *t* + L, since they grant a claim to take over only after hearing nothing
  from the primary for more than its lease plus a margin.

It acknowledges a publish that the standby does not hold yet only while the lease
holds, checked when the answer is written (monotonic clock: a process paused, or
a stalled machine, finds it expired when it runs again). A standby takes over
only once the lease it granted ran out and a majority of the witnesses granted
its claim. A witness that answers ``deposed`` tells a primary that another node
took over: it stops serving and follows that node.

This is a leader lease (etcd's lease reads, NATS JetStream's clustered leaders,
Kafka's controller fencing) with nsqlookupd as the witnesses; Go's nsqlookupd
has no ``/witness`` and cannot be one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.python.failure import Failure

MARGIN = 1.0  # seconds beyond a lease that a takeover waits (as lookupd_tw.witness.MARGIN)


def pair_id(secret: bytes) -> str:
    """What the witnesses call a pair: derived from its shared secret (which it
    does not reveal), so that both nodes name the pair the same way."""
    return hashlib.sha256(b"nsq-tw replication pair\0" + secret).hexdigest()[:32]


def majority(n: int) -> int:
    return n // 2 + 1


class WitnessClient:
    """POSTs to the witnesses' HTTP API: ``call(address, path, params)`` fires
    with the decoded answer, or fails (unreachable, not a witness: ``NotAWitness``)."""

    def __init__(self, http: Callable[[], Any], reactor: Any, timeout: float) -> None:
        self._http = http
        self.reactor = reactor
        self.timeout = timeout

    @defer.inlineCallbacks
    def call(self, address: str, path: str, params: dict[str, Any]) -> Any:
        from urllib.parse import urlencode

        url = f"http://{address}{path}?{urlencode(params)}"
        resp = yield self._http().post(url, b"", timeout=self.timeout, reactor=self.reactor)
        body = yield resp.content()
        if resp.code == 404:
            raise NotAWitness(address)
        if resp.code != 200:
            raise ValueError(f"{address} answered {resp.code}")
        doc = json.loads(body)
        if not isinstance(doc, dict):
            raise ValueError(f"{address} answered {body[:100]!r}")
        return doc


class NotAWitness(Exception):
    """An nsqlookupd without ``/witness`` (Go's, or an older nsq-tw)."""


class PrimaryLease:
    """A primary's lease (see the module): from its standby and its witnesses."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.length = service.timeout
        self.standby_until = 0.0  # monotonic
        self.witness_ok: dict[str, float] = {}  # witness -> send time of the last heartbeat it answered ok
        self._witness_until = 0.0  # what witness_ok makes of the lease: worked out as answers come, not per publish
        self._asking: set[str] = set()
        self._told: dict[str, str] = {}  # witness -> what was last logged of it

    def mono(self) -> float:
        return float(self.service.mono())

    # -- from the standby -------------------------------------------------------------

    def token(self) -> int:
        """A PING's token: this node's monotonic clock, in microseconds."""
        return int(self.mono() * 1_000_000)

    def echoed(self, token: int) -> None:
        """An ACK echoed the PING sent with ``token``."""
        if token:
            self.standby_until = max(self.standby_until, token / 1_000_000 + self.length)

    # -- from the witnesses -----------------------------------------------------------

    def witness_until(self) -> float:
        return self._witness_until

    def witnessed(self, answers: dict[str, float] | None = None) -> None:
        """``answers`` (witness -> send time of an ok) taken in; the witnesses' lease worked out again."""
        if answers:
            self.witness_ok.update(answers)
        addresses = self.service.witness_addresses()
        need = majority(self.service.witness_total())
        times = sorted((self.witness_ok[a] for a in addresses if a in self.witness_ok), reverse=True)
        self._witness_until = times[need - 1] + self.length if addresses and len(times) >= need else 0.0

    def heartbeat(self) -> None:
        """Tell every witness this node is alive as the primary at its epoch."""
        service = self.service
        state = service.state
        params = {
            "pair": service.pair,
            "node": state.node,
            "epoch": state.epoch,
            "address": service.announced_address(),
            "lease_ms": int(self.length * 1000),
        }
        self.witnessed()  # the witnesses may have changed (PUT /config/nsqlookupd_tcp_addresses)
        for address in service.witness_addresses():
            if address in self._asking:
                continue
            self._asking.add(address)
            sent = self.mono()
            d = service.witness_client.call(address, "/witness/heartbeat", params)
            d.addBoth(self._answered, address, sent, state.epoch)

    def _answered(self, doc: Any, address: str, sent: float, epoch: int) -> None:
        self._asking.discard(address)
        if isinstance(doc, Failure):
            err = doc.value
            self._note(address, "not a witness" if isinstance(err, NotAWitness) else f"unreachable - {err}")
            return
        status = doc.get("status")
        if self.service.state.epoch != epoch:
            return  # promoted or demoted meanwhile
        if status == "ok":
            self.witnessed({address: sent})
            self._note(address, "ok")
        elif status == "deposed":
            self.witness_ok.pop(address, None)
            self.witnessed()
            self.service.deposed(address, doc)
        else:  # starting, reserved: no renewal from it now
            self._note(address, str(status))

    def _note(self, address: str, what: str) -> None:
        """Log what a witness says when it changes (not every heartbeat)."""
        if self._told.get(address) == what:
            return
        self._told[address] = what
        log = self.service.log
        if what == "ok":
            log.info("REPLICATION: witness {w} answers", w=address)
        elif what == "not a witness":
            log.error(
                "REPLICATION: nsqlookupd {w} cannot witness a failover (no /witness: Go's nsqlookupd, or an older "
                "nsq-tw): this primary counts on its standby alone while it is one",
                w=address,
            )
        else:
            log.warn("REPLICATION: witness {w}: {what}", w=address, what=what)

    # -- the lease -----------------------------------------------------------------------

    def until(self) -> float:
        return max(self.standby_until, self.witness_until())

    def valid(self) -> bool:
        return self.mono() < self.until()

    def reset(self) -> None:
        """A new epoch (a promotion): leases of the old one do not carry over."""
        self.standby_until = 0.0
        self.witness_ok.clear()
        self._witness_until = 0.0

    def status(self) -> dict[str, Any]:
        left = self.until() - self.mono()
        return {"lease_ms": max(0, int(left * 1000))}


class Takeover:
    """A standby's side of the lease: when it last granted one (a PING received),
    how long its primary's lease is, and its claim to the witnesses."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.granted_at = float(service.mono())  # a restart may have forgotten a grant: as if just granted
        self.granted_by: dict[str, float] = {}  # the witnesses that granted the last claim, and when it was made

    def granted(self) -> None:
        self.granted_at = float(self.service.mono())

    def expires_at(self) -> float:
        """When the lease this standby granted last runs out, with the margin."""
        return self.granted_at + self.service.primary_lease() + MARGIN

    def expired(self) -> bool:
        return float(self.service.mono()) >= self.expires_at()

    @defer.inlineCallbacks
    def claim(self, epoch: int) -> Any:
        """Ask the witnesses to let this node be the primary at ``epoch``: (granted
        by a majority?, what they answered, by witness). Reservations of a claim
        that failed are given back; those of one that succeeded are the new
        primary's first lease (:attr:`granted_by`: witness -> when it was asked)."""
        service = self.service
        addresses = service.witness_addresses()
        params = {
            "pair": service.pair,
            "node": service.state.node,
            "epoch": epoch,
            "address": service.announced_address(),
            "lease_ms": int(service.timeout * 1000),
        }
        sent = float(service.mono())
        calls = [service.witness_client.call(a, "/witness/claim", params) for a in addresses]
        results = yield defer.DeferredList(calls, consumeErrors=True)
        answers: dict[str, str] = {}
        for address, (ok, value) in zip(addresses, results, strict=True):
            if not ok:
                answers[address] = "not a witness" if isinstance(value.value, NotAWitness) else "unreachable"
            else:
                status = str(value.get("status"))
                heard = value.get("heard_ms")
                answers[address] = status if heard is None or status != "alive" else f"alive (heard {heard} ms ago)"
        granted = [a for a, status in answers.items() if status == "granted"]
        if addresses and len(granted) >= majority(service.witness_total()):
            self.granted_by = {a: sent for a in granted}
            return True, answers
        release = {"pair": service.pair, "node": service.state.node, "epoch": epoch}
        for address in granted:
            service.witness_client.call(address, "/witness/release", release).addErrback(lambda _: None)
        return False, answers
