"""The stats snapshot (``/stats``, statsd, Prometheus) in Go's shapes.

:func:`get_stats` returns plain dicts whose key order is Go's struct field
order, so :func:`nsq_wire.gojson.dumps` writes what Go's ``/stats?format=json``
writes; :func:`print_stats` is the text format. The memory figures are
:mod:`nsq_service.memstats`'.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from nsq_wire.gofmt import go_duration
from nsqd_tw.core.quantile import EMPTY_RESULT, Quantile

if TYPE_CHECKING:
    from nsqd_tw.core.channel import Channel
    from nsqd_tw.core.nsqd import NSQD
    from nsqd_tw.core.topic import Topic
    from nsqd_tw.tcp.client import ClientV2


def nanoseconds_to_human(v: float) -> str:
    if v > 1_000_000_000:
        return "%0.1fs" % (v / 1_000_000_000)
    if v > 1_000_000:
        return "%0.1fms" % (v / 1_000_000)
    if v > 1000:
        return "%0.1fus" % (v / 1000)
    return "%0.1fns" % v


def result_string(r: dict[str, Any]) -> str:
    return ", ".join(nanoseconds_to_human(p["value"]) for p in r["percentiles"] or [])


# -- the snapshot ---------------------------------------------------------------


def latency(q: Quantile | None, now: float) -> dict[str, Any]:
    """A latency quantile's figures in Go's shape (no quantile: Go's empty one)."""
    return q.result(now) if q is not None else EMPTY_RESULT


def client_stats(client: ClientV2, topic_filter: str = "") -> dict[str, Any]:
    pub_counts = []
    for topic, count in client.pub_counts.items():
        if topic_filter and topic != topic_filter:
            continue
        pub_counts.append({"topic": topic, "count": count})
        break  # Go reports one topic here (a `break` in ClientV2Stats)
    stats: dict[str, Any] = {
        "client_id": client.client_id,
        "hostname": client.hostname,
        "version": "V2",
        "remote_address": client.remote_address,
        "state": client.state,
        "ready_count": client.ready_count,
        "in_flight_count": client.in_flight_count,
        "message_count": client.message_count,
        "finish_count": client.finish_count,
        "requeue_count": client.requeue_count,
        "connect_ts": int(client.connect_time),
        "sample_rate": client.sample_rate,
        "deflate": client.deflate,
        "snappy": client.snappy,
        "user_agent": client.user_agent,
    }
    auth = client.auth_state
    if auth is not None and auth.authorizations:
        stats["authed"] = True
    if auth is not None and auth.identity:
        stats["auth_identity"] = auth.identity
    if auth is not None and auth.identity_url:
        stats["auth_identity_url"] = auth.identity_url
    if pub_counts:
        stats["pub_counts"] = pub_counts
    tls = client.tls_info() if client.tls else {}
    stats["tls"] = client.tls
    stats["tls_cipher_suite"] = tls.get("cipher_suite", "")
    stats["tls_version"] = tls.get("version", "")
    stats["tls_negotiated_protocol"] = tls.get("negotiated_protocol", "")
    stats["tls_negotiated_protocol_is_mutual"] = tls.get("negotiated_protocol_is_mutual", False)
    return stats


def channel_stats(c: Channel, clients: list[dict[str, Any]] | None, now: float) -> dict[str, Any]:
    return {
        "channel_name": c.name,
        "depth": c.depth(),
        "backend_depth": c.backend.depth(),
        "in_flight_count": len(c.in_flight),
        "deferred_count": len(c.deferred),
        "message_count": c.message_count,
        "requeue_count": c.requeue_count,
        "timeout_count": c.timeout_count,
        "client_count": len(c.clients),
        "clients": clients,
        "paused": c.paused,
        "e2e_processing_latency": latency(c.e2e, now),
        # beyond Go (after Go's keys): bytes held in memory, and on disk not yet read
        "memory_bytes": c.memory_bytes,
        "backend_bytes": getattr(c.backend, "queued_bytes", 0),
        "oldest_message_age_ms": c.oldest_message_age_ms(),
        "fin_latency": latency(c.fin_latency, now),
        "dead_letter_count": c.dead_letter_count,
        "expired_count": c.expired_count,
        "dropped_count": c.dropped_count,
        **_settings(c, c.topic_name),
        **({"rewind": c.rewind.stats()} if c.rewind is not None else {}),
    }


def _settings(q: Topic | Channel, topic_name: str) -> dict[str, Any]:
    """Beyond Go: what applies to the queue, when anything beyond Go does."""
    return {"settings": q.policy.as_json(topic_name)} if q.policy.active else {}


def topic_stats(t: Topic, channels: list[dict[str, Any]], now: float) -> dict[str, Any]:
    return {
        "topic_name": t.name,
        "channels": channels,
        "depth": t.depth(),
        "backend_depth": t.backend.depth(),
        "message_count": t.message_count,
        "message_bytes": t.message_bytes,
        "paused": t.paused,
        "e2e_processing_latency": latency(t.aggregate_e2e(now), now),
        "memory_bytes": t.memory_bytes,
        "backend_bytes": getattr(t.backend, "queued_bytes", 0),
        "oldest_message_age_ms": t.oldest_message_age_ms(),
        "fin_latency": latency(t.aggregate_fin_latency(now), now),
        "expired_count": t.expired_count,
        "dropped_count": t.dropped_count,
        **_settings(t, t.name),
        **_retained(t),
    }


def _retained(t: Topic) -> dict[str, Any]:
    """Beyond Go: the topic's retained log, when it has one."""
    log = t.retained
    if log is None:
        return {}
    retained = {
        "messages": log.messages,
        "bytes": log.bytes,
        "segments": len(log.segments),
        "earliest_timestamp": log.earliest_ts or 0,
        "available_since": log.horizon_ns,
    }
    faults = log.faults
    if faults.damaged:  # damaged records stepped over, in the segments retained
        retained["damaged"] = faults.damaged
    if faults.missing:  # segments missing between those retained
        retained["missing_segments"] = faults.missing
    return {"retained": retained}


def get_stats(nsqd: NSQD, topic: str = "", channel: str = "", include_clients: bool = True) -> dict[str, Any]:
    """Go's NSQD.GetStats: {"topics": [...] or None, "producers": [...] or None}."""
    now = nsqd.now()
    if not topic:
        topics = sorted(nsqd.topics.values(), key=lambda t: t.name)
    elif topic in nsqd.topics:
        topics = [nsqd.topics[topic]]
    else:
        return {"topics": None, "producers": None}
    out = []
    for t in topics:
        if not channel:
            chans = sorted(t.channels.values(), key=lambda c: c.name)
        elif channel in t.channels:
            chans = [t.channels[channel]]
        else:
            continue
        cstats = []
        for c in chans:
            clients = [client_stats(cl, topic) for cl in c.clients.values()] if include_clients else None  # type: ignore[arg-type]
            cstats.append(channel_stats(c, clients, now))
        out.append(topic_stats(t, cstats, now))
    producers = None
    if include_clients:
        producers = [client_stats(cl, topic) for cl in nsqd.clients.values() if cl.pub_counts] or None  # type: ignore[arg-type]
    return {"topics": out, "producers": producers}


# -- the text format -------------------------------------------------------------


def rfc3339(ts: float) -> str:
    t = time.localtime(ts)
    offset = t.tm_gmtoff
    if offset == 0:
        zone = "Z"
    else:
        sign = "+" if offset > 0 else "-"
        offset = abs(offset)
        zone = "%s%02d:%02d" % (sign, offset // 3600, offset % 3600 // 60)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + zone


def _client_line(s: dict[str, Any], now: float) -> str:
    duration = go_duration(int(now - s["connect_ts"]) * 1_000_000_000)
    port = s["remote_address"].rpartition(":")[2]
    ident = f"{s['hostname']}:{port} {s['user_agent']}"
    if s.get("pub_counts"):
        total = sum(p["count"] for p in s["pub_counts"])
        topics = ",".join(f"{p['topic']}={p['count']}" for p in s["pub_counts"])
        return f"[{s['version']} {ident:<21}] msgs: {total:<8} topics: {topics} connected: {duration}"
    return (
        f"[{s['version']} {ident:<21}] state: {s['state']} inflt: {s['in_flight_count']:<4} "
        f"rdy: {s['ready_count']:<4} fin: {s['finish_count']:<8} re-q: {s['requeue_count']:<8} "
        f"msgs: {s['message_count']:<8} connected: {duration}"
    )


def print_stats(
    stats: dict[str, Any],
    mem: dict[str, int] | None,
    health: str,
    start_time: float,
    now: float,
    version: str,
    replication: dict[str, Any] | None = None,
) -> str:
    w: list[str] = [version + "\n"]
    w.append(f"start_time {rfc3339(start_time)}\n")
    w.append(f"uptime {go_duration(int((now - start_time) * 1e9))}\n")
    w.append(f"\nHealth: {health}\n")
    if replication is not None:  # beyond Go: only when this node is one of a pair
        w.append(f"\nReplication: {replication_line(replication)}\n")
    if mem is not None:
        w.append("\nMemory:\n")
        for key, value in mem.items():
            w.append(f"   {key:<25}\t{value}\n")
    topics = stats["topics"] or []
    w.append("\nTopics: None\n" if not topics else "\nTopics:")
    for t in topics:
        prefix = "*P " if t["paused"] else "   "
        w.append(
            f"\n{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5} be-depth: {t['backend_depth']:<5} "
            f"msgs: {t['message_count']:<8} e2e%: {result_string(t['e2e_processing_latency'])}\n"
        )
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            w.append(
                f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5} be-depth: {c['backend_depth']:<5} "
                f"inflt: {c['in_flight_count']:<4} def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5} "
                f"timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8} "
                f"e2e%: {result_string(c['e2e_processing_latency'])}\n"
            )
            for client in c["clients"] or []:
                w.append(f"        {_client_line(client, now)}\n")
    producers = stats["producers"] or []
    if not producers:
        w.append("\nProducers: None\n")
    else:
        w.append("\nProducers:\n")
        for p in producers:
            w.append(f"   {_client_line(p, now)}\n")
    return "".join(w)


def replication_line(r: dict[str, Any]) -> str:
    """One line of a node's replication status, for the text /stats."""
    peer = r["peer"] or "(none)"
    line = f"{r['role']} (epoch {r['epoch']}), {'standby' if r['role'] == 'primary' else 'primary'} {peer} {r['state']}"
    if r.get("degraded"):
        line += " - DEGRADED"
    lag = r.get("lag")
    if lag is not None:
        line += f", lag {lag['messages']} msgs {lag['bytes']} bytes {lag['ms']}ms"
    return line
