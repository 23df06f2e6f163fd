"""The executor side of the source: one task takes one partition's messages
from its nsqd, stages them, then FINs them.

A partition is ``(batch, index, nsqd address, quota)``, planned on the
driver. Its task:

1. reads the partition's staging file if an earlier attempt (or the run
   before a driver restart) staged it, and returns those rows: a batch's
   content is fixed once staged;
2. otherwise subscribes to the nsqd with enough connections that the quota
   fits within nsqd's ``--max-rdy-count`` per connection (messages stay in
   flight until staged), and takes up to ``quota`` messages, stopping early
   after ``idleTimeout`` without one, or (availableNow) at the first message
   published after the run began, which it gives back;
3. writes them to the staging file (:mod:`nsq_spark.staging`); if it is the
   first attempt to do so it FINs them, else it REQs them and returns the
   winner's rows. nsqd answers CLS with CLOSE_WAIT after every FIN before it,
   so the task ends once nsqd has them all.

Messages are TOUCHed while a slow partition is being filled, so none times
out in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import pyarrow as pa

from nsq_client.blocking import Connection, ConnectOptions
from nsq_wire import commands
from nsq_wire.errors import NSQError
from nsq_wire.frames import CLOSE_WAIT, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, HEARTBEAT
from nsq_wire.message import decode

log = logging.getLogger("nsq_spark.intake")

MAX_CONNECTIONS = 16  # per task
DEFAULT_MAX_RDY = 2500  # nsqd's --max-rdy-count default
_POLL = 0.25  # how often a reading thread looks up from its socket


@dataclass
class Plan:
    """One partition of a micro-batch, as the driver planned it."""

    query: str
    batch: int
    index: int
    address: str
    quota: int
    cutoff_ns: int | None = None  # availableNow: messages stamped later are not this run's


@dataclass
class _Conn:
    conn: Connection
    ids: list[bytes] = field(default_factory=list)
    caught_up: bool = False
    closed: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class Taken:
    """Messages taken from one nsqd for one partition, not yet answered."""

    def __init__(self, plan: Plan, topic: str, channel: str) -> None:
        self.plan = plan
        self.topic = topic
        self.channel = channel
        self.ids: list[str] = []
        self.bodies: list[bytes] = []
        self.timestamps: list[int] = []
        self.attempts: list[int] = []
        self.conns: list[_Conn] = []
        self.cond = threading.Condition()
        self.last_activity = time.monotonic()
        self.error: BaseException | None = None
        self.stopped = False  # no more messages are taken; late arrivals are given back
        self.done = False

    @property
    def caught_up(self) -> bool:
        return any(c.caught_up for c in self.conns)

    def table(self, schema: pa.Schema) -> pa.Table:
        n = len(self.ids)
        received = time.time_ns() // 1000
        return pa.Table.from_arrays(
            [
                pa.array(self.ids, pa.string()),
                pa.array(self.bodies, pa.binary()),
                pa.array([t // 1000 for t in self.timestamps], pa.timestamp("us", tz="UTC")),
                pa.array(self.attempts, pa.int32()),
                pa.array([self.plan.address] * n, pa.string()),
                pa.array([self.topic] * n, pa.string()),
                pa.array([self.channel] * n, pa.string()),
                pa.array([received] * n, pa.timestamp("us", tz="UTC")),
            ],
            schema=schema,
        )


def take(
    plan: Plan,
    topic: str,
    channel: str,
    connect: ConnectOptions,
    max_in_flight: int,
    idle_timeout: float,
) -> Taken:
    """Subscribe and take up to ``plan.quota`` messages, left in flight."""
    taken = Taken(plan, topic, channel)
    try:
        first = Connection(plan.address, connect).open()
        taken.conns.append(_Conn(first))
        per_conn = min(max_in_flight, int(first.identify_response.get("max_rdy_count") or DEFAULT_MAX_RDY))
        count = min(MAX_CONNECTIONS, max(1, -(-plan.quota // per_conn)))
        for _ in range(count - 1):
            taken.conns.append(_Conn(Connection(plan.address, connect).open()))
        left = plan.quota
        for state in taken.conns:
            state.conn.subscribe(topic, channel)
            rdy = min(per_conn, left)
            left -= rdy
            if rdy:
                state.conn.rdy(rdy)
            state.thread = threading.Thread(
                target=_read, args=(taken, state), name=f"nsq-intake-{plan.address}", daemon=True
            )
        taken.last_activity = time.monotonic()
        for state in taken.conns:
            assert state.thread is not None
            state.thread.start()
        _wait(taken, idle_timeout, _msg_timeout(first, connect))
        _stop(taken)
    except BaseException:
        abandon(taken)
        raise
    if taken.error is not None:
        error = taken.error
        abandon(taken)
        raise error
    return taken


def _msg_timeout(conn: Connection, connect: ConnectOptions) -> float:
    ms = conn.identify_response.get("msg_timeout") or connect.msg_timeout_ms or 60000
    return float(ms) / 1000.0


def _wait(taken: Taken, idle_timeout: float, msg_timeout: float) -> None:
    """Until the quota is met, every connection caught up, nothing came for
    ``idle_timeout``, or a connection failed; TOUCHing meanwhile."""
    touch_every = max(0.5, msg_timeout / 2)
    next_touch = time.monotonic() + touch_every
    while True:
        touch: list[tuple[Connection, list[bytes]]] = []
        with taken.cond:
            if taken.error is not None or len(taken.ids) >= taken.plan.quota:
                return
            if all(c.caught_up or c.closed.is_set() for c in taken.conns):
                return
            now = time.monotonic()
            if now - taken.last_activity >= idle_timeout:
                return
            if now >= next_touch:
                touch = [(c.conn, list(c.ids)) for c in taken.conns]
                next_touch = now + touch_every
            else:
                taken.cond.wait(min(_POLL, idle_timeout - (now - taken.last_activity), next_touch - now))
        # sent outside the lock, which the reading threads need to add messages
        for conn, ids in touch:
            try:
                conn.touch(ids)
            except (OSError, NSQError):
                pass


def _stop(taken: Taken) -> None:
    """Take nothing more: RDY 0 on every connection; a message already on its
    way when this runs is given back (REQ) by the reading thread, so what was
    taken, and will be staged and FINed, is fixed from here on."""
    for state in taken.conns:
        try:
            state.conn.rdy(0)
        except (OSError, NSQError):
            pass  # the reading thread reports the connection's failure
    with taken.cond:
        taken.stopped = True


def _read(taken: Taken, state: _Conn) -> None:
    conn = state.conn
    cutoff = taken.plan.cutoff_ns
    try:
        while True:
            frames = conn.poll_frames(_POLL)
            got: list[tuple[bytes, bytes, int, int]] = []
            for frame_type, data in frames:
                if frame_type == FRAME_TYPE_MESSAGE:
                    msg_id, body, timestamp, attempts = decode(data)
                    if cutoff is not None and timestamp > cutoff:
                        # published after availableNow began: not this run's
                        conn.req(msg_id, 0)
                        if not state.caught_up:
                            state.caught_up = True
                            conn.rdy(0)
                        continue
                    got.append((msg_id, body, timestamp, attempts))
                elif frame_type == FRAME_TYPE_ERROR:
                    error = NSQError.from_frame(data, conn.address)
                    if error.code in ("E_FIN_FAILED", "E_TOUCH_FAILED", "E_REQ_FAILED"):
                        log.warning("%s: %s", conn.address, error.text)
                        continue
                    raise error
                elif data == HEARTBEAT:
                    conn.send(commands.NOP)
                elif data == CLOSE_WAIT:
                    return
            with taken.cond:
                late = got if taken.stopped else []
                if got and not late:
                    for msg_id, body, timestamp, attempts in got:
                        state.ids.append(msg_id)
                        taken.ids.append(msg_id.decode("ascii", "replace"))
                        taken.bodies.append(body)
                        taken.timestamps.append(timestamp)
                        taken.attempts.append(attempts)
                    taken.last_activity = time.monotonic()
                taken.cond.notify_all()
            if late:
                conn.send(b"".join(commands.req(msg_id, 0) for msg_id, _, _, _ in late))
    except (OSError, NSQError, ValueError) as e:
        if not taken.done:
            with taken.cond:
                if taken.error is None:
                    taken.error = NSQError(f"consuming from {conn.address} failed: {e}", conn.address)
                taken.cond.notify_all()
    finally:
        state.closed.set()
        with taken.cond:
            taken.cond.notify_all()


def finish(taken: Taken, fin: bool, timeout: float = 10.0) -> None:
    """FIN (or REQ) every message taken, then CLS and wait for nsqd's
    CLOSE_WAIT, which follows every command sent before it. The connections
    are at RDY 0 already (:func:`_stop`), so nothing is sent in between."""
    taken.done = True
    for state in taken.conns:
        try:
            if fin:
                state.conn.fin(state.ids)
            else:
                state.conn.send(b"".join(commands.req(i, 0) for i in state.ids))
            state.conn.send(commands.rdy(0) + commands.CLS)
        except (OSError, NSQError) as e:
            if fin:
                # nsqd delivers them again; the archive's dedup drops the copies
                log.warning("could not FIN %d messages on %s: %s", len(state.ids), state.conn.address, e)
    deadline = time.monotonic() + timeout
    for state in taken.conns:
        state.closed.wait(max(0.0, deadline - time.monotonic()))
    for state in taken.conns:
        state.conn.close()


def abandon(taken: Taken) -> None:
    """Close without answering: nsqd requeues whatever was in flight."""
    taken.done = True
    for state in taken.conns:
        state.conn.close()
    for state in taken.conns:
        if state.thread is not None and state.thread.is_alive():
            state.thread.join(1.0)
