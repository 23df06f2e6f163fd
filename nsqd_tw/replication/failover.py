"""A standby taking over (beyond Go): by itself after ``--promote-after``, or on
``POST /replication/promote`` (docs/replication.md, "Failover").

Either way it waits out the lease it granted its primary (``--replication-timeout``
of the primary, plus a margin, after the last ``PING`` it received), and, when
its primary named witnesses (nsq-tw nsqlookupds), a majority of them must grant
its claim: they have not heard from the primary for longer than its lease. Only
then is the epoch raised and the node serves (:meth:`ReplicationService.promote`).
A forced promotion (``?force=true``) skips both: the operator says the primary
is gone for good.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task

from nsqd_tw.core.replica import PRIMARY, STANDBY
from nsqd_tw.replication.errors import PromoteError
from nsqd_tw.replication.lease import MARGIN


class Failover:
    """The standby side of a takeover (``service``: the ReplicationService)."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.claiming = False
        self._said = ""  # the last reason logged for not taking over (said once until it changes)

    # -- automatic ----------------------------------------------------------------------

    def tick(self) -> None:
        """--promote-after: the primary unheard that long and its lease run out,
        then the witnesses' grant."""
        service = self.service
        after = service.nsqd.opts.promote_after
        state = service.state
        if not after or self.claiming or not state.synced or service.link is not None:
            return
        now = service.mono()
        if now < service.unlinked_mono + after or not service.takeover.expired():
            return
        if not service.witness_addresses():
            self._say(
                "REPLICATION: primary {peer} unreachable, but it named no nsqlookupd to witness its absence: "
                "not promoting (POST /replication/promote does, once an operator knows it is gone)",
            )
            return
        self.claiming = True
        d = service.takeover.claim(state.epoch + 1)

        def answered(result: tuple[bool, dict[str, str]]) -> None:
            self.claiming = False
            granted, answers = result
            if state.role != STANDBY or service.link is not None or not service.running:
                return
            if not granted:
                self._say(
                    "REPLICATION: primary {peer} unreachable, but no majority of its witnesses lets this standby "
                    "take over: " + _answers(answers),
                )
                return
            self._said = ""
            service.promote(
                why=f"primary {state.peer} unreachable for {round(service.mono() - service.unlinked_mono)}s, "
                f"its lease run out, and its witnesses granted the takeover ({_answers(answers)})",
                claimed=True,
            )

        def failed(f: Any) -> None:
            self.claiming = False
            service.log.failure("REPLICATION: automatic promotion failed", f)

        d.addCallbacks(answered, failed)

    def _say(self, text: str) -> None:
        text = text.replace("{peer}", self.service.state.peer or "(none)")
        if text != self._said:
            self._said = text
            self.service.log.warn("{text}", text=text)

    # -- POST /replication/promote -----------------------------------------------------------

    @defer.inlineCallbacks
    def request(self, force: bool) -> Any:
        """An operator's promotion: refused (:class:`PromoteError`) while linked
        to the primary or not in sync (unless ``force``); otherwise it waits out
        the lease this standby granted and asks the witnesses, then promotes."""
        service = self.service
        me = service.state
        if me.role == PRIMARY:
            raise PromoteError(409, "ALREADY_PRIMARY", "this nsqd is the primary already")
        if not force and service.standby_side is not None:
            raise PromoteError(409, "PRIMARY_CONNECTED", f"primary {me.peer} is linked (stop it first, or force=true)")
        if not force and not me.synced:
            raise PromoteError(
                409,
                "NOT_IN_SYNC",
                "this standby has not received its primary's snapshot whole (force=true loses the rest)",
            )
        if force:
            service.promote(force=True)
            return
        if self.claiming:
            raise PromoteError(409, "PROMOTING", "a promotion is already under way")
        self.claiming = True
        try:
            wait = service.takeover.expires_at() - service.mono()
            if wait > 0:
                service.log.info(
                    "REPLICATION: promotion requested: waiting {t:.1f}s for the lease granted to {peer} to run out",
                    t=wait,
                    peer=me.peer,
                )
                yield task.deferLater(service.nsqd.reactor, wait, lambda: None)
            if service.standby_side is not None:
                raise PromoteError(409, "PRIMARY_CONNECTED", f"primary {me.peer} linked again meanwhile")
            if me.role == PRIMARY:
                return
            claimed = False
            if service.witness_addresses():
                granted, answers = yield self._claim_patiently()
                if not granted:
                    raise PromoteError(
                        409,
                        "WITNESS_REFUSED",
                        "no majority of the primary's witnesses grants the takeover: "
                        + _answers(answers)
                        + " (force=true promotes anyway: the primary may still acknowledge)",
                    )
                claimed = True
            service.promote(why="POST /replication/promote", claimed=claimed)
        finally:
            self.claiming = False

    @defer.inlineCallbacks
    def _claim_patiently(self) -> Any:
        """Claim; while witnesses answer that they heard from the primary less than
        its lease ago (it may just have died), ask again once that lease ran out
        there, for at most another lease."""
        service = self.service
        deadline = service.mono() + service.primary_lease() + MARGIN
        while True:
            granted, answers = yield service.takeover.claim(service.state.epoch + 1)
            left = deadline - service.mono()
            if granted or left <= 0 or not any(a.startswith("alive") for a in answers.values()):
                return granted, answers
            yield task.deferLater(service.nsqd.reactor, min(left, 0.5), lambda: None)


def _answers(answers: dict[str, str]) -> str:
    return ", ".join(f"{a} {s}" for a, s in answers.items()) or "no witness answered"
