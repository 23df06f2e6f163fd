"""The data file a disk queue reads and the one it writes, each open by number.

Reads go through a read-ahead buffer (one ``pread`` of up to 1 MiB serves many
records); writes are ``pwrite`` at the queue's write position.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from nsqd_tw.storage.layout import QueueFiles

READ_CHUNK = 1 << 20


class RecordReader:
    """The data file being read: its number, the bytes readable in it, a buffer."""

    def __init__(self, chunk: int = READ_CHUNK) -> None:
        """``chunk``: the most one ``pread`` reads ahead."""
        self.fd: int | None = None
        self.num = -1
        self.limit = 0  # bytes readable in the open file
        self._chunk = chunk
        self._buf = b""
        self._buf_start = 0

    def open(self, path: str, num: int, limit: int | None) -> bool:
        """Open data file ``num``, readable to ``limit`` (None: its size); False if
        there is no such file."""
        self.close()
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        self.num = num
        self._buf = b""
        self._buf_start = 0
        self.limit = os.fstat(self.fd).st_size if limit is None else limit
        return True

    def read_at(self, pos: int, n: int) -> bytes:
        start = pos - self._buf_start
        if 0 <= start and start + n <= len(self._buf):
            return self._buf[start : start + n]
        want = max(n, min(self._chunk, self.limit - pos))
        assert self.fd is not None
        self._buf = os.pread(self.fd, want, pos)
        self._buf_start = pos
        return self._buf[:n]

    def buffered(self, num: int, pos: int, n: int) -> bytes | None:
        """``n`` bytes at ``pos`` of file ``num`` if the buffer holds them (no I/O)."""
        start = pos - self._buf_start
        if self.num != num or start < 0 or start + n > len(self._buf):
            return None
        return self._buf[start : start + n]

    def window(self) -> tuple[bytes, int]:
        """The read-ahead buffer and the file offset it starts at."""
        return self._buf, self._buf_start

    def drop_buffer(self) -> None:
        self._buf = b""

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            self.num = -1
            self._buf = b""


class RecordWriter:
    """The data file being written, opened (created if need be) when a write goes
    to another number; the file it replaces is handed to ``retire`` (the next
    sync fsyncs and closes it)."""

    def __init__(self, files: QueueFiles, retire: Callable[[int], None]) -> None:
        self.files = files
        self._retire = retire
        self.fd: int | None = None
        self.num = -1

    def write(self, num: int, offset: int, data: bytes) -> None:
        if self.fd is None or self.num != num:
            self.retire()
            fn = self.files.data_file(num)
            self.fd = os.open(fn, os.O_RDWR | os.O_CREAT, 0o600)
            self.num = num
            self.files.log.info("DISKQUEUE({name}): writeOne() opened {fn}", name=self.files.name, fn=fn)
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, offset)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            view = view[n:]
            offset += n

    def retire(self) -> None:
        if self.fd is not None:
            self._retire(self.fd)
            self.fd = None
            self.num = -1

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            self.num = -1
