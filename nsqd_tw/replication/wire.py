"""The replication link's frames (docs/replication.md, "The link"): encoders, a
reader that splits a byte stream into frames, and the payloads' decoders.
Pure Python, no I/O.

A frame is a 4-byte big-endian size (of what follows), a 1-byte type and the
payload. Names are a 1-byte length and ASCII; records (nsqd's own, as the disk
queues store them) and entries are counted and each sized.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import struct
from collections.abc import Sequence
from typing import Any

from nsqd_tw.storage.layout import FramedRecords

MAGIC = b"  R1"
# 2: PUB and DPUB records framed as a data file holds them; 3: PING's token, echoed by ACK
# (the lease); 4: the retained logs (AT, SEGMENT, SEGMENT_END, WANT)
VERSION = 4

# both ways
HELLO, AUTH, ERROR = 0x01, 0x02, 0x03
# primary to standby: operations (counted by the standby) ...
BEGIN, TOPIC_RECORDS, CHANNEL_RECORDS, END = 0x10, 0x11, 0x12, 0x13
PUB, DPUB, FIN, REQ, CTRL = 0x20, 0x21, 0x22, 0x23, 0x24
# the retained logs: where the next publish of a topic is written; a snapshot's segments
AT, SEGMENT, SEGMENT_END = 0x25, 0x26, 0x27
# ... and the heartbeat, which is not one
PING = 0x30
# standby to primary
ACK = 0x31
WANT = 0x32  # the segments of its primary's retained logs a standby lacks (after BEGIN)

# ERROR's JSON: {"error": text} and, from a standby that could not apply (store) an
# operation, "code": APPLY_FAILED: the primary links again only after a while
APPLY_FAILED = "apply_failed"

OPERATIONS = frozenset(
    (BEGIN, TOPIC_RECORDS, CHANNEL_RECORDS, END, PUB, DPUB, FIN, REQ, CTRL, AT, SEGMENT, SEGMENT_END)
)

MAX_FRAME = 64 << 20  # a frame bigger than this is a broken peer
MAX_HELLO = 64 << 10  # before authentication: the largest frame a peer may send (a HELLO)
MAX_JSON_DEPTH = 32  # a JSON payload nested deeper is refused before it is parsed

_HEAD = struct.Struct(">IB")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACK = struct.Struct(">QQ")
_I64 = struct.Struct(">q")
_ENTRY = struct.Struct(">qI")
_BATCH = struct.Struct(">III")  # count, smallest and largest record
_PLACE = struct.Struct(">IQ8s")  # a retained segment's number, an offset in it, its identity
ID_LENGTH = 16


class LinkError(Exception):
    """Bytes that are not a frame of this protocol; ``str()`` says why."""


class FrameTooBig(LinkError):
    """A frame header announcing more than the reader takes (refused before any of it is read)."""


def frame(kind: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) + 1, kind) + payload


def _name(name: str) -> bytes:
    raw = name.encode("ascii")
    return bytes((len(raw),)) + raw


def json_frame(kind: int, doc: Any) -> bytes:
    return frame(kind, json.dumps(doc, separators=(",", ":")).encode())


# -- encoders -----------------------------------------------------------------------


def records_frame(kind: int, topic: str, records: Sequence[bytes], delay_ns: int | None = None) -> bytes:
    """PUB (``delay_ns`` None) or DPUB: the topic, the count and the sizes of the
    smallest and the largest record, then the records as a data file holds them
    (each after its 4-byte size), which a standby can append to a disk queue as
    they came. Built with C-level calls, no loop in Python for a publish of 200."""
    batch = FramedRecords.of(records)
    head = _name(topic) if delay_ns is None else _name(topic) + _I64.pack(delay_ns)
    size = len(head) + _BATCH.size + len(batch.data) + 1
    return b"".join((_HEAD.pack(size, kind), head, _BATCH.pack(batch.count, batch.smallest, batch.largest), batch.data))


def pub(topic: str, records: Sequence[bytes]) -> bytes:
    return records_frame(PUB, topic, records)


def dpub(topic: str, delay_ns: int, records: Sequence[bytes]) -> bytes:
    return records_frame(DPUB, topic, records, delay_ns)


def fin(topic: str, channel: str, ids: Sequence[bytes]) -> bytes:
    return frame(FIN, _name(topic) + _name(channel) + b"".join(ids))


def req(topic: str, channel: str, delay_ns: int, record: bytes) -> bytes:
    return frame(REQ, _name(topic) + _name(channel) + _I64.pack(delay_ns) + record)


def entries_frame(topic: str, channel: str | None, entries: Sequence[tuple[int, bytes]]) -> bytes:
    """TOPIC_RECORDS (``channel`` None) or CHANNEL_RECORDS: (deliver-at ns or 0, record)s."""
    pack = _ENTRY.pack
    head = _name(topic) if channel is None else _name(topic) + _name(channel)
    parts = [head, _U32.pack(len(entries))]
    for at, record in entries:
        parts.append(pack(at, len(record)))
        parts.append(record)
    return frame(TOPIC_RECORDS if channel is None else CHANNEL_RECORDS, b"".join(parts))


def at(topic: str, segment: int, offset: int, uid: str) -> bytes:
    """AT: the topic's next publish is written at ``offset`` of its retained
    segment ``segment`` (identity ``uid``, 16 hex digits) on the primary."""
    return frame(AT, _name(topic) + _PLACE.pack(segment, offset, bytes.fromhex(uid)))


def segment(topic: str, num: int, offset: int, uid: str, data: bytes) -> bytes:
    """SEGMENT: bytes of a retained segment, from ``offset`` (a snapshot's)."""
    return b"".join(
        (
            _HEAD.pack(len(topic) + 2 + _PLACE.size + len(data), SEGMENT),
            _name(topic),
            _PLACE.pack(num, offset, bytes.fromhex(uid)),
            data,
        )
    )


def ping(token: int) -> bytes:
    """PING with ``token``: what the primary's clock read when it sent it (its
    own unit), echoed by every ACK the standby sends from then on."""
    return frame(PING, _U64.pack(token))


def ack(count: int, token: int = 0) -> bytes:
    """ACK: the operations held, and the token of the last PING received (0: none)."""
    return frame(ACK, _ACK.pack(count, token))


# -- authentication -------------------------------------------------------------------


def proof(secret: bytes, label: bytes, dialer_hello: bytes, acceptor_hello: bytes) -> bytes:
    """AUTH: an HMAC-SHA256 under the shared secret of the sender's side
    (``b"dialer"`` or ``b"acceptor"``) and both HELLO payloads (their nonces)."""
    mac = hmac.new(secret, label, hashlib.sha256)
    mac.update(hashlib.sha256(dialer_hello).digest())
    mac.update(hashlib.sha256(acceptor_hello).digest())
    return mac.digest()


def verify(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


# -- reading ---------------------------------------------------------------------------


class FrameReader:
    """Feed bytes, take whole frames ``(type, payload)`` in order."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes fed and not taken as frames yet."""
        return len(self._buf) - self._pos

    def release(self) -> None:
        """Drop what is buffered (the link is over)."""
        self._buf = bytearray()
        self._pos = 0

    def next(self) -> tuple[int, bytes] | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 5:
            self._compact()
            return None
        size, kind = _HEAD.unpack_from(buf, pos)
        if size > self.max_frame:
            raise FrameTooBig(f"a frame of {size} bytes, over the limit of {self.max_frame}")
        if size < 1:
            raise LinkError(f"bad frame size {size}")
        end = pos + 4 + size
        if len(buf) < end:
            self._compact()
            return None
        payload = bytes(buf[pos + 5 : end])
        self._pos = end
        return kind, payload

    def _compact(self) -> None:
        if self._pos > (1 << 16) and self._pos > len(self._buf) // 2:
            del self._buf[: self._pos]
            self._pos = 0


class Payload:
    """A cursor over a frame's payload; every read checks the bounds."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise LinkError("payload too short")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def name(self) -> str:
        n = self.take(1)[0]
        try:
            return self.take(n).decode("ascii")
        except UnicodeDecodeError:
            raise LinkError("name not ASCII") from None

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def place(self) -> tuple[int, int, str]:
        """AT's and SEGMENT's (segment number, offset, identity)."""
        num, offset, uid = _PLACE.unpack(self.take(_PLACE.size))
        return int(num), int(offset), uid.hex()

    def i64(self) -> int:
        return int(_I64.unpack(self.take(8))[0])

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out

    def framed(self) -> FramedRecords:
        """A PUB's or DPUB's records, as they came (the rest of the payload)."""
        count, smallest, largest = _BATCH.unpack(self.take(_BATCH.size))
        if not count or smallest > largest:
            raise LinkError("bad records header")
        return FramedRecords(count, smallest, largest, self.rest())

    def records(self) -> list[bytes]:
        """A PUB's or DPUB's records, one by one."""
        return unframe(self.framed())

    def entries(self) -> list[tuple[int, bytes]]:
        out = []
        for _ in range(self.u32()):
            at, size = _ENTRY.unpack(self.take(_ENTRY.size))
            out.append((at, self.take(size)))
        return out

    def ids(self) -> list[bytes]:
        raw = self.rest()
        if len(raw) % ID_LENGTH:
            raise LinkError("IDs not 16 bytes each")
        return [raw[i : i + ID_LENGTH] for i in range(0, len(raw), ID_LENGTH)]

    def end(self) -> None:
        if self.pos != len(self.data):
            raise LinkError("trailing bytes in payload")


def unframe(batch: FramedRecords) -> list[bytes]:
    """The records of a PUB or DPUB one by one (LinkError if they are not as said)."""
    try:
        return batch.records()
    except ValueError as e:
        raise LinkError(str(e)) from None


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth(data: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (strings left out):
    looked at before parsing, as Python's parser recurses once per level."""
    depth = deepest = 0
    for c in _STRING.sub(b"", data).translate(None, _NOT_BRACKETS):
        if c in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def json_payload(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """A JSON object (HELLO, ERROR, CTRL, BEGIN); LinkError if it is not one, or
    if it nests deeper than ``max_depth``."""
    if json_depth(data) > max_depth:
        raise LinkError(f"payload nested deeper than {max_depth}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise LinkError("payload is not JSON") from None
    if not isinstance(doc, dict):
        raise LinkError("payload is not a JSON object")
    return doc


def ack_count(data: bytes) -> tuple[int, int]:
    """An ACK's payload: (operations held, the PING token echoed)."""
    if len(data) != _ACK.size:
        raise LinkError("bad ACK")
    count, token = _ACK.unpack(data)
    return int(count), int(token)


def ping_token(data: bytes) -> int:
    if len(data) != _U64.size:
        raise LinkError("bad PING")
    return int(_U64.unpack(data)[0])
