"""Go-format log lines, --log-level, and the rate limit on lines of one kind."""

from __future__ import annotations

from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial import unittest

from nsq_service.log import LogGate, Throttle


class ThrottleTests(unittest.TestCase):
    def setUp(self) -> None:
        self.now = 1000.0
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        self.logger = LogGate(throttle=Throttle(limit=5, clock=lambda: self.now)).logger("nsqd_tw.test")

    def texts(self) -> list[str]:
        from twisted.logger import formatEvent

        return [formatEvent(e) for e in self.events if e.get("log_namespace") == "nsqd_tw.test"]

    def test_a_flood_of_one_kind_is_cut_and_says_so(self) -> None:
        for i in range(1000):
            self.logger.error("[{client}] - E_FIN_FAILED FIN {id} failed", client="c", id=i)
        texts = self.texts()
        self.assertEqual(len(texts), 6)
        self.assertEqual(texts[4], "[c] - E_FIN_FAILED FIN 4 failed")
        self.assertIn("more than 5 lines a second like", texts[5])
        self.assertIn("dropping them for now", texts[5])

        self.now += 1.0
        self.logger.error("[{client}] - E_FIN_FAILED FIN {id} failed", client="c", id="next")
        texts = self.texts()
        self.assertIn("995 lines like", texts[6])
        self.assertEqual(texts[7], "[c] - E_FIN_FAILED FIN next failed")

    def test_other_kinds_are_not_held_back(self) -> None:
        for _ in range(100):
            self.logger.error("flood {x}", x=1)
        self.logger.info("TCP: new client({addr})", addr="a")
        self.assertEqual(self.texts()[-1], "TCP: new client(a)")
        self.assertEqual([e["log_level"] for e in self.events][-1], LogLevel.info)

    def test_a_steady_trickle_passes(self) -> None:
        for _ in range(20):
            for _ in range(5):
                self.logger.warn("steady")
            self.now += 1.0
        self.assertEqual(len(self.texts()), 100)
