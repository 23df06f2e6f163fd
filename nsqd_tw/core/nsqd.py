"""NSQD: the topics, the clients, health, the queue scan, the metadata, as Go's nsqd/nsqd.go.

One reactor thread owns all of it. Time and scheduling come from the injected
reactor (any ``IReactorTime``), so tests drive it with ``task.Clock``.

What Go's nsqd does not have lives in a module of its own, which the NSQD, its
topics and channels reach through an attribute named for it: ``stores``
(core/stores.py: the queues' backends, durable mode, what a stop could not
write), ``drain`` (core/drain.py), ``shipper`` and ``standby`` (core/roles.py:
replication), ``expiry``, ``dead_letters``, ``retention`` (core/expiry.py,
core/deadletters.py, core/retention.py). The layers above hook in through its
base class (core/hooks.py).
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable
from typing import Any, Protocol

from twisted.application import service
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime

from nsq_service.limits import RateLimitedLog
from nsq_service.log import LogGate
from nsq_service.options import StartError
from nsq_wire.message import numbered_records
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name
from nsq_wire.version import version_string
from nsqd_tw.core.channel import Channel
from nsqd_tw.core.deadletters import DeadLetters
from nsqd_tw.core.drain import Drain, on_sigterm, start_drain
from nsqd_tw.core.expiry import ExpirySweep
from nsqd_tw.core.guid import GUIDFactory
from nsqd_tw.core.hooks import Hooks
from nsqd_tw.core.message import Message
from nsqd_tw.core.metadata import (
    METADATA_FILE,
    DirLock,
    MetadataError,
    MetadataSnapshot,
    read_metadata,
)
from nsqd_tw.core.queue import Item
from nsqd_tw.core.retention import Retention
from nsqd_tw.core.roles import Shipper, refuse_unshipped, set_standby, shipped
from nsqd_tw.core.settings import defaults_from_options, loaded_settings
from nsqd_tw.core.stores import QueueStores
from nsqd_tw.core.topic import DrainingError, StandbyError, Topic, TopicError
from nsqd_tw.options import NSQDOptions
from nsqd_tw.storage.backend import DummyBackendQueue, IBackendQueue, MemoryBackendQueue
from nsqd_tw.storage.budget import DiskBudget
from nsqd_tw.storage.files import write_atomic
from nsqd_tw.storage.layout import DataDirectory
from nsqd_tw.storage.syncer import Syncer


class Client(Protocol):
    """A connected client as the core sees it (the TCP side's client)."""

    id: int
    pub_counts: dict[str, int]

    def shutdown(self) -> None:
        """nsqd is stopping: give back what it holds and close."""


BackendFactory = Callable[[str, bool], IBackendQueue]


def memory_backend_factory(name: str, ephemeral: bool) -> IBackendQueue:
    """Keep overflow in memory (tests, and embedders who want no disk)."""
    if ephemeral:
        return DummyBackendQueue(name)
    return MemoryBackendQueue(name)


class NSQD(Hooks, service.Service):
    """The core nsqd service. Its parent starts it first and stops it last. What
    the layers above hook into it (observers, the lookupds' channels of a new
    topic) is its base class's, :class:`~nsqd_tw.core.hooks.Hooks`."""

    name = "nsqd"

    def __init__(
        self,
        opts: NSQDOptions,
        reactor: IReactorTime | None = None,
        backend_factory: BackendFactory | None = None,
        run_blocking: Callable[[Callable[[], None]], defer.Deferred[None]] | None = None,
    ) -> None:
        """``backend_factory(name, ephemeral)`` replaces the disk queues (and then
        nothing is written to the data path); ``run_blocking`` runs fsyncs (a
        thread by default)."""
        if reactor is None:
            from twisted.internet import reactor as _reactor

            reactor = _reactor  # type: ignore[assignment]
        Hooks.__init__(self)
        self.opts = opts
        # this server's --log-level: what it creates logs through loggers of this gate
        self.log_gate = LogGate(opts.log_level)
        self.log = self.log_gate.logger("nsqd_tw.core.nsqd", self)
        self.reactor: Any = reactor
        self.backend_factory = backend_factory
        self.data_path = opts.data_path or os.getcwd()
        # durable mode: every message on disk, fsynced before OK, owned until FIN
        self.durable = backend_factory is None and opts.mem_queue_size == 0 and opts.sync_every <= 1
        # how the queues are stored (their backends), what they share, what a stop could not write
        self.stores = QueueStores(self)
        self.syncer = Syncer(reactor, run_blocking, self.stores.sync_result)
        self.disk_budget = DiskBudget(opts.max_disk_bytes)
        self.dirlock = DirLock(self.data_path)
        self.data_dir = DataDirectory(opts.data_path)
        self.guid = GUIDFactory(opts.node_id, self.now_ns)
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, Client] = {}
        self._client_seq = 0
        self.health_error: BaseException | None = None
        self.start_time = self.now()
        self.loading = False
        self.metadata_loaded = False  # only the process that loaded nsqd.dat may write it
        self.exit_code = 0  # 1 once stopped if a queue could not write what it held

        self.drain: Drain | None = None
        # how nsqd stops its process (a drain's end, PUT /config/shutdown): makeService
        # sets the top service's; by default this service alone stops
        self.request_stop: Callable[[], None] = self._stop_alone

        self._metadata = MetadataSnapshot()
        # beyond Go: the flags' settings, under every queue's own; the queues with a TTL
        self.settings_defaults = defaults_from_options(opts)
        self.expiry = ExpirySweep(self)
        self.queue_events = RateLimitedLog(self.reactor, self.log)
        self.dead_letters = DeadLetters(self)
        self._scan_channels: list[Channel] | None = None
        self._scan_refresh_at = 0.0
        # beyond Go: the retained logs and the rewinds; a full disk budget deletes retained segments first
        self.retention = Retention(self)
        self.disk_budget.reclaim = self.retention.reclaim_retained

        # beyond Go, replication (nsqd_tw.replication): a primary's shipper (None: no
        # replica), a standby's refusal (None: not a standby), the service for HTTP
        self.shipper: Shipper | None = None
        self.standby: StandbyError | None = None
        self.replication: Any = None

    # -- time and scheduling --------------------------------------------

    def now(self) -> float:
        return float(self.reactor.seconds())

    def now_ns(self) -> int:
        return int(self.reactor.seconds() * 1_000_000_000)

    def schedule(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the next reactor turn."""
        self.reactor.callLater(0, fn)

    # -- health -----------------------------------------------------------

    def set_health(self, err: BaseException | None) -> None:
        self.health_error = err

    def is_healthy(self) -> bool:
        return self.health_error is None

    def get_health(self) -> str:
        if self.health_error is not None:
            return f"NOK - {self.health_error}"
        return "OK"

    # -- draining (beyond Go) -------------------------------------------

    @property
    def draining(self) -> bool:
        return self.drain is not None

    def sigterm(self) -> bool:
        """SIGTERM arrived: True when nsqd takes it itself (:func:`nsqd_tw.core.drain.on_sigterm`)."""
        return on_sigterm(self)

    def start_drain(self, why: str) -> None:
        """Refuse new messages, topics and channels; stop once every queue is
        empty (:func:`nsqd_tw.core.drain.start_drain`). A drain cannot be undone."""
        start_drain(self, why)

    def _stop_alone(self) -> None:
        if self.running:
            self.stopService()

    # -- beyond Go: replication ---------------------------------------------

    def set_standby(self, refusal: StandbyError | None) -> None:
        """Refuse producers and consumers as a replication standby, or serve (None):
        :func:`nsqd_tw.core.roles.set_standby`."""
        set_standby(self, refusal)

    # -- clients ----------------------------------------------------------

    def add_client(self, client: Client) -> int:
        self._client_seq += 1
        self.clients[self._client_seq] = client
        return self._client_seq

    def remove_client(self, client_id: int) -> None:
        self.clients.pop(client_id, None)

    # -- topics and channels ----------------------------------------------

    def get_topic(self, name: str, replicated: bool = False) -> Topic:
        """The topic, created (and started) if it does not exist; a standby creates
        one only from its primary (``replicated``, and then it is not started)."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        if not replicated:
            if self.standby is not None:
                raise self.standby
            if self.drain is not None:
                raise DrainingError()
        topic = Topic(name, self)
        topic.apply_policies()
        self.topics[name] = topic
        self.log.info("TOPIC({name}): created", name=name)
        self._changed("topic_created", topic)
        if self.loading or replicated:
            return topic  # started once its channels are loaded (or its primary's topic starts)
        self._start_topic(topic)  # once the lookupds' channels for it exist, as Go's GetTopic
        return topic

    def publish(self, topic_name: str, bodies: list[bytes], delay: float = 0.0) -> defer.Deferred[None] | None:
        """Publish message bodies to a topic (created if needed): :meth:`publish_to`
        for a name not checked yet (raises :class:`TopicError` for an invalid one)."""
        if not is_valid_topic_name(topic_name):
            raise TopicError(f"invalid topic name {topic_name!r}")
        return self.publish_to(self.get_topic(topic_name), bodies, delay)

    def publish_to(self, topic: Topic, bodies: list[bytes], delay: float = 0.0) -> defer.Deferred[None] | None:
        """Publish message bodies to a topic, as PUB/MPUB/DPUB do.

        ``delay`` (seconds) defers delivery like DPUB. Raises :class:`TopicError`
        for a topic being deleted, :class:`DrainingError` while nsqd drains, or
        the backend's error (then nothing of the batch is stored). In durable
        mode returns a Deferred that fires once the messages are fsynced (answer
        OK then); otherwise ``None``: they are stored already.
        """
        if self.drain is not None:
            raise DrainingError()
        if self.standby is not None:
            raise self.standby
        shipper = self.shipper
        if shipper is not None:
            refuse_unshipped(shipper)
        ts = self.now_ns()
        items: list[Item]
        if delay:
            deferred = list(map(Message, self.guid.new_ids(len(bodies)), bodies, [ts] * len(bodies)))
            for msg in deferred:
                msg.deferred = delay
            items = list(deferred)
        else:  # queued as they will be stored: no Message yet (nor an ID object)
            items = numbered_records(self.guid.new_id_runs(len(bodies)), bodies, ts)
        topic.put_items(items, sum(map(len, bodies)))
        if shipper is not None and not topic.ephemeral:
            return shipped(shipper, topic, items, self.syncer.commit if self.durable else None)
        if self.durable and not topic.ephemeral:
            return self.syncer.commit()
        return None

    def get_existing_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError("topic does not exist")
        return topic

    def delete_existing_topic(self, name: str, keep_retained: bool = False) -> None:
        """``keep_retained``: its retained log is closed, not deleted (a standby's
        snapshot: see Retention.keep_retained)."""
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError("topic does not exist")
        topic.exiting = True
        self._changed("topic_deleted", topic)  # as Go: the topic's UNREGISTER, then its channels'
        topic.delete(keep_retained)
        del self.topics[name]
        self.expiry.forget(topic)
        self.dead_letters.forget_topic(name)
        self._scan_channels = None

    def channels(self) -> list[Channel]:
        return [c for t in self.topics.values() for c in t.channels.values()]

    # callbacks from topics and channels
    def channel_created(self, channel: Channel) -> None:
        if self._scan_channels is not None:
            self._scan_channels.append(channel)  # not rebuilt: 10,000s of channels
        self._changed("channel_created", channel)

    def channel_deleted(self, channel: Channel) -> None:
        self._scan_channels = None
        self.expiry.forget(channel)
        self._changed("channel_deleted", channel)

    def channel_emptied(self, channel: Channel) -> None:
        """An ephemeral channel lost its last consumer: delete it."""
        topic = self.topics.get(channel.topic_name)
        if topic is not None and topic.channels.get(channel.name) is channel:
            topic.delete_existing_channel(channel.name)

    def topic_emptied(self, topic: Topic) -> None:
        """An ephemeral topic lost its last channel: delete it."""
        if self.topics.get(topic.name) is topic:
            self.delete_existing_topic(topic.name)

    def _changed(self, what: str, obj: Topic | Channel) -> None:
        if not obj.ephemeral:
            self.metadata_changed(obj.name if isinstance(obj, Topic) else obj.topic_name)
        for observer in self._change_observers:
            try:
                observer(what, obj)
            except Exception:
                self.log.failure("change observer failed for {what}", what=what)

    # -- queue scan -------------------------------------------------------

    def queue_scan(self) -> None:
        """One tick of the probabilistic scan of in-flight and deferred queues.

        Like Redis's key expiry (and Go nsqd): look at a random sample of
        ``--queue-scan-selection-count`` channels from a list refreshed every
        ``queue_scan_refresh_interval``; a channel with expired in-flight or due
        deferred messages is dirty; if more than ``queue_scan_dirty_percent``
        of the sample was dirty, sample again at once instead of sleeping.
        """
        try:
            now = self.now()
            channels = self._scan_channels
            if channels is None or now >= self._scan_refresh_at:
                channels = self._scan_channels = self.channels()
                self._scan_refresh_at = now + self.opts.queue_scan_refresh_interval
            self.expiry.tick(now)
            if self.retention.active:
                self.retention.check_retention(now)
            self.dead_letters.save(now)
            if not channels:
                return
            num = min(self.opts.queue_scan_selection_count, len(channels))
            if num <= 0:
                return
            while True:
                dirty = 0
                for channel in random.sample(channels, num):
                    if channel.process_queues(now):
                        dirty += 1
                if dirty / num <= self.opts.queue_scan_dirty_percent:
                    break
        except Exception:
            self.log.failure("QUEUESCAN: failed")

    # -- metadata -----------------------------------------------------------

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.opts.data_path, METADATA_FILE)

    def metadata(self) -> bytes:
        """nsqd.dat as it should be now."""
        return self._metadata.encode(self.topics.values())

    def metadata_changed(self, topic_name: str | None = None) -> None:
        """Persist nsqd.dat with the next sync (a durable commit waits for it);
        ``topic_name``: the topic whose entry changed (None: every one)."""
        self._metadata.changed(topic_name)
        if self.loading or not self.metadata_loaded or not self.running:
            return
        self.syncer.persist(self.metadata_path, self.metadata)

    def metadata_synced(self) -> defer.Deferred[None] | None:
        """A Deferred that fires once nsqd.dat (and every write so far) is on disk,
        or None when nothing is persisted (memory backends)."""
        if not self.metadata_loaded or not self.running:
            return None
        self.metadata_changed()
        return self.syncer.commit()

    def load_metadata(self) -> None:
        """Create the topics and channels of nsqd.dat, paused as they were."""
        self.loading = True
        rewinds: list[tuple[Channel, Any]] = []
        try:
            for t in read_metadata(self.metadata_path):
                if not is_valid_topic_name(t.name):
                    self.log.warn("skipping creation of invalid topic {name}", name=t.name)
                    continue
                topic = self.get_topic(t.name)
                topic.paused = t.paused
                topic.own_settings = loaded_settings(t.settings, t.name, self.log)
                topic.dropped_count = t.dropped
                for c in t.channels:
                    if not is_valid_channel_name(c.name):
                        self.log.warn("skipping creation of invalid channel {name}", name=c.name)
                        continue
                    channel = topic.get_channel(c.name)
                    channel.paused = c.paused
                    channel.own_settings = loaded_settings(c.settings, f"{t.name}:{c.name}", self.log)
                    channel.dropped_count = c.dropped
                    if c.rewind is not None:
                        rewinds.append((channel, c.rewind))
                topic.apply_policies()
        finally:
            self.loading = False
            self._metadata.changed(None)
        # beyond Go: the retained logs once every topic has its settings, then the rewinds
        for topic in list(self.topics.values()):
            try:
                topic.apply_retention()
            except OSError as e:
                self.log.error("TOPIC({name}): cannot open its retained log - {err}", name=topic.name, err=e)
        self.retention.resume_rewinds(rewinds)
        self.retention.warn_retained_left()
        for topic in self.topics.values():
            topic.apply_bounds()  # what came back after a crash, past a bound
            topic.start()

    def persist_metadata(self) -> None:
        self.log.info("NSQ: persisting topic/channel metadata to {path}", path=self.metadata_path)
        self._metadata.changed(None)  # every entry as it is now (counts kept beyond Go change unannounced)
        write_atomic(self.metadata_path, self.metadata())

    # -- service ----------------------------------------------------------

    def privilegedStartService(self) -> None:
        # Go's order: nsqd.New() logs, locks the data path and binds the listeners
        # (our listening services, started after this one); Start() then loads and
        # persists the metadata (startService). A failed start writes nothing.
        self.log.info("{version}", version=version_string("nsqd"))
        self.log.info("ID: {id}", id=self.opts.node_id)
        self._lock()
        service.Service.privilegedStartService(self)

    def _lock(self) -> None:
        if self.backend_factory is not None or self.dirlock.locked:
            return
        try:
            self.dirlock.lock()
        except MetadataError as e:
            raise StartError(f"failed to instantiate nsqd - {e}") from None

    def startService(self) -> None:
        if self.backend_factory is None:
            self._lock()
            try:
                self.load_metadata()
            except MetadataError as e:
                raise StartError(f"failed to load metadata - {e}") from None
            self.metadata_loaded = True  # from now on this process owns nsqd.dat
            self.dead_letters.load()
            self.stores.check_budget()
            try:
                self.persist_metadata()
            except OSError as e:
                if not (self.opts.replicated and e.errno in (errno.ENOSPC, errno.EDQUOT)):
                    raise StartError(f"failed to persist metadata - {e}") from None
                # beyond Go: a node of a replication pair starts on a full disk, to say it is not in sync
                self.log.error("failed to persist metadata - {err} (starting anyway: replication)", err=e)
        self.start_time = self.now()
        service.Service.startService(self)

    def stopService(self) -> defer.Deferred[None]:
        """Disconnect clients, let a running sync finish, then close every topic
        (each channel hands what it holds to its disk queue), persist, unlock."""
        service.Service.stopService(self)
        self.queue_events.stop()
        self.expiry.stop()
        if self.drain is not None:
            self.drain.cancel()
        self.disk_budget.enforcing = False  # what is held in memory goes to disk whatever it costs
        for client in list(self.clients.values()):
            client.shutdown()
        d = self.syncer.wait_idle()
        d.addCallback(lambda _: self._close_storage())
        return d

    def _close_storage(self) -> None:
        self.log.info("NSQ: closing topics")
        # after a drain, a queue left empty leaves no files (nsqd.dat still lists it)
        for topic in list(self.topics.values()):
            try:
                topic.close(retire_empty=self.draining)
            except Exception as e:
                self.stores.could_not_close(f"topic {topic.name}", e)
        if self.backend_factory is None:
            try:
                self.syncer.sync_all_now()
                if self.metadata_loaded:
                    self.persist_metadata()
                    self.dead_letters.save_now()
            except Exception as e:
                self.stores.stop_errors += 1
                self.log.error("failed to persist metadata - {err}", err=e)
        for observer in self._closed_observers:
            observer(not self.stores.stop_errors)
        if self.backend_factory is None:
            self.dirlock.unlock()
        self.exit_code = self.stores.exit_code()
        self.log.info("NSQ: bye")
