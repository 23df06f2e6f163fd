"""Retained logs and rewinds (beyond Go): what the NSQD keeps of them.

A topic whose policy has ``retention`` or ``retention_bytes`` holds a
:class:`~nsqd_tw.storage.retained.RetainedLog`, opened, reshaped and deleted
here; a channel's :class:`~nsqd_tw.core.rewind.Rewind` is started, resumed
after a restart and ended here. :class:`Retention` keeps the topics that retain
and the channels that rewind, and its :meth:`~Retention.check_retention` (from
the queue scan, once a second) ages out segments and pokes every rewind. See
docs/replay.md for the user's side.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from nsq_service import memstats
from nsq_wire.gofmt import go_duration, rfc3339_nano
from nsqd_tw.core.channel import Channel
from nsqd_tw.core.rewind import Copies, Rewind, RewindBudget, position_of
from nsqd_tw.core.settings import Policy
from nsqd_tw.core.topic import Topic
from nsqd_tw.options import NSQDOptions
from nsqd_tw.storage.budget import DiskBudget
from nsqd_tw.storage.diskqueue import DiskQueue
from nsqd_tw.storage.faults import Gap
from nsqd_tw.storage.layout import DataDirectory
from nsqd_tw.storage.retained import RetainedLog
from nsqd_tw.storage.retained_segments import Segment
from nsqd_tw.storage.spill import SUFFIX, SpillQueue
from nsqd_tw.storage.syncer import NEVER_BY_COUNT, Syncer

RETENTION_INTERVAL = 1.0  # seconds between checks of the retained logs (and rewinds' pokes)
REWIND_PROGRESS_INTERVAL = 5.0  # seconds between a rewind's progress lines (and persisted positions)
RELEASE_WAIT = 10.0  # seconds after the last rewind ended that the memory they used is given back, at the latest


class RewindError(Exception):
    """A rewind that cannot start; ``str()`` says why."""


class Owner(Protocol):
    """What the retained logs and rewinds need of their nsqd (the NSQD)."""

    opts: NSQDOptions
    shipper: Any  # a replication primary's Shipper (core/roles.py), or None
    log: Any
    syncer: Syncer
    data_dir: DataDirectory
    disk_budget: DiskBudget
    durable: bool
    topics: dict[str, Topic]

    def now(self) -> float: ...
    def now_ns(self) -> int: ...
    def schedule(self, fn: Any) -> None: ...
    def metadata_changed(self, topic_name: str | None = None) -> None: ...


class Retention:
    """The retained logs of an nsqd's topics and the rewinds of its channels."""

    def __init__(self, nsqd: Owner) -> None:
        self.nsqd = nsqd
        # the topics with a retained log, the channels rewinding
        self.retained: dict[Topic, None] = {}
        self.rewinding: dict[Channel, None] = {}
        # what the rewinds may hold in memory and read in a reactor turn, all together
        self.budget = RewindBudget(nsqd.schedule)
        self._checked_at = 0.0
        # the last rewind ended: when to give the memory they used back to the system at the latest
        self._release_at: float | None = None
        # beyond Go's beyond, replication (docs/replication.md, "Retained logs"): a
        # standby's logs are copies of its primary's (storage/mirror.py); the
        # segments of the logs a snapshot closed, to open them again; and the
        # rewinds of its primary's channels, to go on with once promoted
        self.mirroring = False
        self._kept: dict[str, list[Segment]] = {}
        self.replicated_rewinds: dict[tuple[str, str], dict[str, Any]] = {}

    @property
    def active(self) -> bool:
        """Some topic retains or some channel rewinds: the queue scan checks them."""
        return bool(self.retained or self.rewinding or self._release_at is not None)

    def _segment_shape(self, policy: Policy) -> tuple[int, int]:
        """A retained log's segment size and roll age (ns): a segment is at most
        --max-bytes-per-file, an eighth of retention_bytes, a sixteenth of
        --max-disk-bytes, and an eighth of the retention old, so that deleting
        whole segments keeps close to the limits."""
        opts = self.nsqd.opts
        size = opts.max_bytes_per_file
        if policy.retention_bytes:
            size = min(size, max(1, policy.retention_bytes // 8))
        if opts.max_disk_bytes:
            size = min(size, max(1, opts.max_disk_bytes // 16))
        return size, int(policy.retention * 1e9 / 8)

    def open_retained(self, topic: Topic) -> RetainedLog:
        """The topic's retained log, with what the data path holds of it."""
        nsqd = self.nsqd
        opts = nsqd.opts
        size, roll_ns = self._segment_shape(topic.policy)
        kept = self._kept.pop(topic.name, [])
        log = RetainedLog(
            topic.name,
            opts.data_path,
            nsqd.syncer,
            nsqd.log,
            nsqd.now_ns(),
            sorted({*nsqd.data_dir.take_retained(topic.name), *(seg.num for seg in kept)}),
            max_msg_size=opts.max_msg_size,
            # fsynced with every group commit in durable mode, else every --sync-timeout:
            # the channels deliver, this copy is for rewinds (and a kill -9 loses no page)
            sync_every=1 if nsqd.durable else NEVER_BY_COUNT,
            budget=nsqd.disk_budget,
            segment_bytes=size,
            roll_ns=roll_ns,
            known=kept,
        )
        log.on_delete = lambda seg, why: self._segment_deleted(topic, seg, why)
        log.mirror = self.mirroring
        self.retained[topic] = None
        self.spill_channels(topic, log)
        nsqd.log.info(
            "TOPIC({name}): retained log: {n} messages, {size} bytes in {segs} segment(s); retention {ret}, "
            "retention_bytes {rb}",
            name=topic.name,
            n=log.messages,
            size=log.bytes,
            segs=len(log.segments),
            ret=go_duration(int(topic.policy.retention * 1e9)) if topic.policy.retention else "none",
            rb=topic.policy.retention_bytes or "none",
        )
        limit = topic.policy.retention_bytes
        if limit and log.bytes > limit:
            log.trim(limit)
        return log

    def _release_spills(self, topic: Topic, nums: list[int]) -> None:
        """Retention was turned off while nsqd was down: the channels' runs in the
        log (``<queue>.spill.dat``) go to their disk queues, read from the log as it is."""
        nsqd = self.nsqd
        data_path = nsqd.opts.data_path
        owing = [
            c
            for c in topic.channels.values()
            if isinstance(c.backend, DiskQueue) and os.path.exists(os.path.join(data_path, c.backend.name + SUFFIX))
        ]
        if not owing:
            return
        log = RetainedLog(
            topic.name, data_path, nsqd.syncer, nsqd.log, nsqd.now_ns(), nums, max_msg_size=nsqd.opts.max_msg_size
        )
        try:
            for channel in owing:
                backend = channel.backend
                assert isinstance(backend, DiskQueue)
                spill = SpillQueue(backend, log, backend.name, data_path, nsqd.log)
                n = spill.spilled
                channel.backend = spill.unwrap()
                nsqd.log.info(
                    "CHANNEL({topic}:{name}): its topic has no retention now: {n} messages of its backlog "
                    "copied from the retained log to its disk queue",
                    topic=topic.name,
                    name=channel.name,
                    n=n,
                )
        finally:
            log.close()

    def retention_changed(self, topic: Topic) -> None:
        log = topic.retained
        if log is not None:
            log.segment_bytes, log.roll_ns = self._segment_shape(topic.policy)
            self.spill_channels(topic, log)  # a channel made since

    def spill_channels(self, topic: Topic, log: RetainedLog) -> None:
        """The channels of ``topic`` keep what their memory cannot hold as runs
        of its retained log rather than a second copy (storage/spill.py); not in
        durable mode, where a disk queue's records stay until finished."""
        nsqd = self.nsqd
        if nsqd.durable:
            return
        for channel in topic.channels.values():
            backend = channel.backend
            if isinstance(backend, DiskQueue) and not backend.acked:
                channel.backend = SpillQueue(backend, log, backend.name, nsqd.opts.data_path, nsqd.log)

    def drop_retained(self, topic: Topic, why: str) -> None:
        """Delete the topic's retained log (and stop its channels' rewinds)."""
        log = topic.retained
        if log is None:
            return
        for channel in list(topic.channels.values()):
            if channel.rewind is not None:
                channel.rewind.cancel(why)
            if isinstance(channel.backend, SpillQueue):
                channel.backend = channel.backend.unwrap()  # its runs copied to the disk queue
        self.nsqd.log.info(
            "TOPIC({name}): retained log deleted ({why}): {n} messages, {size} bytes",
            name=topic.name,
            why=why,
            n=log.messages,
            size=log.bytes,
        )
        log.delete()
        topic.retained = None
        self.retained.pop(topic, None)

    def _segment_deleted(self, topic: Topic, seg: Segment, why: str) -> None:
        shipper = self.nsqd.shipper
        log = topic.retained
        if shipper is not None and log is not None and not log.mirror:  # its standby deletes its copy
            shipper.replicate(
                {"op": "retained_delete", "topic": topic.name, "segment": seg.num, "horizon": log.horizon_ns}
            )
        self.nsqd.log.info(
            "TOPIC({name}): retained segment {num} deleted ({why}): {n} messages, {size} bytes, "
            "published {first} to {last}",
            name=topic.name,
            num=seg.num,
            why=why,
            n=seg.count,
            size=seg.size,
            first=rfc3339_nano(seg.first_ts) if seg.count else "-",
            last=rfc3339_nano(seg.max_ts) if seg.count else "-",
        )

    def reclaim_retained(self, need: int) -> None:
        """--max-disk-bytes is reached: delete retained segments, the oldest of
        any topic first, until ``need`` bytes are free or none is left (the
        disk budget's ``reclaim``). What a channel still owes of a segment is
        copied to its disk queue first (storage/spill.py): that much is not freed."""
        budget = self.nsqd.disk_budget
        target = budget.used - need
        while budget.used > target:
            logs = [t.retained for t in self.retained if t.retained is not None and t.retained.segments]
            if not logs:
                return
            oldest = min(logs, key=lambda log: log.segments[0].appended_ns)
            oldest.evict()

    def check_retention(self, now: float) -> None:
        """Once a second (from the queue scan): delete the retained segments aged
        out; poke every rewind, log its progress and persist its position."""
        if now < self._checked_at + RETENTION_INTERVAL:
            return
        self._checked_at = now
        nsqd = self.nsqd
        now_ns = int(now * 1e9)
        for topic in list(self.retained):
            log, retention = topic.retained, topic.policy.retention
            if log is not None and retention and not log.mirror:  # a copy goes as its primary says
                try:
                    log.expire(now_ns - int(retention * 1e9))
                except Exception:
                    nsqd.log.failure("RETAINED({name}): failed to delete aged-out segments", name=topic.name)
        for channel in list(self.rewinding):
            rewind = channel.rewind
            if rewind is None:
                self.rewinding.pop(channel, None)
                continue
            if channel.is_empty():
                rewind.safe = rewind.reader.position
            rewind.poke()
            if now >= rewind.progress_at + REWIND_PROGRESS_INTERVAL:
                rewind.progress_at = now
                nsqd.log.info(
                    "CHANNEL({topic}:{name}): rewinding since {since}: {queued} messages queued, {left} left",
                    topic=channel.topic_name,
                    name=channel.name,
                    since=rewind.since_text(),
                    queued=rewind.queued,
                    left=rewind.left,
                )
                if not channel.ephemeral:
                    nsqd.metadata_changed(channel.topic_name)
        if self._release_at is not None and not self.rewinding:
            self._release_memory(now)

    def _release_memory(self, now: float) -> None:
        """The rewinds are over: once their copies are delivered (or RELEASE_WAIT
        after), give the C heap's free pages back. Their batches and messages came
        and went between blocks that stay (CPython asks the C heap for every
        object over 512 bytes), and the heap does not give back what is free
        below its top: after 16 rewinds at once, 20 to 60 MiB of RSS (bench/README.md)."""
        at = self._release_at
        channels = (c for t in self.retained for c in t.channels.values())
        if at is not None and now < at and any(c.copies is not None and not c.is_empty() for c in channels):
            return
        self._release_at = None
        memstats.release_free_memory()

    def start_rewind(self, channel: Channel, since_ns: int | None) -> Rewind:
        """Give ``channel`` again every retained message published at or after
        ``since_ns`` (None: every one retained), replacing a rewind it has.
        Raises :class:`RewindError` (no retained log) or
        :class:`~nsqd_tw.storage.retained.SinceTooOld`."""
        topic = self.nsqd.topics.get(channel.topic_name)
        log = topic.retained if topic is not None else None
        if log is None:
            raise RewindError(f"topic {channel.topic_name} has no retention")
        start = log.locate(since_ns)
        return self._rewind(channel, log, since_ns, start, log.end())

    def create_channel_since(self, topic: Topic, name: str, since_ns: int | None) -> Channel:
        """A new channel of ``topic`` that starts from the retained past (every
        message published at or after ``since_ns``, None: every one retained)
        instead of from now. Checked before the channel is made: raises
        :class:`RewindError`, ``SinceTooOld`` or
        :class:`~nsqd_tw.core.topic.DrainingError`."""
        log = topic.retained
        if log is None:
            raise RewindError(f"topic {topic.name} has no retention")
        start = log.locate(since_ns)
        end = log.end()
        channel = topic.get_channel(name)
        self._rewind(channel, log, since_ns, start, end)
        return channel

    def _rewind(
        self, channel: Channel, log: RetainedLog, since_ns: int | None, start: Any, end: Any, feed: bool = True
    ) -> Rewind:
        """``feed``: queue its first batch now (else the caller pokes it)."""
        nsqd = self.nsqd
        old = channel.rewind
        if old is not None:
            old.close()
        rewind = Rewind(channel, log, since_ns, start, end, self.budget)
        rewind.reader.label = f"CHANNEL({channel.topic_name}:{channel.name}) rewind"
        rewind.progress_at = nsqd.now()
        channel.rewind = rewind
        channel.copies = Copies()  # none pending: this rewind is
        self.rewinding[channel] = None
        gaps = log.gaps_between(start, end)
        nsqd.log.info(
            "CHANNEL({topic}:{name}): rewinding since {since}{replaced}: {n} retained messages to queue again{gaps}",
            topic=channel.topic_name,
            name=channel.name,
            since=rewind.since_text(),
            replaced=f" (replacing the rewind since {old.since_text()})" if old is not None else "",
            n=rewind.left,
            gaps=f"; missing from the retained log, skipped: {', '.join(map(_gap_text, gaps))}" if gaps else "",
        )
        if not channel.ephemeral:
            nsqd.metadata_changed(channel.topic_name)
        self.ship_rewind(channel)
        if rewind.done:
            self.rewind_finished(channel, rewind)
        elif feed:
            rewind.feed_now()  # the first batch before anything published from now on
        return rewind

    def ship_rewind(self, channel: Channel) -> None:
        """A replication primary tells its standby where ``channel``'s rewind is
        (or that it has none): promoted, the standby goes on from there."""
        shipper = self.nsqd.shipper
        if shipper is not None:
            rewind = channel.rewind
            state = rewind.copied_state() if rewind is not None else None
            shipper.replicate({"op": "rewind", "topic": channel.topic_name, "channel": channel.name, "state": state})

    def gaps_crossed(self, rewind: Rewind) -> list[Gap]:
        """The segments missing from the retained log that a rewind just started
        crosses (it skips them; its answer names them)."""
        return rewind.log.gaps_between(rewind.safe, rewind.reader.end)

    def rewind_finished(self, channel: Channel, rewind: Rewind, completed: bool = False) -> None:
        """A rewind read all it had to (``completed``: until its copies are
        finished, a kill makes it start again from its safe position), or was
        cancelled."""
        rewind.close()
        if channel.rewind is rewind:
            channel.rewind = None
            self.rewinding.pop(channel, None)
            if not self.rewinding:
                self._release_at = self.nsqd.now() + RELEASE_WAIT
            if channel.copies is not None:  # (always: it was rewinding)
                channel.copies.pending = rewind.state() if completed and not channel.is_empty() else None
            if not channel.ephemeral and not channel.exiting:
                self.nsqd.metadata_changed(channel.topic_name)
            if not channel.exiting:
                self.ship_rewind(channel)

    def resume_rewinds(self, pending: list[tuple[Channel, Any]]) -> None:
        """The rewinds nsqd.dat kept (a restart): on from their last position, fed
        once they have all started (each its share of the budget)."""
        nsqd = self.nsqd
        resumed: list[Rewind] = []
        for channel, state in pending:
            topic = nsqd.topics.get(channel.topic_name)
            log = topic.retained if topic is not None else None
            where = f"{channel.topic_name}:{channel.name}"
            if not isinstance(state, dict):
                nsqd.log.warn("ignoring the rewind of {where} in nsqd.dat - not an object", where=where)
                continue
            if channel.copies is None:
                channel.copies = Copies()  # its copies may be queued still
            if not state:
                continue  # a rewind done
            since, start, end = state.get("since"), position_of(state.get("from")), position_of(state.get("to"))
            if since is not None and (isinstance(since, bool) or not isinstance(since, int)):
                since = None
            if log is None or start is None or end is None:
                nsqd.log.warn(
                    "ignoring the rewind of {where} in nsqd.dat - {why}",
                    where=where,
                    why="its topic has no retention" if log is None else "bad position",
                )
                continue
            # a segment scanned at start (no index) numbers the records after damage anew
            resumed.append(self._rewind(channel, log, since, log.renumbered(start), log.renumbered(end), feed=False))
        for rewind in resumed:
            rewind.poke()

    def warn_retained_left(self) -> None:
        """Retained segments under the data path that no topic took (it has no
        retention): what its channels kept there (runs, storage/spill.py) is
        copied to their disk queues first, the segments stay."""
        nsqd = self.nsqd
        for name, nums in sorted(nsqd.data_dir.retained_left().items()):
            topic = nsqd.topics.get(name)
            if topic is not None:
                self._release_spills(topic, nums)
            nsqd.log.warn(
                "TOPIC({name}): {n} retained segment(s) under the data path, but the topic has no retention: "
                "kept, unused (set retention to use them, or remove {name}.retained.*)",
                name=name,
                n=len(nums),
            )

    # -- replication (beyond Go's beyond: docs/replication.md, "Retained logs") ------------

    def set_mirroring(self, on: bool) -> None:
        """A standby's logs are copies of its primary's (written where it says);
        a primary's its own: promoted, a standby seals the segments it copied,
        and what it writes from then on are segments of its own."""
        if on == self.mirroring:
            return
        self.mirroring = on
        for topic in self.retained:
            log = topic.retained
            if log is not None:
                log.mirror = on
                log.mirror_at = None
                log.seal_active()

    def keep_retained(self, topic: Topic) -> None:
        """A snapshot begins on a standby: ``topic`` is made again as its primary
        has it, its retained log closed meanwhile, not deleted: kept until the
        primary's segments replace it (storage/mirror.py)."""
        log = topic.retained
        if log is None:
            return
        self._kept[topic.name] = list(log.segments)
        log.close()
        topic.retained = None
        self.retained.pop(topic, None)

    def forget_kept(self) -> None:
        """The logs a snapshot closed whose topic the primary has no retained log
        for: nothing will replace them, their files go."""
        nsqd = self.nsqd
        for name, segments in self._kept.items():
            log = RetainedLog(
                name,
                nsqd.opts.data_path,
                nsqd.syncer,
                nsqd.log,
                nsqd.now_ns(),
                [seg.num for seg in segments],
                max_msg_size=nsqd.opts.max_msg_size,
                known=segments,
            )
            nsqd.log.info(
                "TOPIC({name}): retained log deleted (not retained by the primary): {n} messages, {size} bytes",
                name=name,
                n=log.messages,
                size=log.bytes,
            )
            log.delete()
        self._kept.clear()

    def promoted(self) -> None:
        """A standby takes over: its logs are its own from now on, and the rewinds
        its primary had go on from where the copies it holds end."""
        self.set_mirroring(False)
        rewinds, self.replicated_rewinds = self.replicated_rewinds, {}
        pending = []
        for (topic_name, name), state in rewinds.items():
            topic = self.nsqd.topics.get(topic_name)
            channel = topic.channels.get(name) if topic is not None else None
            if channel is not None:
                pending.append((channel, state))
        self.resume_rewinds(pending)


def _gap_text(gap: Gap) -> str:
    what = f"segment {gap.first}" if gap.first == gap.last else f"segments {gap.first} to {gap.last}"
    return f"{what} ({gap.text()})"
