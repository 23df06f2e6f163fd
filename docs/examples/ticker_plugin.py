"""An example twistd plugin that embeds nsqd next to a service of its own.

Copy this file into a ``twisted/plugins/`` directory on your PYTHONPATH and run::

    twistd -n ticker --tcp-address 127.0.0.1:4150 --http-address 127.0.0.1:4151 --interval 1

Every nsqd flag works (``--mem-queue-size``, ``--config``...) plus this
plugin's own ``--interval`` and ``--topic``. The Ticker publishes a message to
the embedded nsqd every interval through :meth:`NSQD.publish`, with no socket
in between; consumers read it over TCP as from any nsqd.
"""

from __future__ import annotations

from typing import Any

from twisted.application.internet import TimerService
from twisted.application.service import MultiService, ServiceMaker

from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.tap import Options as NSQDUsageOptions
from nsqd_tw.tap import makeService as make_nsqd_service


class Options(NSQDUsageOptions):
    optParameters = [
        *NSQDUsageOptions.optParameters,
        ["interval", None, 1.0, "seconds between ticks", float],
        ["topic", None, "ticks", "topic the ticks are published to"],
    ]


class Ticker(TimerService):
    """A user's own service: publish a numbered tick into the embedded nsqd."""

    def __init__(self, nsqd: NSQD, topic: str, interval: float) -> None:
        self.nsqd = nsqd
        self.topic = topic
        self.count = 0
        super().__init__(interval, self.tick)
        self.clock = nsqd.reactor

    def tick(self) -> None:
        self.count += 1
        self.nsqd.publish(self.topic, [b"tick %d" % self.count])


def makeService(config: Any, reactor: Any = None) -> MultiService:
    top = make_nsqd_service(config, reactor)  # nsqd's own hierarchy, built from the same options
    Ticker(top.nsqd, config["topic"], config["interval"]).setServiceParent(top)  # type: ignore[attr-defined]
    return top


ticker = ServiceMaker("ticker", __name__, "nsqd with a ticker publishing into it", "ticker")
