"""Answers held back for a publish that waits (durable mode, a sync standby) go out in order, at once."""

from __future__ import annotations

from twisted.internet import defer
from twisted.trial import unittest

from nsq_wire.frames import FRAME_TYPE_RESPONSE, OK
from nsqd_tw.tcp.responses import Responses


def recording(events: list[object]) -> Responses:
    def send(frame_type: int, data: bytes) -> None:
        events.append((frame_type, data))

    return Responses(send, lambda err: None, lambda: None, lambda: events.append("flush"))


class ResponsesTests(unittest.TestCase):
    def test_a_held_answer_released_is_flushed_at_once(self) -> None:
        events: list[object] = []
        r = Responses(
            lambda ft, data: events.append((ft, data)), lambda err: None, lambda: None, lambda: events.append("flush")
        )
        d: defer.Deferred[None] = defer.Deferred()
        r.later(d, "MPUB", 2)
        r.respond(FRAME_TYPE_RESPONSE, b"_heartbeat_")  # behind the held ones
        self.assertEqual(events, [])
        d.callback(None)
        self.assertEqual(events, [(FRAME_TYPE_RESPONSE, OK)] * 2 + [(FRAME_TYPE_RESPONSE, b"_heartbeat_"), "flush"])

    def test_not_once_closed(self) -> None:
        events: list[object] = []
        r = Responses(
            lambda ft, data: events.append((ft, data)), lambda err: None, lambda: None, lambda: events.append("flush")
        )
        d: defer.Deferred[None] = defer.Deferred()
        r.later(d, "PUB")
        r.closed = True
        d.callback(None)
        self.assertEqual(events, [])
