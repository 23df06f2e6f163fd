"""Running a server as a console command: Go's log lines and exit codes."""

from __future__ import annotations

import sys
from typing import Any

from nsq_service.golog import go_log_line
from nsq_service.options import ConfigError, start_error_text


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
    # Twisted only now: --version, --help and a refused flag never load it
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner

    from nsq_service.log import GoLogObserver
    from nsq_service.serving import ignore_stop_signals, install_stop_signals

    signals = install_stop_signals(reactor)
    observer = GoLogObserver(sys.stderr, opts.log_prefix, opts.log_level)
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False, discardBuffer=False)
    try:
        top = make_service(opts, reactor)
    except ConfigError as e:
        return fatal(opts.log_prefix, f"{instantiate_error} - {e}")
    signals.serve(top)
    try:
        top.privilegedStartService()
        top.startService()
    except Exception as e:
        return fatal(opts.log_prefix, start_error_text(e, instantiate_error))
    reactor.addSystemEventTrigger("before", "shutdown", top.stopService)
    reactor.run()
    ignore_stop_signals()
    return int(getattr(top, "exit_code", 0))
