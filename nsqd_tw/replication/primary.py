"""A primary's end of the stream: the shipper nsqd calls on every change, the
acknowledgements its publishers wait for; the snapshot a new link starts with is
:mod:`.catchup`'s."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from nsq_wire.names import is_ephemeral
from nsqd_tw.core.channel import Channel
from nsqd_tw.core.message import Message
from nsqd_tw.core.queue import Item
from nsqd_tw.core.replica import Backpressure
from nsqd_tw.core.topic import Topic
from nsqd_tw.replication import wire
from nsqd_tw.replication.catchup import SnapshotSender
from nsqd_tw.replication.errors import NoLease, NotInSync, ReplicaLost

if TYPE_CHECKING:
    from nsqd_tw.replication.link import Link, Node

DISCONNECTED, CATCHING_UP, IN_SYNC = "disconnected", "catching_up", "in_sync"
FIN_FRAME_IDS = 4096  # IDs in one FIN frame at most
# a standby that could not store what it was sent is linked again after this long,
# doubled at each failure up to the most (and from the least again after a quiet while)
RETRY_FAILED_MIN, RETRY_FAILED_MAX = 1.0, 30.0


class Primary:
    """What nsqd ships (``nsqd.shipper`` while this node is the primary of a pair),
    and the state of its standby across links."""

    def __init__(self, service: Node) -> None:
        self.service = service
        self.nsqd = service.nsqd
        opts = service.nsqd.opts
        self.sync = opts.replication_mode == "sync"
        self.required = opts.replication_required
        self.max_lag = opts.replication_max_lag
        self.max_lag_bytes = opts.replication_max_lag_bytes
        self.link: Link | None = None
        self.state = DISCONNECTED
        self._refusal: Exception | None = None
        # per link: operations sent and acknowledged, messages and bytes sent, and
        # for each publish (seq, sent at, messages so far, bytes so far, waiter or None)
        self.sent = self.acked = 0
        self.sent_messages = self.acked_messages = 0
        self.sent_bytes = self.acked_bytes = 0
        self._marks: deque[tuple[int, float, int, int, defer.Deferred[None] | None]] = deque()
        self._fins: dict[tuple[str, str], list[bytes]] = {}
        self._fin_call: Any = None
        self.snapshot: SnapshotSender | None = None
        self.end_seq = 0  # the END of the snapshot: acknowledged, the standby is in sync
        self.witnesses_told: list[Any] = []
        self.standby_error = ""  # why the standby could not store what it was sent (until in sync again)
        self.failed_at = float("-inf")
        self.retry_after = 0.0
        self._set_refusal()

    # -- links ------------------------------------------------------------------------

    def attach(self, link: Link) -> None:
        """A standby is linked: send it the snapshot, then the stream."""
        if self.link is not None:
            self.detach("replaced by a new link")
        self.link = link
        self.witnesses_told = []
        self.sent = self.acked = self.sent_messages = self.acked_messages = self.sent_bytes = self.acked_bytes = 0
        self._set_state(CATCHING_UP)
        link.send(wire.ping(self.service.lease.token()))  # the standby's lease, from the first ACK on
        self.snapshot = SnapshotSender(self, link)
        self.snapshot.start()

    def detach(self, why: str) -> None:
        """The link is gone: publishes waiting for it are answered (or refused,
        --replication-required)."""
        link, self.link = self.link, None
        if link is None:
            return
        if self.snapshot is not None:
            self.snapshot.close()
            self.snapshot = None
        if self._fin_call is not None and self._fin_call.active():
            self._fin_call.cancel()
        self._fin_call = None
        self._fins.clear()
        marks, self._marks = self._marks, deque()
        leased = self.service.lease.valid()
        for _, _, _, _, waiter in marks:
            if waiter is None:
                continue
            if self.required:
                waiter.errback(ReplicaLost(f"replication: standby {link.address} lost before it held the message"))
            elif not leased:  # acknowledged alone only with the lease, checked now
                waiter.errback(self.no_lease())
            else:
                waiter.callback(None)
        self._set_state(DISCONNECTED, why)

    def _set_state(self, state: str, why: str = "") -> None:
        old, self.state = self.state, state
        self._set_refusal()
        if old == state:
            return
        log = self.service.log
        peer = self.service.peer_address
        if state == IN_SYNC:
            self.standby_error = ""
            log.info("REPLICATION: standby {peer} in sync", peer=peer)
        elif old == IN_SYNC:
            log.warn(
                "REPLICATION: degraded - standby {peer} is {state}{why}: {what}",
                peer=peer,
                state=state,
                why=f" ({why})" if why else "",
                what="publishes are refused (--replication-required)"
                if self.required
                else "what is acknowledged is on this node only",
            )

    def refresh(self) -> None:
        """The node's state was loaded (the peer it names in its refusal)."""
        self._set_refusal()

    def _set_refusal(self) -> None:
        if not self.required or self.state == IN_SYNC:
            self._refusal = None
        else:
            self._refusal = NotInSync(
                f"replication: standby {self.service.peer_address or '(none)'} is {self.state} (--replication-required)"
            )

    @property
    def refusal(self) -> Exception | None:
        """Why a publish is refused now: --replication-required and the standby not
        in sync, or (its acknowledgement not waiting for the standby) no lease."""
        if self._refusal is not None:
            return self._refusal
        if self.state == IN_SYNC and self.sync:
            return None  # acknowledged once the standby holds it
        lease = self.service.lease
        if lease.valid():
            return None
        return self.no_lease()

    def no_lease(self) -> NoLease:
        return NoLease(
            f"replication: no lease (standby {self.service.peer_address or '(none)'} and a majority of the "
            "nsqlookupd witnesses unreachable for --replication-timeout): another node may have taken over"
        )

    def confirm(self, result: Any = None) -> Any:
        """A publish the standby does not hold, about to be acknowledged (a durable
        one after its fsync): only with the lease (raises :class:`NoLease`)."""
        if not self.service.lease.valid():
            raise self.no_lease()
        return result

    def standby_failed(self, why: str) -> float:
        """The standby could not store what it was sent: how long to wait before
        linking again (1 s, doubled at each failure up to 30 s)."""
        now = self.service.now()
        quiet = now - self.failed_at > 2 * RETRY_FAILED_MAX
        self.retry_after = RETRY_FAILED_MIN if quiet else min(self.retry_after * 2, RETRY_FAILED_MAX)
        self.failed_at = now
        self.standby_error = why
        return self.retry_after

    def hold_off(self) -> float:
        """Seconds to wait before dialing the standby again (0: no reason to)."""
        return max(0.0, self.failed_at + self.retry_after - self.service.now())

    # -- operations out -------------------------------------------------------------------

    def _send(self, data: bytes, now: bool = False, ops: int = 1) -> None:
        """``ops`` operations to the standby (counted, as the standby counts them);
        ``now``: on the wire at once, not at the end of this reactor turn."""
        link = self.link
        if link is None:
            return
        self.sent += ops
        self.sent_bytes += len(data)
        if now:
            link.send_now(data)
        else:
            link.send(data)

    def published(self, topic: Topic, items: list[Item]) -> defer.Deferred[None] | None:
        if self.link is None:
            return None
        first = items[0]
        if isinstance(first, bytes):
            records: list[bytes] = items  # type: ignore[assignment]
            data = wire.pub(topic.name, records)
        else:
            delay_ns = int(first.deferred * 1e9)
            data = wire.dpub(topic.name, delay_ns, [m if isinstance(m, bytes) else m.encode() for m in items])
        ops = 1
        log = topic.retained
        if log is not None and log.last_append is not None:  # where its retained log wrote them: the copy too
            at = log.last_append[0]
            data = wire.at(topic.name, at.segment, at.offset, log.active_uid) + data
            ops = 2  # past the byte bound (in any state): it waits, and its producer is not
        # read from meanwhile, so what is held for the standby stays bounded
        held = self.sent_bytes + len(data) - self.acked_bytes > self.max_lag_bytes
        # a producer that waits for the standby: its publish goes on the wire now
        waits = held or (self.state == IN_SYNC and (self.sync or self.sent + 1 - self.acked > self.max_lag))
        self._send(data, now=waits, ops=ops)
        self.sent_messages += len(items)
        waiter: defer.Deferred[None] | None = (Backpressure() if held else defer.Deferred()) if waits else None
        self._marks.append((self.sent, self.service.now(), self.sent_messages, self.sent_bytes, waiter))
        return waiter

    def poll(self) -> None:
        """Before the work of another publish: take in the ACKs the standby sent
        meanwhile, so that the publishes they release are answered first (their
        producers get on with their next while this one is stored)."""
        marks = self._marks
        if marks and marks[0][4] is not None and self.link is not None:
            self.link.poll()

    def gone(self, channel: Channel, ids: Any) -> None:
        if self.link is None or is_ephemeral(channel.topic_name):
            return
        key = (channel.topic_name, channel.name)
        batch = self._fins.get(key)
        if batch is None:
            batch = self._fins[key] = []
        batch.extend(ids)
        if self._fin_call is None:
            self._fin_call = self.nsqd.reactor.callLater(0, self.flush_fins)

    def tell_witnesses(self, addresses: list[str], total: int) -> None:
        """Tell the standby this node's lookupds (HTTP) when they change, and how
        many it has: they are the witnesses of a takeover."""
        told = [*addresses, total]
        if self.link is None or not addresses or told == self.witnesses_told:
            return
        self.witnesses_told = told
        self._send(wire.json_frame(wire.CTRL, {"op": "lookupd", "addresses": addresses, "witnesses": total}))

    def flush_fins(self) -> None:
        """The FINs of this reactor turn, one frame per channel."""
        self._fin_call = None
        fins, self._fins = self._fins, {}
        for (topic, channel), ids in fins.items():
            for i in range(0, len(ids), FIN_FRAME_IDS):
                self._send(wire.fin(topic, channel, ids[i : i + FIN_FRAME_IDS]))

    def replicate(self, doc: dict[str, Any]) -> None:
        """A retained log's segment deleted, a rewind moved on: CTRL, after the FINs waiting to go."""
        if self.link is None or is_ephemeral(str(doc.get("topic", ""))):
            return
        if doc.get("op") == "retained_delete" and self.snapshot is not None:
            self.snapshot.deleted(str(doc["topic"]), int(doc["segment"]))
        if self._fins:
            self.flush_fins()
        self._send(wire.json_frame(wire.CTRL, doc))

    def requeued(self, channel: Channel, msg: Message, delay: float) -> None:
        if self.link is None or is_ephemeral(channel.topic_name):
            return
        self._send(wire.req(channel.topic_name, channel.name, int(delay * 1e9), msg.encode()))

    def fed(self, channel: Channel, records: list[bytes]) -> None:
        if self.link is None or is_ephemeral(channel.topic_name) or not records:
            return
        self._send(wire.entries_frame(channel.topic_name, channel.name, [(0, r) for r in records]))
        self.nsqd.retention.ship_rewind(channel)  # the standby holds the copies up to there

    def control(self, op: str, obj: Topic | Channel, channel: Channel | None = None) -> None:
        """A change of a topic or channel: CTRL, after the FINs waiting to go."""
        if self.link is None:
            return
        if isinstance(obj, Channel):
            topic_name, channel = obj.topic_name, obj
        else:
            topic_name = obj.name
        if is_ephemeral(topic_name):
            return
        doc: dict[str, Any] = {"op": op, "topic": topic_name}
        if channel is not None:
            doc["channel"] = channel.name
        if op == "settings":
            doc["settings"] = (channel if channel is not None else obj).settings_json()
        elif op == "topic_create":
            doc["started"] = obj.started  # type: ignore[union-attr]
        if op in ("topic_empty", "channel_empty", "topic_delete", "channel_delete") and self.snapshot is not None:
            self.snapshot.drop(obj, op == "topic_delete")
        if self._fins:
            self.flush_fins()
        self._send(wire.json_frame(wire.CTRL, doc))

    def changed(self, what: str, obj: Topic | Channel) -> None:
        """nsqd's change observer: topics and channels created and deleted."""
        op = {
            "topic_created": "topic_create",
            "topic_deleted": "topic_delete",
            "channel_created": "channel_create",
            "channel_deleted": "channel_delete",
        }.get(what)
        if op is not None:
            self.control(op, obj)

    # -- acknowledgements ---------------------------------------------------------------

    def acknowledged(self, count: int) -> None:
        """The standby holds every operation up to ``count``."""
        if count <= self.acked:
            return
        self.acked = min(count, self.sent)
        marks = self._marks
        while marks and marks[0][0] <= self.acked:
            _, _, messages, size, waiter = marks.popleft()
            self.acked_messages, self.acked_bytes = messages, size
            if waiter is not None:
                waiter.callback(None)
        if not marks:
            self.acked_messages, self.acked_bytes = self.sent_messages, self.sent_bytes
        if self.state == CATCHING_UP and self.end_seq and self.acked >= self.end_seq:
            self._set_state(IN_SYNC)

    def lag(self) -> dict[str, Any]:
        """Messages and bytes sent and not acknowledged, and for how long (ms)."""
        oldest = self._marks[0][1] if self._marks else None
        return {
            "operations": self.sent - self.acked,
            "messages": self.sent_messages - self.acked_messages,
            "bytes": self.sent_bytes - self.acked_bytes,
            "ms": int((self.service.now() - oldest) * 1000) if oldest is not None else 0,
        }


class PrimaryEnd:
    """An established link seen from its primary: ACKs in, the link's loss."""

    def __init__(self, primary: Primary, link: Link) -> None:
        self.primary = primary
        self.link = link

    def frame(self, kind: int, payload: bytes) -> None:
        if kind == wire.ACK:
            if self.primary.link is self.link:
                count, token = wire.ack_count(payload)
                self.primary.service.lease.echoed(token)
                self.primary.acknowledged(count)
        elif kind == wire.WANT:
            snapshot = self.primary.snapshot
            if self.primary.link is self.link and snapshot is not None:
                snapshot.wanted(wire.json_payload(payload))
        elif kind == wire.ERROR:
            doc = wire.json_payload(payload)
            why = doc.get("error", "")
            primary, log = self.primary, self.primary.service.log
            if doc.get("code") != wire.APPLY_FAILED or primary.link is not self.link:
                log.error("REPLICATION: standby {peer}: {why}", peer=self.link.address, why=why)
                self.link.fail(f"closed by the standby - {why}", tell=False)
                return
            # one line: the "degraded" one when it was in sync, else this one
            why = f"{why}; linking again in {primary.standby_failed(str(why)):g}s"
            if primary.state != IN_SYNC:
                log.error(
                    "REPLICATION: standby {peer} is {state}: {why}",
                    peer=self.link.address,
                    state=primary.state,
                    why=why,
                )
            self.link.fail(why, tell=False)
        else:
            raise wire.LinkError(f"unexpected frame {kind:#x} from the standby")

    def read_done(self) -> None:
        pass

    def lost(self, why: str) -> None:
        if self.primary.link is self.link:
            self.primary.detach(why)
