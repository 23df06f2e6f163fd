"""Options: one table, three front ends.

:class:`NSQDOptions` is the table: each field carries its Go flag name, its
``--config`` (TOML) key, its kind and help text. From it come the ``nsqd``
command's parser (Go's flag syntax, via argparse), the ``twistd nsqd``
usage.Options, and the TOML loader. Durations are float seconds.

The machinery (kinds, :func:`build_argparser`, :func:`resolve`,
:func:`usage_options`) is shared with ``lookupd_tw``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import json
import re
import socket
import ssl
import sys
import tomllib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from twisted.application.service import ServiceMaker
from twisted.python import usage

from nsqd_tw.log import Logger, go_log_line

VERSION = "1.3.0"

_log = Logger(namespace="nsqd_tw.options")


class ConfigError(Exception):
    """A bad option value; ``str()`` is the message Go prints."""


class StartError(Exception):
    """A start that cannot go on; ``str()`` is the whole of Go's FATAL text
    (``failed to load metadata - ...``)."""


def start_error_text(e: BaseException, instantiate_error: str) -> str:
    """The FATAL text for a failed start: a StartError's own, else Go's
    ``failed to instantiate nsqd - <error>``."""
    return str(e) if isinstance(e, StartError) else f"{instantiate_error} - {e}"


def install_stop_signals(reactor: Any) -> None:
    """SIGTERM and SIGINT stop the reactor cleanly from now on, as Go's nsqd.

    A signal that comes before the reactor runs queues the stop for when it
    does; SIGINT is caught even when the process inherited it ignored (started
    with ``&``), as Go's signal.Notify does; signals after the first are ignored
    (Go's nsqd, too). The reactor installs its own handlers when it starts:
    ours go back in place once it runs.
    """
    import signal

    stopping: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if stopping:
            return
        stopping.append(signum)
        (reactor.sigInt if signum == signal.SIGINT else reactor.sigTerm)(signum, frame)

    def install() -> None:
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    install()
    reactor.callWhenRunning(install)


# -- Go's time.ParseDuration ---------------------------------------------

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


def parse_duration(text: str) -> float:
    """Parse a Go duration ("1h2m", "250ms", "0") into seconds."""
    orig = text
    sign = 1.0
    if text[:1] in "+-" and text:
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
    if text == "0":
        return 0.0
    if not text:
        raise ConfigError(f'time: invalid duration "{orig}"')
    total = 0.0
    pos = 0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            if _DURATION_PART.match(text + "s", pos) is not None or text[pos:].replace(".", "").isdigit():
                raise ConfigError(f'time: missing unit in duration "{orig}"')
            raise ConfigError(f'time: invalid duration "{orig}"')
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def format_duration(seconds: float) -> str:
    """Go's Duration.String() for the values used as defaults."""
    if seconds == 0:
        return "0s"
    ns = round(seconds * 1e9)
    if ns < 1_000_000_000:
        for unit, scale in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= scale:
                return f"{ns / scale:g}{unit}"
    h, rem = divmod(ns, 3_600_000_000_000)
    m, rem = divmod(rem, 60_000_000_000)
    s = rem / 1e9
    out = ""
    if h:
        out += f"{h}h"
    if h or m:
        out += f"{m}m"
    return out + f"{s:g}s"


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


# -- kinds -----------------------------------------------------------------


class Kind:
    """How one option's value is read from a flag and from the config file."""

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
        return parse_duration(text)

    def from_cfg(self, value: Any) -> float:
        # go-options reads a bare number in a config file as milliseconds
        if isinstance(value, int) and not isinstance(value, bool):
            return value / 1000.0
        return super().from_cfg(value)

    def show(self, value: Any) -> str:
        return format_duration(value)


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


TLS_NOT_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_REQUIRED = 0, 1, 2


class _TLSRequired(Kind):
    """true, false or tcp-https; a bare ``--tls-required`` means true."""

    is_bool = True

    def from_flag(self, text: str) -> int:
        text = text.lower()
        if text == "tcp-https":
            return TLS_REQUIRED_EXCEPT_HTTP
        return TLS_REQUIRED if _parse_bool(text) else TLS_NOT_REQUIRED

    def from_cfg(self, value: Any) -> int:
        if isinstance(value, bool):
            return TLS_REQUIRED if value else TLS_NOT_REQUIRED
        if isinstance(value, int):
            return value
        try:
            return self.from_flag(str(value))
        except ConfigError:
            raise ConfigError(f"failed parsing tls_required {value}") from None


TLS_VERSIONS = {
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}


class _TLSMinVersion(Kind):
    def from_flag(self, text: str) -> str:
        text = text.lower()
        if text == "":
            return "tls1.0"
        if text not in TLS_VERSIONS:
            raise ConfigError(f'unknown tlsVersionOption "{text}"')
        return text

    def from_cfg(self, value: Any) -> str:
        try:
            return self.from_flag(str(value))
        except ConfigError:
            raise ConfigError(f"failed parsing tls_min_version {value}") from None


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


STRING = _String()
INT = _Int()
FLOAT = _Float()
BOOL = _Bool()
DURATION = _Duration()
STRING_LIST = _StringList()
FLOAT_LIST = _FloatList()
TLS_REQUIRED_KIND = _TLSRequired()
TLS_MIN_VERSION = _TLSMinVersion()
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


def default_node_id() -> int:
    """Go's default: crc32(md5(hostname)) % 1024."""
    return zlib.crc32(hashlib.md5(hostname().encode()).digest()) % 1024


@dataclass
class NSQDOptions:
    node_id: int = opt(
        "node-id",
        INT,
        default_node_id,
        "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
        cfg="id",
    )
    log_level: str = opt("log-level", LOG_LEVEL, "info", "set log verbosity: debug, info, warn, error, or fatal")
    log_prefix: str = opt("log-prefix", STRING, "[nsqd] ", "log message prefix")

    https_address: str = opt("https-address", STRING, "0.0.0.0:4152", "<addr>:<port> to listen on for HTTPS clients")
    http_address: str = opt(
        "http-address",
        STRING,
        "0.0.0.0:4151",
        "address to listen on for HTTP clients (<addr>:<port> for TCP/IP or <path> for unix socket)",
    )
    tcp_address: str = opt(
        "tcp-address",
        STRING,
        "0.0.0.0:4150",
        "address to listen on for TCP clients (<addr>:<port> for TCP/IP or <path> for unix socket)",
    )
    auth_http_addresses: list[str] = opt(
        "auth-http-address",
        STRING_LIST,
        [],
        "<addr>:<port> or a full url to query auth server (may be given multiple times)",
        cfg="auth_http_addresses",
    )
    auth_http_request_method: str = opt(
        "auth-http-request-method", STRING, "get", "HTTP method to use for auth server requests"
    )
    broadcast_address: str = opt(
        "broadcast-address",
        STRING,
        hostname,
        "address that will be registered with lookupd (defaults to the OS hostname)",
    )
    broadcast_tcp_port: int = opt(
        "broadcast-tcp-port",
        INT,
        0,
        "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd is listening on)",
    )
    broadcast_http_port: int = opt(
        "broadcast-http-port",
        INT,
        0,
        "HTTP port that will be registered with lookupd (defaults to the HTTP port that this nsqd is listening on)",
    )
    lookupd_tcp_addresses: list[str] = opt(
        "lookupd-tcp-address",
        STRING_LIST,
        [],
        "lookupd TCP address (may be given multiple times)",
        cfg="nsqlookupd_tcp_addresses",
    )
    http_client_connect_timeout: float = opt("http-client-connect-timeout", DURATION, 2.0, "timeout for HTTP connect")
    http_client_request_timeout: float = opt("http-client-request-timeout", DURATION, 5.0, "timeout for HTTP request")

    data_path: str = opt("data-path", STRING, "", "path to store disk-backed messages")
    mem_queue_size: int = opt("mem-queue-size", INT, 10000, "number of messages to keep in memory (per topic/channel)")
    mem_queue_bytes: int = opt(
        "mem-queue-bytes",
        INT,
        0,
        "beyond Go: message bytes to keep in memory (per topic/channel); the rest goes to disk (0 = no limit)",
    )
    max_disk_bytes: int = opt(
        "max-disk-bytes",
        INT,
        0,
        "beyond Go: message bytes all disk queues may hold; past it publishes fail (0 = no limit)",
    )
    max_bytes_per_file: int = opt(
        "max-bytes-per-file", INT, 100 * 1024 * 1024, "number of bytes per diskqueue file before rolling"
    )
    sync_every: int = opt("sync-every", INT, 2500, "number of messages per diskqueue fsync")
    sync_timeout: float = opt("sync-timeout", DURATION, 2.0, "duration of time per diskqueue fsync")

    queue_scan_worker_pool_max: int = opt(
        "queue-scan-worker-pool-max",
        INT,
        4,
        "max concurrency for checking in-flight and deferred message timeouts",
    )
    queue_scan_selection_count: int = opt(
        "queue-scan-selection-count",
        INT,
        20,
        "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts",
    )
    queue_scan_interval: float = opt(None, DURATION, 0.1, "")
    queue_scan_refresh_interval: float = opt(None, DURATION, 5.0, "")
    queue_scan_dirty_percent: float = opt(None, FLOAT, 0.25, "")

    msg_timeout: float = opt("msg-timeout", DURATION, 60.0, "default duration to wait before auto-requeing a message")
    max_msg_timeout: float = opt("max-msg-timeout", DURATION, 900.0, "maximum duration before a message will timeout")
    max_msg_size: int = opt("max-msg-size", INT, 1024 * 1024, "maximum size of a single message in bytes")
    max_req_timeout: float = opt("max-req-timeout", DURATION, 3600.0, "maximum requeuing timeout for a message")
    max_body_size: int = opt("max-body-size", INT, 5 * 1024 * 1024, "maximum size of a single command body")
    client_timeout: float = opt(None, DURATION, 60.0, "")

    max_heartbeat_interval: float = opt(
        "max-heartbeat-interval",
        DURATION,
        60.0,
        "maximum client configurable duration of time between client heartbeats",
    )
    max_rdy_count: int = opt("max-rdy-count", INT, 2500, "maximum RDY count for a client")
    max_output_buffer_size: int = opt(
        "max-output-buffer-size",
        INT,
        65536,
        "maximum client configurable size (in bytes) for a client output buffer",
    )
    max_output_buffer_timeout: float = opt(
        "max-output-buffer-timeout",
        DURATION,
        30.0,
        "maximum client configurable duration of time between flushing to a client",
    )
    min_output_buffer_timeout: float = opt(
        "min-output-buffer-timeout",
        DURATION,
        0.025,
        "minimum client configurable duration of time between flushing to a client",
    )
    output_buffer_timeout: float = opt(
        "output-buffer-timeout", DURATION, 0.25, "default duration of time between flushing data to clients"
    )
    max_channel_consumers: int = opt(
        "max-channel-consumers",
        INT,
        0,
        "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)",
    )

    statsd_address: str = opt("statsd-address", STRING, "", "UDP <addr>:<port> of a statsd daemon for pushing stats")
    statsd_interval: float = opt("statsd-interval", DURATION, 60.0, "duration between pushing to statsd")
    statsd_mem_stats: bool = opt("statsd-mem-stats", BOOL, True, "toggle sending memory and GC stats to statsd")
    statsd_prefix: str = opt(
        "statsd-prefix", STRING, "nsq.%s", "prefix used for keys sent to statsd (%s for host replacement)"
    )
    statsd_udp_packet_size: int = opt("statsd-udp-packet-size", INT, 508, "the size in bytes of statsd UDP packets")
    statsd_exclude_ephemeral: bool = opt(
        "statsd-exclude-ephemeral",
        BOOL,
        False,
        "Skip ephemeral topics and channels when sending stats to statsd",
    )

    e2e_processing_latency_percentiles: list[float] = opt(
        "e2e-processing-latency-percentile",
        FLOAT_LIST,
        [],
        "message processing time percentiles (as float (0, 1.0]) to track (can be specified multiple times "
        "or comma separated '1.0,0.99,0.95', default none)",
        cfg="e2e_processing_latency_percentiles",
    )
    e2e_processing_latency_window_time: float = opt(
        "e2e-processing-latency-window-time",
        DURATION,
        600.0,
        "calculate end to end latency quantiles for this duration of time "
        "(ie: 60s would only show quantile calculations from the past 60 seconds)",
    )

    tls_cert: str = opt("tls-cert", STRING, "", "path to certificate file")
    tls_key: str = opt("tls-key", STRING, "", "path to key file")
    tls_client_auth_policy: str = opt(
        "tls-client-auth-policy", STRING, "", "client certificate auth policy ('require' or 'require-verify')"
    )
    tls_root_ca_file: str = opt("tls-root-ca-file", STRING, "", "path to certificate authority file")
    tls_required: int = opt(
        "tls-required",
        TLS_REQUIRED_KIND,
        TLS_NOT_REQUIRED,
        "require TLS for client connections (true, false, tcp-https)",
    )
    tls_min_version: str = opt(
        "tls-min-version",
        TLS_MIN_VERSION,
        "tls1.0",
        "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
    )

    deflate: bool = opt("deflate", BOOL, True, "enable deflate feature negotiation (client compression)")
    max_deflate_level: int = opt(
        "max-deflate-level",
        INT,
        6,
        "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)",
    )
    snappy: bool = opt("snappy", BOOL, True, "enable snappy feature negotiation (client compression)")

    def validate(self) -> None:
        """Go's checks in nsqd.New(), with its texts."""
        if not 1 <= self.max_deflate_level <= 9:
            raise ConfigError("--max-deflate-level must be [1,9]")
        if not 0 <= self.node_id < 1024:
            raise ConfigError("--node-id must be [0,1024)")
        if self.mem_queue_bytes < 0:
            raise ConfigError("--mem-queue-bytes must be >= 0")
        if self.max_disk_bytes < 0:
            raise ConfigError("--max-disk-bytes must be >= 0")
        if self.tls_client_auth_policy and self.tls_required == TLS_NOT_REQUIRED:
            self.tls_required = TLS_REQUIRED
        if self.tls_required != TLS_NOT_REQUIRED and not (self.tls_cert and self.tls_key):
            raise ConfigError("cannot require TLS client connections without TLS key and cert")
        if (self.tls_cert or self.tls_key) and self.https_address and split_address(self.https_address) is None:
            # HTTPS is TCP only (a path is not a unix socket there), refused before anything starts
            raise ConfigError(missing_port(self.https_address))
        if self.auth_http_request_method not in ("post", "get"):
            raise ConfigError("--auth-http-request-method must be post or get")
        for p in self.e2e_processing_latency_percentiles:
            if p <= 0 or p > 1:
                raise ConfigError(f"invalid E2E processing latency percentile: {p:g}")


NSQD_DEPRECATED_FLAGS = {
    "verbose": "[deprecated] has no effect, use --log-level",
    "worker-id": "[deprecated] use --node-id",
}


# -- the front ends --------------------------------------------------------

T = TypeVar("T")


def option_fields(cls: type) -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(cls))


def flag_fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("flag")]


class _GoArgumentParser(argparse.ArgumentParser):
    """Exit 2 with the message first, as Go's flag package does."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{message}\nRun '{self.prog} -help' for usage.\n")


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
    for key in keys:
        hint = difflib.get_close_matches(key.replace("-", "_").lower(), sorted(known), n=1)
        _log.warn(
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


def usage_options(
    cls: type, description: str, prog: str, deprecated: dict[str, str] | None = None
) -> type[usage.Options]:
    """A twistd usage.Options class built from the same table.

    Parsing goes through the console command's own parser (:func:`build_argparser`),
    so ``twistd nsqd ARGS`` accepts every form ``nsqd ARGS`` does and resolves to the
    same options; it also accepts ``--no-flag`` for a boolean. Whatever that parser
    does not know is left to usage.Options, so a subclass may add options of its
    own. Afterwards ``self.resolved`` is the options object and ``self[flag]``
    its value. Errors end the process the way the console command does: exit 2
    with the message for a bad flag, exit 1 with a FATAL line for a bad config file.
    """
    defaults = cls()
    fields = flag_fields(cls)
    parameters: list[list[Any]] = []
    flags: list[list[Any]] = []
    for f in fields:
        flag = f.metadata["flag"]
        kind: Kind = f.metadata["kind"]
        shown = kind.show(getattr(defaults, f.name))
        if kind.is_bool:
            forms = f"--{flag}[=true|false], --no-{flag}"
            flags.append([flag, None, f"{f.metadata['help']} [{forms}] (default {shown})"])
        else:
            parameters.append([flag, None, None, f.metadata["help"] + (f" (default {shown})" if shown else "")])
    for flag, help_text in (deprecated or {}).items():
        flags.append([flag, None, help_text])
    log_prefix = getattr(defaults, "log_prefix", f"[{prog.split()[-1]}] ")

    def parse_options(self: Any, options: Sequence[str] | None = None) -> None:
        argv = sys.argv[1:] if options is None else list(options)
        if "--_shell-completion" in argv:
            return usage.Options.parseOptions(self, argv)  # type: ignore[no-any-return]
        # a plugin subclassing these Options runs under its own name: twistd ticker
        sub = getattr(getattr(self, "parent", None), "subCommand", None)
        parser = build_argparser(f"twistd {sub}" if sub else self.prog, cls, deprecated, twistd=True)
        self._namespace, rest = parser.parse_known_args(argv)
        if self._namespace._help:
            self.opt_help()
        if self._namespace.version:
            self.opt_version()
        try:
            usage.Options.parseOptions(self, rest)
        except usage.UsageError as e:
            parser.error(str(e))

    def post_options(self: Any) -> None:
        try:
            self.resolved = resolve_namespace(cls, self._namespace, deprecated)
        except ConfigError as e:
            exit_fatal(log_prefix, str(e))
        self["config"] = self._namespace.config
        for f in fields:
            self[f.metadata["flag"]] = getattr(self.resolved, f.name)

    return type(
        cls.__name__ + "Usage",
        (usage.Options,),
        {
            "prog": prog,
            "optParameters": [["config", None, "", "path to config file"], *parameters],
            "optFlags": flags,
            "parseOptions": parse_options,
            "postOptions": post_options,
            "longdesc": description,
        },
    )


class TwistdServiceMaker(ServiceMaker):
    """twistd's ServiceMaker, ending on Go's FATAL line when the options are refused.

    ``makeService`` validates the options as the console command does; the
    error is its one ``FATAL: failed to instantiate APP - ...`` line and exit 1,
    not a traceback.
    """

    def makeService(self, options: Any) -> Any:
        from twisted.internet import reactor

        # twistd installs its signal handlers only when the reactor runs, after the
        # listening lines: a supervisor's early SIGTERM must still stop cleanly
        install_stop_signals(reactor)
        try:
            top = super().makeService(options)
        except ConfigError as e:
            resolved = getattr(options, "resolved", None)
            prefix = getattr(resolved, "log_prefix", f"[{self.tapname}] ")
            exit_fatal(prefix, f"failed to instantiate {self.tapname} - {e}")
        if hasattr(top, "exit_on_start_failure"):
            top.exit_on_start_failure = True
        return top
