"""The driver side of the source: which nsqd to read, and how much.

The driver never consumes. Before each micro-batch it surveys the nodes:
``nsqdTcpAddresses``, ``nsqdHttpAddresses`` (their TCP port from ``/info``)
and the producers nsqlookupd lists for the topic (polled, so nodes joining
mid-query are picked up). Where it knows a node's HTTP address it reads the
channel's depth from ``/stats`` (creating the channel first if it does not
exist yet, so messages published from now on are kept for it); a node known
only by its TCP address is probed with a TCP connect and its depth is
unknown. :func:`allot` turns the depths and the batch's row limit into
partitions of ``(nsqd, quota)``, several per node when the depth warrants it.

A node that cannot be reached is left out of the batch and logged at WARNING;
when none could be reached for ``noNodeTimeout`` the query fails with
:class:`NoNodeError` and the last reason.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.error import HTTPError
from urllib.parse import quote
from urllib.request import Request, urlopen

from nsq_client.blocking import split_address
from nsq_wire import lookupd
from nsq_wire.gofmt import join_host_port

log = logging.getLogger("nsq_spark.planner")

_HTTP_TIMEOUT = 5.0
_LOG_AGAIN_AFTER = 30.0  # a node still failing the same way is logged again after this long


class NoNodeError(RuntimeError):
    """No nsqd could be reached for ``noNodeTimeout``."""


class RewindError(RuntimeError):
    """A node refused to rewind the channel, or could not be asked."""


@dataclass(frozen=True)
class Node:
    tcp: str
    http: str | None = None  # known: depth from /stats


@dataclass
class PlannerConfig:
    topic: str
    channel: str
    nsqd_addresses: list[str] = field(default_factory=list)
    nsqd_http_addresses: list[str] = field(default_factory=list)
    lookupd_addresses: list[str] = field(default_factory=list)
    lookupd_poll_interval: float = 60.0
    no_node_timeout: float = 60.0  # 0: wait forever


class Planner:
    def __init__(self, config: PlannerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.cond = threading.Condition()
        self.found: set[Node] = set()  # from lookupd, as of its last answer
        self.resolved: dict[str, Node] = {}  # nsqdHttpAddresses → node, once /info answered
        self.discovered = threading.Event()  # the first lookupd poll (or none to do) is done
        self.last_error: str | None = None
        self.unreachable_since = clock()
        self.stopping = False
        self.started = False
        self._logged: dict[str, tuple[str, float]] = {}

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        self.unreachable_since = self.clock()
        if self.config.lookupd_addresses:
            threading.Thread(target=self._poll_lookupd, name="nsq-lookupd-poll", daemon=True).start()
        else:
            self.discovered.set()

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    # -- the survey --------------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        """Every node known now (reachable or not)."""
        nodes: dict[str, Node] = {a: Node(a) for a in self.config.nsqd_addresses}
        for http in self.config.nsqd_http_addresses:
            node = self.resolved.get(http) or self._resolve(http)
            if node is not None:
                nodes[node.tcp] = node
        with self.cond:
            for node in self.found:
                if node.http is not None or node.tcp not in nodes:
                    nodes[node.tcp] = node
        return sorted(nodes.values(), key=lambda n: n.tcp)

    def survey(self) -> list[tuple[Node, int | None]]:
        """The reachable nodes and their channel depth (None: unknown)."""
        self.discovered.wait(30)
        reachable: list[tuple[Node, int | None]] = []
        for node in self.nodes():
            try:
                depth: int | None = None
                if node.http:
                    depth = self._depth(node)
                else:
                    self._probe(node)
            except Exception as e:
                self._failed(node.tcp, f"cannot consume from {node.tcp}: {_reason(e)}")
                continue
            self._logged.pop(node.tcp, None)
            reachable.append((node, depth))
        with self.cond:
            if reachable:
                self.last_error = None
                self.unreachable_since = self.clock()
            elif not self.found and not self.config.nsqd_addresses and not self.config.nsqd_http_addresses:
                # lookupd answered that no node has the topic yet: no failure
                if self.last_error is None:
                    self.unreachable_since = self.clock()
        return reachable

    def _resolve(self, http: str) -> Node | None:
        try:
            info = _get_json(f"http://{http}/info")
            host = split_address(http)[0]
            node = Node(join_host_port(host, int(info["tcp_port"])), http)
        except Exception as e:
            self._failed(http, f"cannot consume from {http}: {_reason(e)}")
            return None
        self.resolved[http] = node
        return node

    def _probe(self, node: Node) -> None:
        host, port = split_address(node.tcp)
        socket.create_connection((host, port), timeout=_HTTP_TIMEOUT).close()

    def _depth(self, node: Node) -> int:
        """The channel's depth on ``node``; creates the channel if it is missing."""
        topic, channel = self.config.topic, self.config.channel
        # (a channel filter would hide a topic that lacks the channel)
        stats = _get_json(f"http://{node.http}/stats?format=json&topic={quote(topic)}")
        for t in stats.get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            channels = t.get("channels") or []
            for c in channels:
                if c.get("channel_name") == channel:
                    # a rewind feeds the channel as it drains: what it has yet
                    # to feed is part of what the job has to read
                    rewind = c.get("rewind") or {}
                    return int(c.get("depth") or 0) + int(rewind.get("messages_left") or 0)
            # the channel does not exist yet: create it so that it keeps what
            # is published from now on; a topic with no channel at all hands
            # its backlog to the first one
            _post(f"http://{node.http}/channel/create?topic={quote(topic)}&channel={quote(channel)}")
            return 0 if channels else int(t.get("depth") or 0)
        return 0

    def start_times(self) -> dict[str, float]:
        """When each node started (``start_time`` of its ``/info``), by TCP
        address. A node known only by its TCP address, or not answering, is
        left out: the caller cannot tell whether it restarted."""
        self.discovered.wait(30)
        times: dict[str, float] = {}
        for node in self.nodes():
            if node.http is None:
                continue
            try:
                times[node.tcp] = float(_get_json(f"http://{node.http}/info")["start_time"])
            except Exception as e:
                log.debug("no start time from %s: %s", node.http, _reason(e))
        return times

    def rewind(self, since: str) -> dict[str, int | None]:
        """Rewind the channel on every node known now to ``since`` (Unix ms or
        ``earliest``): each delivers again, in publish order, what its topic
        retained from then on (a missing channel is created from then on).
        Returns, per node, the messages it will deliver again (None: a new
        channel, count unknown; 0: the topic is not there). Raises RewindError."""
        self.discovered.wait(30)
        topic, channel = self.config.topic, self.config.channel
        query = f"topic={quote(topic)}&channel={quote(channel)}&since={quote(since)}"
        done: dict[str, int | None] = {}
        for node in self.nodes():
            if node.http is None:
                raise RewindError(
                    f"cannot rewind {node.tcp}: its HTTP address is unknown (give nsqdHttpAddresses or "
                    "lookupdHttpAddresses)"
                )
            try:
                done[node.tcp] = _rewind_node(node.http, query)
            except HTTPError as e:
                raise RewindError(
                    f"nsqd {node.http} refused to rewind {topic}/{channel}: {_error_message(e)}"
                ) from None
            except (OSError, ValueError) as e:
                raise RewindError(f"cannot rewind {topic}/{channel} on {node.http}: {_reason(e)}") from None
            count = done[node.tcp]
            log.info("rewound %s/%s on %s to %s: %s", topic, channel, node.tcp, since, _count_text(count))
        return done

    def _failed(self, key: str, text: str) -> None:
        with self.cond:
            self.last_error = text
        now = self.clock()
        last = self._logged.get(key)
        if last is None or last[0] != text or now - last[1] >= _LOG_AGAIN_AFTER:
            self._logged[key] = (text, now)
            log.warning(text)

    def _poll_lookupd(self) -> None:
        failures = 0
        while not self.stopping:
            found, problems = self._lookup()
            if problems and len(problems) == len(self.config.lookupd_addresses):
                failures += 1  # none answered: ask again soon, backing off
                with self.cond:
                    self.last_error = "; ".join(problems)
            else:
                failures = 0
                with self.cond:
                    self.found = found
            self.discovered.set()
            interval = self.config.lookupd_poll_interval
            if failures:
                interval = min(interval, 0.5 * 2 ** min(failures, 7))
            deadline = self.clock() + interval
            with self.cond:
                while not self.stopping and self.clock() < deadline:
                    self.cond.wait(deadline - self.clock())

    def _lookup(self) -> tuple[set[Node], list[str]]:
        found: set[Node] = set()
        problems: list[str] = []
        for address in self.config.lookupd_addresses:
            try:
                req = Request(lookupd.lookup_url(address, self.config.topic), headers={"Accept": lookupd.ACCEPT})
                with urlopen(req, timeout=_HTTP_TIMEOUT) as resp:
                    body = resp.read()
                for host, tcp, http in lookupd.producer_ports(body):
                    found.add(Node(join_host_port(host, tcp), join_host_port(host, http) if http else None))
            except HTTPError as e:
                if e.code == 404:  # the topic is on no node yet
                    log.info("lookupd %s: no nsqd has topic %s yet", address, self.config.topic)
                else:
                    problems.append(f"lookupd {address}: {e}")
                    self._failed(address, f"lookupd {address}: {e}")
            except Exception as e:
                problems.append(f"lookupd {address}: {_reason(e)}")
                self._failed(address, f"lookupd {address}: {_reason(e)}")
        return found, problems

    # -- failing clearly ------------------------------------------------------------------------

    def no_node_error(self) -> str | None:
        """Why the query should fail: no node reachable for ``no_node_timeout``."""
        with self.cond:
            timeout = self.config.no_node_timeout
            if self.last_error is None or timeout <= 0:
                return None
            if self.clock() - self.unreachable_since < timeout:
                return None
            return f"no nsqd could be reached for {timeout:g}s: {self.last_error}"

    def check_reachable(self) -> None:
        error = self.no_node_error()
        if error is not None:
            raise NoNodeError(error)


def allot(nodes: list[tuple[Node, int | None]], limit: int, part_size: int) -> list[tuple[str, int, bool]]:
    """Partitions ``(nsqd, quota, depth known)`` for a batch of at most
    ``limit`` rows: a node of known depth wants its depth, one of unknown depth
    an even share; shares are cut in proportion when they exceed the limit;
    each node's quota is split into partitions of at most ``part_size``."""
    wants = [(n, d if d is not None else max(1, limit // len(nodes)), d is not None) for n, d in nodes if d != 0]
    total = sum(w for _, w, _ in wants)
    if not total:
        return []
    if total > limit:
        scaled = [(n, w * limit // total, k) for n, w, k in wants]
        spare = limit - sum(w for _, w, _ in scaled)
        wants = [(n, w + (1 if i < spare else 0), k) for i, (n, w, k) in enumerate(scaled)]
    parts: list[tuple[str, int, bool]] = []
    for node, quota, known in wants:
        if quota <= 0:
            continue
        count = -(-quota // part_size)
        base, extra = divmod(quota, count)
        parts.extend((node.tcp, base + (1 if i < extra else 0), known) for i in range(count))
    return parts


def _get_json(url: str) -> dict:
    req = Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    with urlopen(req, timeout=_HTTP_TIMEOUT) as resp:
        data = json.loads(resp.read())
    if isinstance(data, dict) and isinstance(data.get("data"), dict) and "status_code" in data:
        data = data["data"]  # nsqd before 1.0 wrapped its answers
    if not isinstance(data, dict):
        raise ValueError(f"{url}: not a JSON object")
    return data


def _rewind_node(http: str, query: str) -> int | None:
    """POST /channel/rewind to one nsqd (/channel/create with ``since`` when the
    channel does not exist there); the messages it will deliver again."""
    try:
        return int(_post_json(f"http://{http}/channel/rewind?{query}").get("messages") or 0)
    except HTTPError as e:
        if e.code != 404:
            raise
        message = _error_message(e)
        if message == "TOPIC_NOT_FOUND":
            return 0  # nothing published there, nothing retained
        if message != "CHANNEL_NOT_FOUND":
            raise
    _post(f"http://{http}/channel/create?{query}")
    return None


def _count_text(count: int | None) -> str:
    if count is None:
        return "a new channel from then on"
    return "nothing retained there" if count == 0 else f"{count} messages to deliver again"


def _post_json(url: str) -> dict:
    with urlopen(Request(url, data=b"", method="POST"), timeout=_HTTP_TIMEOUT) as resp:
        data = json.loads(resp.read() or b"{}")
    return data if isinstance(data, dict) else {}


def _error_message(e: HTTPError) -> str:
    """nsqd's ``{"message": ...}`` of an HTTP error, else its status line (the
    body is read once: the message is kept on the exception)."""
    message = getattr(e, "nsq_message", None)
    if message is None:
        try:
            message = str(json.loads(e.read())["message"])
        except Exception:
            message = f"{e.code} {e.reason}"
        e.nsq_message = message  # type: ignore[attr-defined]
    return str(message)


def _post(url: str) -> None:
    with urlopen(Request(url, data=b"", method="POST"), timeout=_HTTP_TIMEOUT) as resp:
        resp.read()


def _reason(e: BaseException) -> str:
    if hasattr(e, "reason") and not isinstance(e, HTTPError):
        return str(e.reason)  # URLError: the socket error itself
    return str(e)
