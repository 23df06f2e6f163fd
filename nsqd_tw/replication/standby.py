"""A standby's end of the stream: apply each operation, acknowledge what one
read brought once it is held (in durable mode, once applied and fsynced;
otherwise once received, before it is applied)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nsqd_tw.core.replica import StandbyApply
from nsqd_tw.replication import wire

if TYPE_CHECKING:
    from nsqd_tw.replication.link import Link, Node


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
        self.received: list[tuple[int, bytes]] = []  # not durable: held, applied once acknowledged

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
            # what the primary holds cannot be held here (a full disk, say): not in sync
            self.service.log.error("REPLICATION: cannot apply an operation of the primary - {err}", err=e)
            self.service.diverged()
            self.link.fail(f"standby cannot apply an operation - {e}")
            return False
        self.applied += 1
        return True

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
        elif kind == wire.BEGIN:
            self.in_sync = False
            self.service.snapshot_begins()
            apply.begin(wire.json_payload(p.rest()))
        elif kind == wire.END:
            self.in_sync = True
            self.service.snapshot_ends()

    def read_done(self) -> None:
        """Everything one read brought is held: acknowledge it, in durable mode
        once applied and fsynced (one fsync for all of it: the group commit),
        otherwise at once, put on the wire before the operations are applied.
        A PING is answered with what is held already."""
        received = self.received
        if not received:
            self._acknowledge(self.applied)
            return
        self.received = []
        self._acknowledge(self.applied + len(received))
        try:
            for kind, payload in received:
                if self.link.closed or not self._apply_one(kind, payload):
                    return
        except wire.LinkError as e:
            self.link.fail(f"bad frame - {e}")

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
