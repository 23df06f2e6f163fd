"""Options: one table, three front ends.

:class:`NSQDOptions` is the table: each field carries its Go flag name, its
``--config`` (TOML) key, its kind and help text. From it come the ``nsqd``
command's parser (Go's flag syntax, via argparse), the ``twistd nsqd``
usage.Options, and the TOML loader. Durations are float seconds.

The machinery (kinds, :func:`build_argparser`, :func:`resolve`,
:func:`usage_options`) is shared with ``lookupd_tw``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from nsq_service.options import (
    BOOL,
    DURATION,
    FLOAT,
    FLOAT_LIST,
    INT,
    LOG_LEVEL,
    STRING,
    STRING_LIST,
    ConfigError,
    Kind,
    _parse_bool,
    hostname,
    missing_port,
    opt,
    split_address,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# -- Go's time.ParseDuration ---------------------------------------------


# -- kinds -----------------------------------------------------------------


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


# the protocol numbers (Go's tls.VersionTLS1x, Python's ssl.TLSVersion): no ssl import for --help
TLS_VERSIONS = {"tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}


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

    def to_http(self, value: Any) -> int:
        return TLS_VERSIONS[value]


SIGTERM_MODES = ("shutdown", "drain")


class _SigtermMode(Kind):
    def from_flag(self, text: str) -> str:
        mode = text.lower()
        if mode not in SIGTERM_MODES:
            raise ConfigError(f'unknown sigterm mode "{text}" (shutdown or drain)')
        return mode


REPLICATION_ROLES = ("primary", "standby")
REPLICATION_MODES = ("sync", "async")


class _ReplicationRole(Kind):
    def from_flag(self, text: str) -> str:
        role = text.lower()
        if role not in REPLICATION_ROLES:
            raise ConfigError(f'unknown replication role "{text}" (primary or standby)')
        return role


class _ReplicationMode(Kind):
    def from_flag(self, text: str) -> str:
        mode = text.lower()
        if mode not in REPLICATION_MODES:
            raise ConfigError(f'unknown replication mode "{text}" (sync or async)')
        return mode


REPLICATION_ROLE = _ReplicationRole()
REPLICATION_MODE = _ReplicationMode()
TLS_REQUIRED_KIND = _TLSRequired()
TLS_MIN_VERSION = _TLSMinVersion()
SIGTERM_MODE = _SigtermMode()


def default_node_id() -> int:
    """Go's default: crc32(md5(hostname)) % 1024."""
    try:  # CPython's own md5: hashlib's is OpenSSL's, whose library takes ms to load
        from _md5 import md5
    except ImportError:
        from hashlib import md5

    return zlib.crc32(md5(hostname().encode()).digest()) % 1024


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
    max_attempts: int = opt(
        "max-attempts",
        INT,
        0,
        "beyond Go: default of every channel: deliveries before a message goes to its dead-letter topic (0 = none)",
    )
    dead_letter_topic: str = opt(
        "dead-letter-topic",
        STRING,
        "",
        "beyond Go: default dead-letter topic of every channel (empty = <topic>.dead)",
    )
    expire_to_dead_letter: bool = opt(
        "expire-to-dead-letter",
        BOOL,
        False,
        "beyond Go: default: messages past --max-age go to the channel's dead-letter topic instead of being dropped",
    )
    max_age: float = opt(
        "max-age",
        DURATION,
        0.0,
        "beyond Go: default message TTL of every topic and channel: older messages are never delivered (0 = none)",
    )
    max_depth: int = opt(
        "max-depth",
        INT,
        -1,
        "beyond Go: default bound of every topic and channel in messages (-1 = none; 0 = buffer nothing)",
    )
    max_queue_bytes: int = opt(
        "max-queue-bytes",
        INT,
        -1,
        "beyond Go: default bound of every topic and channel in message bytes, memory and disk (-1 = none)",
    )
    overflow: str = opt(
        "overflow",
        STRING,
        "reject",
        "beyond Go: what a full bounded queue does: reject (publishes fail) or drop_oldest",
    )
    retention: float = opt(
        "retention",
        DURATION,
        0.0,
        "beyond Go: default of every topic: keep each published message this long in the topic's retained log, "
        "for channel rewinds (0 = no retained log)",
    )
    retention_bytes: int = opt(
        "retention-bytes",
        INT,
        0,
        "beyond Go: default of every topic: the most bytes its retained log keeps, oldest segments deleted first "
        "(0 = no limit; alone: a retained log bounded by size only)",
    )
    max_bytes_per_file: int = opt(
        "max-bytes-per-file", INT, 100 * 1024 * 1024, "number of bytes per diskqueue file before rolling"
    )
    sync_every: int = opt("sync-every", INT, 2500, "number of messages per diskqueue fsync")
    sync_timeout: float = opt("sync-timeout", DURATION, 2.0, "duration of time per diskqueue fsync")
    sigterm_mode: str = opt(
        "sigterm-mode",
        SIGTERM_MODE,
        "shutdown",
        "beyond Go: what SIGTERM does: shutdown (stop now, keeping what is queued for the next start) "
        "or drain (refuse new messages, deliver every queued one, then stop)",
    )
    drain_timeout: float = opt(
        "drain-timeout",
        DURATION,
        0.0,
        "beyond Go: how long a drain may last before nsqd stops anyway, keeping what is left on disk (0 = no limit)",
    )

    replica: str = opt(
        "replica",
        STRING,
        "",
        "beyond Go: <addr>:<port> (TCP) of the standby nsqd this primary streams everything it accepts to",
    )
    replication_role: str = opt(
        "replication-role",
        REPLICATION_ROLE,
        "primary",
        "beyond Go: primary or standby: this node's replication role at its first start "
        "(then replication.json under --data-path keeps it)",
    )
    replication_secret_file: str = opt(
        "replication-secret-file",
        STRING,
        "",
        "beyond Go: path to the secret both nodes of a replication pair share (they authenticate each other with it)",
    )
    replication_mode: str = opt(
        "replication-mode",
        REPLICATION_MODE,
        "sync",
        "beyond Go: sync (PUB answered OK once the standby holds the message) or async (OK at once)",
    )
    replication_required: bool = opt(
        "replication-required",
        BOOL,
        False,
        "beyond Go: refuse publishes while the standby is not in sync, rather than acknowledge on one node",
    )
    replication_timeout: float = opt(
        "replication-timeout",
        DURATION,
        5.0,
        "beyond Go: a replication link silent this long is dropped; also the primary's lease, which its standby "
        "waits out (and 1s) before taking over",
    )
    replication_max_lag: int = opt(
        "replication-max-lag",
        INT,
        10000,
        "beyond Go: async mode: operations sent and not acknowledged by the standby before publishes wait for it",
    )
    replication_max_lag_bytes: int = opt(
        "replication-max-lag-bytes",
        INT,
        64 << 20,
        "beyond Go: bytes sent and not acknowledged by the standby before publishes wait for it (either mode), "
        "and their producers are not read from meanwhile",
    )
    promote_after: float = opt(
        "promote-after",
        DURATION,
        0.0,
        "beyond Go: a standby promotes itself once its primary is unreachable this long, its lease has run out "
        "and a majority of its witnesses agree (0 = only POST /replication/promote)",
    )
    replication_witnesses: list[str] = opt(
        "replication-witness",
        STRING_LIST,
        [],
        "beyond Go: <addr>:<port> (HTTP) of an nsq-tw nsqlookupd that witnesses this pair's failovers (may be given "
        "multiple times; default: the --lookupd-tcp-address nsqlookupds)",
        cfg="replication_witnesses",
    )

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
        if self.sigterm_mode not in SIGTERM_MODES:
            raise ConfigError(f'--sigterm-mode must be shutdown or drain, not "{self.sigterm_mode}"')
        if self.drain_timeout < 0:
            raise ConfigError("--drain-timeout must be >= 0")
        self._validate_replication()
        from nsqd_tw.core.settings import SettingsError, check_defaults

        try:
            check_defaults(self)
        except SettingsError as e:
            raise ConfigError(str(e)) from None
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

    @property
    def replicated(self) -> bool:
        """Whether this node is one of a replication pair (beyond Go)."""
        return bool(self.replica) or self.replication_role == "standby"

    def _validate_replication(self) -> None:
        if self.replication_role not in REPLICATION_ROLES:
            raise ConfigError(f'--replication-role must be primary or standby, not "{self.replication_role}"')
        if self.replication_mode not in REPLICATION_MODES:
            raise ConfigError(f'--replication-mode must be sync or async, not "{self.replication_mode}"')
        if not 0 < self.replication_timeout <= 3600:
            raise ConfigError("--replication-timeout must be > 0 and at most 1h (it is the primary's lease)")
        if self.replication_max_lag < 1:
            raise ConfigError("--replication-max-lag must be >= 1")
        if self.replication_max_lag_bytes < 1:
            raise ConfigError("--replication-max-lag-bytes must be >= 1")
        if self.promote_after < 0:
            raise ConfigError("--promote-after must be >= 0")
        if self.replicated and not self.replication_secret_file:
            raise ConfigError(
                "--replication-secret-file is required with --replica or --replication-role standby "
                "(the pair authenticates each other with it)"
            )
        if self.replica and split_address(self.replica) is None:
            raise ConfigError(f"--replica {self.replica}: missing port in address")
        if len(self.replication_witnesses) > 9:
            raise ConfigError("--replication-witness: at most 9")
        for address in self.replication_witnesses:
            if split_address(address) is None:
                raise ConfigError(f"--replication-witness {address}: missing port in address")


NSQD_DEPRECATED_FLAGS = {
    "verbose": "[deprecated] has no effect, use --log-level",
    "worker-id": "[deprecated] use --node-id",
}


# -- the front ends --------------------------------------------------------
