"""The driver side of the streaming source: consume, hold, then FIN.

One :class:`HoldingConsumer` lives in the Python process where Spark calls
the stream reader's offset methods. It subscribes to every nsqd it knows of
(``nsqdTcpAddresses``, and the producers nsqlookupd lists for the topic,
polled), numbers each message it receives and holds it, unanswered, until
Spark has committed the micro-batch that carried it. Then it FINs it on the
connection that received it. Held messages are TOUCHed so they do not time
out while a batch is being processed.

Offsets are ``{"session": <this consumer's id>, "seq": <messages received>}``.
A restarted driver has a new session: ranges of an old session cannot be read
again, and need not be, since their messages were never FINed and nsqd
delivers them again.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.error import HTTPError
from urllib.request import Request, urlopen

from nsq_client.blocking import Connection, ConnectOptions
from nsq_wire import commands, lookupd
from nsq_wire.errors import NSQError
from nsq_wire.frames import CLOSE_WAIT, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, HEARTBEAT
from nsq_wire.gofmt import join_host_port
from nsq_wire.message import decode

log = logging.getLogger("nsq_spark.consumer")

DEFAULT_MAX_RDY = 2500  # nsqd's --max-rdy-count default
MAX_CONNECTIONS_PER_NSQD = 16


@dataclass(slots=True)
class Held:
    seq: int
    conn: Connection
    id: bytes
    body: bytes
    timestamp: int
    attempts: int


@dataclass
class ConsumerConfig:
    topic: str
    channel: str
    nsqd_addresses: list[str]
    lookupd_addresses: list[str]
    connect: ConnectOptions
    max_in_flight: int = 1000
    lookupd_poll_interval: float = 60.0
    idle_timeout: float = 2.0  # availableNow: the channel is drained after this long without a message
    touch_interval: float = 0.0  # 0: half the negotiated msg_timeout
    no_node_timeout: float = 60.0  # fail after this long with no nsqd reachable; 0: wait forever


class NoNodeError(RuntimeError):
    """No nsqd could be consumed from for ``noNodeTimeout`` (or ever, for a
    failure retrying cannot mend, such as E_AUTH_FAILED)."""


@dataclass
class _ConnState:
    address: str
    key: str = ""
    conn: Connection | None = None
    thread: threading.Thread | None = None
    caught_up: bool = False  # availableNow: a message newer than the cutoff came from it
    closing: bool = False
    close_wait: threading.Event = field(default_factory=threading.Event)
    failures: int = 0
    static: bool = True


class HoldingConsumer:
    def __init__(self, config: ConsumerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.session = uuid.uuid4().hex
        self.cond = threading.Condition()
        self.held: deque[Held] = deque()  # received and not FINed, in seq order
        self.next_seq = 0
        self.finished_seq = 0  # every seq below it has been FINed (or its connection is gone)
        self.conns: dict[str, _ConnState] = {}
        self.started = False
        self.stopping = False
        self.cutoff_ns: int | None = None  # availableNow: messages stamped later are given back
        self.last_activity = clock()
        self.discovered = threading.Event()  # the first lookupd poll (or none to do) is done
        # reachability: the last failure to reach a lookupd or nsqd since the
        # last sign of health, and since when no connection has been live
        self.last_error: str | None = None
        self.fatal_error: str | None = None
        self.unreachable_since = clock()
        self._threads: list[threading.Thread] = []

    # -- life ----------------------------------------------------------------------

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        self.unreachable_since = self.clock()
        for address in self.config.nsqd_addresses:
            self._add(address, static=True)
        if self.config.lookupd_addresses:
            self._spawn(self._poll_lookupd, "nsq-lookupd-poll")
        else:
            self.discovered.set()
        self._spawn(self._toucher, "nsq-touch")

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def _add(self, address: str, static: bool) -> None:
        """Subscribe to ``address`` with enough connections for max_in_flight:
        nsqd caps each connection's RDY at its --max-rdy-count (2500), and
        messages stay in flight until their batch commits."""
        count = min(MAX_CONNECTIONS_PER_NSQD, -(-self.config.max_in_flight // DEFAULT_MAX_RDY))
        for i in range(count):
            key = f"{address}#{i}"
            with self.cond:
                if key in self.conns or self.stopping:
                    continue
                state = _ConnState(address, key=key, static=static)
                self.conns[key] = state
            state.thread = self._spawn(functools.partial(self._run, state), f"nsq-consume-{key}")

    def _run(self, state: _ConnState) -> None:
        """Connect, subscribe, read until the connection ends; retry with backoff."""
        while not self.stopping and not state.closing:
            try:
                conn = Connection(state.address, self.config.connect).open()
                conn.subscribe(self.config.topic, self.config.channel)
            except (OSError, NSQError, ValueError) as e:
                self._connection_failed(state, e)
                if not state.static:
                    # lookupd will list it again if it comes back
                    with self.cond:
                        self.conns.pop(state.key, None)
                    return
                continue
            with self.cond:
                self.last_error = None
                state.conn = conn
                self.last_activity = self.clock()
                self._rebalance_rdy()
                self.cond.notify_all()
            log.info("subscribed to %s/%s on %s", self.config.topic, self.config.channel, state.address)
            try:
                self._read_loop(state, conn)
            except (OSError, NSQError) as e:
                if not self.stopping and not state.closing:
                    log.warning("connection to %s lost: %s", state.address, e)
            finally:
                conn.close()
                with self.cond:
                    state.conn = None
                    if not self._live():
                        self.unreachable_since = self.clock()
                    self._rebalance_rdy()
                    self.cond.notify_all()

    def _connection_failed(self, state: _ConnState, e: BaseException) -> None:
        state.failures += 1
        text = f"cannot consume from {state.address}: {e}"
        permanent = isinstance(e, NSQError) and e.code in (
            "E_AUTH_FAILED",
            "E_UNAUTHORIZED",
            "E_BAD_TOPIC",
            "E_BAD_CHANNEL",
        )
        with self.cond:
            self._failed(text)
            if permanent:
                self.fatal_error = text
            self.cond.notify_all()
        log.warning(text)
        if permanent:
            state.closing = True  # retrying cannot help
            return
        delay = min(60.0, 0.5 * 2 ** min(state.failures, 7)) * (0.5 + random.random() / 2)
        deadline = self.clock() + delay
        with self.cond:
            while not self.stopping and self.clock() < deadline:
                self.cond.wait(deadline - self.clock())

    def _read_loop(self, state: _ConnState, conn: Connection) -> None:
        heartbeat = conn.identify_response.get("heartbeat_interval") or 30000
        conn.sock.settimeout(2 * heartbeat / 1000 + 5)  # two missed heartbeats: nsqd is gone
        while True:
            messages: list[bytes] = []
            for frame_type, data in conn.read_frames():
                if frame_type == FRAME_TYPE_MESSAGE:
                    messages.append(data)
                elif frame_type == FRAME_TYPE_ERROR:
                    error = NSQError.from_frame(data, state.address)
                    if error.code in ("E_FIN_FAILED", "E_TOUCH_FAILED", "E_REQ_FAILED"):
                        log.warning("%s: %s", state.address, error.text)  # e.g. a message that had timed out
                        continue
                    raise error
                elif data == HEARTBEAT:
                    conn.send(commands.NOP)
                elif data == CLOSE_WAIT:
                    state.close_wait.set()
                    return
            if messages:
                self._received(state, conn, messages)

    def _received(self, state: _ConnState, conn: Connection, frames: list[bytes]) -> None:
        state.failures = 0  # this connection works: reconnect at once if it drops
        decoded = [decode(data) for data in frames]
        with self.cond:
            self.last_activity = self.clock()
            cutoff = self.cutoff_ns
            seq = self.next_seq
            held = self.held
            for msg_id, body, timestamp, attempts in decoded:
                if cutoff is not None and timestamp > cutoff:
                    # published after availableNow began: not this run's; give it back
                    conn.req(msg_id, 0)
                    if not state.caught_up:
                        state.caught_up = True
                        conn.rdy(0)
                    continue
                held.append(Held(seq, conn, msg_id, body, timestamp, attempts))
                seq += 1
            self.next_seq = seq
            self.cond.notify_all()

    def _rebalance_rdy(self) -> None:
        """Spread max_in_flight over the live connections (called with the lock held)."""
        live = [s for s in self.conns.values() if s.conn is not None and not s.caught_up]
        if not live:
            return
        per = max(1, self.config.max_in_flight // len(live))
        for s in live:
            try:
                assert s.conn is not None
                s.conn.rdy(min(per, int(s.conn.identify_response.get("max_rdy_count") or 2500)))
            except (OSError, NSQError):
                pass

    def _failed(self, text: str) -> None:
        """Record a failure to reach a node (called with the lock held)."""
        self.last_error = text

    def _live(self) -> bool:
        return any(s.conn is not None for s in self.conns.values())

    def _poll_lookupd(self) -> None:
        first = True
        failures = 0
        while not self.stopping:
            found, problems = self._lookup()
            if problems and len(problems) == len(self.config.lookupd_addresses):
                failures += 1  # none answered: ask again soon, backing off
                with self.cond:
                    self._failed("; ".join(problems))
                    self.cond.notify_all()
            else:
                failures = 0
                if not found and not self.config.nsqd_addresses:
                    # the lookupds answered: no node has the topic yet, which is no failure
                    with self.cond:
                        self.last_error = None
                        if not self._live():
                            self.unreachable_since = self.clock()
                        self.cond.notify_all()
            for address in found:
                self._add(address, static=False)
            if first:
                first = False
                self.discovered.set()
            interval = self.config.lookupd_poll_interval
            if failures:
                interval = min(interval, 0.5 * 2 ** min(failures, 7))
            deadline = self.clock() + interval
            with self.cond:
                while not self.stopping and self.clock() < deadline:
                    self.cond.wait(deadline - self.clock())

    def _lookup(self) -> tuple[list[str], list[str]]:
        """The topic's nsqd addresses the lookupds list, and the lookupds that failed."""
        found: list[str] = []
        problems: list[str] = []
        for address in self.config.lookupd_addresses:
            try:
                req = Request(lookupd.lookup_url(address, self.config.topic), headers={"Accept": lookupd.ACCEPT})
                with urlopen(req, timeout=5) as resp:
                    found.extend(join_host_port(host, port) for host, port in lookupd.producers(resp.read()))
            except HTTPError as e:
                if e.code == 404:  # the topic is on no node yet
                    log.info("lookupd %s: no nsqd has topic %s yet", address, self.config.topic)
                else:
                    problems.append(f"lookupd {address}: {e}")
                    log.warning("lookupd %s: %s", address, e)
            except Exception as e:
                problems.append(f"lookupd {address}: {e}")
                log.warning("lookupd %s: %s", address, e)
        return sorted(set(found)), problems

    def _toucher(self) -> None:
        while not self.stopping:
            interval = self.config.touch_interval or self._negotiated_msg_timeout() / 2
            deadline = self.clock() + max(0.5, interval)
            with self.cond:
                while not self.stopping and self.clock() < deadline:
                    self.cond.wait(deadline - self.clock())
                if self.stopping:
                    return
                by_conn: dict[int, tuple[Connection, list[bytes]]] = {}
                for h in self.held:
                    by_conn.setdefault(id(h.conn), (h.conn, []))[1].append(h.id)
            for conn, ids in by_conn.values():
                try:
                    conn.touch(ids)
                except (OSError, NSQError):
                    pass

    def _negotiated_msg_timeout(self) -> float:
        with self.cond:
            for s in self.conns.values():
                if s.conn is not None and s.conn.identify_response.get("msg_timeout"):
                    return float(s.conn.identify_response["msg_timeout"]) / 1000.0
        return (self.config.connect.msg_timeout_ms or 60000) / 1000.0

    # -- what the stream reader asks ------------------------------------------------------

    def finish_below(self, seq: int) -> int:
        """FIN every held message numbered below ``seq`` (their batch is committed)."""
        by_conn: dict[int, tuple[Connection, list[bytes]]] = {}
        with self.cond:
            while self.held and self.held[0].seq < seq:
                h = self.held.popleft()
                by_conn.setdefault(id(h.conn), (h.conn, []))[1].append(h.id)
            self.finished_seq = max(self.finished_seq, seq)
            if by_conn:
                self.last_activity = self.clock()  # nsqd may send more now
        count = 0
        for conn, ids in by_conn.values():
            try:
                conn.fin(ids)
                count += len(ids)
            except (OSError, NSQError) as e:
                # nsqd gives these back once it notices the connection is gone
                log.warning("could not FIN %d messages on %s: %s", len(ids), conn.address, e)
        return count

    def slice(self, start: int, end: int) -> list[Held]:
        with self.cond:
            return [h for h in self.held if start <= h.seq < end]

    def available(self) -> int:
        with self.cond:
            return self.next_seq

    def begin_available_now(self) -> None:
        with self.cond:
            self.cutoff_ns = time.time_ns()

    def no_node_error(self) -> str | None:
        """Why the query should fail, if no nsqd has been reachable for
        ``no_node_timeout`` (called with the lock held)."""
        if self._live():
            return None
        if self.fatal_error is not None and not any(not s.closing for s in self.conns.values()):
            return f"no nsqd can be consumed from: {self.fatal_error}"
        timeout = self.config.no_node_timeout
        if self.last_error is None or timeout <= 0:
            return None
        if self.clock() - self.unreachable_since < timeout:
            return None
        return f"no nsqd could be reached for {timeout:g}s: {self.last_error}"

    def check_reachable(self) -> None:
        """Raise :class:`NoNodeError` once no nsqd has been reachable for ``no_node_timeout``."""
        with self.cond:
            error = self.no_node_error()
        if error is not None:
            raise NoNodeError(error)

    def wait_for_more(self, seq: int) -> bool:
        """availableNow: block until a message numbered ``seq`` exists (True) or
        the channel is drained (False): every connection has caught up with the
        cutoff, or nothing arrived for ``idle_timeout`` (since the last message,
        subscription or FIN, which lets nsqd send more). While no nsqd can be
        reached the channel is not drained: it waits, and raises
        :class:`NoNodeError` after ``no_node_timeout``."""
        self.discovered.wait(30)
        with self.cond:
            while True:
                if self.next_seq > seq:
                    return True
                live = [s for s in self.conns.values() if s.conn is not None]
                if live and all(s.caught_up for s in live):
                    return False
                error = self.no_node_error()
                if error is not None:
                    raise NoNodeError(error)
                unreachable = not live and self.last_error is not None
                idle_for = self.clock() - self.last_activity
                if idle_for >= self.config.idle_timeout and not unreachable:
                    return False
                self.cond.wait(0.2 if unreachable else min(0.2, self.config.idle_timeout - idle_for))

    def fill(self, target: int, quiet: float = 0.1, max_wait: float = 2.0) -> None:
        """availableNow: let a batch grow to ``target`` while messages keep
        coming (fewer, larger micro-batches drain a backlog faster)."""
        deadline = self.clock() + max_wait
        with self.cond:
            while self.next_seq < target and not self.stopping:
                now = self.clock()
                if now >= deadline or now - self.last_activity >= quiet:
                    return
                self.cond.wait(min(quiet, deadline - now))

    def close(self, timeout: float = 5.0) -> None:
        """Stop: CLS each subscription and wait for CLOSE_WAIT, which nsqd sends
        after every FIN written before it; then close."""
        with self.cond:
            if self.stopping:
                return
            states = list(self.conns.values())
            for s in states:
                s.closing = True
        for s in states:
            if s.conn is not None:
                try:
                    s.conn.send(commands.rdy(0) + commands.CLS)
                except (OSError, NSQError):
                    s.close_wait.set()
            else:
                s.close_wait.set()
        deadline = self.clock() + timeout
        for s in states:
            s.close_wait.wait(max(0.0, deadline - self.clock()))
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for s in states:
            if s.conn is not None:
                s.conn.close()
