"""/channel/peek with nsqd as a process: bounded answers that stall nothing, in delivery order."""

from __future__ import annotations

import base64
import gc
import json
import select
import socket
import time
import weakref
from typing import Any

import treq
from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from nsq_client.twisted_client import connect
from nsq_service.listen import server_endpoint
from nsqd_tw.http.api import make_site
from nsqd_tw.http.inspect import PEEK_BYTES
from tests.helpers import make_nsqd
from tests.integration.procs import eventually, rss_mb
from tests.integration.test_queue_settings_process import QueueSettingsProcessTestCase

MIB = 1 << 20
PEEK_ALL = b"GET /channel/peek?topic=big&channel=c&n=1000 HTTP/1.1\r\nHost: nsqd\r\n\r\n"


class PeekProcessTestCase(QueueSettingsProcessTestCase):
    @defer.inlineCallbacks
    def get(self, path: str, method: str = "GET") -> Any:
        resp = yield treq.request(method, f"http://{self.http}{path}", persistent=False)
        content = yield resp.content()
        self.assertEqual(resp.code, 200, content)
        return content


class BoundedPeekProcessTests(PeekProcessTestCase):
    @defer.inlineCallbacks
    def test_unread_peeks_of_a_large_backlog_stall_nothing(self) -> None:
        proc = self.start("--max-msg-size", str(2 * MIB), "--mem-queue-size", "2")
        assert proc.proc is not None
        yield self.get("/topic/create?topic=big", "POST")
        yield self.get("/channel/create?topic=big&channel=c", "POST")
        bodies = [b"%04d" % i * (MIB // 4) for i in range(40)]  # 40 MiB, 38 of them on disk
        yield self.publish(proc.port(), "big", bodies, batch=4)
        start_rss = rss_mb(proc.proc.pid)
        http_port = proc.port("HTTP")
        socks = []
        for _ in range(4):  # peeks whose answers are never read
            s = socket.create_connection(("127.0.0.1", http_port))
            self.addCleanup(s.close)
            s.sendall(PEEK_ALL)
            socks.append(s)
        # /ping, from when they were sent until every one is answered (its first
        # bytes arrived, not read) and after
        slowest = 0.0
        pings = 0
        deadline = time.monotonic() + 60
        while pings < 20 or len(select.select(socks, [], [], 0)[0]) < len(socks):
            self.assertLess(time.monotonic(), deadline, "the peeks are answered")
            started = time.monotonic()
            content = yield self.get("/ping")
            slowest = max(slowest, time.monotonic() - started)
            self.assertEqual(content, b"OK")
            pings += 1
        self.assertLess(slowest, 1.0, "/ping answers while the peeks are answered and wait to be read")
        content = yield self.get("/channel/peek?topic=big&channel=c&n=1000")
        self.assertLessEqual(len(content), PEEK_BYTES)
        data = json.loads(content)
        self.assertIs(data["truncated"], True)
        shown = [base64.b64decode(m["body"]) for m in data["messages"]]
        self.assertEqual([b[:4] for b in shown], [b"0002", b"0000"], "disk and memory in turns, as many as fit")
        self.assertEqual([len(b) for b in shown], [MIB, MIB])
        self.assertLess(rss_mb(proc.proc.pid) - start_rss, 200)
        stats = json.loads((yield self.get("/stats?format=json&topic=big")))
        self.assertEqual(stats["topics"][0]["channels"][0]["depth"], 40, "nothing taken")


class PeekOrderProcessTests(PeekProcessTestCase):
    """What /channel/peek shows is what one consumer is then sent, in that order,
    with the channel's messages in memory (some back from a consumer) and on disk."""

    @defer.inlineCallbacks
    def mixed(self, port: int, topic: str) -> Any:
        """A channel holding messages in memory and on disk, with one requeued by a
        consumer, one published while it was out and more after it went."""
        yield self.get(f"/topic/create?topic={topic}", "POST")
        yield self.get(f"/channel/create?topic={topic}&channel=c", "POST")
        yield self.publish(port, topic, [b"%d" % i for i in range(30)])  # 0-4 in memory, the rest on disk
        got: list[Any] = []
        conn = yield connect(reactor, "127.0.0.1", port)
        conn.on_message = got.append
        yield conn.sub(topic, "c")
        conn.rdy(3)
        yield eventually(lambda: len(got) == 3)
        conn.rdy(0)
        got[0].requeue()
        for msg in got[1:]:
            msg.finish()
        yield self.publish(port, topic, [b"100"])
        yield conn.cls()
        conn.close()
        yield conn.closed_d
        yield self.publish(port, topic, [b"%d" % i for i in range(101, 110)])

    @defer.inlineCallbacks
    def consume(self, port: int, topic: str, rdy: int, count: int) -> Any:
        got: list[bytes] = []
        conn = yield connect(reactor, "127.0.0.1", port)

        def fin(msg: Any) -> None:
            got.append(msg.body)
            msg.finish()

        conn.on_message = fin
        yield conn.sub(topic, "c")
        conn.rdy(rdy)
        yield eventually(lambda: len(got) >= count)
        conn.close()
        yield conn.closed_d
        return got

    @defer.inlineCallbacks
    def test_delivered_as_peeked(self) -> None:
        proc = self.start("--mem-queue-size", "5")
        for topic, rdy in (("one", 1), ("many", 2500)):
            yield self.mixed(proc.port(), topic)
            content = yield self.get(f"/channel/peek?topic={topic}&channel=c&n=1000")
            peeked = [base64.b64decode(m["body"]) for m in json.loads(content)["messages"]]
            self.assertEqual(len(peeked), 38)
            delivered = yield self.consume(proc.port(), topic, rdy, len(peeked))
            self.assertEqual(delivered, peeked, f"RDY {rdy}")


class PeekAnswerLifetimeTests(unittest.TestCase):
    """In one process, over a real socket: an answer its client never read goes
    with the connection (nothing else holds it), with the cyclic GC off."""

    @defer.inlineCallbacks
    def test_an_unread_answer_goes_with_its_client(self) -> None:
        nsqd = make_nsqd(mem_queue_size=10)
        nsqd.get_topic("big").get_channel("c")
        nsqd.publish("big", [b"x" * MIB] * 3)
        site = make_site(nsqd)
        conns: list[Any] = []
        build = site.buildProtocol
        site.buildProtocol = lambda addr: conns.append(build(addr)) or conns[-1]  # type: ignore[method-assign]
        port = yield server_endpoint(reactor, "127.0.0.1:0").listen(site)
        self.addCleanup(port.stopListening)
        client = socket.socket()
        self.addCleanup(client.close)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port.getHost().port))
        client.sendall(PEEK_ALL)

        def unsent() -> int:
            t = conns[0].transport
            return len(t.dataBuffer) - t.offset + t._tempDataLen if conns else 0

        yield eventually(lambda: conns and unsent() > 0)  # what the kernel's buffers could not take
        transport = weakref.ref(conns[0].transport)
        channel = weakref.ref(conns.pop())
        gc.disable()
        self.addCleanup(gc.enable)
        client.close()
        yield eventually(lambda: transport() is None or not transport().connected)
        yield task.deferLater(reactor, 0, lambda: None)
        self.assertEqual((channel(), transport()), (None, None))
