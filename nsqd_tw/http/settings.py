"""Beyond Go: ``/topic/settings`` and ``/channel/settings``, a queue's own settings
(dead letters, TTL, bounds, retention: :mod:`nsqd_tw.core.settings`) and what
applies to it, read (``GET``) or changed (``PUT``, answered once nsqd.dat has them).
"""

from __future__ import annotations

import json
from typing import Any

from twisted.web.server import Request

from nsq_service.web import HTTPError, content_length, route
from nsq_service.web import body as read_body
from nsqd_tw.core.settings import SettingsError, parse_settings
from nsqd_tw.http.routes import FeatureRoutes


class SettingsRoutes(FeatureRoutes):
    """The settings routes of :class:`nsqd_tw.http.api.NSQDHTTPAPI` (a mixin of it)."""

    SETTINGS_BODY = 64 * 1024

    def _settings_changes(self, request: Request) -> dict[str, Any] | None:
        """PUT: the settings sent (JSON object; null clears a key); GET: None."""
        if request.method != b"PUT":
            return None
        if content_length(request) > self.SETTINGS_BODY:
            raise HTTPError(413, "BODY_TOO_BIG")
        data = read_body(request, self.SETTINGS_BODY + 1)
        if len(data) > self.SETTINGS_BODY:
            raise HTTPError(413, "BODY_TOO_BIG")
        try:
            return parse_settings(json.loads(data or b"null"))
        except (ValueError, RecursionError) as e:
            text = str(e) if isinstance(e, SettingsError) else "body is not JSON"
            raise HTTPError(400, f"INVALID_SETTINGS: {text}") from None

    def _settings_answer(self, topic: Any, channel: Any, changes: dict[str, Any] | None) -> Any:
        if changes is not None:
            try:
                topic.update_settings(changes, channel)
            except SettingsError as e:
                raise HTTPError(400, f"INVALID_SETTINGS: {e}") from None
        queue = channel if channel is not None else topic
        answer: dict[str, Any] = {"topic": topic.name}
        if channel is not None:
            answer["channel"] = channel.name
        answer["settings"] = queue.settings_json()
        answer["effective"] = queue.policy.as_json(topic.name)
        if changes is None:
            return answer
        d = self._persisted()
        return answer if d is None else d.addCallback(lambda _: answer)

    @route("/topic/settings", "GET", "PUT", body=lambda api: api.SETTINGS_BODY)
    def topic_settings(self, request: Request) -> Any:
        changes = self._settings_changes(request)
        return self._settings_answer(self._existing_topic(request), None, changes)

    @route("/channel/settings", "GET", "PUT", body=lambda api: api.SETTINGS_BODY)
    def channel_settings(self, request: Request) -> Any:
        changes = self._settings_changes(request)
        channel = self._existing_channel(request)
        topic = self.nsqd.get_existing_topic(channel.topic_name)
        return self._settings_answer(topic, channel, changes)
