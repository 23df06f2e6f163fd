"""Stats helpers, the latency quantiles, statsd lines and packets, Prometheus."""

from __future__ import annotations

from twisted.trial import unittest

from nsq_wire.gofmt import go_duration
from nsqd_tw.core.quantile import Quantile
from nsqd_tw.http import stats
from nsqd_tw.http.metrics import make_registry, render
from nsqd_tw.http.statsd import host_key, metric_lines, packets, statsd_prefix
from tests.helpers import FakeClient, make_nsqd


class FormatTests(unittest.TestCase):
    def test_go_duration(self) -> None:
        cases = {
            0: "0s",
            1: "1ns",
            1500: "1.5µs",
            988_843_441: "988.843441ms",
            1_000_000_000: "1s",
            8_073_073_250: "8.07307325s",
            90 * 10**9: "1m30s",
            3600 * 10**9: "1h0m0s",
            -2 * 10**9: "-2s",
        }
        for ns, text in cases.items():
            self.assertEqual(go_duration(ns), text)

    def test_nanoseconds_to_human(self) -> None:
        self.assertEqual(
            [stats.nanoseconds_to_human(v) for v in (500, 251_756_542, 2.5e9, 1500.0)],
            ["500.0ns", "251.8ms", "2.5s", "1.5us"],
        )


class QuantileTests(unittest.TestCase):
    def test_window_moves(self) -> None:
        q = Quantile(10.0, [0.5, 0.99], now=0.0)
        for v in range(1, 101):
            q.insert(v * 1e6, now=1.0)
        r = q.result(now=2.0)
        self.assertEqual(r["count"], 100)
        self.assertLess(abs(r["percentiles"][0]["value"] - 50e6), 1e6)
        self.assertLess(abs(r["percentiles"][1]["value"] - 99e6), 2e6)
        self.assertEqual(q.result(now=6.0)["count"], 100, "half a window later the samples are still there")
        self.assertEqual(q.result(now=11.0)["count"], 0, "a whole window later they are gone")

    def test_merge(self) -> None:
        a = Quantile(60.0, [0.5], now=0.0)
        b = Quantile(60.0, [0.5], now=0.0)
        a.insert(1e6, now=1.0)
        b.insert(3e6, now=1.0)
        a.merge(b, now=1.0)
        self.assertEqual(a.result(now=1.0)["count"], 2)


class StatsdTests(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd(
            e2e_processing_latency_percentiles=[0.99], statsd_mem_stats=False, broadcast_address="host.example"
        )
        self.nsqd.opts.broadcast_http_port = 4151

    def test_prefix(self) -> None:
        self.assertEqual(host_key("a.b:4151"), "a_b_4151")
        self.assertEqual(statsd_prefix(self.nsqd), "nsq.host_example_4151.")
        self.nsqd.opts.statsd_prefix = ""
        self.assertEqual(statsd_prefix(self.nsqd), "")

    def test_lines_and_counter_diffs(self) -> None:
        consumer = FakeClient(self.nsqd)
        consumer.sub("t", "c", rdy=10)
        FakeClient(self.nsqd).mpub("t", [b"a", b"bb"])
        lines, last, mem = metric_lines(self.nsqd, {}, None)
        text = b"".join(lines).decode()
        p = "nsq.host_example_4151."
        for line in [
            f"{p}topic.t.message_count:2|c",
            f"{p}topic.t.message_bytes:3|c",
            f"{p}topic.t.depth:0|g",
            f"{p}topic.t.backend_depth:0|g",
            f"{p}topic.t.e2e_processing_latency_99:0|g",
            f"{p}topic.t.channel.c.message_count:2|c",
            f"{p}topic.t.channel.c.in_flight_count:2|g",
            f"{p}topic.t.channel.c.deferred_count:0|g",
            f"{p}topic.t.channel.c.requeue_count:0|c",
            f"{p}topic.t.channel.c.timeout_count:0|c",
            f"{p}topic.t.channel.c.clients:1|g",
            f"{p}topic.t.channel.c.e2e_processing_latency_99:0|g",
        ]:
            self.assertIn(line + "\n", text)
        FakeClient(self.nsqd).pub("t", b"ccc")
        lines, _, _ = metric_lines(self.nsqd, last, mem)
        self.assertIn(f"{p}topic.t.message_count:1|c\n".encode(), lines)

    def test_exclude_ephemeral_and_mem(self) -> None:
        self.nsqd.opts.statsd_exclude_ephemeral = True
        self.nsqd.opts.statsd_mem_stats = True
        self.nsqd.get_topic("e#ephemeral")
        lines, _, _ = metric_lines(self.nsqd, {}, None)
        text = b"".join(lines).decode()
        self.assertNotIn("ephemeral", text)
        self.assertIn(".mem.heap_objects:", text)
        self.assertIn(".mem.gc_runs:", text)

    def test_packets(self) -> None:
        lines = [b"a" * 200 + b"\n"] * 5
        out = packets(lines, 508)
        self.assertEqual([len(p) for p in out], [402, 402, 201])
        self.assertEqual(packets([b"x" * 600 + b"\n", b"y\n"], 508), [b"x" * 600 + b"\n", b"y\n"])


class PrometheusTests(unittest.TestCase):
    def test_render(self) -> None:
        nsqd = make_nsqd()
        consumer = FakeClient(nsqd)
        consumer.identify(client_id="worker-1")
        consumer.sub("t", "c", rdy=7)
        FakeClient(nsqd).pub("t", b"x")
        text = render(make_registry(nsqd)).decode()
        self.assertIn('nsq_topic_depth{topic="t"} 0.0', text)
        self.assertIn('nsq_topic_messages_total{topic="t"} 1.0', text)
        self.assertIn('nsq_channel_in_flight{channel="c",topic="t"} 1.0', text)
        self.assertIn('nsq_client_ready_count{channel="c",client_id="worker-1",', text)
        self.assertIn("# TYPE nsq_channel_messages_total counter", text)
        self.assertIn("nsq_healthy 1.0", text)
