"""nsqd's HTTP API, a Klein app.

This is the seam the HTTP API issue fills in; for now it answers ``/ping``,
which clients and scripts use as the readiness check.
"""

from __future__ import annotations

from typing import Any

from klein import Klein
from twisted.web.server import Request, Site

from nsqd_tw.nsqd import NSQD


class NSQDHTTPAPI:
    app = Klein()

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd

    @app.route("/ping", methods=["GET", "HEAD"])
    def ping(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
        if not self.nsqd.is_healthy():
            request.setResponseCode(500)
        return self.nsqd.get_health().encode()

    def resource(self) -> Any:
        return self.app.resource()


class QuietSite(Site):
    """A Site that does not write an access log line per request."""

    noisy = False

    def log(self, request: Any) -> None:
        pass


def make_site(nsqd: NSQD) -> Site:
    return QuietSite(NSQDHTTPAPI(nsqd).resource())
