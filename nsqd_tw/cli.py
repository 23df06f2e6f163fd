"""The ``nsqd`` command: Go nsqd's flags, log lines and exit codes.

The process started is the server itself (no shell, no fork), so a harness
may SIGKILL its PID and restart on the same ports at once.
"""

from __future__ import annotations

import sys

from nsq_wire.version import version_string

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if list(argv) in (["--version"], ["-version"]):  # the answer the options table would give
        print(version_string("nsqd"))
        return 0
    from nsq_service.cli import fatal, run_server
    from nsq_service.options import ConfigError, parse_command_line
    from nsqd_tw.options import NSQD_DEPRECATED_FLAGS, NSQDOptions

    try:
        opts, _ = parse_command_line("nsqd", NSQDOptions, argv, NSQD_DEPRECATED_FLAGS)
    except ConfigError as e:
        return fatal("[nsqd] ", str(e))
    if opts is None:
        print(version_string("nsqd"))
        return 0
    tls = bool(opts.tls_cert or opts.tls_key)
    listen = [opts.tcp_address, opts.http_address]
    if tls:  # the HTTPS listener exists only then
        listen.append(opts.https_address)
    # startTLS: IDENTIFY's tls_v1 (needs a certificate), and a replication link, whose
    # dialer starts TLS as a client when its peer has a certificate
    start_tls = tls or opts.replicated or bool(opts.replication_secret_file)
    return run_server("nsqd", opts, _make_service, "failed to instantiate nsqd", listen, start_tls)


def _make_service(opts: Any, reactor: Any) -> Any:
    from nsqd_tw.tap import makeService  # after the listening sockets are bound (run_server)

    return makeService(opts, reactor)


if __name__ == "__main__":
    sys.exit(main())
