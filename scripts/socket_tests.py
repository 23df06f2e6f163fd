"""Which tests need real sockets or processes: run trial, report the tests that did.

    .venv/bin/python scripts/socket_tests.py [trial arguments, default: tests]

A test counts when, while it runs, something binds or connects an IPv4/IPv6
socket (a listener on 127.0.0.1, a client connection, an HTTP request) or
starts a process (subprocess, os.fork, posix_spawn: nsqd, nsqlookupd, Spark's
JVM). Prints each such test with what it did, then the totals; exits as trial does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import defaultdict
from typing import Any

from twisted.scripts import trial
from twisted.trial import unittest

_current: list[str] = []
_used: defaultdict[str, set[str]] = defaultdict(set)
_tests: set[str] = set()


def _mark(what: str) -> None:
    if _current:
        _used[_current[-1]].add(what)


def _wrap_socket(name: str, what: str) -> None:
    original = getattr(socket.socket, name)

    def wrapper(self: socket.socket, *args: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _mark(what)
        return original(self, *args)

    setattr(socket.socket, name, wrapper)


def _wrap_process(owner: Any, name: str) -> None:
    original = getattr(owner, name, None)
    if original is None:
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _mark("process")
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def _wrap_run(cls: Any) -> None:
    original = cls.run

    def run(self: Any, result: Any) -> Any:
        _tests.add(self.id())
        _current.append(self.id())
        try:
            return original(self, result)
        finally:
            _current.pop()

    cls.run = run


def main() -> None:
    _wrap_socket("bind", "listen")
    _wrap_socket("connect", "connect")
    _wrap_socket("connect_ex", "connect")
    _wrap_process(subprocess.Popen, "__init__")
    for name in ("fork", "posix_spawn", "posix_spawnp"):
        _wrap_process(os, name)
    _wrap_run(unittest.SynchronousTestCase)
    if "run" in vars(unittest.TestCase):
        _wrap_run(unittest.TestCase)
    sys.path.insert(0, os.getcwd())
    sys.argv = ["trial", *(sys.argv[1:] or ["tests"])]
    code: Any = 0
    try:
        trial.run()
    except SystemExit as e:
        code = e.code
    by_module: defaultdict[str, int] = defaultdict(int)
    print("\n-- tests that need real sockets or processes --")
    for test in sorted(_used):
        print(f"{test}: {', '.join(sorted(_used[test]))}")
        by_module[test.rsplit(".", 2)[0]] += 1
    print("\n-- per module --")
    for module, n in sorted(by_module.items()):
        print(f"{n:4d} {module}")
    print(f"\n{len(_used)} of {len(_tests)} tests need real sockets or processes")
    sys.exit(code)


if __name__ == "__main__":
    main()
