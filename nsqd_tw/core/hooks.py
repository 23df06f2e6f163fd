"""What the layers above the core hook into the NSQD, which imports none of them.

The core never imports the TCP, HTTP, lookup or replication code
(docs/architecture.md): they plug in here, in :class:`Hooks`, the NSQD's base
class. Observers are told of the topics and channels created and deleted (the
lookupd peers' REGISTER and UNREGISTER, replication), of the options changed at
run time (PUT /config) and of the queues closed at stop. The channel source
(the lookupd peers) names the channels a new topic must have before its
messages flow: as Go's GetTopic does, they are created before the topic starts,
and the command that made the topic is answered only then (:meth:`Hooks.topic_ready`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.python.failure import Failure

from nsq_wire.names import is_valid_channel_name

if TYPE_CHECKING:
    from nsqd_tw.core.channel import Channel
    from nsqd_tw.core.topic import Topic


class Hooks:
    """The NSQD's hooks for the layers above it (see the module's docstring)."""

    if TYPE_CHECKING:  # the NSQD's
        log: Any
        topics: dict[str, Topic]

        def get_topic(self, name: str, replicated: bool = False) -> Topic: ...

    def __init__(self) -> None:
        # who is told of changes (see observe_changes, observe_options, set_channel_source)
        self._change_observers: list[Callable[[str, Topic | Channel], None]] = []
        self._option_observers: list[Callable[[str], None]] = []
        self._closed_observers: list[Callable[[bool], None]] = []
        self._channel_source: Callable[[str], defer.Deferred[list[str]] | None] | None = None
        # topics waiting for their channels from the lookupds, and who waits for their start
        self._starting: dict[Topic, list[defer.Deferred[None]]] = {}

    # -- observers ----------------------------------------------------------

    def observe_changes(self, observer: Callable[[str, Topic | Channel], None]) -> None:
        """Call ``observer(what, obj)`` when a topic or channel is created or deleted
        (``topic_created``, ``topic_deleted``, ``channel_created``, ``channel_deleted``)."""
        self._change_observers.append(observer)

    def observe_options(self, observer: Callable[[str], None]) -> None:
        """Call ``observer(name)`` when an option changes at run time (PUT /config)."""
        self._option_observers.append(observer)

    def observe_closed(self, observer: Callable[[bool], None]) -> None:
        """Call ``observer(clean)`` once the queues are closed at stop (``clean``:
        everything they held was written)."""
        self._closed_observers.append(observer)

    def set_channel_source(self, source: Callable[[str], defer.Deferred[list[str]] | None]) -> None:
        """``source(topic)`` names the channels a new topic must have before its
        messages flow (nsqlookupd knows them), or None; messages published
        meanwhile are held by the topic."""
        self._channel_source = source

    def options_changed(self, name: str) -> None:
        """An option changed at run time (PUT /config/...): tell the observers."""
        for observer in self._option_observers:
            try:
                observer(name)
            except Exception:
                self.log.failure("option observer failed for {name}", name=name)

    # -- a new topic's channels ---------------------------------------------

    def _start_topic(self, topic: Topic) -> None:
        """Start a topic just created: at once, or once the channel source's
        channels for it exist (messages published meanwhile are held by the topic)."""
        name = topic.name
        query = self._channel_source(name) if self._channel_source is not None else None
        if query is None:
            topic.start()
            return

        # messages published meanwhile are held by the topic, not lost
        self._starting[topic] = []

        def create(channels: list[str]) -> None:
            if self.topics.get(name) is not topic or topic.exiting:
                return
            for channel in channels:
                if is_valid_channel_name(channel) and not channel.endswith("#ephemeral"):
                    # what the cluster has (for a topic made before a drain began) is no new channel
                    topic.get_channel(channel, while_draining=True)

        def start(result: Any) -> Any:
            if isinstance(result, Failure):
                self.log.failure("failed to pre-create channels for topic {name}", result, name=name)
            if not topic.exiting:
                topic.start()
            for waiter in self._starting.pop(topic, ()):
                waiter.callback(None)

        query.addCallback(create).addBoth(start)

    def topic_ready(self, name: str) -> defer.Deferred[None] | None:
        """Create the topic if it does not exist (as ``get_topic``); a Deferred
        that fires once it has started if this call created it and it waits for the
        lookupds' channels, else None.

        Go's GetTopic returns only then, so the command that creates a topic is
        answered after the topic's channels exist and its messages flow: a client
        that publishes and then subscribes finds them flowing. Other commands
        meanwhile do not wait (their messages are held by the topic), as in Go.
        """
        if name in self.topics:
            return None
        topic = self.get_topic(name)
        waiters = self._starting.get(topic)
        if waiters is None:
            return None
        d: defer.Deferred[None] = defer.Deferred()
        waiters.append(d)
        return d
