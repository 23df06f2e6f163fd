"""A message as nsqd sends and stores it: ``[8-byte ns timestamp][2-byte attempts][16-byte ID][body]``.

The same bytes are a message frame's data and a disk-queue record, as in Go
nsqd. This module alone knows the layout: nsqd's Message takes its
``encode``/``frame`` methods from here, the clients decode with :func:`decode`,
the disk queue's recovery finds records with the offsets.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from nsq_wire.frames import FRAME_TYPE_MESSAGE

try:
    import cython
except ModuleNotFoundError:
    from nsq_wire import cython_shim as cython

if cython.compiled:  # the C API that the compiled frames() writes a burst with (and decode_fields reads a view)
    from cython.cimports.cpython.bytes import PyBytes_AS_STRING, PyBytes_FromStringAndSize  # type: ignore
    from cython.cimports.cpython.memoryview import PyMemoryView_GET_BUFFER  # type: ignore
    from cython.cimports.libc.string import memcpy  # type: ignore

MSG_ID_LENGTH = 16

T = TypeVar("T")


# the timestamp (8 bytes) and attempts (2) come first
ID_OFFSET = 10


MESSAGE_HEADER_LENGTH = ID_OFFSET + MSG_ID_LENGTH


# the timestamp alone, signed nanoseconds
TIMESTAMP = struct.Struct(">q")


_HEADER = struct.Struct(">qH16s")
# Go writes uint64/uint16: negative timestamps and attempts past 65535 wrap
_ENCODE_HEADER = struct.Struct(">QH")
# frame size, frame type, then the header up to the ID
_FRAME_HEADER = struct.Struct(">iiQH")
_U64 = 0xFFFF_FFFF_FFFF_FFFF


class Fields(Protocol):
    id: bytes
    body: bytes
    timestamp: int
    attempts: int


class MessageFields:
    """The fields this layout frames, as the base of a server's message class (nsqd's
    Message): compiled (setup.py), an extension type whose fields :func:`frames` reads
    as C struct members (message.pxd)."""

    __slots__ = ("attempts", "body", "id", "timestamp")

    id: bytes
    body: bytes
    timestamp: int
    attempts: int


def encode(m: Fields) -> bytes:
    """The message frame's data, and the disk-queue record."""
    return _ENCODE_HEADER.pack(m.timestamp & _U64, m.attempts & 0xFFFF) + m.id + m.body


def _records(ids: list[bytes], bodies: list[bytes], timestamp: int) -> list[bytes]:
    header = _ENCODE_HEADER.pack(timestamp & _U64, 0)
    return [header + i + b for i, b in zip(ids, bodies, strict=True)]


def records(ids: list[bytes], bodies: list[bytes], timestamp: int) -> list[bytes]:
    """The records of messages published together: one timestamp, no attempts yet."""
    if not cython.compiled or type(ids) is not list:
        return _records(ids, bodies, timestamp)
    return numbered_records([(b"", ids)], bodies, timestamp)  # one run: the whole IDs as suffixes


def _ids_of(runs: Sequence[tuple[bytes, Sequence[bytes]]]) -> list[bytes]:
    return [prefix + suffix for prefix, suffixes in runs for suffix in suffixes]


@cython.locals(
    k=cython.Py_ssize_t,
    j=cython.Py_ssize_t,
    m=cython.Py_ssize_t,
    count=cython.Py_ssize_t,
    n=cython.Py_ssize_t,
    pl=cython.Py_ssize_t,
    hl=cython.Py_ssize_t,
    idl=cython.Py_ssize_t,
    io=cython.Py_ssize_t,
    p=cython.p_char,
    hp=cython.p_char,
    out=list,
    head=bytes,
    prefix=bytes,
    suffix=bytes,
    b=bytes,
    r=bytes,
)
def numbered_records(runs: list[tuple[bytes, list[bytes]]], bodies: list[bytes], timestamp: int) -> list[bytes]:
    """:func:`records` with the IDs given in runs: a run ``(prefix, suffixes)`` is
    the IDs ``prefix + suffix``, a suffix each (a GUID factory's batch: one prefix
    per clock tick). Compiled, no ID is made as an object of its own: each is
    written into its record from its two parts, and each record is made at its
    size with one copy of its body (not header + ID, then + body)."""
    if not cython.compiled or type(runs) is not list or type(bodies) is not list:
        return _records(_ids_of(runs), bodies, timestamp)
    hl, idl, io = MESSAGE_HEADER_LENGTH, MSG_ID_LENGTH, ID_OFFSET  # (C constants)
    count = 0
    for run in runs:  # every shape checked first: anything else takes the pure path
        if type(run) is not tuple or len(run) != 2 or type(run[0]) is not bytes or type(run[1]) is not list:
            return _records(_ids_of(runs), bodies, timestamp)
        pl = len(run[0])
        for o in run[1]:
            if type(o) is not bytes or pl + len(o) != idl:
                return _records(_ids_of(runs), bodies, timestamp)
        count += len(run[1])
    if count != len(bodies):
        return _records(_ids_of(runs), bodies, timestamp)
    for k in range(count):
        if type(bodies[k]) is not bytes:
            return _records(_ids_of(runs), bodies, timestamp)
    head = _ENCODE_HEADER.pack(timestamp & _U64, 0)
    hp = PyBytes_AS_STRING(head)
    out = []
    k = 0
    for run in runs:
        prefix = run[0]
        pl = len(prefix)
        suffixes = run[1]
        m = len(suffixes)
        for j in range(m):
            suffix = suffixes[j]
            b = bodies[k]
            k += 1
            n = len(b)
            r = PyBytes_FromStringAndSize(cython.NULL, hl + n)
            p = PyBytes_AS_STRING(r)
            memcpy(p, hp, io)
            memcpy(p + io, PyBytes_AS_STRING(prefix), pl)
            memcpy(p + io + pl, PyBytes_AS_STRING(suffix), idl - pl)
            memcpy(p + hl, PyBytes_AS_STRING(b), n)
            out.append(r)
    return out


def frame(m: Fields) -> bytes:
    """The whole message frame: size, type, then :func:`encode`'s bytes."""
    return (
        _FRAME_HEADER.pack(
            len(m.body) + MESSAGE_HEADER_LENGTH + 4, FRAME_TYPE_MESSAGE, m.timestamp & _U64, m.attempts & 0xFFFF
        )
        + m.id
        + m.body
    )


def _frames(msgs: Sequence[Fields]) -> bytes:
    pack = _FRAME_HEADER.pack
    size = MESSAGE_HEADER_LENGTH + 4
    return b"".join(
        [
            pack(len(m.body) + size, FRAME_TYPE_MESSAGE, m.timestamp & _U64, m.attempts & 0xFFFF) + m.id + m.body
            for m in msgs
        ]
    )


# the header of a message frame: size (4), type (4), timestamp (8), attempts (2), ID (16)
FRAME_HEADER_LENGTH = 8 + MESSAGE_HEADER_LENGTH


@cython.locals(
    m=MessageFields,
    total=cython.Py_ssize_t,
    n=cython.Py_ssize_t,
    size=cython.Py_ssize_t,
    p=cython.p_uchar,
    ts=cython.ulonglong,
    attempts=cython.ulonglong,
    i=cython.int,
    hl=cython.Py_ssize_t,
    idl=cython.Py_ssize_t,
    ft=cython.uchar,
    out=bytes,
    body=bytes,
)
def frames(msgs: Sequence[Fields]) -> bytes:
    """The message frames of ``msgs`` back to back: a burst to one consumer, one buffer."""
    if not cython.compiled:
        return _frames(msgs)
    # compiled: one allocation for the burst and one copy of each body; messages that
    # are not MessageFields holding exact bytes take the pure path
    hl, idl, ft = FRAME_HEADER_LENGTH, MSG_ID_LENGTH, FRAME_TYPE_MESSAGE  # (C constants)
    total = 0
    for o in msgs:
        if not isinstance(o, MessageFields):
            return _frames(msgs)
        m = cython.cast(MessageFields, o)
        if type(m.body) is not bytes or type(m.id) is not bytes or len(m.id) != idl:
            return _frames(msgs)
        total += hl + len(m.body)
    out = PyBytes_FromStringAndSize(cython.NULL, total)
    p = cython.cast(cython.p_uchar, PyBytes_AS_STRING(out))
    for o in msgs:
        m = cython.cast(MessageFields, o)
        body = m.body
        n = len(body)
        size = n + hl - 4  # what follows the size
        ts = cython.cast(cython.ulonglong, m.timestamp)  # Go's uint64: a negative one wraps
        attempts = m.attempts & 0xFFFF
        p[0] = (size >> 24) & 0xFF
        p[1] = (size >> 16) & 0xFF
        p[2] = (size >> 8) & 0xFF
        p[3] = size & 0xFF
        p[4] = p[5] = p[6] = 0
        p[7] = ft
        for i in range(8):
            p[8 + i] = (ts >> (56 - 8 * i)) & 0xFF
        p[16] = (attempts >> 8) & 0xFF
        p[17] = attempts & 0xFF
        memcpy(p + 18, PyBytes_AS_STRING(m.id), idl)
        memcpy(p + hl, PyBytes_AS_STRING(body), n)
        p += hl + n
    return out


def decode(data: bytes) -> tuple[bytes, bytes, int, int]:
    """``(id, body, timestamp, attempts)`` of a message frame's data or a record."""
    if len(data) < MESSAGE_HEADER_LENGTH:
        raise ValueError(f"invalid message buffer size ({len(data)})")
    timestamp, attempts, msg_id = _HEADER.unpack_from(data)
    return msg_id, data[MESSAGE_HEADER_LENGTH:], timestamp, attempts


def decode_into(make: Callable[[bytes, bytes, int, int], T], data: bytes | memoryview) -> T:
    """:func:`decode` straight into ``make(id, body, timestamp, attempts)`` (nsqd's Message);
    ``data`` may be a view of a disk queue's read buffer (the body is copied out of it)."""
    if len(data) < MESSAGE_HEADER_LENGTH:
        raise ValueError(f"invalid message buffer size ({len(data)})")
    timestamp, attempts, msg_id = _HEADER.unpack_from(data)
    body = data[MESSAGE_HEADER_LENGTH:]
    return make(msg_id, body if type(body) is not memoryview else body.tobytes(), timestamp, attempts)


@cython.locals(
    m=MessageFields,
    raw=bytes,
    p=cython.p_uchar,
    q=cython.p_char,
    ts=cython.ulonglong,
    i=cython.int,
    hl=cython.Py_ssize_t,
    n=cython.Py_ssize_t,
    io=cython.Py_ssize_t,
)
def decode_fields(m: MessageFields, data: bytes | memoryview) -> bool:
    """Compiled (setup.py): :func:`decode` into the fields of ``m``, a message just made,
    with the header read in place; False, and ``m`` untouched, when ``data`` is neither
    exact bytes nor a memoryview (a ``CutRecord``, a bytearray) or not compiled: use
    :func:`decode_into`. Once per message delivered: struct's tuple and the Python ints
    in it cost more than the rest of the message. A memoryview (a record in a disk
    queue's read buffer, :meth:`~nsqd_tw.storage.diskqueue_read.DiskQueueReading.read_views`)
    is read where it lies: the body is the one copy made."""
    if not cython.compiled:
        return False
    hl, io = MESSAGE_HEADER_LENGTH, ID_OFFSET  # (C integers)
    if type(data) is bytes:
        raw = data
        n = len(raw)
        q = cython.cast(cython.p_char, raw)
    elif type(data) is memoryview:
        # a view of bytes, as read_views makes: one dimension, contiguous
        q = cython.cast(cython.p_char, PyMemoryView_GET_BUFFER(data).buf)
        n = PyMemoryView_GET_BUFFER(data).len
    else:
        return False
    if n < hl:
        raise ValueError(f"invalid message buffer size ({n})")
    p = cython.cast(cython.p_uchar, q)
    ts = 0
    for i in range(8):
        ts = (ts << 8) | p[i]
    m.timestamp = cython.cast(cython.longlong, ts)
    m.attempts = (p[8] << 8) | p[9]
    # made from the pointer: a slice of typed bytes still makes a slice object
    m.id = PyBytes_FromStringAndSize(q + io, hl - io)
    m.body = PyBytes_FromStringAndSize(q + hl, n - hl)
    return True


def message_id(data: bytes) -> bytes:
    """The ID of a message frame's data, without decoding the rest."""
    return data[ID_OFFSET:MESSAGE_HEADER_LENGTH]
