"""Beyond Go: a topic's or channel's queued messages, looked at without taking them.

``GET /topic/peek`` and ``GET /channel/peek`` answer with up to ``n`` messages in
delivery order, in at most :data:`PEEK_BYTES` of JSON whatever ``n`` and the
messages' sizes: the queue reads no more records than can fit, and the answer is
written here, a message at a time (Go's JSON of these keys, its bodies in base64,
which needs no escaping), rather than as one document through the JSON encoder.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from twisted.web.server import Request

from nsq_service.web import JSON_TYPE, HTTPError, go_parse_int, route
from nsq_wire import gojson
from nsqd_tw.core.message import Message
from nsqd_tw.core.peek import CutMessage
from nsqd_tw.core.queue import MessageQueue
from nsqd_tw.http.routes import FeatureRoutes

PEEK_DEFAULT = 10  # messages /topic/peek and /channel/peek answer with, unless ?n= says
PEEK_MAX = 1000
PEEK_BYTES = 4 << 20  # the most a peek answers with (its whole JSON)
# The records a queue reads for one answer: a body takes 4/3 of its bytes in base64,
# and a message's JSON has more than its record's 26-byte header around its body,
# so records of more bytes than this cannot fit in PEEK_BYTES.
PEEK_RECORD_BYTES = PEEK_BYTES * 3 // 4

_OPEN = b'{"messages":['
_CLOSE = b"]}"
_CLOSE_TRUNCATED = b'],"truncated":true}'


class PeekRoutes(FeatureRoutes):
    """The peek routes of :class:`nsqd_tw.http.api.NSQDHTTPAPI` (a mixin of it)."""

    def _peek_count(self, request: Request) -> int:
        """``n``: 1 to PEEK_MAX (PEEK_DEFAULT when not given)."""
        params = self.query(request)
        if "n" not in params:
            return PEEK_DEFAULT
        try:
            n = go_parse_int(params["n"][0])
        except ValueError:
            raise HTTPError(400, "INVALID_N") from None
        if not 1 <= n <= PEEK_MAX:
            raise HTTPError(400, "INVALID_N")
        return n

    @route("/topic/peek", "GET", style="raw")
    def topic_peek(self, request: Request) -> bytes:
        """A topic's own backlog (a topic with no channel, a paused one)."""
        topic = self._existing_topic(request)
        return self._peek_answer(request, topic.name, topic)

    @route("/channel/peek", "GET", style="raw")
    def channel_peek(self, request: Request) -> bytes:
        channel = self._existing_channel(request)
        return self._peek_answer(request, channel.topic_name, channel)

    def _peek_answer(self, request: Request, topic: str, queue: MessageQueue) -> bytes:
        """The messages as JSON; a dead letter with where it came from (``dead_letter``)."""
        n = self._peek_count(request)
        msgs = queue.peek(n, PEEK_RECORD_BYTES)
        origin = self.nsqd.dead_letters.origin
        left_out = len(msgs) < min(n, queue.depth())
        data = peek_json(msgs, lambda msg_id: origin(topic, msg_id), left_out)
        return self.finish(request, 200, data, JSON_TYPE)


def peek_json(msgs: list[Message], origin: Callable[[bytes], Any], left_out: bool = False) -> bytes:
    """``{"messages":[...]}`` of ``msgs``, in order, in at most PEEK_BYTES: the
    messages that fit, the first cut if even it does not (``body_bytes``, its
    whole size, and ``"truncated":true`` after its keys); then ``"truncated":true``
    after ``messages`` when messages were left out (``left_out``: by the queue's
    own bound) or cut."""
    parts = [_OPEN]
    size = len(_OPEN)
    truncated = left_out
    last = len(msgs) - 1
    for i, msg in enumerate(msgs):
        dead_letter = origin(msg.id)
        cut = isinstance(msg, CutMessage)
        head, tail = _message_parts(msg, dead_letter, msg.body_bytes if isinstance(msg, CutMessage) else None)
        sep = 1 if i else 0
        close = len(_CLOSE if i == last and not left_out and not cut else _CLOSE_TRUNCATED)
        body: bytes | memoryview = msg.body
        if not cut and size + sep + len(head) + _b64_len(len(body)) + len(tail) + close > PEEK_BYTES:
            if i:
                truncated = True
                break
            cut = True
            head, tail = _message_parts(msg, dead_letter, len(body))
            close = len(_CLOSE_TRUNCATED)
        if cut:  # as much of the body as fits (whole base64 quanta: no padding)
            room = PEEK_BYTES - size - sep - len(head) - len(tail) - close
            body = memoryview(body)[: max(room, 0) // 4 * 3]
            truncated = True
        if sep:
            parts.append(b",")
        parts += (head, base64.b64encode(body), tail)
        size += sep + len(head) + _b64_len(len(body)) + len(tail)
        if cut:
            break
    parts.append(_CLOSE_TRUNCATED if truncated else _CLOSE)
    return b"".join(parts)


def message_json(msg: Message, dead_letter: dict[str, Any] | None = None, body_bytes: int | None = None) -> bytes:
    """One peeked message, as Go's JSON would write these keys in this order. Keys
    added later go after the first four, so that readers of these keep working:
    ``dead_letter``, where a dead letter came from; ``body_bytes`` and
    ``truncated``, a body cut to fit the answer (its whole size)."""
    head, tail = _message_parts(msg, dead_letter, body_bytes)
    return head + base64.b64encode(msg.body) + tail


def _message_parts(msg: Message, dead_letter: Any, body_bytes: int | None) -> tuple[bytes, bytes]:
    """A message's JSON before its base64 body and after it."""
    msg_id = gojson.dumps(msg.id.decode("latin-1"))  # Go's IDs are 16 hex digits
    head = b'{"id":%s,"timestamp":%d,"attempts":%d,"body":"' % (msg_id, msg.timestamp, msg.attempts)
    tail = b'"'
    if dead_letter is not None:
        tail += b',"dead_letter":' + gojson.dumps(dead_letter)
    if body_bytes is not None:
        tail += b',"body_bytes":%d,"truncated":true' % body_bytes
    return head, tail + b"}"


def _b64_len(n: int) -> int:
    return (n + 2) // 3 * 4
