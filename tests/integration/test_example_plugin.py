"""The example plugin in docs/examples embeds nsqd next to its own service."""

import importlib.util
from pathlib import Path

from twisted.internet import defer, reactor
from twisted.trial import unittest

from nsq_client.twisted_client import Consumer

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ticker_plugin.py"


def load_example():
    spec = importlib.util.spec_from_file_location("ticker_plugin", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ExamplePluginTests(unittest.TestCase):
    timeout = 20

    @defer.inlineCallbacks
    def test_ticks_reach_a_tcp_consumer(self):
        example = load_example()
        config = example.Options()
        config.parseOptions(
            ["--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--interval", "0.05", "--topic", "t"]
        )
        top = example.makeService(config, reactor)
        top.privilegedStartService()
        top.startService()
        self.addCleanup(top.stopService)
        got: list = []
        done: defer.Deferred = defer.Deferred()

        def handle(msg):
            got.append(msg.body)
            if len(got) == 3:
                done.callback(None)

        port = top.bound.tcp[1]
        consumer = yield Consumer.connect(reactor, "127.0.0.1", port, "t", "c", handle, max_in_flight=5)
        self.addCleanup(consumer.close)
        yield done
        self.assertTrue(all(b.startswith(b"tick ") for b in got))
        self.assertEqual(example.ServiceMaker.__name__, "ServiceMaker")
