"""Responses and errors in the order of the commands they answer.

A command whose answer is not ready yet (a durable publish waiting for its
fsync) holds back the answers behind it while commands go on being read, so
that publishes share fsyncs (group commit). Message frames and heartbeats are
not responses and are not held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.python.failure import Failure

from nsq_wire.errors import FatalClientError
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, OK


class Responses:
    """``send(frame_type, data)`` writes a frame; ``fatal(error)`` is told when
    a fatal answer is decided (no more commands are read) and ``close()`` once it
    has gone out."""

    def __init__(
        self,
        send: Callable[[int, bytes], None],
        fatal: Callable[[FatalClientError | None], None],
        close: Callable[[], None],
        flush: Callable[[], None] = lambda: None,
    ) -> None:
        """``flush()`` puts what was sent on the wire at once (a held answer released)."""
        self._send = send
        self._flush = flush
        self._fatal = fatal
        self._close = close
        self._pending: deque[list[Any]] = deque()  # [frame type, data, fatal, ready]
        self._waiters: list[defer.Deferred[None]] = []
        self.closed = False

    def respond(self, frame_type: int, data: bytes, fatal: bool = False) -> None:
        if fatal:
            self._fatal(None)
        if self._pending:
            self._pending.append([frame_type, data, fatal, True])
            return
        self._send(frame_type, data)
        if fatal:
            self._close()

    def later(self, d: defer.Deferred[Any], verb: str, count: int = 1) -> None:
        """``count`` OKs once ``d`` fires; its failure is ``E_<VERB>_FAILED <verb> failed <error>``, fatal."""
        slots: list[list[Any]] = [[FRAME_TYPE_RESPONSE, OK, False, False] for _ in range(count)]
        self._pending.extend(slots)

        def ok(_: Any) -> None:
            for slot in slots:
                slot[3] = True
            self._drain()
            if not self.closed:
                self._flush()  # its publisher waits for it: not at the end of this turn

        def failed(f: Failure) -> None:
            err = FatalClientError(f"E_{verb}_FAILED", f"{verb} failed {f.value}")
            slots[0][:] = [FRAME_TYPE_ERROR, err.wire(), True, True]  # the first is fatal: the rest never go
            self._fatal(err)
            self._drain()

        d.addCallbacks(ok, failed)

    def drained(self) -> defer.Deferred[None]:
        """Fires when every response held back so far has been sent."""
        if not self._pending:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._waiters.append(d)
        return d

    def _drain(self) -> None:
        pending = self._pending
        while pending and pending[0][3]:
            frame_type, data, fatal, _ = pending.popleft()
            if self.closed:
                continue
            self._send(frame_type, data)
            if fatal:
                pending.clear()
                self._close()
        if not pending and self._waiters and not self.closed:
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                w.callback(None)
