"""What the compiled modules use of Cython's pure-Python mode, for when Cython is not installed.

A module that setup.py compiles imports ``cython`` as::

    try:
        import cython
    except ModuleNotFoundError:
        from nsq_wire import cython_shim as cython

(Cython needs the ``import cython`` in the module itself.) Compiled, the decorators
type locals and the names are C types; uncompiled, they change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

compiled = False

# C types, as Python sees them
bint = bool
int = int
longlong = int
Py_ssize_t = int
uint = int
ulonglong = int
double = float
uchar = int
p_uchar = bytes  # a pointer into a bytes object's buffer
p_char = bytes


def cast(t: Any, value: Any) -> Any:
    """``cython.cast(type, value)``: a C cast when compiled."""
    return value


def locals(**types: Any) -> Callable[[F], F]:
    """``@cython.locals(name=type)``: the types of a function's locals when compiled."""
    return lambda f: f
