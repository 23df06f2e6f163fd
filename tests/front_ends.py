"""Parse the same arguments through the console command and twistd's Options.

Both front ends must accept every form the command accepts and resolve to the
same options object; the cases are generated from the options table itself, so
an option added to the table is covered without touching the tests.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.python import usage

from nsq_service import options as machinery
from nsqd_tw import options as o

# sample flag values by kind: (text, what it must resolve to)
SAMPLES: dict[type, list[tuple[str, Any]]] = {
    type(machinery.STRING): [("some-value", "some-value"), ("127.0.0.1:7", "127.0.0.1:7")],
    type(machinery.INT): [("7", 7), ("0x10", 16)],
    type(machinery.DURATION): [("1m30s", 90.0), ("250ms", 0.25)],
    type(machinery.BOOL): [("true", True), ("false", False), ("0", False), ("T", True)],
    type(o.TLS_REQUIRED_KIND): [
        ("true", o.TLS_REQUIRED),
        ("false", o.TLS_NOT_REQUIRED),
        ("tcp-https", o.TLS_REQUIRED_EXCEPT_HTTP),
        ("TCP-HTTPS", o.TLS_REQUIRED_EXCEPT_HTTP),
        ("1", o.TLS_REQUIRED),
        ("F", o.TLS_NOT_REQUIRED),
    ],
    type(machinery.STRING_LIST): [("a:4160", ["a:4160"])],
    type(machinery.FLOAT_LIST): [("0.5,0.99", [0.99, 0.5]), ("1.0", [1.0])],
    type(o.TLS_MIN_VERSION): [("tls1.2", "tls1.2"), ("TLS1.3", "tls1.3")],
    type(machinery.LOG_LEVEL): [("debug", "debug"), ("WARN", "warn")],
    type(o.SIGTERM_MODE): [("drain", "drain"), ("SHUTDOWN", "shutdown")],
    type(o.REPLICATION_ROLE): [("standby", "standby"), ("PRIMARY", "primary")],
    type(o.REPLICATION_MODE): [("async", "async"), ("SYNC", "sync")],
}


def forms(flag: str, text: str) -> list[list[str]]:
    """Every spelling Go's flag package (and so the console command) accepts."""
    return [[f"--{flag}={text}"], [f"-{flag}={text}"], [f"--{flag}", text], [f"-{flag}", text]]


def generated_cases(cls: type) -> list[tuple[list[str], str, Any]]:
    """(argv, field name, expected value) for every flag of the table."""
    cases: list[tuple[list[str], str, Any]] = []
    for f in machinery.flag_fields(cls):
        flag, kind = f.metadata["flag"], f.metadata["kind"]
        samples = SAMPLES[type(kind)]
        for text, want in samples:
            for argv in forms(flag, text):
                cases.append((argv, f.name, want))
        if kind.is_bool:
            bare_true = o.TLS_REQUIRED if kind is o.TLS_REQUIRED_KIND else True
            cases.append(([f"--{flag}"], f.name, bare_true))
            cases.append(([f"-{flag}"], f.name, bare_true))
            # a bare flag followed by another flag
            cases.append(([f"--{flag}", "--log-prefix", "x"], f.name, bare_true))
        if kind.is_list:
            first, second = samples[0][0], samples[-1][0]
            want = kind.finalize(kind.from_flag(first) + kind.from_flag(second))
            cases.append(([f"--{flag}", first, f"-{flag}={second}"], f.name, want))
    return cases


def write_config(text: str) -> str:
    fd, path = tempfile.mkstemp(suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


class FrontEndParity:
    """Mixin for a TestCase: the console command and twistd's Options agree."""

    cls: type
    prog: str
    deprecated: dict[str, str]
    twistd_options: Callable[[], usage.Options]
    assertEqual: Callable[..., None]
    subTest: Callable[..., Any]
    patch: Callable[..., None]

    def command(self, argv: Sequence[str]) -> Any:
        opts, _ = machinery.parse_command_line(self.prog, self.cls, argv, self.deprecated)
        return opts

    def twistd(self, argv: Sequence[str]) -> Any:
        config = self.twistd_options()
        config.parseOptions(list(argv))
        return config.resolved

    def assert_same(self, argv: Sequence[str]) -> Any:
        ours = self.command(argv)
        theirs = self.twistd(argv)
        self.assertEqual(ours, theirs, f"{argv}: nsqd and twistd disagree")
        return ours

    def test_every_flag_in_every_form(self) -> None:
        cases = generated_cases(self.cls)
        self.assertGreater(len(cases), 4 * len(machinery.flag_fields(self.cls)))
        for argv, name, want in cases:
            resolved = self.assert_same(argv)
            self.assertEqual(getattr(resolved, name), want, argv)

    def test_defaults(self) -> None:
        self.assertEqual(self.assert_same([]), self.cls())

    def test_deprecated_flags(self) -> None:
        for flag in self.deprecated:
            for argv in ([f"--{flag}"], [f"-{flag}=true"], [f"--{flag}", "--log-prefix", "x"]):
                self.assert_same(argv)

    def test_config_file_and_flags(self) -> None:
        path = write_config('log_level = "debug"\ntcp_address = "127.0.0.1:9"\n')
        self.addCleanup(os.remove, path)  # type: ignore[attr-defined]
        for argv in (
            ["--config", path],
            [f"--config={path}"],
            ["-config", path, "--tcp-address", "127.0.0.1:10"],
            ["--tcp-address=127.0.0.1:10", "-config", path],
        ):
            self.assert_same(argv)

    def warnings_for(self, config: str, parse: Callable[[Sequence[str]], Any]) -> list[str]:
        """The WARNING lines logged while ``parse`` reads ``config`` as a --config file."""
        path = write_config(config)
        self.addCleanup(os.remove, path)  # type: ignore[attr-defined]
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        try:
            parse(["--config", path])
        finally:
            globalLogPublisher.removeObserver(events.append)
        return [
            formatEvent(e).replace(path, "CFG")
            for e in events
            if e.get("log_level") == LogLevel.warn and e.get("log_namespace", "").startswith("nsqd_tw")
        ]

    def assert_warnings(self, config: str, expected: list[str]) -> None:
        for parse in (self.command, self.twistd):
            self.assertEqual(self.warnings_for(config, parse), expected)

    def test_unknown_config_key_warns(self) -> None:
        self.assert_warnings(
            'tcp-address = "127.0.0.1:1"\nlog_level = "debug"\nno_such_thing = 1\n[section]\nx = 1\n',
            [
                'config file CFG: unknown key "tcp-address" ignored (did you mean "tcp_address"?)',
                'config file CFG: unknown key "no_such_thing" ignored',
                'config file CFG: unknown key "section" ignored',
            ],
        )

    def test_known_config_keys_do_not_warn(self) -> None:
        lines = []
        for f in machinery.flag_fields(self.cls):
            text, want = SAMPLES[type(f.metadata["kind"])][0]
            value = json.dumps(want) if isinstance(want, list) else json.dumps(text)
            lines.append(f"{f.metadata['cfg']} = {value}")
        lines += [f"{flag.replace('-', '_')} = true" for flag in self.deprecated]
        self.assert_warnings("\n".join(lines) + "\n", [])

    def _exit(self, call: Callable[[], Any]) -> tuple[int, str]:
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        try:
            call()
        except SystemExit as e:
            return int(e.code or 0), err.getvalue()
        raise AssertionError("did not exit")

    def assert_same_exit(self, argv: Sequence[str], code: int) -> str:
        """Both front ends exit with ``code`` and the same message."""
        ours = self._exit(lambda: self.command(argv))
        theirs = self._exit(lambda: self.twistd(argv))
        self.assertEqual(ours[0], code, ours)
        self.assertEqual(theirs[0], code, theirs)
        self.assertEqual(_strip(ours[1], self.prog), _strip(theirs[1], f"twistd {self.prog}"), (ours[1], theirs[1]))
        self.assertNotIn("Traceback", theirs[1])
        return theirs[1]

    def test_bad_flag_value(self) -> None:
        for f in machinery.flag_fields(self.cls):
            kind = f.metadata["kind"]
            if kind in (machinery.STRING, machinery.STRING_LIST):
                continue
            flag = f.metadata["flag"]
            for argv in ([f"--{flag}=bogus"], [f"-{flag}", "bogus"]):
                text = self.assert_same_exit(argv, 2)
                self.assertIn(f'invalid value "bogus" for flag -{flag}', text)

    def test_unknown_flag(self) -> None:
        ours = self._exit(lambda: self.command(["--no-such-flag"]))
        theirs = self._exit(lambda: self.twistd(["--no-such-flag"]))
        self.assertEqual((ours[0], theirs[0]), (2, 2))
        self.assertIn("--no-such-flag", theirs[1])
        self.assertIn(f"Run 'twistd {self.prog} -help' for usage.", theirs[1])
        self.assertNotIn("Traceback", theirs[1])


def _strip(text: str, prog: str) -> str:
    return text.replace(f"'{prog} -help'", "'PROG -help'")
