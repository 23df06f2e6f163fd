"""A queue's records as they were at one moment, read later a chunk at a time
(beyond Go: what a replication primary sends a standby that catches up).

The files of the range are opened when the snapshot is taken, so one the queue
finishes and removes meanwhile can still be read to its end.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from nsq_wire.message import ID_OFFSET, MESSAGE_HEADER_LENGTH
from nsqd_tw.storage.layout import RECORD_SIZE

CHUNK = 256 * 1024  # bytes read (and handed on) at a time


class QueueSnapshot:
    """Records of a queue between two positions, each with its deliver-at time
    (ns, 0 when none); :meth:`next` returns up to about ``max_bytes`` of them."""

    def take(self, max_bytes: int = CHUNK) -> list[tuple[int, bytes]]:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """Let the files go (the snapshot is abandoned, or read to its end)."""


class ListSnapshot(QueueSnapshot):
    """Records already in memory (a memory backend, a queue's memory)."""

    def __init__(self, records: Iterable[bytes], deferred: dict[bytes, int] | None = None) -> None:
        self._records = list(records)
        self._pos = 0
        self._deferred = deferred or {}

    def take(self, max_bytes: int = CHUNK) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        size = 0
        records, at = self._records, self._deferred
        while self._pos < len(records) and size < max_bytes:
            r = records[self._pos]
            self._pos += 1
            size += len(r)
            out.append((at.get(r[ID_OFFSET:MESSAGE_HEADER_LENGTH], 0) if at else 0, r))
        return out

    @property
    def done(self) -> bool:
        return self._pos >= len(self._records)

    def close(self) -> None:
        self._records = []
        self._pos = 0


class FileSnapshot(QueueSnapshot):
    """A disk queue's records from its read position to its write position,
    both as they were when taken; ``fds``: its data files, by number, opened then."""

    def __init__(
        self,
        fds: dict[int, int],
        start: tuple[int, int],
        end: tuple[int, int],
        deferred: dict[bytes, int],
        min_size: int,
        max_size: int,
    ) -> None:
        self._fds = fds
        self._num, self._pos = start
        self._end = end
        self._deferred = deferred
        self._min, self._max = min_size, max_size
        self._buf = b""
        self._buf_start = 0

    @property
    def done(self) -> bool:
        return (self._num, self._pos) >= self._end or not self._fds

    def take(self, max_bytes: int = CHUNK) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        size = 0
        at = self._deferred
        while size < max_bytes and not self.done:
            fd = self._fds.get(self._num)
            limit = self._end[1] if self._num == self._end[0] else None
            if fd is None:
                self._next_file()
                continue
            if limit is None:
                limit = os.fstat(fd).st_size
            if self._pos + 4 > limit:
                self._next_file()
                continue
            head = self._read(fd, self._pos, 4, limit)
            (n,) = RECORD_SIZE.unpack(head) if len(head) == 4 else (-1,)
            if n < self._min or n > self._max or self._pos + 4 + n > limit:
                self._next_file()  # not a record: what follows in this file cannot be found from here
                continue
            record = self._read(fd, self._pos + 4, n, limit)
            self._pos += 4 + n
            size += n
            out.append((at.get(record[ID_OFFSET:MESSAGE_HEADER_LENGTH], 0) if at else 0, record))
        if self.done:
            self.close()
        return out

    def _read(self, fd: int, pos: int, n: int, limit: int) -> bytes:
        start = pos - self._buf_start
        if 0 <= start and start + n <= len(self._buf):
            return self._buf[start : start + n]
        self._buf = os.pread(fd, max(n, min(CHUNK, limit - pos)), pos)
        self._buf_start = pos
        return self._buf[:n]

    def _next_file(self) -> None:
        fd = self._fds.pop(self._num, None)
        if fd is not None:
            os.close(fd)
        self._num += 1
        self._pos = 0
        self._buf = b""
        self._buf_start = 0
        if self._num > self._end[0]:
            self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
