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
