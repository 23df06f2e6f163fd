"""Go's formats: %q quoting, host:port, base-10 parsing with Go's wrap, durations, RFC 3339 times, errno texts."""

from __future__ import annotations

import errno
import re
import time
import unicodedata


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


def join_host_port(host: str, port: int | str) -> str:
    """``host:port``, an IPv6 host in brackets (Go's net.JoinHostPort)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class DurationError(ValueError):
    """Text that is not a Go duration; ``str()`` is Go's message."""


_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
MAX_DURATION_NS = (1 << 63) - 1  # Go's time.Duration: 2562047h47m16.854775807s


def parse_duration_ns(text: str) -> int:
    """Parse a Go duration ("1h2m", "250ms", "0") into nanoseconds, refusing what
    does not fit Go's int64 (``time: invalid duration``), as Go's ParseDuration does."""
    orig = text
    sign = 1
    if text[:1] in "+-" and text:
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if text == "0":
        return 0
    if not text:
        raise DurationError(f'time: invalid duration "{orig}"')
    invalid = DurationError(f'time: invalid duration "{orig}"')
    limit = MAX_DURATION_NS + (1 if sign < 0 else 0)
    total = 0
    pos = 0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            if _DURATION_PART.match(text + "s", pos) is not None or text[pos:].replace(".", "").isdigit():
                raise DurationError(f'time: missing unit in duration "{orig}"')
            raise invalid
        whole, _, frac = m.group(1).partition(".")
        unit = _UNIT_NS[m.group(2)]
        whole = whole.lstrip("0")
        if len(whole) > 19 or (whole and int(whole) > limit // unit):
            raise invalid
        value = int(whole or 0) * unit
        frac = frac[:30]  # digits past these are below a nanosecond of any unit
        if frac:
            value += int(frac) * unit // 10 ** len(frac)
        total += value
        if total > limit:
            raise invalid
        pos = m.end()
    return sign * total


def parse_duration(text: str) -> float:
    """Parse a Go duration ("1h2m", "250ms", "0") into seconds; Go's range only
    (at most 2562047h47m16.854775807s either way)."""
    return parse_duration_ns(text) / 1e9


def go_duration(ns: int) -> str:
    """Go's time.Duration.String() of ``ns`` nanoseconds: ``1h2m3.004s``, ``1.5µs``, ``0s``."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000_000_000:
        # below a second: one unit, with the fraction Go keeps (trailing zeros cut)
        unit, scale, digits = ("ns", 1, 0) if u < 1_000 else ("µs", 1_000, 3) if u < 1_000_000 else ("ms", 1_000_000, 6)
        return sign + _decimal(u, scale, digits) + unit
    h, rem = divmod(u, 3_600_000_000_000)
    m, rem = divmod(rem, 60_000_000_000)
    out = f"{h}h{m}m" if h else f"{m}m" if m else ""
    return sign + out + _decimal(rem, 1_000_000_000, 9) + "s"


def _decimal(n: int, scale: int, digits: int) -> str:
    whole, frac = divmod(n, scale)
    return f"{whole}.{frac:0{digits}d}".rstrip("0") if frac else str(whole)


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)


def parse_rfc3339_ns(text: str) -> int:
    """Unix nanoseconds of an RFC 3339 time (Go's ``time.RFC3339Nano`` layout:
    ``2026-11-26T10:00:00Z``, ``...00.123456789+01:00``); ValueError otherwise."""
    import calendar  # only here: not loaded for a start's flags

    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if m.group(9):
        oh, om = int(m.group(10)), int(m.group(11))
        if oh > 23 or om > 59:
            raise ValueError(f"not an RFC 3339 time: {text!r}")
        offset = oh * 3600 + om * 60
        seconds -= offset if m.group(9) == "+" else -offset
    frac = m.group(7) or ""
    return seconds * 1_000_000_000 + int(frac.ljust(9, "0") or 0)


def rfc3339_nano(ns: int) -> str:
    """Go's ``time.RFC3339Nano`` of Unix nanoseconds, in UTC: ``2026-11-26T10:00:00.123456789Z``
    (trailing zeros of the fraction cut, no fraction for a whole second)."""
    seconds, frac = divmod(ns, 1_000_000_000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + "Z"


_GO_ERRNO = {
    errno.EAGAIN: "resource temporarily unavailable",
    errno.ENOENT: "no such file or directory",
    errno.EACCES: "permission denied",
    errno.ENOTDIR: "not a directory",
    errno.EADDRINUSE: "address already in use",
    errno.EADDRNOTAVAIL: "cannot assign requested address",
}


def go_errno(e: OSError) -> str:
    """An errno as Go's syscall.Errno prints it (its lower-case strerror)."""
    if e.errno is not None and e.errno in _GO_ERRNO:
        return _GO_ERRNO[e.errno]
    return (e.strerror or str(e)).lower()
