"""The ``nsqd`` command: Go nsqd's flags, log lines and exit codes.

The process started is the server itself (no shell, no fork), so a harness
may SIGKILL its PID and restart on the same ports at once.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from nsq_service.cli import fatal, run_server
from nsq_service.options import ConfigError, parse_command_line
from nsqd_tw.options import NSQD_DEPRECATED_FLAGS, NSQDOptions


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts, _ = parse_command_line("nsqd", NSQDOptions, argv, NSQD_DEPRECATED_FLAGS)
    except ConfigError as e:
        return fatal("[nsqd] ", str(e))
    if opts is None:
        from nsq_wire.version import version_string

        print(version_string("nsqd"))
        return 0
    from nsqd_tw.tap import makeService

    return run_server("nsqd", opts, makeService, "failed to instantiate nsqd")


if __name__ == "__main__":
    sys.exit(main())
