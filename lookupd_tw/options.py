"""nsqlookupd's options table (Go's flags, defaults and --config keys)."""

from __future__ import annotations

from dataclasses import dataclass

from nsq_service.options import DURATION, LOG_LEVEL, STRING, ConfigError, hostname, missing_port, opt, split_address


@dataclass
class NSQLookupdOptions:
    log_level: str = opt("log-level", LOG_LEVEL, "info", "set log verbosity: debug, info, warn, error, or fatal")
    log_prefix: str = opt("log-prefix", STRING, "[nsqlookupd] ", "log message prefix")
    tcp_address: str = opt("tcp-address", STRING, "0.0.0.0:4160", "<addr>:<port> to listen on for TCP clients")
    http_address: str = opt("http-address", STRING, "0.0.0.0:4161", "<addr>:<port> to listen on for HTTP clients")
    broadcast_address: str = opt(
        "broadcast-address", STRING, hostname, "address of this lookupd node, (default to the OS hostname)"
    )
    inactive_producer_timeout: float = opt(
        "inactive-producer-timeout",
        DURATION,
        300.0,
        "duration of time a producer will remain in the active list since its last ping",
    )
    tombstone_lifetime: float = opt(
        "tombstone-lifetime",
        DURATION,
        45.0,
        "duration of time a producer will remain tombstoned if registration remains",
    )

    def validate(self) -> None:
        """Go's nsqlookupd listens on TCP only: an address without a port is refused
        (with Go's listen error) before anything starts, not taken as a unix socket."""
        for address in (self.tcp_address, self.http_address):
            if split_address(address) is None:
                raise ConfigError(missing_port(address))


DEPRECATED_FLAGS = {"verbose": "[deprecated] has no effect, use --log-level"}
