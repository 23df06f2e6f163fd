"""Beyond Go: replication over HTTP (docs/replication.md): ``GET /replication``
(the node's status), ``POST /replication/promote``, and what a standby refuses
(:data:`STANDBY_REFUSED`: whatever would change its queues, answered 503 with
where its primary is, :func:`standby_json`). ``/stats`` shows the same status
under ``replication``. Only :mod:`nsqd_tw.replication.errors` is imported: the
API loads no link."""

from __future__ import annotations

from typing import Any

from twisted.web.server import Request

from nsq_service.web import BOOL_PARAMS, HTTPError, route
from nsqd_tw.core.topic import StandbyError
from nsqd_tw.http.routes import FeatureRoutes
from nsqd_tw.replication.errors import PromoteError

# what a replication standby refuses (it changes only as its primary says)
STANDBY_REFUSED = frozenset(
    (
        "/pub",
        "/mpub",
        "/topic/create",
        "/topic/delete",
        "/topic/empty",
        "/topic/pause",
        "/topic/unpause",
        "/topic/settings",
        "/channel/create",
        "/channel/delete",
        "/channel/empty",
        "/channel/pause",
        "/channel/unpause",
        "/channel/settings",
        "/channel/rewind",
    )
)


class ReplicationRoutes(FeatureRoutes):
    """The replication routes of :class:`nsqd_tw.http.api.NSQDHTTPAPI` (a mixin of it)."""

    @route("/replication", "GET")
    def replication(self, request: Request) -> dict[str, Any]:
        """This node's role, epoch, peer, the link's state and lag (404 without replication)."""
        if self.nsqd.replication is None:
            raise HTTPError(404, "NOT_FOUND")
        status: dict[str, Any] = self.nsqd.replication.status()
        return status

    @route("/replication/promote", "POST")
    def replication_promote(self, request: Request) -> Any:
        """Make this standby the primary (``force``: even while linked to its
        primary, or not in sync); answered with the new status."""
        replication = self.nsqd.replication
        if replication is None:
            raise HTTPError(404, "NOT_FOUND")
        params = self.query(request)
        force = "force" in params and BOOL_PARAMS.get(params["force"][0], True)

        def refused(f: Any) -> None:
            f.trap(PromoteError)
            e = f.value
            self.log.info("POST /replication/promote refused - {err}", err=e)
            raise HTTPError(e.code, e.message, {"why": str(e)})

        # answered once promoted: after the lease granted to the primary ran out, and its witnesses agreed
        d = replication.promote_request(force=force)
        return d.addCallbacks(lambda _: replication.status(), refused)


def standby_json(standby: StandbyError) -> dict[str, Any]:
    """Where a standby's refusal sends the client: its primary's HTTP address."""
    return {"primary": standby.primary_http or standby.primary, "epoch": standby.epoch}
