"""``GET /metrics``: the stats in the Prometheus text format (beyond Go).

Gauges and counters per topic (label ``topic``), per channel (``topic``,
``channel``) and per consumer (``topic``, ``channel``, ``client_id``,
``remote_address``), from the same snapshot as ``/stats``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nsq_service.memstats import GCPauses, mem_stats
from nsq_wire.gofmt import parse_duration
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.http.stats import get_stats

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class NSQDCollector:
    def __init__(self, nsqd: NSQD, gc_pauses: GCPauses | None = None) -> None:
        self.nsqd = nsqd
        self.gc_pauses = gc_pauses

    def describe(self) -> list[Metric]:
        return []  # collected fresh on each scrape

    def collect(self) -> Iterator[Metric]:
        nsqd = self.nsqd
        stats = get_stats(nsqd, include_clients=True)
        healthy = GaugeMetricFamily("nsq_healthy", "1 if nsqd is healthy (GET /ping answers OK)")
        healthy.add_metric([], 1 if nsqd.is_healthy() else 0)
        yield healthy
        draining = GaugeMetricFamily("nsq_draining", "1 while nsqd drains (PUT /config/drain, --sigterm-mode drain)")
        draining.add_metric([], 1 if nsqd.draining else 0)
        yield draining
        if nsqd.replication is not None:  # beyond Go: only when this node is one of a pair
            yield from _replication(nsqd.replication.status())
        start = GaugeMetricFamily("nsq_start_time_seconds", "when nsqd started (unix time)")
        start.add_metric([], nsqd.start_time)
        yield start
        budget = nsqd.disk_budget
        disk = GaugeMetricFamily("nsq_disk_queue_bytes", "message bytes in all disk queues not yet read (or finished)")
        disk.add_metric([], budget.used)
        yield disk
        disk_limit = GaugeMetricFamily("nsq_disk_queue_bytes_limit", "--max-disk-bytes (0: no limit)")
        disk_limit.add_metric([], budget.limit)
        yield disk_limit

        t_labels = ["topic"]
        t_depth = GaugeMetricFamily(
            "nsq_topic_depth", "messages queued in the topic (memory and disk)", labels=t_labels
        )
        t_backend = GaugeMetricFamily("nsq_topic_backend_depth", "messages queued on disk", labels=t_labels)
        t_msgs = CounterMetricFamily("nsq_topic_messages", "messages published to the topic", labels=t_labels)
        t_bytes = CounterMetricFamily("nsq_topic_message_bytes", "bytes published to the topic", labels=t_labels)
        t_paused = GaugeMetricFamily("nsq_topic_paused", "1 if the topic is paused", labels=t_labels)
        t_mem = GaugeMetricFamily("nsq_topic_memory_bytes", "message bytes held in memory", labels=t_labels)
        t_disk = GaugeMetricFamily("nsq_topic_backend_bytes", "message bytes on disk not yet read", labels=t_labels)
        t_age = GaugeMetricFamily(
            "nsq_topic_oldest_message_age_seconds", "age of the oldest message the topic holds", labels=t_labels
        )
        t_expired = CounterMetricFamily("nsq_topic_expired", "messages dropped past max_age", labels=t_labels)
        t_dropped = CounterMetricFamily("nsq_topic_dropped", "messages dropped (drop_oldest)", labels=t_labels)
        t_retained = GaugeMetricFamily(
            "nsq_topic_retained_messages", "messages in the topic's retained log (retention)", labels=t_labels
        )
        t_retained_bytes = GaugeMetricFamily(
            "nsq_topic_retained_bytes", "bytes of the topic's retained log (retention)", labels=t_labels
        )
        t_retained_damaged = GaugeMetricFamily(
            "nsq_topic_retained_damaged",
            "damaged records stepped over in the topic's retained log (its segments retained)",
            labels=t_labels,
        )
        t_retained_missing = GaugeMetricFamily(
            "nsq_topic_retained_missing_segments",
            "segments missing from the middle of the topic's retained log",
            labels=t_labels,
        )

        c_labels = ["topic", "channel"]
        c_depth = GaugeMetricFamily("nsq_channel_depth", "messages queued (memory and disk)", labels=c_labels)
        c_backend = GaugeMetricFamily("nsq_channel_backend_depth", "messages queued on disk", labels=c_labels)
        c_inflight = GaugeMetricFamily("nsq_channel_in_flight", "messages in flight", labels=c_labels)
        c_deferred = GaugeMetricFamily("nsq_channel_deferred", "deferred messages", labels=c_labels)
        c_msgs = CounterMetricFamily("nsq_channel_messages", "messages put to the channel", labels=c_labels)
        c_requeue = CounterMetricFamily("nsq_channel_requeued", "messages requeued", labels=c_labels)
        c_timeout = CounterMetricFamily("nsq_channel_timed_out", "messages that timed out", labels=c_labels)
        c_clients = GaugeMetricFamily("nsq_channel_clients", "consumers connected", labels=c_labels)
        c_paused = GaugeMetricFamily("nsq_channel_paused", "1 if the channel is paused", labels=c_labels)
        c_mem = GaugeMetricFamily("nsq_channel_memory_bytes", "message bytes held in memory", labels=c_labels)
        c_disk = GaugeMetricFamily(
            "nsq_channel_backend_bytes", "message bytes on disk not yet read (or finished)", labels=c_labels
        )
        c_age = GaugeMetricFamily(
            "nsq_channel_oldest_message_age_seconds", "age of the oldest queued message", labels=c_labels
        )
        c_dead = CounterMetricFamily(
            "nsq_channel_dead_letters", "messages moved to the dead-letter topic", labels=c_labels
        )
        c_expired = CounterMetricFamily("nsq_channel_expired", "messages past max_age", labels=c_labels)
        c_rewind = GaugeMetricFamily(
            "nsq_channel_rewind_messages_left",
            "retained messages a rewinding channel has still to queue again",
            labels=c_labels,
        )
        c_dropped = CounterMetricFamily(
            "nsq_channel_dropped", "messages dropped by overflow drop_oldest", labels=c_labels
        )
        setting = GaugeMetricFamily(
            "nsq_queue_setting",
            "settings that apply to a topic (channel empty) or channel: max_attempts, max_age_seconds, "
            "max_depth, max_bytes, retention_seconds, retention_bytes",
            labels=["topic", "channel", "setting"],
        )
        e2e = GaugeMetricFamily(
            "nsq_channel_e2e_processing_latency_seconds",
            "end-to-end processing latency quantiles (--e2e-processing-latency-percentile)",
            labels=[*c_labels, "quantile"],
        )
        fin = GaugeMetricFamily(
            "nsq_channel_fin_latency_seconds",
            "delivery-to-FIN latency quantiles (--e2e-processing-latency-percentile)",
            labels=[*c_labels, "quantile"],
        )

        k_labels = ["topic", "channel", "client_id", "remote_address"]
        k_ready = GaugeMetricFamily("nsq_client_ready_count", "the consumer's RDY count", labels=k_labels)
        k_inflight = GaugeMetricFamily("nsq_client_in_flight", "messages in flight to the consumer", labels=k_labels)
        k_msgs = CounterMetricFamily("nsq_client_messages", "messages sent to the consumer", labels=k_labels)
        k_fin = CounterMetricFamily("nsq_client_finished", "messages the consumer finished", labels=k_labels)
        k_req = CounterMetricFamily("nsq_client_requeued", "messages the consumer requeued", labels=k_labels)

        for t in stats["topics"] or []:
            tl = [t["topic_name"]]
            t_depth.add_metric(tl, t["depth"])
            t_backend.add_metric(tl, t["backend_depth"])
            t_msgs.add_metric(tl, t["message_count"])
            t_bytes.add_metric(tl, t["message_bytes"])
            t_paused.add_metric(tl, 1 if t["paused"] else 0)
            t_mem.add_metric(tl, t["memory_bytes"])
            t_disk.add_metric(tl, t["backend_bytes"])
            t_age.add_metric(tl, t["oldest_message_age_ms"] / 1e3)
            t_expired.add_metric(tl, t["expired_count"])
            t_dropped.add_metric(tl, t["dropped_count"])
            _add_settings(setting, [t["topic_name"], ""], t.get("settings"))
            if "retained" in t:
                t_retained.add_metric(tl, t["retained"]["messages"])
                t_retained_bytes.add_metric(tl, t["retained"]["bytes"])
                t_retained_damaged.add_metric(tl, t["retained"].get("damaged", 0))
                t_retained_missing.add_metric(tl, t["retained"].get("missing_segments", 0))
            for c in t["channels"]:
                cl = [t["topic_name"], c["channel_name"]]
                c_depth.add_metric(cl, c["depth"])
                c_backend.add_metric(cl, c["backend_depth"])
                c_inflight.add_metric(cl, c["in_flight_count"])
                c_deferred.add_metric(cl, c["deferred_count"])
                c_msgs.add_metric(cl, c["message_count"])
                c_requeue.add_metric(cl, c["requeue_count"])
                c_timeout.add_metric(cl, c["timeout_count"])
                c_clients.add_metric(cl, c["client_count"])
                c_paused.add_metric(cl, 1 if c["paused"] else 0)
                c_mem.add_metric(cl, c["memory_bytes"])
                c_disk.add_metric(cl, c["backend_bytes"])
                c_age.add_metric(cl, c["oldest_message_age_ms"] / 1e3)
                _add_quantiles(e2e, cl, c["e2e_processing_latency"])
                _add_quantiles(fin, cl, c["fin_latency"])
                c_dead.add_metric(cl, c["dead_letter_count"])
                c_expired.add_metric(cl, c["expired_count"])
                c_dropped.add_metric(cl, c["dropped_count"])
                _add_settings(setting, cl, c.get("settings"))
                if "rewind" in c:
                    c_rewind.add_metric(cl, c["rewind"]["messages_left"])
                for k in c["clients"] or []:
                    kl = [*cl, k["client_id"], k["remote_address"]]
                    k_ready.add_metric(kl, k["ready_count"])
                    k_inflight.add_metric(kl, k["in_flight_count"])
                    k_msgs.add_metric(kl, k["message_count"])
                    k_fin.add_metric(kl, k["finish_count"])
                    k_req.add_metric(kl, k["requeue_count"])
        yield from (t_depth, t_backend, t_msgs, t_bytes, t_paused, t_mem, t_disk, t_age, t_expired, t_dropped)
        yield from (t_retained, t_retained_bytes, t_retained_damaged, t_retained_missing, c_rewind)
        yield from (c_depth, c_backend, c_inflight, c_deferred, c_msgs, c_requeue, c_timeout, c_clients, c_paused)
        yield from (c_mem, c_disk, c_age, c_dead, c_expired, c_dropped, setting, e2e, fin)
        yield from (k_ready, k_inflight, k_msgs, k_fin, k_req)

        producers = CounterMetricFamily(
            "nsq_producer_published",
            "messages a producer connection published",
            labels=["client_id", "remote_address", "topic"],
        )
        for client in nsqd.clients.values():
            for topic, count in client.pub_counts.items():
                names = [getattr(client, "client_id", ""), getattr(client, "remote_address", "")]
                producers.add_metric([*names, topic], count)
        yield producers

        mem = mem_stats(self.gc_pauses)
        for key, help_text in (
            ("heap_objects", "memory blocks allocated by the Python allocator"),
            ("heap_in_use_bytes", "resident set size"),
        ):
            g = GaugeMetricFamily(f"nsq_mem_{key}", help_text)
            g.add_metric([], mem[key])
            yield g
        runs = CounterMetricFamily("nsq_mem_gc_runs", "cyclic garbage collections")
        runs.add_metric([], mem["gc_total_runs"])
        yield runs


def _replication(status: dict[str, Any]) -> Iterator[Metric]:
    """A node of a replication pair: its role, epoch, the link's state, the lag."""
    primary = GaugeMetricFamily("nsq_replication_primary", "1 if this node is the primary of its pair, 0 a standby")
    primary.add_metric([], 1 if status["role"] == "primary" else 0)
    yield primary
    epoch = GaugeMetricFamily("nsq_replication_epoch", "the pair's epoch as this node knows it")
    epoch.add_metric([], status["epoch"])
    yield epoch
    state = GaugeMetricFamily(
        "nsq_replication_state", "1 for the link's state (disconnected, catching_up, in_sync)", labels=["state"]
    )
    for name in ("disconnected", "catching_up", "in_sync"):
        state.add_metric([name], 1 if status["state"] == name else 0)
    yield state
    degraded = GaugeMetricFamily("nsq_replication_degraded", "1 while the pair is not redundant (not in sync)")
    degraded.add_metric([], 1 if status["degraded"] else 0)
    yield degraded
    lag = status.get("lag")
    if lag is not None:
        for key, help_text in (
            ("messages", "messages sent to the standby and not acknowledged"),
            ("bytes", "bytes sent to the standby and not acknowledged"),
            ("operations", "operations sent to the standby and not acknowledged"),
        ):
            family = GaugeMetricFamily(f"nsq_replication_lag_{key}", help_text)
            family.add_metric([], lag[key])
            yield family
        seconds = GaugeMetricFamily(
            "nsq_replication_lag_seconds", "how long the oldest publish not acknowledged by the standby has waited"
        )
        seconds.add_metric([], lag["ms"] / 1000)
        yield seconds


def _num(q: float) -> str:
    return f"{q:g}"


def _add_quantiles(family: GaugeMetricFamily, labels: list[str], result: dict[str, Any]) -> None:
    """A latency's percentiles (ns in the stats) as seconds, labelled by quantile."""
    for p in result["percentiles"] or []:
        family.add_metric([*labels, _num(p["quantile"])], p["value"] / 1e9)


def make_registry(nsqd: NSQD, gc_pauses: GCPauses | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NSQDCollector(nsqd, gc_pauses))  # type: ignore[arg-type]
    return registry


def render(registry: CollectorRegistry) -> bytes:
    data: Any = generate_latest(registry)
    return bytes(data)


def _add_settings(family: GaugeMetricFamily, labels: list[str], settings: dict[str, Any] | None) -> None:
    if not settings:
        return
    if settings["max_attempts"]:
        family.add_metric([*labels, "max_attempts"], settings["max_attempts"])
    if settings["max_age"]:
        family.add_metric([*labels, "max_age_seconds"], parse_duration(settings["max_age"]))
    for key in ("max_depth", "max_bytes"):
        if settings[key] is not None:
            family.add_metric([*labels, key], settings[key])
    if settings.get("retention"):
        family.add_metric([*labels, "retention_seconds"], parse_duration(settings["retention"]))
    if settings.get("retention_bytes"):
        family.add_metric([*labels, "retention_bytes"], settings["retention_bytes"])
