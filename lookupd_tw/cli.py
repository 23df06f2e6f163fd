"""The ``nsqlookupd`` command: Go nsqlookupd's flags, log lines and exit codes."""

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
        print(version_string("nsqlookupd"))
        return 0
    from lookupd_tw.options import DEPRECATED_FLAGS, NSQLookupdOptions
    from nsq_service.cli import fatal, run_server
    from nsq_service.options import ConfigError, parse_command_line

    try:
        opts, _ = parse_command_line("nsqlookupd", NSQLookupdOptions, argv, DEPRECATED_FLAGS)
    except ConfigError as e:
        return fatal("[nsqlookupd] ", str(e))
    if opts is None:
        print(version_string("nsqlookupd"))
        return 0
    listen = [opts.tcp_address, opts.http_address]
    return run_server("nsqlookupd", opts, _make_service, "failed to instantiate nsqlookupd", listen, tls=False)


def _make_service(opts: Any, reactor: Any) -> Any:
    from lookupd_tw.tap import makeService  # after the listening sockets are bound (run_server)

    return makeService(opts, reactor)


if __name__ == "__main__":
    sys.exit(main())
