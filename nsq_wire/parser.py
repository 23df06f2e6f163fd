"""The V2 command parser: bytes in, commands out, no I/O."""

from __future__ import annotations

import re
import struct

from nsq_wire.errors import FatalClientError

try:
    import cython
except ModuleNotFoundError:
    from nsq_wire import cython_shim as cython

if cython.compiled:  # what the compiled FIN run takes its IDs with
    from cython.cimports.cpython.bytes import PyBytes_FromStringAndSize  # type: ignore

# bufio.Reader size Go nsqd reads command lines with: a longer line kills
# the connection without an error frame.
MAX_LINE_LENGTH = 16 * 1024


# Commands followed by a 4-byte big-endian size and a body.
BODY_COMMANDS = frozenset({b"IDENTIFY", b"PUB", b"MPUB", b"DPUB", b"AUTH"})


_INT32 = struct.Struct(">i")


class ProtocolViolation(Exception):
    """Input that ends the connection with no error frame (as Go's read errors)."""


class Command:
    """One parsed V2 command: its name, its parameters and its body.

    ``body`` is the body of IDENTIFY, PUB, DPUB and AUTH; ``bodies`` holds the
    messages of an MPUB. A command with a body is returned twice by the parser:
    first with ``complete`` false, when its line has been read (Go checks the
    state, the parameters and the topic name there, before reading the body),
    then complete.
    """

    __slots__ = ("bodies", "body", "complete", "name", "params")

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
        self.complete = True

    def __repr__(self) -> str:
        return f"Command({self.name!r}, {self.params!r}, body={self.body!r}, bodies={self.bodies!r})"


_LINE, _SIZE, _BODY, _MPUB_COUNT, _MPUB_SIZE, _MPUB_BODY = range(6)

_FIN_LINE = 21  # b"FIN " + a 16-byte message ID + b"\n"
_FIN_RUN = re.compile(rb"(?:FIN [^ \r\n]{16}\n)+")  # what next() would parse as FIN ID, and nothing else


@cython.locals(
    raw=bytes,
    p=cython.p_uchar,
    n=cython.Py_ssize_t,
    end=cython.Py_ssize_t,
    j=cython.Py_ssize_t,
    c=cython.uchar,
    line=cython.Py_ssize_t,
)
def _fin_run_end(raw: bytes, pos: int) -> int:
    """Compiled: where :data:`_FIN_RUN` matched at ``pos`` ends (``pos`` when it does not
    match), read in one C loop: a consumer's read is mostly FIN lines, and the regular
    expression cost ~5% of nsqd's time in a consume."""
    n = len(raw)
    p = raw
    end = pos
    line = _FIN_LINE
    while end + line <= n:
        if p[end] != 70 or p[end + 1] != 73 or p[end + 2] != 78 or p[end + 3] != 32 or p[end + 20] != 10:
            break  # not b"FIN " ... b"\n"
        for j in range(end + 4, end + 20):
            c = p[j]
            if c == 32 or c == 13 or c == 10:  # a space, CR or LF in the ID: another shape
                return end
        end += line
    return end


@cython.locals(b=bytes, q=cython.p_char, at=cython.Py_ssize_t, end=cython.Py_ssize_t, line=cython.Py_ssize_t)
def _fin_ids(raw: bytes, pos: int, end: int) -> list[bytes]:
    """The IDs of the FIN lines from ``pos`` to ``end`` (of :data:`_FIN_RUN`'s match)."""
    if not cython.compiled or type(raw) is not bytes:
        return [raw[at : at + 16] for at in range(pos + 4, end, _FIN_LINE)]
    b = raw
    q = cython.cast(cython.p_char, b)
    line = _FIN_LINE
    out = []
    at = pos + 4
    while at < end:
        out.append(PyBytes_FromStringAndSize(q + at, 16))  # not a slice: no slice object each
        at += line
    return out


@cython.locals(
    raw=bytes,
    p=cython.p_uchar,
    q=cython.p_char,
    n=cython.Py_ssize_t,
    at=cython.Py_ssize_t,
    left=cython.Py_ssize_t,
    used=cython.Py_ssize_t,
    max_msg=cython.Py_ssize_t,
    max_body=cython.Py_ssize_t,
    size=cython.Py_ssize_t,
    u=cython.uint,
)
def _mpub_pairs(
    raw: bytes, pos: int, left: int, used: int, max_msg: int, max_body: int, out: list[bytes]
) -> tuple[int, int, int, int | None]:
    """Compiled: the MPUB loop's fast path over whole (size, body) pairs in ``raw``
    from ``pos``, in C: no size tuple or slice per message, each body made from a
    pointer. Appends the bodies to ``out``; returns the position, the messages
    still to read, the body bytes read so far, and a size that is refused (the
    caller raises its error) or None."""
    n = len(raw)
    q = cython.cast(cython.p_char, raw)
    p = cython.cast(cython.p_uchar, q)
    at = pos
    while left and n - at >= 4:
        u = (
            (cython.cast(cython.uint, p[at]) << 24)
            | (cython.cast(cython.uint, p[at + 1]) << 16)
            | (cython.cast(cython.uint, p[at + 2]) << 8)
            | cython.cast(cython.uint, p[at + 3])
        )
        size = cython.cast(cython.int, u)  # Go's int32
        if size <= 0 or size > max_msg or used + size > max_body:
            return at, left, used, size
        if n - at - 4 < size:
            break
        used += size
        out.append(PyBytes_FromStringAndSize(q + at + 4, size))
        at += 4 + size
        left -= 1
    return at, left, used, None


class V2Parser:
    """An incremental parser for the commands a V2 client sends.

    Feed it bytes with :meth:`feed` and take commands with :meth:`next`
    until it returns ``None``. Errors are raised as :class:`FatalClientError`
    (Go's code and text) or :class:`ProtocolViolation`; after an error the
    parser is not usable, as the connection is closed.

    A command with a body comes out first incomplete, when its line is read:
    the caller checks it (and may raise) before calling :meth:`next` again to
    read the body, as Go validates the line before reading on.
    """

    def __init__(self, max_msg_size: int, max_body_size: int) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self._buf = b""
        self._pos = 0
        self._parts: list[bytes] = []
        self._parts_len = 0
        self._state = _LINE
        self._cmd: Command | None = None
        self._need = 0
        self._mpub_left = 0
        self._mpub_index = 0
        self._mpub_bodies = 0  # bytes of message bodies the MPUB has announced so far

    def feed(self, data: bytes) -> None:
        if self._pos >= len(self._buf) and not self._parts:
            self._buf = data
            self._pos = 0
        else:
            self._parts.append(data)
            self._parts_len += len(data)

    def take_fins(self) -> list[bytes]:
        """The IDs of the ``FIN <16-byte ID>\\n`` lines next in the buffer, taken: a
        consumer's read is mostly these, and they need no :class:`Command` each.
        Anything else (another command, a FIN of another shape, a line the read
        cut) is left for :meth:`next`, which parses it as it always does."""
        if self._state != _LINE:
            return []
        pos = self._pos
        buf = self._buf
        if cython.compiled and type(buf) is bytes:
            end = _fin_run_end(buf, pos)
            if end == pos:
                return []
        else:
            run = _FIN_RUN.match(buf, pos)
            if run is None:
                return []
            end = run.end()
        self._pos = end
        return _fin_ids(buf, pos, end)

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
        """The next command (incomplete: just a body command's line), or ``None``
        until more bytes arrive."""
        while True:
            state = self._state
            if state == _LINE:
                # _read_line's common case inline: the whole line is in the buffer
                buf = self._buf
                pos = self._pos
                idx = buf.find(b"\n", pos)
                if 0 <= idx < pos + MAX_LINE_LENGTH:
                    line = buf[pos:idx]
                    self._pos = idx + 1
                    if line[-1:] == b"\r":
                        line = line[:-1]
                else:
                    read = self._read_line()
                    if read is None:
                        return None
                    line = read
                params = line.split(b" ")
                name = params[0]
                if name not in BODY_COMMANDS:
                    return Command(name, params)
                line_read = self._cmd = Command(name, params)
                line_read.complete = False
                self._state = _SIZE
                return line_read
            elif state == _SIZE:
                size = self._read_int32()
                if size is None:
                    return None
                assert self._cmd is not None
                self._check_size(self._cmd.name, size)
                if self._cmd.name == b"MPUB":
                    self._cmd.bodies = []
                    self._mpub_bodies = 0
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
                cmd.complete = True
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
        max_body_size = self.max_body_size
        unpack_from = _INT32.unpack_from
        append = bodies.append
        while self._mpub_left:
            if self._state == _MPUB_SIZE:
                buf = self._buf
                pos = self._pos
                end = len(buf)
                # fast path: whole (size, body) pairs already in the buffer, the
                # counters in locals (written back before an error is raised)
                left, used = self._mpub_left, self._mpub_bodies
                first = left
                if cython.compiled and type(buf) is bytes:
                    pos, left, used, refused = _mpub_pairs(buf, pos, left, used, max_msg_size, max_body_size, bodies)
                    if refused is not None:
                        self._pos, self._mpub_bodies = pos, used
                        self._mpub_index += first - left
                        self._mpub_left = left
                        self._check_message_size(refused)
                while left and end - pos >= 4:
                    (size,) = unpack_from(buf, pos)
                    if size <= 0 or size > max_msg_size or used + size > max_body_size:
                        self._pos, self._mpub_bodies = pos, used
                        self._mpub_index += first - left
                        self._mpub_left = left
                        self._check_message_size(size)
                    if end - pos - 4 < size:
                        break
                    used += size
                    start = pos + 4
                    pos = start + size
                    append(buf[start:pos])
                    left -= 1
                self._pos, self._mpub_bodies = pos, used
                self._mpub_index += first - left
                self._mpub_left = left
                if not self._mpub_left:
                    break
                size = self._read_int32()
                if size is None:
                    return None
                self._check_message_size(size)
                self._mpub_bodies += size
                self._need = size
                self._state = _MPUB_BODY
            body = self._read_bytes(self._need)
            if body is None:
                return None
            bodies.append(body)
            self._mpub_left -= 1
            self._mpub_index += 1
            self._state = _MPUB_SIZE
        cmd.complete = True
        self._cmd = None
        self._state = _LINE
        return cmd

    def _check_message_size(self, size: int) -> None:
        if size <= 0:
            raise FatalClientError("E_BAD_MESSAGE", f"MPUB invalid message({self._mpub_index}) body size {size}")
        if size > self.max_msg_size:
            raise FatalClientError("E_BAD_MESSAGE", f"MPUB message too big {size} > {self.max_msg_size}")
        # Go reads the messages by their count whatever body size was declared (a
        # client that counts only the bodies is served). Beyond Go, what is read is
        # bounded by real bytes: the bodies of one MPUB total at most --max-body-size
        # (its framing, 4 bytes a message, adds less than that again), however it
        # is compressed and whatever it declared
        bodies = self._mpub_bodies + size
        if bodies > self.max_body_size:
            raise FatalClientError("E_BAD_BODY", f"MPUB body too big {bodies} > {self.max_body_size}")

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
