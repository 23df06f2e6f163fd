"""The BackendQueue seam: where a topic or channel puts what memory can't hold.

Records are opaque bytes (an encoded :class:`~nsqd_tw.core.message.Message`). A
backend is used from the reactor thread only.

Implementations:

- :class:`nsqd_tw.storage.diskqueue.DiskQueue`: go-diskqueue's files (the default);
- :class:`MemoryBackendQueue`: records kept in memory (for tests, and for
  embedders who want no disk at all); it never drops a record;
- :class:`DummyBackendQueue`: for ephemeral topics and channels, which by
  design drop what overflows their memory queue (as Go nsqd does).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice

from zope.interface import Attribute, Interface, implementer

from nsq_wire.message import TIMESTAMP
from nsqd_tw.storage.snapshot import ListSnapshot


class IBackendQueue(Interface):
    """Go nsqd's BackendQueue, in pull form for a single-threaded reactor."""

    acked = Attribute("True if records read stay owned until done() (durable mode)")
    spilling = Attribute(
        "Optional (beyond Go): True while every record put should go here rather than to memory "
        "(a retained topic's backlog kept as runs of its log, nsqd_tw.storage.spill)"
    )

    def put(data: bytes) -> None:
        """Append one record. Raise an exception if it could not be stored."""

    def put_many(records: Sequence[bytes]) -> object:
        """Append records in order, in one write where possible: all of them, or
        (raising) none. Return a mark for unput()."""

    def unput(mark: object) -> None:
        """Take back the records of the put_many that returned ``mark`` and
        everything put since (none of them read yet), as if never put."""

    def get() -> bytes | None:
        """Remove and return the oldest record, or ``None`` if there is none."""

    def read() -> tuple[bytes, object | None] | None:
        """Like get(), with a token to pass to done() in acknowledged mode."""

    def done(token: object | None) -> None:
        """The message read with ``token`` is finished: its record may go."""

    def release_files() -> None:
        """Nothing is queued: give back the storage that held what was read."""

    def set_deferred(msg_id: bytes, deliver_at_ns: int) -> None:
        """Remember the deliver-at time of a deferred message put in this queue."""

    def take_deferred(msg_id: bytes) -> int | None:
        """The deliver-at time remembered for ``msg_id`` (forgotten once taken)."""

    def depth() -> int:
        """The number of records held."""

    def peek(n: int, max_bytes: int | None = None) -> list[bytes]:
        """Up to ``n`` of the oldest records, in order, none of them taken
        (for inspection; a backend without it shows none). With ``max_bytes``,
        no more records than total at most that many bytes, each read only if it
        fits; a first record alone over it comes cut to its first ``max_bytes``
        bytes, as a :class:`CutRecord` (read no further: a peek holds no more
        than its bound). A backend written before ``max_bytes`` is called
        without it (see docs/extending.md)."""

    def head() -> bytes | None:
        """The oldest record, not taken (``None``: none); optional, cheap where it
        can be (a replication standby's channel looks at it after every batch)."""

    def snapshot() -> object:
        """Optional (beyond Go, replication): the records held now, readable later
        a chunk at a time (a :class:`~nsqd_tw.storage.snapshot.QueueSnapshot`)."""

    def head_timestamp() -> int | None:
        """The message timestamp (ns) of the oldest record, ``None`` if there is
        none; called for every ``/stats``, so it must be cheap (a backend
        without it counts as empty in ``oldest_message_age_ms``)."""

    def empty() -> None:
        """Drop every record."""

    def delete() -> None:
        """Drop every record and whatever storage backs them; the queue is done."""

    def close() -> None:
        """Release resources, keeping the records for the next start."""


class CutRecord(bytes):
    """The first bytes of a record that alone passes a peek's ``max_bytes``;
    ``size``: the whole record's."""

    size: int

    def __new__(cls, data: bytes, size: int) -> CutRecord:
        cut = super().__new__(cls, data)
        cut.size = size
        return cut


def take_bounded(records: Iterable[bytes], max_bytes: int | None) -> list[bytes]:
    """``records`` in order while they total at most ``max_bytes`` (None: all of
    them); the first, alone over it, cut (a peek's bound, for records held in memory)."""
    if max_bytes is None:
        return list(records)
    out: list[bytes] = []
    total = 0
    for record in records:
        total += len(record)
        if total > max_bytes:
            if not out:
                out.append(CutRecord(record[:max_bytes], len(record)))
            break
        out.append(record)
    return out


class _NoAcks:
    acked = False
    spilling = False  # see nsqd_tw.storage.spill

    def put_many(self, records: Sequence[bytes]) -> object:
        mark = self.depth()  # type: ignore[attr-defined]
        for data in records:
            self.put(data)  # type: ignore[attr-defined]
        return mark

    def unput(self, mark: object) -> None:
        pass

    def read(self) -> tuple[bytes, object | None] | None:
        data = self.get()  # type: ignore[attr-defined]
        return None if data is None else (data, None)

    def done(self, token: object | None) -> None:
        pass

    def release_files(self) -> None:
        pass


@implementer(IBackendQueue)
class MemoryBackendQueue(_NoAcks):
    def __init__(self, name: str) -> None:
        self.name = name
        self._records: deque[bytes] = deque()
        self._deferred_at: dict[bytes, int] = {}

    def put(self, data: bytes) -> None:
        self._records.append(data)

    def unput(self, mark: object) -> None:
        assert isinstance(mark, int)
        while len(self._records) > mark:
            self._records.pop()

    def get(self) -> bytes | None:
        return self._records.popleft() if self._records else None

    def peek(self, n: int, max_bytes: int | None = None) -> list[bytes]:
        return take_bounded(islice(self._records, max(n, 0)), max_bytes)

    def head(self) -> bytes | None:
        return self._records[0] if self._records else None

    def snapshot(self) -> ListSnapshot:
        return ListSnapshot(self._records, dict(self._deferred_at))

    def head_timestamp(self) -> int | None:
        return int(TIMESTAMP.unpack_from(self._records[0])[0]) if self._records else None

    def set_deferred(self, msg_id: bytes, deliver_at_ns: int) -> None:
        self._deferred_at[msg_id] = deliver_at_ns

    def take_deferred(self, msg_id: bytes) -> int | None:
        return self._deferred_at.pop(msg_id, None) if self._deferred_at else None

    def depth(self) -> int:
        return len(self._records)

    def empty(self) -> None:
        self._records.clear()
        self._deferred_at.clear()

    def delete(self) -> None:
        self.empty()

    def close(self) -> None:
        pass


@implementer(IBackendQueue)
class DummyBackendQueue(_NoAcks):
    def __init__(self, name: str = "") -> None:
        self.name = name

    def set_deferred(self, msg_id: bytes, deliver_at_ns: int) -> None:
        pass

    def take_deferred(self, msg_id: bytes) -> int | None:
        return None

    def put(self, data: bytes) -> None:
        pass

    def get(self) -> bytes | None:
        return None

    def peek(self, n: int, max_bytes: int | None = None) -> list[bytes]:
        return []

    def head(self) -> bytes | None:
        return None

    def snapshot(self) -> ListSnapshot:
        return ListSnapshot(())

    def head_timestamp(self) -> int | None:
        return None

    def depth(self) -> int:
        return 0

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass
