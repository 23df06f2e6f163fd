"""Running a server as a console command: Go's log lines and exit codes."""

from __future__ import annotations

import sys

from nsq_service.golog import go_log_line
from nsq_service.options import ConfigError, start_error_text
from nsq_service.prebind import Prebound

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


def fatal(prefix: str, text: str) -> int:
    sys.stderr.write(go_log_line(prefix, "FATAL", text))
    sys.stderr.flush()
    return 1


def run_server(
    app: str,
    opts: Any,
    make_service: Any,
    instantiate_error: str,
    listen: Iterable[str] = (),
    tls: bool = True,
) -> int:
    """Log to stderr as Go does, start the services, run the reactor.

    The TCP addresses in ``listen`` are listened on first, before Twisted is
    loaded (nsq_service.prebind): a client that connects during the start waits
    in the backlog instead of being refused. The listeners of the service tree
    adopt those sockets; one that none adopts is closed once the start is over.

    ``tls``: whether the server may use TLS on its TCP connections (startTLS);
    without it the reactor is imported without pyOpenSSL (nsq_service.runtime).

    A failed start prints one FATAL line and returns 1 without stopping
    anything: nothing was handed over yet, and stopping would write files.
    """
    prebound = Prebound()
    prebound.listen(listen)
    try:
        return _serve(opts, make_service, instantiate_error, prebound, tls)
    finally:
        prebound.close()


def _serve(opts: Any, make_service: Any, instantiate_error: str, prebound: Prebound, tls: bool) -> int:
    # Twisted only now: --version, --help and a refused flag never load it
    from nsq_service.runtime import import_reactor

    reactor = import_reactor(tls)
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
    for child in top:
        adopt = getattr(child, "adopt", None)  # a ListeningService
        if adopt is not None:
            adopt(prebound.take(child.address))
    try:
        top.privilegedStartService()
        top.startService()
    except Exception as e:
        return fatal(opts.log_prefix, start_error_text(e, instantiate_error))
    prebound.close()
    reactor.addSystemEventTrigger("before", "shutdown", top.stopService)
    reactor.run()
    ignore_stop_signals()
    return int(getattr(top, "exit_code", 0))
