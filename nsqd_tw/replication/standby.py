"""A standby's end of the stream: apply each operation, acknowledge what one
read brought once it is held (in durable mode, once applied and fsynced;
otherwise once received, before it is applied, while it has room to spare, else
once applied), and tell the primary at once what it could not store."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from twisted.logger import LogLevel

from nsqd_tw.core.replica import StandbyApply
from nsqd_tw.replication import wire
from nsqd_tw.storage.errors import DiskQueueError
from nsqd_tw.storage.mirror import MirrorDiverged

if TYPE_CHECKING:
    from nsqd_tw.core.nsqd import NSQD
    from nsqd_tw.replication.link import Link, Node

HEADROOM = 64 << 20  # bytes free beyond what a read may write, to acknowledge it before it is stored
LOOK_EVERY = 0.1  # seconds: how long a look at the free space (and the topics' fan-out) holds


def free_bytes(path: str) -> int:
    """Bytes an unprivileged process may still write on the filesystem of ``path``."""
    st = os.statvfs(path or ".")
    return st.f_bavail * st.f_frsize


class Headroom:
    """Whether a standby that is not durable may acknowledge a read before it
    applies it (the fast path): only while no write of its has failed since, the
    --max-disk-bytes budget has room and its data path has :data:`HEADROOM` free
    beyond what the read may write (a copy for each channel of the widest topic).
    Otherwise it applies the read first and acknowledges what it stored, so that
    a full disk reaches the primary as an ERROR instead of an ACK."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.free = 0
        self.fanout = 1
        self.until = float("-inf")  # when to look again

    def allows(self, size: int) -> bool:
        nsqd = self.nsqd
        if nsqd.health_error is not None:
            return False
        now = nsqd.now()
        if now >= self.until:
            self._look(now)
        need = size * self.fanout
        budget = nsqd.disk_budget
        if (budget.limit and budget.used + need > budget.limit) or self.free - need < HEADROOM:
            return False
        self.free -= need
        return True

    def _look(self, now: float) -> None:
        try:
            self.free = free_bytes(self.nsqd.data_path)
        except OSError:
            self.free = 0
        self.fanout = max((len(t.channels) for t in self.nsqd.topics.values()), default=1) or 1
        self.until = now + LOOK_EVERY


class StandbySide:
    """Frames from the primary, applied in order; ``ACK`` after each read."""

    def __init__(self, service: Node, link: Link) -> None:
        self.service = service
        self.nsqd = service.nsqd
        self.link = link
        self.apply = StandbyApply(service.nsqd)
        self.applied = 0  # operations applied on this link
        self.committing = 0  # the count being made durable (or acknowledged already)
        self.confirmed = 0  # the count acknowledged
        self.want_ack = False  # a PING to answer
        self.token = 0  # the last PING's token, echoed by every ACK (the primary's lease)
        self.in_sync = False
        self.closed = False
        self.failed = False  # it could not apply an operation (and said so)
        self.room = Headroom(service.nsqd)
        self.received: list[tuple[int, bytes]] = []  # not durable: held until the end of the read

    def frame(self, kind: int, payload: bytes) -> None:
        if kind == wire.PING:
            self.token = wire.ping_token(payload)
            self.service.lease_granted()
            self.want_ack = True
            return
        if kind == wire.ERROR:
            why = wire.json_payload(payload).get("error", "")
            self.link.fail(f"closed by the primary - {why}", tell=False)
            return
        if kind not in wire.OPERATIONS:
            raise wire.LinkError(f"unexpected frame {kind:#x} from the primary")
        if not self.nsqd.durable:
            # held once received (a kill loses this process's memory either way):
            # acknowledged at the end of the read, before the work of applying it
            # while there is room to spare for it (read_done)
            self.received.append((kind, payload))
            return
        self._apply_one(kind, payload)

    def _apply_one(self, kind: int, payload: bytes) -> bool:
        """Apply one operation; False if it could not be (the link is failed)."""
        try:
            self._apply(kind, wire.Payload(payload))
        except wire.LinkError:
            raise
        except Exception as e:
            self._cannot_apply(e)
            return False
        self.applied += 1
        return True

    def _cannot_apply(self, e: Exception) -> None:
        """What the primary holds cannot be held here (a full disk, say): what was
        stored before it is acknowledged, then the primary is told at once, and
        this node is not in sync (nor promotable) until a snapshot arrives whole."""
        self.failed = True
        if not self.nsqd.durable:
            self._confirm(self.applied)
        self.service.diverged()
        peer = self.service.peer_address
        if not isinstance(e, (OSError, DiskQueueError, MirrorDiverged)):  # not the disk's doing: a bug to see whole
            self.service.log.failure("REPLICATION: cannot apply an operation of the primary")
        self.nsqd.queue_events.emit(
            ("replication", "apply"),
            LogLevel.error,
            lambda n: (
                f"REPLICATION: cannot store what primary {peer} sends - {e}: told it, and not in sync until "
                f"a snapshot arrives whole ({n['operations']} operation(s) refused)"
            ),
            operations=1,
        )
        why = f"standby cannot store what it is sent - {e}"
        self.link.send_now(wire.json_frame(wire.ERROR, {"error": why, "code": wire.APPLY_FAILED}))
        self.link.fail(why, tell=False)

    def _apply(self, kind: int, p: wire.Payload) -> None:
        apply = self.apply
        if kind == wire.PUB:
            topic, batch = p.name(), p.framed()
            if not apply.append_framed(topic, batch):
                apply.publish(topic, wire.unframe(batch))
        elif kind == wire.FIN:
            topic, channel = p.name(), p.name()
            apply.finish(topic, channel, p.ids())
        elif kind == wire.DPUB:
            topic, delay_ns = p.name(), p.i64()
            apply.publish(topic, p.records(), delay_ns / 1e9)
        elif kind == wire.REQ:
            topic, channel, delay_ns = p.name(), p.name(), p.i64()
            apply.requeue(topic, channel, delay_ns / 1e9, p.rest())
        elif kind == wire.CTRL:
            doc = wire.json_payload(p.rest())
            if doc.get("op") == "lookupd":
                total = doc.get("witnesses")
                self.service.witnesses(
                    [a for a in doc.get("addresses") or [] if isinstance(a, str)],
                    total if isinstance(total, int) and 0 <= total < 1000 else 0,
                )
            else:
                apply.control(doc)
        elif kind == wire.TOPIC_RECORDS:
            topic = p.name()
            entries = p.entries()
            p.end()
            apply.topic_records(topic, entries)
        elif kind == wire.CHANNEL_RECORDS:
            topic, channel = p.name(), p.name()
            entries = p.entries()
            p.end()
            apply.channel_records(topic, channel, entries)
        elif kind == wire.AT:
            topic = p.name()
            num, offset, uid = p.place()
            p.end()
            apply.retained_at(topic, num, offset, uid)
        elif kind == wire.SEGMENT:
            topic = p.name()
            num, offset, uid = p.place()
            apply.segment_data(topic, num, offset, uid, p.rest())
        elif kind == wire.SEGMENT_END:
            apply.segment_done(wire.json_payload(p.rest()))
        elif kind == wire.BEGIN:
            self.in_sync = False
            self.service.snapshot_begins()
            wants = apply.begin(wire.json_payload(p.rest()))
            self.link.send(wire.json_frame(wire.WANT, wants))  # what the primary sends after the queues
        elif kind == wire.END:
            self.service.snapshot_ends()
            self.in_sync = True

    def read_done(self) -> None:
        """Everything one read brought is held: acknowledge it, in durable mode
        once applied and fsynced (one fsync for all of it: the group commit),
        otherwise at once, put on the wire before the operations are applied,
        while there is room to spare for them, else once applied. A PING is
        answered with what is held already."""
        received = self.received
        if not received:
            self._acknowledge(self.applied)
            return
        self.received = []
        early = self.room.allows(sum(len(payload) for _, payload in received))
        if early:
            self._acknowledge(self.applied + len(received))
        try:
            for kind, payload in received:
                if self.link.closed or not self._apply_one(kind, payload):
                    return
        except wire.LinkError as e:
            self.link.fail(f"bad frame - {e}")
            return
        if not early:
            self._acknowledge(self.applied)

    def _acknowledge(self, n: int) -> None:
        if n > self.committing:
            self.committing = n
            if self.nsqd.durable:
                self.nsqd.syncer.commit().addCallbacks(lambda _: self._confirm(n), self._sync_failed)
            else:
                self._confirm(n)
        elif self.want_ack:
            self.link.send(wire.ack(self.confirmed, self.token))
        self.want_ack = False

    def _confirm(self, n: int) -> None:
        if n > self.confirmed:
            self.confirmed = n
            self.link.send_now(wire.ack(n, self.token))  # a publish waits for it on the primary

    def _sync_failed(self, f: Any) -> None:
        self.link.fail(f"standby failed to sync - {f.getErrorMessage()}")

    def lost(self, why: str) -> None:
        self.closed = True
        self.apply.close()
