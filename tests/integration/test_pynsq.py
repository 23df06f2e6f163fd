"""pynsq, a real client library, publishes to and consumes from our nsqd."""

import json
import subprocess
import sys
from pathlib import Path

from twisted.internet import defer, reactor
from twisted.trial import unittest

from nsq_client.twisted_client import connect
from tests.integration.procs import ServerProcess

SCRIPT = Path(__file__).with_name("pynsq_interop.py")


class PynsqTests(unittest.TestCase):
    timeout = 90

    @defer.inlineCallbacks
    def test_pub_mpub_dpub_fin_req_touch_timeout_channels(self):
        proc = ServerProcess("nsqd", "-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0", cwd=self.mktemp())
        Path(proc.cwd).mkdir()
        proc.start()
        self.addCleanup(proc.kill)
        port = proc.port()
        # both channels exist before anything is published
        for channel in ("a", "b"):
            conn = yield connect(reactor, "127.0.0.1", port)
            yield conn.sub("interop", channel)
            conn.close()
            yield conn.closed_d

        out = yield _run([sys.executable, str(SCRIPT), f"127.0.0.1:{port}", "interop"])
        result = json.loads(out.strip().splitlines()[-1])
        expected = {f"m{i}" for i in range(20)} | {f"p{i}" for i in range(5)} | {"d0"}
        seen = result["seen"]
        self.assertEqual(result["pub"], ["OK"] * 7)
        self.assertEqual(set(seen["a"]), expected)
        self.assertEqual(set(seen["b"]), expected)
        self.assertEqual(seen["a"]["m3"], [1, 2], "REQ redelivers with attempts 2")
        self.assertEqual(seen["a"]["m5"], [1, 2], "an unanswered message times out and comes back")
        self.assertEqual(seen["a"]["m7"], [1], "TOUCH kept it in flight past its 1 s timeout")
        self.assertTrue(result["m7"])
        self.assertTrue(all(seen["b"][k] == [1] for k in expected), seen["b"])
        self.assertGreater(result["per_reader"].get("a1", 0), 0)
        self.assertGreater(result["per_reader"].get("a2", 0), 0)


def _run(argv: list[str]) -> defer.Deferred:
    from twisted.internet.threads import deferToThread

    def call() -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=80)
        if done.returncode != 0:
            raise RuntimeError(f"pynsq script failed ({done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    return deferToThread(call)
