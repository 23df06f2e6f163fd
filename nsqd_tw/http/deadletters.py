"""Beyond Go: ``/topic/dead_letter``, where a recent dead letter came from
(:class:`nsqd_tw.core.deadletters.DeadLetters` keeps it, by message ID)."""

from __future__ import annotations

from typing import Any

from twisted.web.server import Request

from nsq_service.web import HTTPError, route
from nsqd_tw.http.routes import FeatureRoutes


class DeadLetterRoutes(FeatureRoutes):
    """The dead-letter route of :class:`nsqd_tw.http.api.NSQDHTTPAPI` (a mixin of it)."""

    @route("/topic/dead_letter", "GET")
    def topic_dead_letter(self, request: Request) -> dict[str, Any]:
        """Beyond Go: where a dead letter of topic T came from (recent ones, by message ID)."""
        params, topic = self._topic_from_query(request)
        if "id" not in params:
            raise HTTPError(400, "MISSING_ARG_ID")
        msg_id = params["id"][0]
        origin = self.nsqd.dead_letters.origin(topic, msg_id.encode("latin-1", "replace"))
        if origin is None:
            raise HTTPError(404, "DEAD_LETTER_NOT_FOUND")
        return {"id": msg_id, "dead_letter_topic": topic, **origin}
