"""Push stats to statsd over UDP, as Go nsqd's statsdLoop does.

Every ``--statsd-interval`` the stats are turned into Go's metric names
(``topic.T.depth``, ``topic.T.channel.C.in_flight_count``, ``mem.heap_objects``...),
counters as the change since the last push, packed into UDP packets of at
most ``--statsd-udp-packet-size`` bytes and spread over the interval.
"""

from __future__ import annotations

from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.internet.protocol import DatagramProtocol
from twisted.internet.task import LoopingCall

from nsq_service.memstats import GCPauses, mem_stats
from nsq_wire.gofmt import join_host_port
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.http.stats import get_stats


def host_key(h: str) -> str:
    return h.replace(".", "_").replace(":", "_")


def statsd_prefix(nsqd: NSQD) -> str:
    """--statsd-prefix with %s replaced by the broadcast address and HTTP port."""
    opts = nsqd.opts
    prefix = opts.statsd_prefix
    if not prefix:
        return ""
    host = host_key(join_host_port(opts.broadcast_address, opts.broadcast_http_port))
    prefix = prefix.replace("%s", host)
    if not prefix.endswith("."):
        prefix += "."
    return prefix


def metric_lines(
    nsqd: NSQD, last: dict[str, Any], last_mem: dict[str, int] | None, gc_pauses: GCPauses | None = None
) -> tuple[list[bytes], dict[str, Any], dict[str, int] | None]:
    """The statsd lines of one push, and the state to diff the next against."""
    opts = nsqd.opts
    prefix = statsd_prefix(nsqd)
    lines: list[bytes] = []

    def incr(stat: str, n: int) -> None:
        lines.append(f"{prefix}{stat}:{n}|c\n".encode())

    def gauge(stat: str, n: int) -> None:
        lines.append(f"{prefix}{stat}:{n}|g\n".encode())

    def percentiles(stat: str, result: dict[str, Any]) -> None:
        for p in result["percentiles"] or []:
            gauge(f"{stat}_{p['quantile'] * 100.0:.0f}", int(p["value"]))

    stats = get_stats(nsqd, include_clients=False)
    last_topics = {t["topic_name"]: t for t in last.get("topics") or []}
    for t in stats["topics"] or []:
        name = t["topic_name"]
        if opts.statsd_exclude_ephemeral and name.endswith("#ephemeral"):
            continue
        lt = last_topics.get(name, {})
        incr(f"topic.{name}.message_count", t["message_count"] - lt.get("message_count", 0))
        incr(f"topic.{name}.message_bytes", t["message_bytes"] - lt.get("message_bytes", 0))
        gauge(f"topic.{name}.depth", t["depth"])
        gauge(f"topic.{name}.backend_depth", t["backend_depth"])
        percentiles(f"topic.{name}.e2e_processing_latency", t["e2e_processing_latency"])
        percentiles(f"topic.{name}.fin_latency", t["fin_latency"])  # beyond Go
        if "settings" in t:  # beyond Go, and only where settings apply: Go's lines otherwise
            for counter in ("expired_count", "dropped_count"):
                incr(f"topic.{name}.{counter}", t[counter] - lt.get(counter, 0))
        last_channels = {c["channel_name"]: c for c in lt.get("channels") or []}
        for c in t["channels"]:
            cname = c["channel_name"]
            if opts.statsd_exclude_ephemeral and cname.endswith("#ephemeral"):
                continue
            lc = last_channels.get(cname, {})
            key = f"topic.{name}.channel.{cname}"
            incr(f"{key}.message_count", c["message_count"] - lc.get("message_count", 0))
            gauge(f"{key}.depth", c["depth"])
            gauge(f"{key}.backend_depth", c["backend_depth"])
            gauge(f"{key}.in_flight_count", c["in_flight_count"])
            gauge(f"{key}.deferred_count", c["deferred_count"])
            incr(f"{key}.requeue_count", c["requeue_count"] - lc.get("requeue_count", 0))
            incr(f"{key}.timeout_count", c["timeout_count"] - lc.get("timeout_count", 0))
            gauge(f"{key}.clients", c["client_count"])
            percentiles(f"{key}.e2e_processing_latency", c["e2e_processing_latency"])
            percentiles(f"{key}.fin_latency", c["fin_latency"])  # beyond Go
            if "settings" in c:
                for counter in ("dead_letter_count", "expired_count", "dropped_count"):
                    incr(f"{key}.{counter}", c[counter] - lc.get(counter, 0))
    mem = None
    if opts.statsd_mem_stats:
        mem = mem_stats(gc_pauses)
        for k, value in mem.items():
            if k != "gc_total_runs":  # sent as the counter mem.gc_runs below
                gauge(f"mem.{k}", value)
        incr("mem.gc_runs", mem["gc_total_runs"] - (last_mem or {}).get("gc_total_runs", 0))
    return lines, stats, mem


def packets(lines: list[bytes], size: int) -> list[bytes]:
    """Go's BoundaryBufferedWriter: whole lines per packet, at most ``size`` bytes."""
    out: list[bytes] = []
    buf = b""
    for line in lines:
        if len(line) > size - len(buf) and buf:
            out.append(buf)
            buf = b""
        if len(line) > size:
            out.append(line)  # bufio writes an oversize line on its own
            continue
        buf += line
    if buf:
        out.append(buf)
    return out


class StatsdService(service.Service):
    name = "statsd"

    def __init__(self, nsqd: NSQD, gc_pauses: GCPauses | None = None) -> None:
        self.nsqd = nsqd
        self.gc_pauses = gc_pauses
        self.log = nsqd.log_gate.logger("nsqd_tw.http.statsd", self)
        self._loop = LoopingCall(self.push)
        self._loop.clock = nsqd.reactor
        self._last: dict[str, Any] = {}
        self._last_mem: dict[str, int] | None = None
        self._port: Any = None
        self._pending: list[Any] = []

    def startService(self) -> None:
        service.Service.startService(self)
        self._port = self.nsqd.reactor.listenUDP(0, DatagramProtocol())
        self._loop.start(self.nsqd.opts.statsd_interval, now=False)

    def stopService(self) -> Any:
        service.Service.stopService(self)
        if self._loop.running:
            self._loop.stop()
        for call in self._pending:
            if call.active():
                call.cancel()
        self._pending = []
        self.log.info("STATSD: closing")
        if self._port is not None:
            port, self._port = self._port, None
            return port.stopListening()
        return None

    @defer.inlineCallbacks
    def push(self) -> Any:
        """One push; a failure is logged, never raised into the loop."""
        opts = self.nsqd.opts
        try:
            host, _, port = opts.statsd_address.rpartition(":")
            ip = yield self.nsqd.reactor.resolve(host.strip("[]") or "127.0.0.1")
            self.log.info("STATSD: pushing stats to {addr}", addr=opts.statsd_address)
            lines, self._last, self._last_mem = metric_lines(self.nsqd, self._last, self._last_mem, self.gc_pauses)
            chunks = packets(lines, opts.statsd_udp_packet_size)
            spread = max(opts.statsd_interval - 1.0, 0.0)
            step = spread / len(chunks) if chunks else 0.0
            self._pending = [c for c in self._pending if c.active()]
            for i, chunk in enumerate(chunks):
                if i == 0 or step == 0:
                    self._send(chunk, ip, int(port))
                else:
                    self._pending.append(self.nsqd.reactor.callLater(i * step, self._send, chunk, ip, int(port)))
        except Exception as e:
            self.log.error("failed to create UDP socket to statsd({addr}) - {err}", addr=opts.statsd_address, err=e)

    def _send(self, data: bytes, ip: str, port: int) -> None:
        if self._port is None:
            return
        try:
            self._port.write(data, (ip, port))
        except Exception as e:
            self.log.error("STATSD: send failed - {err}", err=e)
