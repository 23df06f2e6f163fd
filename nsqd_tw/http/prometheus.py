"""Beyond Go: ``GET /metrics``, the stats in the Prometheus text format. The
collector (:mod:`.metrics`, and prometheus_client with it) is imported with the
first scrape, not when the API is built."""

from __future__ import annotations

from typing import Any

from twisted.web.server import Request

from nsq_service.memstats import GCPauses
from nsq_service.web import route
from nsqd_tw.http.routes import FeatureRoutes


class MetricsRoutes(FeatureRoutes):
    """The ``/metrics`` route of :class:`nsqd_tw.http.api.NSQDHTTPAPI` (a mixin of it)."""

    gc_pauses: GCPauses | None
    _registry: Any = None  # built at the first scrape

    @route("/metrics", "GET", style="raw", access_log=False)
    def metrics(self, request: Request) -> bytes:
        """Beyond Go: the stats in the Prometheus text format."""
        from nsqd_tw.http.metrics import CONTENT_TYPE, make_registry, render

        if self._registry is None:
            self._registry = make_registry(self.nsqd, self.gc_pauses)
        return self.finish(request, 200, render(self._registry), CONTENT_TYPE, nsq=False)
