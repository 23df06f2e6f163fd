"""NSQLookupd: the registration DB and the addresses it serves on."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.application import service

from lookupd_tw.options import NSQLookupdOptions
from lookupd_tw.registration_db import PeerInfo, Registration, RegistrationDB
from lookupd_tw.witness import Witness
from nsq_service.log import LogGate
from nsq_wire.version import version_string

REMOVALS_PER_TURN = 200  # registrations of disconnected peers removed per reactor turn


class _Removal:
    __slots__ = ("done", "info", "next", "registrations")

    def __init__(self, info: PeerInfo, registrations: list[Registration], done: Callable[[Registration], None]):
        self.info = info
        self.registrations = registrations
        self.next = 0
        self.done = done


class NSQLookupd(service.Service):
    name = "nsqlookupd"

    def __init__(self, opts: NSQLookupdOptions, reactor: Any = None, witness_clock: Any = None) -> None:
        if reactor is None:
            from twisted.internet import reactor as _reactor

            reactor = _reactor
        self.opts = opts
        # this server's --log-level: what it creates logs through loggers of this gate
        self.log_gate = LogGate(opts.log_level)
        self.log = self.log_gate.logger("lookupd_tw.nsqlookupd", self)
        self.reactor = reactor
        self.db = RegistrationDB()
        # beyond Go: the witness of nsq-tw replication pairs (lookupd_tw.witness)
        self.witness = Witness(witness_clock) if witness_clock is not None else Witness()
        self.tcp_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self._removals: deque[_Removal] = deque()
        self._removing: Any = None  # the delayed call of the next batch of removals

    def now(self) -> float:
        return float(self.reactor.seconds())

    def privilegedStartService(self) -> None:
        self.log.info("{version}", version=version_string("nsqlookupd"))
        service.Service.privilegedStartService(self)

    def stopService(self) -> None:
        if self._removing is not None and self._removing.active():
            self._removing.cancel()
        self._removing = None
        service.Service.stopService(self)

    def remove_peer(self, info: PeerInfo, removed: Callable[[Registration], None]) -> None:
        """Take a disconnected peer out of the DB.

        Queries stop seeing it at once; its registrations are removed (and
        ``removed`` called for each) ``REMOVALS_PER_TURN`` per reactor turn,
        over all the peers that left, so the reactor is never held for long.
        """
        self._removals.append(_Removal(info, self.db.retire(info), removed))
        if self._removing is None:
            self._removing = self.reactor.callLater(0, self._remove_some)

    def _remove_some(self) -> None:
        self._removing = None
        budget = REMOVALS_PER_TURN
        try:
            while self._removals and budget:
                job = self._removals[0]
                end = min(len(job.registrations), job.next + budget)
                for r in job.registrations[job.next : end]:
                    if self.db.remove_retired(r, job.info):
                        job.done(r)
                budget -= end - job.next
                job.next = end
                if end == len(job.registrations):
                    self._removals.popleft()
        except Exception:
            self.log.failure("removing a disconnected peer's registrations")
            self._removals.popleft()
        finally:
            if self._removals:
                self._removing = self.reactor.callLater(0, self._remove_some)
