"""The ``nsqd`` command: Go nsqd's flags, log lines and exit codes.

The process started is the server itself (no shell, no fork), so a harness
may SIGKILL its PID and restart on the same ports at once.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from twisted.logger import globalLogBeginner

from nsqd_tw.log import GoLogObserver, go_log_line
from nsqd_tw.options import (
    NSQD_DEPRECATED_FLAGS,
    ConfigError,
    NSQDOptions,
    install_stop_signals,
    parse_command_line,
    start_error_text,
)


def fatal(prefix: str, text: str) -> int:
    sys.stderr.write(go_log_line(prefix, "FATAL", text))
    sys.stderr.flush()
    return 1


def run_server(
    app: str,
    opts: Any,
    make_service: Any,
    instantiate_error: str,
) -> int:
    """Log to stderr as Go does, start the services, run the reactor.

    A failed start prints one FATAL line and returns 1 without stopping
    anything: nothing was handed over yet, and stopping would write files.
    """
    from twisted.internet import reactor

    install_stop_signals(reactor)
    observer = GoLogObserver(sys.stderr, opts.log_prefix, opts.log_level)
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False, discardBuffer=False)
    try:
        top = make_service(opts, reactor)
    except ConfigError as e:
        return fatal(opts.log_prefix, f"{instantiate_error} - {e}")
    try:
        top.privilegedStartService()
        top.startService()
    except Exception as e:
        return fatal(opts.log_prefix, start_error_text(e, instantiate_error))
    reactor.addSystemEventTrigger("before", "shutdown", top.stopService)
    reactor.run()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts, _ = parse_command_line("nsqd", NSQDOptions, argv, NSQD_DEPRECATED_FLAGS)
    except ConfigError as e:
        return fatal("[nsqd] ", str(e))
    if opts is None:
        from nsqd_tw.tap import version_string

        print(version_string("nsqd"))
        return 0
    from nsqd_tw.tap import makeService

    return run_server("nsqd", opts, makeService, "failed to instantiate nsqd")


if __name__ == "__main__":
    sys.exit(main())
