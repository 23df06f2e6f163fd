"""The ``nsqlookupd`` command: Go nsqlookupd's flags, log lines and exit codes."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lookupd_tw.options import DEPRECATED_FLAGS, NSQLookupdOptions
from nsq_service.cli import fatal, run_server
from nsq_service.options import ConfigError, parse_command_line


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts, _ = parse_command_line("nsqlookupd", NSQLookupdOptions, argv, DEPRECATED_FLAGS)
    except ConfigError as e:
        return fatal("[nsqlookupd] ", str(e))
    if opts is None:
        from nsq_wire.version import version_string

        print(version_string("nsqlookupd"))
        return 0
    from lookupd_tw.tap import makeService

    return run_server("nsqlookupd", opts, makeService, "failed to instantiate nsqlookupd")


if __name__ == "__main__":
    sys.exit(main())
