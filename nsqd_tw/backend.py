"""The BackendQueue seam: where a topic or channel puts what memory can't hold.

Records are opaque bytes (an encoded :class:`~nsqd_tw.message.Message`). A
backend is used from the reactor thread only.

Implementations here:

- :class:`MemoryBackendQueue`: TEMPORARY stand-in used until the disk queue
  lands. It keeps records in memory, so they survive nothing but the
  process; it never drops a record.
- :class:`DummyBackendQueue`: for ephemeral topics and channels, which by
  design drop what overflows their memory queue (as Go nsqd does).
"""

from __future__ import annotations

from collections import deque

from zope.interface import Interface, implementer


class IBackendQueue(Interface):
    """Go nsqd's BackendQueue, in pull form for a single-threaded reactor."""

    def put(data: bytes) -> None:
        """Append one record. Raise an exception if it could not be stored."""

    def get() -> bytes | None:
        """Remove and return the oldest record, or ``None`` if there is none."""

    def depth() -> int:
        """The number of records held."""

    def empty() -> None:
        """Drop every record."""

    def delete() -> None:
        """Drop every record and whatever storage backs them; the queue is done."""

    def close() -> None:
        """Release resources, keeping the records for the next start."""


@implementer(IBackendQueue)
class MemoryBackendQueue:
    def __init__(self, name: str) -> None:
        self.name = name
        self._records: deque[bytes] = deque()

    def put(self, data: bytes) -> None:
        self._records.append(data)

    def get(self) -> bytes | None:
        return self._records.popleft() if self._records else None

    def depth(self) -> int:
        return len(self._records)

    def empty(self) -> None:
        self._records.clear()

    def delete(self) -> None:
        self._records.clear()

    def close(self) -> None:
        pass


@implementer(IBackendQueue)
class DummyBackendQueue:
    def __init__(self, name: str = "") -> None:
        self.name = name

    def put(self, data: bytes) -> None:
        pass

    def get(self) -> bytes | None:
        return None

    def depth(self) -> int:
        return 0

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass
