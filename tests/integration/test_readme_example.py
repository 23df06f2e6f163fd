"""The README's client example, run as written (only its port changed) against a
real nsqd, twice in a row, on a topic that already has another channel."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.request import Request, urlopen

from twisted.trial import unittest

from tests.integration.checkout import ROOT, wait_for
from tests.integration.procs import ServerProcess

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def readme_example() -> str:
    blocks = [b for b in _BLOCK.findall((ROOT / "README.md").read_text()) if "nsq_client.twisted_client" in b]
    if len(blocks) != 1:
        raise AssertionError(f"expected one README python block using nsq_client.twisted_client, found {len(blocks)}")
    return blocks[0]


class ReadmeExampleTests(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nsq-readme-"))
        self.nsqd = ServerProcess(
            "nsqd", "-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0", cwd=str(self.dir)
        )
        self.nsqd.start()
        self.addCleanup(self.nsqd.kill)

    def http(self, method: str, path: str) -> bytes:
        req = Request(f"http://127.0.0.1:{self.nsqd.port('HTTP')}{path}", method=method)
        with urlopen(req, timeout=10) as resp:
            return bytes(resp.read())

    def channel(self, name: str) -> dict:
        stats = json.loads(self.http("GET", "/stats?format=json&topic=events"))
        [topic] = stats["topics"]
        return next(c for c in topic["channels"] if c["channel_name"] == name)

    def settled(self, name: str) -> dict:
        """The channel once nsqd has seen its consumers go."""
        wait_for(lambda: not self.channel(name)["clients"], 10, f"the consumers of {name} to disconnect")
        return self.channel(name)

    def run_example(self, code: str) -> tuple[int, str, str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.dir
        )
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the example hung; it printed {out!r} {err[-2000:]!r}") from None
        return proc.returncode, out, err

    def test_runs_twice_without_redelivery(self):
        code = readme_example()
        written = '"127.0.0.1", 4150'
        self.assertIn(written, code)
        code = code.replace(written, f'"127.0.0.1", {self.nsqd.port("TCP")}')
        # another consumer's channel already exists on the topic
        self.http("POST", "/topic/create?topic=events")
        self.http("POST", "/channel/create?topic=events&channel=archive")
        for run in (1, 2):
            rc, out, err = self.run_example(code)
            self.assertEqual(rc, 0, f"run {run}: {err}")
            self.assertEqual(out.splitlines(), ["one", "two"], f"run {run}: {err}")
            self.assertNotIn("Traceback", err)
            self.assertNotIn("Unhandled", err)
        printer = self.settled("printer")
        self.assertEqual(printer["message_count"], 4)
        # every message was FINed: none left, in flight, requeued or timed out
        self.assertEqual(
            [printer[k] for k in ("depth", "in_flight_count", "requeue_count", "timeout_count")], [0, 0, 0, 0]
        )
        self.assertEqual(self.channel("archive")["depth"], 4)

    def test_a_message_handled_before_the_reactor_stops_is_fined(self):
        """main() returns from inside the handler and task.react stops the
        reactor: the FIN written as the handler returned still reaches nsqd."""
        code = f"""
from twisted.internet import defer, task
from nsq_client.twisted_client import Consumer, connect

@defer.inlineCallbacks
def main(reactor):
    done = defer.Deferred()
    def handle(msg):
        print(msg.body.decode())
        done.callback(None)
    yield Consumer.connect(reactor, "127.0.0.1", {self.nsqd.port("TCP")}, "events", "printer", handle)
    producer = yield connect(reactor, "127.0.0.1", {self.nsqd.port("TCP")})
    yield producer.pub("events", b"one")
    yield done

task.react(main)
"""
        rc, out, err = self.run_example(code)
        self.assertEqual((rc, out), (0, "one\n"), err)
        printer = self.settled("printer")
        self.assertEqual(
            [printer[k] for k in ("message_count", "depth", "in_flight_count", "requeue_count")], [1, 0, 0, 0]
        )
