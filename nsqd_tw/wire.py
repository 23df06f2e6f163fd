"""The NSQ V2 wire format, with no I/O.

Frames, the command parser, name validation and the client error types live
here so that nsqd, nsqlookupd, the client and the tests agree on every byte.
"""

from __future__ import annotations

import re
import struct
import unicodedata
from collections.abc import Callable

MAGIC_V2 = b"  V2"
MAGIC_V1 = b"  V1"

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

OK = b"OK"
HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"

MSG_ID_LENGTH = 16
# timestamp (8) + attempts (2) + id (16)
MESSAGE_HEADER_LENGTH = 26

# bufio.Reader size Go nsqd reads command lines with: a longer line kills
# the connection without an error frame.
MAX_LINE_LENGTH = 16 * 1024

# Commands followed by a 4-byte big-endian size and a body.
BODY_COMMANDS = frozenset({b"IDENTIFY", b"PUB", b"MPUB", b"DPUB", b"AUTH"})

_FRAME_HEADER = struct.Struct(">ii")
_UINT32 = struct.Struct(">I")
_INT32 = struct.Struct(">i")

_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def pack_frame(frame_type: int, data: bytes) -> bytes:
    """A frame: 4-byte size (type + data), 4-byte type, data."""
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def unpack_frames(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Split ``buf`` into complete frames; return them and the remainder."""
    frames = []
    pos = 0
    end = len(buf)
    while end - pos >= 8:
        size, frame_type = _FRAME_HEADER.unpack_from(buf, pos)
        if size < 4:
            raise ValueError(f"invalid frame size {size}")
        if end - pos - 4 < size:
            break
        frames.append((frame_type, buf[pos + 8 : pos + 4 + size]))
        pos += 4 + size
    return frames, buf[pos:]


def is_valid_name(name: str | bytes) -> bool:
    """Go's rule for topic and channel names."""
    if isinstance(name, bytes):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            return False
    if not 1 <= len(name) <= 64:
        return False
    return _NAME_RE.fullmatch(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    return name.endswith("#ephemeral")


def go_quote(value: bytes | str) -> str:
    """Quote like Go's ``%q`` verb (strconv.Quote), used in error texts."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    out = ['"']
    i = 0
    n = len(value)
    while i < n:
        b = value[i]
        if b < 0x80:
            ch = chr(b)
            i += 1
        else:
            ch = ""
            for width in (2, 3, 4):
                try:
                    ch = value[i : i + width].decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if len(ch) == 1:
                    i += width
                    break
                ch = ""
            if not ch:
                out.append("\\x%02x" % b)
                i += 1
                continue
        out.append(_quote_rune(ch))
    out.append('"')
    return "".join(out)


_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}


def _quote_rune(ch: str) -> str:
    esc = _ESCAPES.get(ch)
    if esc is not None:
        return esc
    r = ord(ch)
    if ch == " " or (ch.isprintable() and unicodedata.category(ch)[0] != "Z"):
        return ch
    if r < 0x20 or r == 0x7F:
        return "\\x%02x" % r
    if r < 0x10000:
        return "\\u%04x" % r
    return "\\U%08x" % r


def parse_base10(value: bytes) -> int:
    """Go's protocol.ByteToBase10: digits only (empty is 0), uint64 wrap."""
    n = 0
    for d in value:
        if not 48 <= d <= 57:
            raise ValueError("failed to convert to Base10")
        n = (n * 10 + d - 48) & 0xFFFFFFFFFFFFFFFF
    return n


def to_int64(n: int) -> int:
    """Reinterpret an integer as Go's int64 (two's complement wrap)."""
    n &= 0xFFFFFFFFFFFFFFFF
    return n - (1 << 64) if n >= 1 << 63 else n


def ms_to_duration_ns(ms: int) -> int:
    """``time.Duration(ms) * time.Millisecond`` with Go's overflow."""
    return to_int64(to_int64(ms) * 1_000_000)


class ClientError(Exception):
    """An error sent to the client as an error frame; the connection stays."""

    fatal = False

    def __init__(self, code: str, text: str = "") -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text

    def __str__(self) -> str:
        return f"{self.code} {self.text}" if self.text else self.code

    def wire(self) -> bytes:
        return str(self).encode("utf-8", "surrogateescape")


class FatalClientError(ClientError):
    """An error sent as an error frame after which the connection is closed."""

    fatal = True


class ProtocolViolation(Exception):
    """Input that ends the connection with no error frame (as Go's read errors)."""


class Command:
    """One parsed V2 command: its name, its parameters and its body.

    ``body`` is the body of IDENTIFY, PUB, DPUB and AUTH; ``bodies`` holds the
    messages of an MPUB.
    """

    __slots__ = ("bodies", "body", "name", "params")

    def __init__(
        self,
        name: bytes,
        params: list[bytes],
        body: bytes | None = None,
        bodies: list[bytes] | None = None,
    ) -> None:
        self.name = name
        self.params = params
        self.body = body
        self.bodies = bodies

    def __repr__(self) -> str:
        return f"Command({self.name!r}, {self.params!r}, body={self.body!r}, bodies={self.bodies!r})"


HeaderCheck = Callable[[bytes, list[bytes]], None]

_LINE, _SIZE, _BODY, _MPUB_COUNT, _MPUB_SIZE, _MPUB_BODY = range(6)


class V2Parser:
    """An incremental parser for the commands a V2 client sends.

    Feed it bytes with :meth:`feed` and take commands with :meth:`next`
    until it returns ``None``. Errors are raised as :class:`FatalClientError`
    (Go's code and text) or :class:`ProtocolViolation`; after an error the
    parser is not usable, as the connection is closed.

    ``check_header(name, params)`` runs when the line of a command with a
    body is complete and before its size is read, where Go validates the
    state, the parameters and the topic name: it may raise.
    """

    def __init__(
        self,
        max_msg_size: int,
        max_body_size: int,
        check_header: HeaderCheck | None = None,
    ) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self._check_header = check_header
        self._buf = b""
        self._pos = 0
        self._parts: list[bytes] = []
        self._parts_len = 0
        self._state = _LINE
        self._cmd: Command | None = None
        self._need = 0
        self._mpub_left = 0
        self._mpub_index = 0
        self._mpub_declared = 0  # the MPUB's body size, as its sender declared it
        self._mpub_used = 0  # bytes of that body its messages take so far

    def feed(self, data: bytes) -> None:
        if self._pos >= len(self._buf) and not self._parts:
            self._buf = data
            self._pos = 0
        else:
            self._parts.append(data)
            self._parts_len += len(data)

    def buffered(self) -> int:
        return len(self._buf) - self._pos + self._parts_len

    def _join(self) -> bytes:
        self._buf = self._buf[self._pos :] + b"".join(self._parts)
        self._pos = 0
        self._parts = []
        self._parts_len = 0
        return self._buf

    def take_remainder(self) -> bytes:
        """Return and forget every byte not yet parsed (for a TLS upgrade)."""
        rest = self._join()
        self._buf = b""
        return rest

    def _available(self, n: int) -> bool:
        """Make sure ``n`` unparsed bytes are contiguous in ``_buf``."""
        if len(self._buf) - self._pos >= n:
            return True
        if len(self._buf) - self._pos + self._parts_len < n:
            return False
        self._join()
        return True

    def _read_line(self) -> bytes | None:
        buf = self._buf
        idx = buf.find(b"\n", self._pos)
        if idx < 0 and self._parts:
            buf = self._join()
            idx = buf.find(b"\n")
        if idx < 0:
            if len(buf) - self._pos >= MAX_LINE_LENGTH:
                raise ProtocolViolation("failed to read command - bufio: buffer full")
            return None
        if idx - self._pos >= MAX_LINE_LENGTH:
            raise ProtocolViolation("failed to read command - bufio: buffer full")
        line = buf[self._pos : idx]
        self._pos = idx + 1
        if line[-1:] == b"\r":
            line = line[:-1]
        return line

    def _read_int32(self) -> int | None:
        if not self._available(4):
            return None
        (value,) = _INT32.unpack_from(self._buf, self._pos)
        self._pos += 4
        return value

    def _read_bytes(self, n: int) -> bytes | None:
        if not self._available(n):
            return None
        pos = self._pos
        self._pos = pos + n
        return self._buf[pos : pos + n]

    def next(self) -> Command | None:
        """The next complete command, or ``None`` until more bytes arrive."""
        while True:
            state = self._state
            if state == _LINE:
                line = self._read_line()
                if line is None:
                    return None
                params = line.split(b" ")
                name = params[0]
                if name not in BODY_COMMANDS:
                    return Command(name, params)
                if self._check_header is not None:
                    self._check_header(name, params)
                self._cmd = Command(name, params)
                self._state = _SIZE
            elif state == _SIZE:
                size = self._read_int32()
                if size is None:
                    return None
                assert self._cmd is not None
                self._check_size(self._cmd.name, size)
                if self._cmd.name == b"MPUB":
                    self._cmd.bodies = []
                    self._mpub_declared = size
                    self._mpub_used = 4
                    self._state = _MPUB_COUNT
                else:
                    self._need = size
                    self._state = _BODY
            elif state == _BODY:
                body = self._read_bytes(self._need)
                if body is None:
                    return None
                cmd = self._cmd
                assert cmd is not None
                cmd.body = body
                self._cmd = None
                self._state = _LINE
                return cmd
            elif state == _MPUB_COUNT:
                count = self._read_int32()
                if count is None:
                    return None
                max_messages = (self.max_body_size - 4) // 5
                if count <= 0 or count > max_messages:
                    raise FatalClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
                self._mpub_left = count
                self._mpub_index = 0
                self._state = _MPUB_SIZE
            else:
                cmd = self._read_mpub_messages()
                if cmd is None:
                    return None
                return cmd

    def _read_mpub_messages(self) -> Command | None:
        """Read MPUB message (size, body) pairs; a tight loop on a full buffer."""
        cmd = self._cmd
        assert cmd is not None and cmd.bodies is not None
        bodies = cmd.bodies
        max_msg_size = self.max_msg_size
        unpack_from = _INT32.unpack_from
        while self._mpub_left:
            if self._state == _MPUB_SIZE:
                buf = self._buf
                pos = self._pos
                end = len(buf)
                # fast path: whole (size, body) pairs already in the buffer
                while self._mpub_left and end - pos >= 4:
                    (size,) = unpack_from(buf, pos)
                    if size <= 0 or size > max_msg_size or self._mpub_used + 4 + size > self._mpub_declared:
                        self._pos = pos
                        self._check_message_size(size)
                    if end - pos - 4 < size:
                        break
                    self._mpub_used += 4 + size
                    bodies.append(buf[pos + 4 : pos + 4 + size])
                    pos += 4 + size
                    self._mpub_left -= 1
                    self._mpub_index += 1
                self._pos = pos
                if not self._mpub_left:
                    break
                size = self._read_int32()
                if size is None:
                    return None
                self._check_message_size(size)
                self._mpub_used += 4 + size
                self._need = size
                self._state = _MPUB_BODY
            body = self._read_bytes(self._need)
            if body is None:
                return None
            bodies.append(body)
            self._mpub_left -= 1
            self._mpub_index += 1
            self._state = _MPUB_SIZE
        self._cmd = None
        self._state = _LINE
        return cmd

    def _check_message_size(self, size: int) -> None:
        if size <= 0:
            raise FatalClientError("E_BAD_MESSAGE", f"MPUB invalid message({self._mpub_index}) body size {size}")
        if size > self.max_msg_size:
            raise FatalClientError("E_BAD_MESSAGE", f"MPUB message too big {size} > {self.max_msg_size}")
        # beyond Go (which reads on past the declared size): an MPUB holds only the
        # bytes it declared, which --max-body-size bounds, however it is compressed
        used = self._mpub_used + 4 + size
        if used > self._mpub_declared:
            raise FatalClientError("E_BAD_BODY", f"MPUB body too big {used} > {self._mpub_declared}")

    def _check_size(self, name: bytes, size: int) -> None:
        verb = name.decode()
        if name in (b"PUB", b"DPUB"):
            if size <= 0:
                raise FatalClientError("E_BAD_MESSAGE", f"{verb} invalid message body size {size}")
            if size > self.max_msg_size:
                raise FatalClientError("E_BAD_MESSAGE", f"{verb} message too big {size} > {self.max_msg_size}")
        elif name == b"MPUB":
            if size <= 0:
                raise FatalClientError("E_BAD_BODY", f"MPUB invalid body size {size}")
            if size > self.max_body_size:
                raise FatalClientError("E_BAD_BODY", f"MPUB body too big {size} > {self.max_body_size}")
        else:  # IDENTIFY, AUTH
            if size > self.max_body_size:
                raise FatalClientError("E_BAD_BODY", f"{verb} body too big {size} > {self.max_body_size}")
            if size <= 0:
                raise FatalClientError("E_BAD_BODY", f"{verb} invalid body size {size}")


def encode_command(name: bytes, *params: bytes | str, body: bytes | None = None) -> bytes:
    """Encode a command as a client sends it (used by the client and tests)."""
    parts = [name]
    for p in params:
        parts.append(p.encode() if isinstance(p, str) else p)
    line = b" ".join(parts) + b"\n"
    if body is None:
        return line
    return line + _UINT32.pack(len(body)) + body


def encode_mpub(topic: bytes | str, bodies: list[bytes]) -> bytes:
    """MPUB: the line, then size, count and each message as (size, body)."""
    pack = _UINT32.pack
    payload = [pack(len(bodies))]
    for b in bodies:
        payload.append(pack(len(b)))
        payload.append(b)
    body = b"".join(payload)
    return encode_command(b"MPUB", topic, body=body)
