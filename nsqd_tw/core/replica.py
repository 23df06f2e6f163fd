"""Beyond Go, replication's domain side: the persisted role and epoch, and what a
standby does with what its primary ships (see docs/replication.md).

The link itself (frames, handshake, acknowledgements, snapshots) is
:mod:`nsqd_tw.replication`; this module never sees a socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from nsq_wire.message import MESSAGE_HEADER_LENGTH
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name
from nsqd_tw.core import skips
from nsqd_tw.core.message import Message
from nsqd_tw.core.queue import Item, body_size
from nsqd_tw.core.settings import SettingsError, parse_settings
from nsqd_tw.core.topic import Topic
from nsqd_tw.storage.diskqueue import DiskQueue
from nsqd_tw.storage.files import fsync_dir, read_regular, write_atomic
from nsqd_tw.storage.layout import FramedRecords
from nsqd_tw.storage.mirror import Receiver, check_at, delete_through, inventory, reconcile

if TYPE_CHECKING:
    from nsqd_tw.core.channel import Channel
    from nsqd_tw.core.nsqd import NSQD

STATE_FILE = "replication.json"
# beyond Go, beside it: present only while a standby's last snapshot is known to have
# arrived whole; removed before anything says otherwise (unlinking needs no free space)
SYNCED_FILE = "replication.synced"
PRIMARY, STANDBY = "primary", "standby"


class Backpressure(defer.Deferred[None]):
    """A publish's acknowledgement by a standby that is behind by more than
    --replication-max-lag-bytes: besides waiting for it, its producer's connection
    is not read from until it fires, so that what the primary holds for the
    standby (the link's unsent and unacknowledged bytes) stays bounded."""


class ReplicaStateError(Exception):
    """replication.json cannot be read; ``str()`` says why."""


@dataclass
class ReplicaState:
    """What a node of a pair keeps in ``replication.json`` (a file Go ignores)."""

    node: str  # this node's own random ID
    role: str  # PRIMARY or STANDBY
    epoch: int  # raised by each promotion; the higher one is the primary
    peer: str = ""  # the other node's TCP address, as last configured or heard
    synced: bool = False  # a standby: its last snapshot was received whole (promotable)
    lookupd: list[str] = field(default_factory=list)  # a standby: its primary's lookupds (HTTP)
    announced: str = ""  # a standby: its primary's address as the primary registers it with them
    witnesses: int = 0  # a standby: how many lookupds its primary has (a majority of them must grant a takeover)
    lease: float = 0.0  # a standby: its primary's lease (seconds), which it waits out before taking over
    peer_node: str = ""  # the other node's own ID, once linked: the only one this node pairs with
    saved: bytes = field(default=b"", compare=False, repr=False)  # replication.json as read or last written

    @classmethod
    def load(cls, data_path: str, default_role: str) -> ReplicaState:
        """The state kept under ``data_path``, or a new one with ``default_role``
        (not written until :meth:`save`). Synced only if replication.json says so
        and the marker file is there."""
        path = os.path.join(data_path, STATE_FILE)
        try:
            raw = read_regular(path)
        except FileNotFoundError:
            return cls(uuid.uuid4().hex, default_role, 0)
        except OSError as e:
            raise ReplicaStateError(f"failed to read {path} - {e}") from None
        try:
            doc = json.loads(raw)
            state = cls(
                str(doc["node"]),
                str(doc["role"]),
                int(doc["epoch"]),
                str(doc.get("peer", "")),
                bool(doc.get("synced", False)) and os.path.isfile(os.path.join(data_path, SYNCED_FILE)),
                [str(a) for a in doc.get("lookupd") or []],
                str(doc.get("announced", "")),
                max(0, int(doc.get("witnesses", 0))),
                max(0.0, min(3600.0, float(doc.get("lease", 0.0)))),
                str(doc.get("peer_node", "")),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ReplicaStateError(f"failed to parse {path} - {e!r}") from None
        if state.role not in (PRIMARY, STANDBY) or state.epoch < 0:
            raise ReplicaStateError(f"failed to parse {path} - bad role or epoch")
        state.saved = state._json()
        return state

    def _json(self) -> bytes:
        doc = asdict(self)
        del doc["saved"]
        return json.dumps(doc).encode() + b"\n"

    def save(self, data_path: str) -> None:
        """Write it atomically (and fsynced) before acting on it. Not synced: the
        marker goes first, so that a disk too full for replication.json cannot
        leave a standby that would read itself as synced after a restart."""
        if not self.synced:
            _remove_marker(data_path)
        data = self._json()
        write_atomic(os.path.join(data_path, STATE_FILE), data)
        self.saved = data

    def save_if_changed(self, data_path: str) -> None:
        """:meth:`save`, unless replication.json holds this already (a start on a full disk)."""
        if self._json() != self.saved:
            self.save(data_path)

    def mark_synced(self, data_path: str, marker: bool = True) -> None:
        """A snapshot arrived whole: replication.json says so, then the marker is
        created (unless not ``marker``: what is held is not all on disk yet).
        Raises OSError (and is not synced) if either cannot be written."""
        self.synced = True
        try:
            self.save(data_path)
            if marker:
                self.mark_held(data_path, True)
        except OSError:
            self.synced = False
            with contextlib.suppress(OSError):
                _remove_marker(data_path)
            raise

    def mark_held(self, data_path: str, held: bool) -> None:
        """Whether a restart finds what a synced standby holds (on disk, or not:
        memory queues die with the process): the marker is there only if so."""
        if not (held and self.synced):
            _remove_marker(data_path)
            return
        os.close(os.open(os.path.join(data_path, SYNCED_FILE), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        fsync_dir(data_path)

    def mark_unsynced(self, data_path: str) -> None:
        """Not promotable until a snapshot arrives whole: the marker is removed,
        then replication.json written (which may raise OSError: the marker is
        gone, so a restart reads not synced whatever the file says)."""
        self.synced = False
        self.save(data_path)


def _remove_marker(data_path: str) -> None:
    try:
        os.remove(os.path.join(data_path, SYNCED_FILE))
    except FileNotFoundError:
        return
    fsync_dir(data_path)


def metadata_doc(topics: Sequence[Topic]) -> dict[str, Any]:
    """The topics and channels a snapshot starts with (``BEGIN``): names, paused,
    own settings, and whether each topic has started handing messages on."""
    out = []
    for t in topics:
        if t.ephemeral:
            continue
        channels = []
        for c in t.channels.values():
            doc: dict[str, Any] = {"name": c.name, "paused": c.paused, "settings": c.settings_json()}
            if c.rewind is not None:  # beyond Go: where it is (the standby goes on from there, promoted)
                doc["rewind"] = c.rewind.copied_state()
            channels.append(doc)
        topic: dict[str, Any] = {
            "name": t.name,
            "paused": t.paused,
            "started": t.started,
            "settings": t.settings_json(),
            "channels": channels,
        }
        if t.retained is not None:  # beyond Go: its segments, which the standby keeps or asks for
            topic["retained"] = inventory(t.retained)
        out.append(topic)
    return {"topics": out}


def entries_items(entries: Sequence[tuple[int, bytes]], now_ns: int) -> list[Item]:
    """Snapshot entries (deliver-at ns or 0, record) as a queue takes them: a
    record, or a Message deferred until its time."""
    items: list[Item] = []
    for at, record in entries:
        if at > now_ns:
            msg = Message.decode(record)
            msg.deferred = (at - now_ns) / 1e9
            items.append(msg)
        else:
            items.append(record)
    return items


class StandbyApply:
    """A standby's side of the stream: each method applies one operation of its
    primary to ``nsqd``'s topics and channels. An operation naming a topic or
    channel this node does not have (deleted meanwhile) is ignored."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.receivers: dict[str, Receiver] = {}  # a snapshot's retained segments, by topic
        self._unretained: set[str] = set()  # topics retained by the primary and not here (said once)

    # -- the snapshot ----------------------------------------------------------------

    def begin(self, doc: Any) -> dict[str, Any]:
        """Drop everything held, then create what the primary has. Retained logs
        are closed, not deleted, and kept where they are the primary's: the
        segments the standby lacks, to ask for (WANT), are returned."""
        nsqd = self.nsqd
        retention = nsqd.retention
        self.close()
        retention.replicated_rewinds.clear()
        for name in list(nsqd.topics):
            nsqd.delete_existing_topic(name, keep_retained=True)
        wants: dict[str, list[list[int]]] = {}
        for t in doc.get("topics", []):
            name = t.get("name")
            if not isinstance(name, str) or not is_valid_topic_name(name):
                continue
            topic = nsqd.get_topic(name, replicated=True)
            topic.own_settings = self._settings(t.get("settings"), name)
            if t.get("paused"):
                topic.pause()
            for c in t.get("channels", []):
                cname = c.get("name")
                if not isinstance(cname, str) or not is_valid_channel_name(cname):
                    continue
                channel = topic.get_channel(cname, replicated=True)
                channel.own_settings = self._settings(c.get("settings"), f"{name}:{cname}")
                if c.get("paused"):
                    channel.pause()
                if isinstance(c.get("rewind"), dict):
                    retention.replicated_rewinds[(name, cname)] = c["rewind"]
            topic.apply_policies()
            if t.get("started"):
                topic.start()
            if "retained" in t or topic.retained is not None:  # not retained there: nothing kept here
                none = {"horizon": nsqd.now_ns(), "next": 0, "segments": []}
                want = self._reconcile(topic, t.get("retained") or none)
                if want:
                    wants[name] = want
        retention.forget_kept()
        return {"topics": wants}

    def _reconcile(self, topic: Topic, doc: Any) -> list[list[int]]:
        log = topic.retained
        if log is None:
            self._not_retained(topic.name)
            return []
        try:
            wants = reconcile(log, doc)
        except ValueError as e:
            self.nsqd.log.warn("REPLICATION: ignoring the retained log of {name} - {err}", name=topic.name, err=e)
            return []
        if wants:
            self.receivers[topic.name] = Receiver(log, self.nsqd.durable)
        return wants

    def _not_retained(self, name: str) -> None:
        if name not in self._unretained:
            self._unretained.add(name)
            self.nsqd.log.warn(
                "REPLICATION: topic {name} has a retained log on the primary and not here (set the same --retention "
                "and --retention-bytes on both nodes): its history is not kept on this standby",
                name=name,
            )

    def close(self) -> None:
        """The link is gone (or a new snapshot begins): segments half received go."""
        for receiver in self.receivers.values():
            receiver.close()
        self.receivers.clear()

    # -- the retained logs (docs/replication.md, "Retained logs") -------------------------

    def retained_at(self, topic_name: str, num: int, offset: int, uid: str) -> None:
        """The topic's next publish, written there on the primary, is written there
        here too. Raises :class:`MirrorDiverged` when this copy is not in step."""
        topic = self.nsqd.topics.get(topic_name)
        log = topic.retained if topic is not None else None
        if log is None:
            if topic is not None:
                self._not_retained(topic_name)
            return
        check_at(log, num, offset, uid)
        log.mirror_at = (num, offset, uid)

    def segment_data(self, topic_name: str, num: int, offset: int, uid: str, data: bytes) -> None:
        receiver = self.receivers.get(topic_name)
        if receiver is not None:
            receiver.data(num, uid, offset, data)

    def segment_done(self, doc: Any) -> None:
        receiver = self.receivers.get(str(doc.get("topic")))
        if receiver is not None:
            receiver.done(doc)

    def retained_delete(self, topic: Topic, doc: dict[str, Any]) -> None:
        num, horizon = doc.get("segment"), doc.get("horizon")
        log = topic.retained
        if not isinstance(num, int) or not isinstance(horizon, int):
            return
        receiver = self.receivers.get(topic.name)
        if receiver is not None:
            receiver.drop(num)
        if log is not None:
            delete_through(log, num, horizon)

    def rewind(self, topic: Topic, name: str, state: Any) -> None:
        """Where a channel's rewind is on the primary (None: it has none)."""
        if isinstance(state, dict) and name in topic.channels:
            self.nsqd.retention.replicated_rewinds[(topic.name, name)] = state
        else:
            self.nsqd.retention.replicated_rewinds.pop((topic.name, name), None)

    def topic_records(self, topic_name: str, entries: Sequence[tuple[int, bytes]]) -> None:
        topic = self.nsqd.topics.get(topic_name)
        if topic is None or not entries:
            return
        items = entries_items(entries, self.nsqd.now_ns())
        topic.put_items(items, sum(body_size(i) for i in items))

    def channel_records(self, topic_name: str, channel_name: str, entries: Sequence[tuple[int, bytes]]) -> None:
        channel = self._channel(topic_name, channel_name)
        if channel is None or not entries:
            return
        channel.stage(entries_items(entries, self.nsqd.now_ns()))
        skips.compact(channel)

    # -- the stream ----------------------------------------------------------------------

    def publish(self, topic_name: str, records: list[bytes], delay: float = 0.0) -> None:
        """PUB and DPUB: the records as the primary stored them (ID, timestamp, attempts)."""
        existing = self.nsqd.topics.get(topic_name)
        topic = existing if existing is not None else self._new_topic(topic_name)
        items: list[Item]
        if delay:
            msgs = [Message.decode(r) for r in records]
            for m in msgs:
                m.deferred = delay
            items = list(msgs)
        else:
            items = list(records)
        topic.put_items(items, sum(map(len, records)) - MESSAGE_HEADER_LENGTH * len(records))

    def append_framed(self, topic_name: str, batch: FramedRecords) -> bool:
        """PUB, the fast way: while every channel of the topic keeps no more in
        memory (the primary's consumers are behind, or there are none), the
        records are appended to each channel's disk queue as they came, one
        write each and nothing done per message. False when that is not so
        (memory has room, a retained log, bounds, a topic paused or without
        channels, durable mode...): the caller publishes them one by one."""
        existing = self.nsqd.topics.get(topic_name)
        topic = existing if existing is not None else self._new_topic(topic_name)
        if topic.exiting or topic.retained is not None or topic._bounded or not topic.flowing():
            return False
        channels = list(topic.channels.values())
        backends: list[DiskQueue] = []
        for channel in channels:
            backend = channel.backend
            if (
                channel.exiting
                or channel._mem_bytes
                or len(channel.memory) < channel._mem_size
                or not isinstance(backend, DiskQueue)
                or backend.acked
                or not backend.takes_framed(batch)
            ):
                return False
            backends.append(backend)
        ctx = self.nsqd
        written: list[tuple[DiskQueue, object]] = []
        for channel, backend in zip(channels, backends, strict=True):
            try:
                written.append((backend, backend.put_framed(batch)))
            except Exception as e:
                for done, mark in reversed(written):
                    done.unput(mark)
                ctx.set_health(e)
                ctx.log.error(channel.write_error, name=channel.name, err=e)
                raise
        if ctx.health_error is not None:
            ctx.set_health(None)
        n = batch.count
        for channel in channels:
            channel.message_count += n
        topic.message_count += n
        topic.message_bytes += len(batch.data) - (4 + MESSAGE_HEADER_LENGTH) * n
        return True

    def finish(self, topic_name: str, channel_name: str, ids: Sequence[bytes]) -> None:
        channel = self._channel(topic_name, channel_name)
        if channel is not None:
            skips.skip(channel, ids)

    def requeue(self, topic_name: str, channel_name: str, delay: float, record: bytes) -> None:
        channel = self._channel(topic_name, channel_name)
        if channel is not None:
            skips.supersede(channel, Message.decode(record), delay)

    def control(self, doc: dict[str, Any]) -> None:
        """A CTRL operation: ``{"op": ..., "topic": ..., "channel": ..., ...}``."""
        nsqd = self.nsqd
        op, topic_name, channel_name = doc.get("op"), doc.get("topic"), doc.get("channel")
        if not isinstance(topic_name, str) or not is_valid_topic_name(topic_name):
            return
        if op == "topic_create":
            created = nsqd.get_topic(topic_name, replicated=True)
            if doc.get("started") and not created.started:
                created.start()
            return
        topic = nsqd.topics.get(topic_name)
        if topic is None:
            return
        if op == "topic_delete":
            nsqd.delete_existing_topic(topic_name)
        elif op == "topic_start":
            if not topic.started:
                topic.start()
        elif op == "topic_pause":
            topic.pause()
        elif op == "topic_unpause":
            topic.unpause()
        elif op == "topic_empty":
            topic.empty()
        elif op == "settings" and channel_name is None:
            topic.own_settings = self._settings(doc.get("settings"), topic_name)
            topic.apply_policies()
            nsqd.metadata_changed(topic_name)
        elif op == "retained_delete":
            self.retained_delete(topic, doc)
        elif op == "rewind" and isinstance(channel_name, str):
            self.rewind(topic, channel_name, doc.get("state"))
        elif isinstance(channel_name, str) and is_valid_channel_name(channel_name):
            self._channel_control(topic, channel_name, op, doc)

    def _channel_control(self, topic: Topic, name: str, op: Any, doc: dict[str, Any]) -> None:
        if op == "channel_create":
            topic.get_channel(name, replicated=True)
            return
        channel = topic.channels.get(name)
        if channel is None:
            return
        if op == "channel_delete":
            topic.delete_existing_channel(name)
        elif op == "channel_pause":
            channel.pause()
        elif op == "channel_unpause":
            channel.unpause()
        elif op == "channel_empty":
            channel.empty()
        elif op == "settings":
            channel.own_settings = self._settings(doc.get("settings"), f"{topic.name}:{name}")
            topic.apply_policies()
            self.nsqd.metadata_changed(topic.name)

    # -- helpers ------------------------------------------------------------------------

    def _new_topic(self, name: str) -> Topic:
        topic = self.nsqd.get_topic(name, replicated=True)
        topic.start()
        return topic

    def _channel(self, topic_name: str, channel_name: str) -> Channel | None:
        topic = self.nsqd.topics.get(topic_name)
        return topic.channels.get(channel_name) if topic is not None else None

    def _settings(self, doc: Any, where: str) -> dict[str, Any]:
        if not doc:
            return {}
        try:
            return {k: v for k, v in parse_settings(doc).items() if v is not None}
        except SettingsError as e:
            self.nsqd.log.warn("REPLICATION: ignoring the settings of {where} - {err}", where=where, err=e)
            return {}
