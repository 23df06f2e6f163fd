"""Options: one table, three front ends (the shared machinery)."""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
from dataclasses import field

from nsq_service.golog import LEVEL_NUMBERS, go_log_line
from nsq_wire.gofmt import MAX_DURATION_NS, DurationError, go_duration, parse_duration

# typing, json: not loaded for a start's flags (nsq_service.prebind listens right after them)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn, TypeVar

    T = TypeVar("T")


class ConfigError(Exception):
    """A bad option value; ``str()`` is the message Go prints."""


class StartError(Exception):
    """A start that cannot go on; ``str()`` is the whole of Go's FATAL text
    (``failed to load metadata - ...``)."""


def start_error_text(e: BaseException, instantiate_error: str) -> str:
    """The FATAL text for a failed start: a StartError's own, else Go's
    ``failed to instantiate nsqd - <error>``."""
    return str(e) if isinstance(e, StartError) else f"{instantiate_error} - {e}"


def split_address(address: str) -> tuple[str, int] | None:
    """``host:port`` (host may be empty or ``[v6]``) or None for a unix path."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def missing_port(address: str) -> str:
    """Go's error for a listener it opens as TCP only, given an address without a port."""
    return f"listen ({address}) failed - listen tcp: address {address}: missing port in address"


def _parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ConfigError(f'strconv.ParseBool: parsing "{text}": invalid syntax')


def _parse_int(text: str) -> int:
    try:
        return int(text, 0) if text.lower().startswith(("0x", "0o", "0b")) else int(text, 10)
    except ValueError:
        raise ConfigError(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f'strconv.ParseFloat: parsing "{text}": invalid syntax') from None


class Kind:
    """How one option's value is read from a flag and from the config file, shown
    in the help, and answered and set over HTTP (``/config/<opt>``)."""

    is_bool = False
    is_list = False

    def from_flag(self, text: str) -> Any:
        raise NotImplementedError

    def from_cfg(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.from_flag(value)
        raise ConfigError(f"invalid value type {type(value).__name__}")

    def show(self, value: Any) -> str:
        return str(value)

    def finalize(self, value: Any) -> Any:
        """Applied to a value given on the command line."""
        return value

    def to_http(self, value: Any) -> Any:
        """The value as ``GET /config/<opt>`` answers it: Go's JSON of the option's type."""
        return value

    def from_http(self, body: bytes) -> Any:
        """The value a ``PUT /config/<opt>`` body sets; ConfigError if it is not one."""
        raise ConfigError("not settable over HTTP")


class _String(Kind):
    def from_flag(self, text: str) -> str:
        return text

    def from_cfg(self, value: Any) -> str:
        return value if isinstance(value, str) else str(value)


class _Int(Kind):
    def from_flag(self, text: str) -> int:
        return _parse_int(text)

    def from_cfg(self, value: Any) -> int:
        if isinstance(value, bool):
            raise ConfigError("invalid int64 value type bool")
        if isinstance(value, int):
            return value
        return super().from_cfg(value)


class _Float(Kind):
    def from_flag(self, text: str) -> float:
        return _parse_float(text)

    def from_cfg(self, value: Any) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return super().from_cfg(value)


class _Bool(Kind):
    is_bool = True

    def from_flag(self, text: str) -> bool:
        return _parse_bool(text)

    def from_cfg(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        return super().from_cfg(value)

    def show(self, value: Any) -> str:
        return "true" if value else "false"


class _Duration(Kind):
    def from_flag(self, text: str) -> float:
        try:
            return parse_duration(text)
        except DurationError as e:
            raise ConfigError(str(e)) from None

    def from_cfg(self, value: Any) -> float:
        # go-options reads a bare number in a config file as milliseconds
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_DURATION_NS // 1_000_000:
                raise ConfigError(f"invalid duration {value}ms (out of Go's range)")
            return value / 1000.0
        return super().from_cfg(value)

    def show(self, value: Any) -> str:
        return go_duration(self.to_http(value))

    def to_http(self, value: Any) -> int:
        return round(value * 1_000_000_000)  # a time.Duration: nanoseconds


class _StringList(Kind):
    is_list = True

    def from_flag(self, text: str) -> list[str]:
        return [text]

    def from_cfg(self, value: Any) -> list[str]:
        if isinstance(value, str):
            return value.split(",")
        if isinstance(value, list):
            return [str(v) for v in value]
        raise ConfigError(f"invalid value type {type(value).__name__}")

    def show(self, value: Any) -> str:
        return ",".join(value)

    def from_http(self, body: bytes) -> list[str]:
        """A JSON array of strings (``null``: none)."""
        import json

        try:
            value = json.loads(body)
        except ValueError:
            raise ConfigError("not JSON") from None
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise ConfigError("not a list of strings")
        return list(value or [])


class _FloatList(Kind):
    """Go's FloatArray: comma separated, repeatable, kept sorted descending."""

    is_list = True

    def from_flag(self, text: str) -> list[float]:
        return [_parse_float(s) for s in text.split(",")]

    def from_cfg(self, value: Any) -> list[float]:
        if isinstance(value, str):
            return [_parse_float(s.strip()) for s in value.split(",")]
        if isinstance(value, list):
            return [FLOAT.from_cfg(v) for v in value]
        raise ConfigError(f"invalid value type {type(value).__name__}")

    def show(self, value: Any) -> str:
        return ",".join(f"{v:f}" for v in value)

    def finalize(self, value: Any) -> Any:
        return sorted(value, reverse=True)


LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")


class _LogLevel(Kind):
    def from_flag(self, text: str) -> str:
        level = text.lower()
        if level not in LOG_LEVELS:
            raise ConfigError(f"invalid log level '{text}' (debug, info, warn, error, fatal)")
        return level

    def from_cfg(self, value: Any) -> str:
        try:
            return self.from_flag(str(value))
        except ConfigError:
            raise ConfigError(f"failed parsing log_level {value}") from None

    def to_http(self, value: Any) -> int:
        return LEVEL_NUMBERS[value]

    def from_http(self, body: bytes) -> str:
        return self.from_flag(body.decode("utf-8", "replace"))


STRING = _String()


INT = _Int()


FLOAT = _Float()


BOOL = _Bool()


DURATION = _Duration()


STRING_LIST = _StringList()


FLOAT_LIST = _FloatList()


LOG_LEVEL = _LogLevel()


def opt(
    flag: str | None,
    kind: Kind,
    default: Any,
    help: str,
    cfg: str | None = None,
) -> Any:
    """A table row: a dataclass field with its flag, config key and kind."""
    meta = {"flag": flag, "kind": kind, "help": help, "cfg": cfg or (flag or "").replace("-", "_")}
    if callable(default):
        return field(default_factory=default, metadata=meta)
    if isinstance(default, list):
        return field(default_factory=_list_factory(default), metadata=meta)
    return field(default=default, metadata=meta)


def _list_factory(items: list[Any]) -> Callable[[], list[Any]]:
    return lambda: list(items)


def hostname() -> str:
    return socket.gethostname()


def option_fields(cls: type) -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(cls))


def flag_fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("flag")]


def field_by_cfg_name(cls: type, name: str) -> dataclasses.Field[Any] | None:
    """The option whose ``--config`` key is ``name`` (Go's getOptByCfgName)."""
    for f in flag_fields(cls):
        if f.metadata["cfg"] == name:
            return f
    return None


class _GoArgumentParser(argparse.ArgumentParser):
    """Exit 2 with the message first, as Go's flag package does."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{message}\nRun '{self.prog} -help' for usage.\n")

    def _get_formatter(self) -> Any:
        # argparse makes one per add_argument too, where the width does not matter:
        # the terminal's (shutil) only for text that is shown
        if self._showing:
            return super()._get_formatter()
        return argparse.HelpFormatter(self.prog, width=80)

    _showing = False

    def format_help(self) -> str:
        self._showing = True
        try:
            return super().format_help()
        finally:
            self._showing = False

    def format_usage(self) -> str:
        self._showing = True
        try:
            return super().format_usage()
        finally:
            self._showing = False


def _kind_type(kind: Kind, flag: str) -> Any:
    def convert(text: str) -> Any:
        try:
            return kind.from_flag(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(f'invalid value "{text}" for flag -{flag}: {e}') from None

    convert.__name__ = flag
    return convert


class _ListAppend(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        current = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, current + list(values))


def build_argparser(
    prog: str, cls: type, deprecated: dict[str, str] | None = None, *, twistd: bool = False
) -> argparse.ArgumentParser:
    """A parser accepting Go's flag syntax: ``-flag``/``--flag``, ``=value`` or a
    separate value, bare booleans, repeatable list flags.

    With ``twistd``, help and version are left to the usage.Options that owns
    the parser, and every boolean also has a ``--no-flag`` form.
    """
    parser = _GoArgumentParser(prog=prog, allow_abbrev=False, add_help=False)
    if twistd:
        parser.add_argument("-h", "-help", "--help", dest="_help", action="store_true", default=False)
    else:
        parser.add_argument("-h", "-help", "--help", action="help", help="show this help message and exit")
    parser.add_argument("-version", "--version", action="store_true", default=False, help="print version string")
    parser.add_argument("-config", "--config", default="", help="path to config file")
    defaults = cls()
    for f in flag_fields(cls):
        flag = f.metadata["flag"]
        kind: Kind = f.metadata["kind"]
        names = [f"-{flag}", f"--{flag}"]
        conv = _kind_type(kind, flag)
        help_text = f.metadata["help"].replace("%", "%%")
        default_shown = kind.show(getattr(defaults, f.name))
        if default_shown and default_shown not in ("0", "false", "0s"):
            help_text += f" (default {default_shown})".replace("%", "%%")
        if kind.is_bool:
            parser.add_argument(
                *names,
                dest=f.name,
                nargs="?",
                const=conv("true"),
                type=conv,
                default=argparse.SUPPRESS,
                metavar="true|false",
                help=help_text,
            )
            if twistd:
                parser.add_argument(
                    f"--no-{flag}", dest=f.name, action="store_const", const=conv("false"), default=argparse.SUPPRESS
                )
        elif kind.is_list:
            parser.add_argument(
                *names,
                dest=f.name,
                action=_ListAppend,
                type=conv,
                default=argparse.SUPPRESS,
                metavar="value",
                help=help_text,
            )
        else:
            parser.add_argument(
                *names, dest=f.name, type=conv, default=argparse.SUPPRESS, metavar="value", help=help_text
            )
    for flag, help_text in (deprecated or {}).items():
        parser.add_argument(
            f"-{flag}",
            f"--{flag}",
            dest="_deprecated_" + flag.replace("-", "_"),
            nargs="?",
            const="true",
            default=argparse.SUPPRESS,
            metavar="true|false",
            help=help_text,
        )
    return parser


def load_config(path: str) -> dict[str, Any]:
    import tomllib  # only with --config

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"failed to load config file {path} - {e}") from None


def config_keys(cls: type, deprecated: dict[str, str] | None = None) -> set[str]:
    """The ``--config`` keys that mean something: the table's, and Go's deprecated flags' (no effect)."""
    return {f.metadata["cfg"] for f in flag_fields(cls)} | {k.replace("-", "_") for k in deprecated or {}}


def unknown_config_keys(cls: type, cfg: dict[str, Any], deprecated: dict[str, str] | None = None) -> list[str]:
    known = config_keys(cls, deprecated)
    return [key for key in cfg if key not in known]


def warn_unknown_keys(path: str, keys: Sequence[str], known: set[str]) -> None:
    """Go ignores a key it does not know without a word; we say so."""
    import difflib
    import json

    from twisted.logger import Logger  # only then: --version and --help import no Twisted

    log = Logger(namespace="nsqd_tw.options")  # the config file is read before any server exists
    for key in keys:
        # 0.7: a typo, not any word that shares a few letters ("section" is not "retention")
        hint = difflib.get_close_matches(key.replace("-", "_").lower(), sorted(known), n=1, cutoff=0.7)
        log.warn(
            "config file {path}: unknown key {key} ignored{hint}",
            path=path,
            key=json.dumps(key),
            hint=f" (did you mean {json.dumps(hint[0])}?)" if hint else "",
        )


def resolve(cls: type[T], flags: dict[str, Any], cfg: dict[str, Any] | None = None) -> T:
    """Flag given on the command line, else config file value, else default."""
    cfg = cfg or {}
    values: dict[str, Any] = {}
    for f in option_fields(cls):
        if f.name in flags:
            values[f.name] = f.metadata["kind"].finalize(flags[f.name])
            continue
        key = f.metadata["cfg"]
        if f.metadata.get("flag") and key in cfg:
            kind: Kind = f.metadata["kind"]
            try:
                values[f.name] = kind.from_cfg(cfg[key])
            except ConfigError as e:
                raise ConfigError(f"Resolve failed to coerce value {cfg[key]!r} for field {key} - {e}") from None
    return cls(**values)


def resolve_namespace(cls: type[T], ns: argparse.Namespace, deprecated: dict[str, str] | None = None) -> T:
    """Options from a parsed command line: its flags, then its ``--config`` file."""
    cfg = load_config(ns.config) if ns.config else {}
    unknown = unknown_config_keys(cls, cfg, deprecated)
    if unknown:
        warn_unknown_keys(ns.config, unknown, config_keys(cls, deprecated))
    flags = {k: v for k, v in vars(ns).items() if not k.startswith("_") and k not in ("version", "config")}
    return resolve(cls, flags, cfg)


def parse_command_line(
    prog: str, cls: type[T], argv: Sequence[str], deprecated: dict[str, str] | None = None
) -> tuple[T | None, argparse.Namespace]:
    """Parse ``argv``; return (options or None if --version, namespace)."""
    parser = build_argparser(prog, cls, deprecated)
    ns = parser.parse_args(list(argv))
    if ns.version:
        return None, ns
    return resolve_namespace(cls, ns, deprecated), ns


def exit_fatal(prefix: str, text: str) -> NoReturn:
    """Go's logFatal: one FATAL line on stderr, exit status 1."""
    sys.stderr.write(go_log_line(prefix, "FATAL", text))
    sys.stderr.flush()
    raise SystemExit(1)
