"""The data file a disk queue reads and the one it writes, each open by number.

Reads go through a read-ahead buffer (one ``pread`` of up to 1 MiB serves many
records); writes are ``pwrite`` at the queue's write position, of the records
framed here (each after its 4-byte size) in one piece.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any, Protocol

try:
    import cython
except ModuleNotFoundError:
    from nsq_wire import cython_shim as cython

if cython.compiled:  # the C API framed() writes a batch with
    from cython.cimports.cpython.bytes import PyBytes_AS_STRING, PyBytes_FromStringAndSize  # type: ignore
    from cython.cimports.libc.string import memcpy  # type: ignore

READ_CHUNK = 1 << 20
# a record's size in the data file, before it: 4 bytes, big-endian (go-diskqueue's int32)
RECORD_SIZE = struct.Struct(">i")


class SizePrefixes(dict[int, bytes]):
    """Record size -> its 4-byte prefix, made once per size (a lookup costs half a
    pack); at most 4,096 sizes kept, then it starts over."""

    def __missing__(self, size: int) -> bytes:
        if len(self) >= 4096:
            self.clear()
        prefix = self[size] = RECORD_SIZE.pack(size)
        return prefix


_prefixes = SizePrefixes()


def _framed(records: Sequence[bytes]) -> bytes:
    pieces: list[Any] = [None] * (2 * len(records))
    pieces[0::2] = list(map(_prefixes.__getitem__, map(len, records)))
    pieces[1::2] = records
    return b"".join(pieces)


@cython.locals(
    k=cython.Py_ssize_t,
    count=cython.Py_ssize_t,
    n=cython.Py_ssize_t,
    total=cython.Py_ssize_t,
    p=cython.p_uchar,
    out=bytes,
    r=bytes,
)
def framed(records: Sequence[bytes]) -> bytes:
    """The records as a data file holds them, each after its 4-byte size.

    Compiled, one pass sizes the batch and one writes it, size and bytes, into
    the result (no prefix object or list of pieces per record); other shapes
    (not a list or tuple of bytes) take the pure path."""
    if not cython.compiled or (type(records) is not list and type(records) is not tuple):
        return _framed(records)
    count = len(records)
    total = 0
    for k in range(count):
        o = records[k]
        if type(o) is not bytes:
            return _framed(records)
        total += 4 + len(o)
    out = PyBytes_FromStringAndSize(cython.NULL, total)
    p = cython.cast(cython.p_uchar, PyBytes_AS_STRING(out))
    for k in range(count):
        r = records[k]
        n = len(r)
        if n > 0x7FFF_FFFF:
            raise struct.error("'i' format requires -2147483648 <= number <= 2147483647")
        p[0] = (n >> 24) & 0xFF
        p[1] = (n >> 16) & 0xFF
        p[2] = (n >> 8) & 0xFF
        p[3] = n & 0xFF
        memcpy(p + 4, PyBytes_AS_STRING(r), n)
        p += 4 + n
    return out


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


class WrittenFiles(Protocol):
    """What a :class:`RecordWriter` needs of its queue's files (a
    :class:`~nsqd_tw.storage.layout.QueueFiles`, which imports this module)."""

    name: str
    log: Any

    def data_file(self, num: int) -> str: ...


class RecordWriter:
    """The data file being written, opened (created if need be) when a write goes
    to another number; the file it replaces is handed to ``retire`` (the next
    sync fsyncs and closes it)."""

    def __init__(self, files: WrittenFiles, retire: Callable[[int], None]) -> None:
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
