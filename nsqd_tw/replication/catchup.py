"""A primary's snapshot (beyond Go): what a new link starts with, so that its
standby catches up (docs/replication.md, "Catch-up").

:class:`SnapshotSender` sends BEGIN (every topic's and channel's metadata), each
queue's content as it was then (memory, in flight and deferred copied at BEGIN,
the backend through its :class:`~nsqd_tw.storage.snapshot.QueueSnapshot`), the
retained segments the standby says it lacks (WANT), then END: a push producer of
the link's transport, a few frames a reactor turn. It sends through its
:class:`~nsqd_tw.replication.primary.Primary` (``_send``: the operations counted
as the stream's), which hears of queues emptied or deleted meanwhile (``drop``)
and of retained segments deleted (``deleted``).
"""

from __future__ import annotations

import errno
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from nsqd_tw.core.channel import Channel
from nsqd_tw.core.queue import Item
from nsqd_tw.core.replica import metadata_doc
from nsqd_tw.core.topic import Topic
from nsqd_tw.replication import wire
from nsqd_tw.storage.retained import RetainedLog
from nsqd_tw.storage.retained_segments import Segment
from nsqd_tw.storage.snapshot import CHUNK, QueueSnapshot

if TYPE_CHECKING:
    from nsqd_tw.core.nsqd import NSQD
    from nsqd_tw.replication.link import Link, Node

SNAPSHOT_FRAMES_PER_TURN = 8  # then the reactor serves others
SNAPSHOT_CHUNK = CHUNK  # bytes of records in one snapshot frame, about


class Sender(Protocol):
    """What the snapshot needs of its :class:`~nsqd_tw.replication.primary.Primary`."""

    nsqd: NSQD
    service: Node
    sent: int
    end_seq: int  # the END of the snapshot: acknowledged, the standby is in sync
    snapshot: SnapshotSender | None

    def _send(self, data: bytes, now: bool = False, ops: int = 1) -> None: ...


class _Source:
    """One queue's part of the snapshot: what it held at BEGIN."""

    __slots__ = ("channel", "parts", "queue", "topic")

    def __init__(self, topic: str, channel: str | None, queue: Topic | Channel, parts: list[QueueSnapshot]) -> None:
        self.topic = topic
        self.channel = channel
        self.queue = queue
        self.parts = parts


class _Entries(QueueSnapshot):
    """Entries (deliver-at ns or 0, record) copied at BEGIN: a queue's memory,
    in-flight and deferred messages."""

    def __init__(self, entries: list[tuple[int, bytes]]) -> None:
        self._entries = entries
        self._pos = 0

    def take(self, max_bytes: int = CHUNK) -> list[tuple[int, bytes]]:
        out = []
        size = 0
        while self._pos < len(self._entries) and size < max_bytes:
            entry = self._entries[self._pos]
            self._pos += 1
            size += len(entry[1])
            out.append(entry)
        return out

    @property
    def done(self) -> bool:
        return self._pos >= len(self._entries)

    def close(self) -> None:
        self._entries = []
        self._pos = 0


def _item_entry(item: Item, now_ns: int) -> tuple[int, bytes]:
    if isinstance(item, bytes):
        return 0, item
    return (now_ns + int(item.deferred * 1e9) if item.deferred else 0), item.encode()


@implementer(IPushProducer)
class SnapshotSender:
    """BEGIN, every queue's content as it was then, END: sent as the socket
    drains (a push producer of the link's transport), a few frames a turn."""

    def __init__(self, primary: Sender, link: Link) -> None:
        self.primary = primary
        self.link = link
        self.sources: deque[_Source] = deque()
        # then the retained segments the standby lacks: once it said which (WANT)
        self.want_pending = True
        self.segments: deque[_SegmentSender] = deque()
        self.paused = False
        self.closed = False
        self._call: Any = None
        self.started_at = primary.service.now()

    def start(self) -> None:
        nsqd = self.primary.nsqd
        topics = [t for t in nsqd.topics.values() if not t.ephemeral]
        for topic in topics:
            if topic.retained is not None:
                topic.retained.seal_active()  # from now on sealed, so sent as they are; the rest goes live
        self.primary._send(wire.json_frame(wire.BEGIN, metadata_doc(topics)))
        now_ns = nsqd.now_ns()
        for topic in topics:
            parts: list[QueueSnapshot] = [_Entries([_item_entry(i, now_ns) for i in topic.memory])]
            self.sources.append(_Source(topic.name, None, topic, parts + _backend_part(topic)))
            for channel in topic.channels.values():
                entries = [_item_entry(i, now_ns) for i in channel.memory]
                entries += [(0, m.encode()) for m in channel.in_flight.values()]
                entries += [(int(m.pri * 1e9), m.encode()) for m in channel.deferred.values()]
                self.sources.append(
                    _Source(topic.name, channel.name, channel, [_Entries(entries), *_backend_part(channel)])
                )
        self.link.transport.registerProducer(self, True)
        self._schedule()

    def _schedule(self) -> None:
        if self._call is None and not self.paused and not self.closed:
            self._call = self.primary.nsqd.reactor.callLater(0, self._pump)

    def _pump(self) -> None:
        self._call = None
        frames = 0
        primary = self.primary
        while not self.paused and not self.closed and frames < SNAPSHOT_FRAMES_PER_TURN:
            if not self.sources:
                if self.want_pending:
                    return  # wanted() goes on
                if not self.segments:
                    self._finish()
                    return
                data = self.segments[0].next_frame()
                if data is None:
                    self.segments.popleft().close()
                else:
                    primary._send(data)
                    frames += 1
                continue
            source = self.sources[0]
            if not source.parts:
                self.sources.popleft()
                continue
            part = source.parts[0]
            entries = part.take(SNAPSHOT_CHUNK)
            if part.done:
                part.close()
                source.parts.pop(0)
            if entries:
                primary._send(wire.entries_frame(source.topic, source.channel, entries))
                frames += 1
        self._schedule()

    def _finish(self) -> None:
        primary = self.primary
        primary._send(wire.frame(wire.END))
        primary.end_seq = primary.sent
        primary.service.log.info(
            "REPLICATION: snapshot sent to {peer} in {t:.3f}s ({n} operations)",
            peer=self.link.address,
            t=primary.service.now() - self.started_at,
            n=primary.sent,
        )
        self.close()

    def wanted(self, doc: dict[str, Any]) -> None:
        """The standby's WANT: the retained segments it lacks, ``{"topics": {topic:
        [[segment, from offset], ...]}}``; sent after the queues, before END."""
        if not self.want_pending:
            return
        self.want_pending = False
        topics = doc.get("topics")
        nsqd = self.primary.nsqd
        for name, wants in topics.items() if isinstance(topics, dict) else ():
            topic = nsqd.topics.get(name)
            log = topic.retained if topic is not None else None
            if log is None or not isinstance(wants, list):
                continue
            for want in wants:
                if not (isinstance(want, list) and len(want) == 2 and all(isinstance(v, int) for v in want)):
                    continue
                seg = log.segment(want[0])
                if seg is not None and seg.uid != log.active_uid:  # sealed: the one written goes live
                    self.segments.append(_SegmentSender(name, log, seg, min(max(0, want[1]), seg.size)))
        self._schedule()

    def deleted(self, topic: str, num: int) -> None:
        """The primary deleted its retained segments of ``topic`` up to ``num``: not sent."""
        for sender in self.segments:
            if sender.topic == topic and sender.seg.num <= num:
                sender.close()

    def drop(self, queue: Topic | Channel, whole_topic: bool) -> None:
        """``queue`` was emptied or deleted (``whole_topic``: a topic and its
        channels): what the snapshot had yet to send of it is not sent."""
        name = queue.name if isinstance(queue, Topic) else None
        for source in list(self.sources):
            if source.queue is queue or (whole_topic and source.topic == name):
                for part in source.parts:
                    part.close()
                source.parts = []

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        for source in self.sources:
            for part in source.parts:
                part.close()
        self.sources.clear()
        for sender in self.segments:
            sender.close()
        self.segments.clear()
        transport = self.link.transport
        if transport is not None and getattr(transport, "producer", self) is self:
            transport.unregisterProducer()
        if self.primary.snapshot is self:
            self.primary.snapshot = None

    # IPushProducer

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        self._schedule()

    def stopProducing(self) -> None:
        self.close()


class _SegmentSender:
    """One sealed retained segment (what the standby lacks of it, from an offset):
    SEGMENT frames of its bytes, a chunk at a time, then its SEGMENT_END."""

    def __init__(self, topic: str, log: RetainedLog, seg: Segment, offset: int) -> None:
        self.topic = topic
        self.log = log
        self.seg = seg
        self.offset = offset
        self.fd: int | None = None
        self.closed = False

    def next_frame(self) -> bytes | None:
        """The next frame to send (None: all sent, or the segment is gone)."""
        seg = self.seg
        if self.closed or self.log.segment(seg.num) is not seg:
            return None
        if self.offset >= seg.size:
            self.closed = True
            doc = {
                "topic": self.topic,
                "segment": seg.num,
                "uid": seg.uid,
                "size": seg.size,
                "count": seg.count,
                "first_ts": seg.first_ts,
                "max_ts": seg.max_ts,
                "appended_ns": seg.appended_ns,
                "sparse": seg.sparse,
            }
            return wire.json_frame(wire.SEGMENT_END, doc)
        path = self.log.data_file(seg.num)
        try:
            if self.fd is None:
                self.fd = os.open(path, os.O_RDONLY)
            data = os.pread(self.fd, min(SNAPSHOT_CHUNK, seg.size - self.offset), self.offset)
            if not data:
                raise OSError(errno.EIO, f"it ends at {self.offset}, before {seg.size}")
        except OSError as e:
            self.log.log.error("REPLICATION: cannot send retained segment {fn} - {err}", fn=path, err=e)
            self.close()
            return None
        offset, self.offset = self.offset, self.offset + len(data)
        return wire.segment(self.topic, seg.num, offset, seg.uid, data)

    def close(self) -> None:
        self.closed = True
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _backend_part(queue: Topic | Channel) -> list[QueueSnapshot]:
    take: Callable[[], QueueSnapshot] | None = getattr(queue.backend, "snapshot", None)
    if take is None or not queue.backend.depth():
        return []
    return [take()]
