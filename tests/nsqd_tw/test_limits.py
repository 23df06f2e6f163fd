"""nsq_service.limits in memory: the rate-limited log, the accept() failure lines, the
RLIMIT_NOFILE raise (the process-level checks are in tests/integration)."""

from __future__ import annotations

import resource
import socket
from typing import Any

from twisted.internet import protocol, reactor
from twisted.internet.task import Clock, deferLater
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial import unittest

from nsq_service import limits
from nsq_service.log import LogGate


class Events:
    def __init__(self, case: unittest.TestCase) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        case.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def texts(self, namespace: str = "nsq_service.limits") -> list[tuple[LogLevel, str]]:
        return [(e["log_level"], e["text"]) for e in self.events if e.get("log_namespace") == namespace and "text" in e]


class RateLimitedLogTests(unittest.TestCase):
    def test_one_line_per_interval_with_the_sum_of_the_rest(self) -> None:
        events = Events(self)
        clock = Clock()
        rl = limits.RateLimitedLog(clock, LogGate().logger("nsq_service.limits"), interval=10)

        def text(counts: dict[str, int]) -> str:
            return f"{counts['n']} thing(s)"

        rl.emit("k", LogLevel.error, text, n=1)
        for _ in range(5):
            clock.advance(1)
            rl.emit("k", LogLevel.error, text, n=2)
        rl.emit("other", LogLevel.warn, text, n=1)
        self.assertEqual(events.texts(), [(LogLevel.error, "1 thing(s)"), (LogLevel.warn, "1 thing(s)")])
        clock.advance(5)
        self.assertEqual(events.texts()[-1], (LogLevel.error, "10 thing(s) in the last 10s"))
        # a quiet interval: the next event is logged at once again
        clock.advance(30)
        rl.emit("k", LogLevel.error, text, n=1)
        self.assertEqual(events.texts()[-1], (LogLevel.error, "1 thing(s)"))
        self.assertEqual(len(events.texts()), 4)
        rl.stop()
        self.assertEqual(clock.getDelayedCalls(), [])


class AcceptErrorTests(unittest.TestCase):
    def listen(self) -> Any:
        port = reactor.listenTCP(0, protocol.Factory.forProtocol(protocol.Protocol), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return port

    def test_emfile_recovery_logged_at_error(self) -> Any:
        events = Events(self)
        port = self.listen()
        limiter = limits.watch_accept_errors(port, "TCP", LogGate().logger("nsq_service.limits"))
        assert limiter is not None
        self.addCleanup(limiter.stop)
        # what twisted's accept loop logs when the process is out of descriptors
        port._logger.info("EMFILE encountered; releasing reserved file descriptor.")
        for n in range(3):
            port._logger.info("EMFILE recovery: Closed socket from {address}", address=("127.0.0.1", 5000 + n))
        port._logger.info("Re-reserving EMFILE recovery file descriptor.")
        port._logger.info("Could not accept new connection ({acceptError})", acceptError="ECONNABORTED")

        def check(_: Any) -> None:
            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            self.assertEqual(
                events.texts(),
                [
                    (
                        LogLevel.error,
                        "TCP: accept() failed - EMFILE (too many open files), "
                        f"open files limit (soft RLIMIT_NOFILE) {soft}; 3 connection(s) closed unserved",
                    ),
                    (LogLevel.warn, "TCP: accept() failed - ECONNABORTED (software caused connection abort)"),
                ],
            )

        return deferLater(reactor, 0.01, lambda: None).addCallback(check)

    def test_other_ports_left_alone(self) -> None:
        class FakePort:
            pass

        self.assertIsNone(limits.watch_accept_errors(FakePort(), "TCP", LogGate().logger("nsq_service.limits")))


class RaiseFdLimitTests(unittest.TestCase):
    def fake(self, soft: int, hard: int, fail: bool = False) -> list[tuple[int, int]]:
        calls: list[tuple[int, int]] = []

        def setrlimit(which: int, value: tuple[int, int]) -> None:
            if fail:
                raise ValueError("not allowed")
            calls.append(value)

        self.patch(limits.resource, "getrlimit", lambda which: (soft, hard))
        self.patch(limits.resource, "setrlimit", setrlimit)
        return calls

    def test_soft_raised_to_hard(self) -> None:
        calls = self.fake(1024, 524288)
        self.assertEqual(limits.raise_fd_limit(LogGate().logger("nsq_service.limits")), (1024, 524288))
        self.assertEqual(calls, [(524288, 524288)])

    def test_left_alone(self) -> None:
        for soft, hard in [(4096, 4096), (1024, resource.RLIM_INFINITY)]:
            calls = self.fake(soft, hard)
            self.assertIsNone(limits.raise_fd_limit(LogGate().logger("nsq_service.limits")))
            self.assertEqual(calls, [])

    def test_refusal_is_logged_not_fatal(self) -> None:
        events = Events(self)
        self.fake(1024, 4096, fail=True)
        self.assertIsNone(limits.raise_fd_limit(LogGate().logger("nsq_service.limits")))
        warnings = [e for e in events.events if e.get("log_namespace") == "nsq_service.limits"]
        self.assertEqual(warnings[0]["log_level"], LogLevel.warn)


class ListenBacklogTests(unittest.TestCase):
    def test_somaxconn_as_the_kernel_says(self) -> None:
        path = self.mktemp()
        for text, want in ((b"4096\n", 4096), (b"65535", 65535), (b"0\n", socket.SOMAXCONN), (b"", socket.SOMAXCONN)):
            with open(path, "wb") as f:
                f.write(text)
            self.assertEqual(limits.listen_backlog(path), want, text)
        self.assertEqual(limits.listen_backlog(path + ".missing"), socket.SOMAXCONN)
