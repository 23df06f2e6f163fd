"""What the routes beyond Go's use of :class:`~nsqd_tw.http.api.NSQDHTTPAPI`.

Each feature beyond Go has its routes in a module of its own, a mixin of the API
whose methods are marked with :func:`nsq_service.web.route`: the API's
:class:`~nsq_service.web.Router` registers them on its one Klein app with Go's
(:mod:`.inspect`: peeks; :mod:`.settings`: queue settings; :mod:`.rewinds`;
:mod:`.deadletters`; :mod:`.drain`; :mod:`.replication`; :mod:`.prometheus`:
``/metrics``). :class:`FeatureRoutes` is their common base: the API's helpers
they call, declared for the type checker only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

if TYPE_CHECKING:
    from nsqd_tw.core.nsqd import NSQD
    from nsqd_tw.core.topic import Topic


class FeatureRoutes:
    """A mixin of :class:`~nsqd_tw.http.api.NSQDHTTPAPI`: its NSQD, its log, and
    the helpers of Go's routes that the routes beyond Go use as well."""

    nsqd: NSQD
    log: Any

    if TYPE_CHECKING:

        def query(self, request: Request) -> dict[str, list[str]]: ...
        def _topic_from_query(self, request: Request) -> tuple[dict[str, list[str]], str]: ...
        def _existing_topic(self, request: Request) -> Topic: ...
        def _existing_channel(self, request: Request) -> Any: ...
        def _persisted(self) -> Any: ...
        def _config_body(self, request: Request) -> bytes: ...
        def finish(
            self, request: Request, code: int, data: bytes, content_type: bytes | None = None, nsq: bool = True
        ) -> bytes: ...
