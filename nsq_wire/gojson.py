"""JSON as Go's encoding/json writes it, byte for byte.

Differences from Python's json module that clients can see: floats are
written without a trailing ``.0`` and with Go's exponent rules (``1e+21``,
``1e-7``), ``<``, ``>``, ``&``, U+2028 and U+2029 are escaped as ``\\u003c``...,
and control characters other than ``\\n``, ``\\r``, ``\\t`` as ``\\u00XX``.
Dicts keep their insertion order (Go's struct field order); Go sorts map
keys, so callers pass maps sorted.
"""

from __future__ import annotations

import math
from typing import Any

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def go_string(s: str) -> str:
    out = ['"']
    for ch in s:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch < " ":
            out.append("\\u%04x" % ord(ch))
        elif "\ud800" <= ch <= "\udfff":
            out.append("\\ufffd")  # Go replaces invalid UTF-8
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def go_float(x: float) -> str:
    """strconv.FormatFloat(x, 'f' or 'e', -1, 64) as encoding/json chooses."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"json: unsupported value: {x}")
    if x == 0:
        return "0"
    r = repr(float(x))  # the shortest digits that round-trip, as Go's -1 precision
    a = abs(x)
    if a < 1e-6 or a >= 1e21:
        mantissa, _, exp = r.partition("e")
        sign, digits = exp[0], exp[1:].lstrip("0") or "0"
        if sign == "+":
            return f"{mantissa}e+{digits.rjust(2, '0')}"
        return f"{mantissa}e-{digits}"  # Go's json turns e-07 into e-7
    if "e" in r:
        r = _to_fixed(r)
    if r.endswith(".0"):
        r = r[:-2]
    return r


def _to_fixed(r: str) -> str:
    mantissa, _, exp = r.lower().partition("e")
    e = int(exp)
    neg = mantissa.startswith("-")
    mantissa = mantissa.lstrip("-")
    whole, _, frac = mantissa.partition(".")
    digits = whole + frac
    point = len(whole) + e
    if point <= 0:
        s = "0." + "0" * (-point) + digits
    elif point >= len(digits):
        s = digits + "0" * (point - len(digits))
    else:
        s = digits[:point] + "." + digits[point:]
    s = s.lstrip("0") or "0"
    if s.startswith("."):
        s = "0" + s
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return ("-" if neg else "") + s


def _encode(obj: Any, out: list[str]) -> None:
    if obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, int):
        out.append(str(obj))
    elif isinstance(obj, float):
        out.append(go_float(obj))
    elif isinstance(obj, str):
        out.append(go_string(obj))
    elif isinstance(obj, bytes):
        out.append(go_string(obj.decode("utf-8", "replace")))
    elif isinstance(obj, dict):
        out.append("{")
        first = True
        for k, v in obj.items():
            if not first:
                out.append(",")
            first = False
            out.append(go_string(str(k)))
            out.append(":")
            _encode(v, out)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(",")
            _encode(v, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def dumps(obj: Any) -> bytes:
    out: list[str] = []
    _encode(obj, out)
    return "".join(out).encode("utf-8")


# -- reading: Go's encoding/json syntax errors ----------------------------------

MAX_NESTING_DEPTH = 10_000  # encoding/json's scanner refuses deeper documents
_WS = b" \t\r\n"
_HEX = b"0123456789abcdefABCDEF"
_LITERALS = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}


def _quote_char(c: int) -> str:
    """encoding/json's quoteChar: the byte as a one-rune Go character literal."""
    if c == 0x27:
        return "'\\''"
    if c == 0x22:
        return "'\"'"
    from nsq_wire.gofmt import go_quote

    return "'" + go_quote(chr(c))[1:-1] + "'"


def syntax_error(data: bytes) -> str | None:
    """The text of the error Go's ``json.Unmarshal`` gives for malformed ``data``
    (``invalid character 'x' after object key``, ``unexpected end of JSON input``,
    ...), or None when the syntax is valid. A state machine as Go's scanner, so
    the first offending byte and its context are Go's."""
    stack: list[int] = []  # 0: object key, 1: object value, 2: array value
    n = len(data)
    i = 0

    def bad(c: int, context: str) -> str:
        return f"invalid character {_quote_char(c)} {context}"

    # each step reads one value; "after" is the structural state that follows it
    expect_value = True
    first_in_container = False  # right after '[' or '{': ']' / '}' may close it
    while True:
        # skip whitespace
        while i < n and data[i] in _WS:
            i += 1
        if i >= n:
            if not stack and not expect_value:
                return None
            return "unexpected end of JSON input"
        c = data[i]
        if expect_value:
            top = stack[-1] if stack else -1
            if first_in_container and top == 2 and c == 0x5D:  # []
                stack.pop()
                i += 1
                expect_value, first_in_container = False, False
                continue
            if top == 0:
                # an object key: a string (or '}' right after '{')
                if first_in_container and c == 0x7D:
                    stack.pop()
                    i += 1
                    expect_value, first_in_container = False, False
                    continue
                if c != 0x22:
                    return bad(c, "looking for beginning of object key string")
            first_in_container = False
            if c == 0x7B or c == 0x5B:  # { [
                stack.append(0 if c == 0x7B else 2)
                if len(stack) > MAX_NESTING_DEPTH:
                    return bad(c, "exceeded max depth")
                i += 1
                first_in_container = True
                continue
            if c == 0x22:
                err, i = _scan_string(data, i + 1)
                if err is not None:
                    return err
            elif c == 0x2D or 0x30 <= c <= 0x39:
                err, i = _scan_number(data, i)
                if err is not None:
                    return err
            elif c in _LITERALS:
                word = _LITERALS[c]
                for k in range(1, len(word)):
                    got = data[i + k] if i + k < n else 0x20  # Go steps a space at the end
                    if got != word[k]:
                        return bad(got, f"in literal {word.decode()} (expecting {_quote_char(word[k])})")
                i += len(word)
            else:
                return bad(c, "looking for beginning of value")
            expect_value = False
            continue
        # after a value
        if not stack:
            return bad(c, "after top-level value")
        top = stack[-1]
        i += 1
        if top == 0:
            if c != 0x3A:
                return bad(c, "after object key")
            stack[-1] = 1
            expect_value = True
        elif top == 1:
            if c == 0x2C:
                stack[-1] = 0
                expect_value = True
            elif c == 0x7D:
                stack.pop()
            else:
                return bad(c, "after object key:value pair")
        else:
            if c == 0x2C:
                expect_value = True
            elif c == 0x5D:
                stack.pop()
            else:
                return bad(c, "after array element")


def _scan_string(data: bytes, i: int) -> tuple[str | None, int]:
    """From just after the opening quote to just after the closing one."""
    n = len(data)
    while i < n:
        c = data[i]
        if c == 0x22:
            return None, i + 1
        if c == 0x5C:
            i += 1
            e = data[i] if i < n else 0x20
            if e == 0x75:  # \uXXXX
                for k in range(1, 5):
                    h = data[i + k] if i + k < n else 0x20
                    if h not in _HEX:
                        return f"invalid character {_quote_char(h)} in \\u hexadecimal character escape", n
                i += 5
                continue
            if e not in b'bfnrt\\/"':
                return f"invalid character {_quote_char(e)} in string escape code", n
            i += 1
            continue
        if c < 0x20:
            return f"invalid character {_quote_char(c)} in string literal", n
        i += 1
    return "unexpected end of JSON input", n


def _scan_number(data: bytes, i: int) -> tuple[str | None, int]:
    """A number per Go's scanner; the byte after it decides the next state."""
    n = len(data)

    def at(k: int) -> int:
        return data[k] if k < n else 0x20  # at the end Go's scanner steps a space

    def digit(c: int) -> bool:
        return 0x30 <= c <= 0x39

    if data[i] == 0x2D:
        i += 1
        if not digit(at(i)):
            return f"invalid character {_quote_char(at(i))} in numeric literal", n
    if data[i] == 0x30:
        i += 1
    else:
        while digit(at(i)):
            i += 1
    if at(i) == 0x2E:
        i += 1
        if not digit(at(i)):
            return f"invalid character {_quote_char(at(i))} after decimal point in numeric literal", n
        while digit(at(i)):
            i += 1
    if at(i) in b"eE":
        i += 1
        if at(i) in b"+-":
            i += 1
        if not digit(at(i)):
            return f"invalid character {_quote_char(at(i))} in exponent of numeric literal", n
        while digit(at(i)):
            i += 1
    return None, i
