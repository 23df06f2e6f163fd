"""Beyond Go: draining over HTTP (docs/operator-guide.md, "Draining a node"; the drain is
:class:`nsqd_tw.core.drain.Drain`'s). ``/config/drain`` and ``/config/shutdown``
come through Go's ``/config/<opt>`` route; ``"draining": true`` follows Go's keys
of ``/info`` and ``/stats`` while nsqd drains; :data:`DRAINING` is what a publish
or a creation refused meanwhile answers."""

from __future__ import annotations

from twisted.web.server import Request

from nsq_service.options import BOOL, ConfigError
from nsq_service.web import HTTPError, JSONValue
from nsqd_tw.http.routes import FeatureRoutes

DRAINING = "DRAINING"  # beyond Go: a refused publish or creation while nsqd drains


class DrainRoutes(FeatureRoutes):
    """The drain's answers of :class:`nsqd_tw.http.api.NSQDHTTPAPI` (a mixin of it)."""

    def _draining(self) -> dict[str, bool]:
        """Beyond Go, after Go's keys: ``"draining": true`` while nsqd drains."""
        return {"draining": True} if self.nsqd.draining else {}

    def _stop_config(self, request: Request, name: str) -> JSONValue:
        """Beyond Go: ``/config/drain`` (GET: whether nsqd drains; PUT ``true``: drain, as
        SIGTERM does with --sigterm-mode drain) and ``/config/shutdown`` (PUT ``true``:
        stop now, as SIGINT does). Neither can be undone: ``false`` is an INVALID_VALUE."""
        if request.method == b"PUT":
            try:
                wanted = BOOL.from_flag(self._config_body(request).decode("utf-8", "replace").strip())
            except ConfigError:
                raise HTTPError(400, "INVALID_VALUE") from None
            if not wanted:
                raise HTTPError(400, "INVALID_VALUE")
            if name == "drain":
                self.nsqd.start_drain("PUT /config/drain")
            else:
                self.log.info("NSQ: stopping: PUT /config/shutdown")
                self.nsqd.reactor.callLater(0, self.nsqd.request_stop)  # once this answer is written
                return JSONValue(True)
        return JSONValue(self.nsqd.draining if name == "drain" else not self.nsqd.running)
