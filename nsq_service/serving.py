"""The front ends once they serve: twistd's Options and ServiceMaker built from
the option table, and the stop signals of both ``nsqd`` and ``twistd nsqd``.

Kept apart from :mod:`nsq_service.options`, which imports no Twisted, so that
``nsqd --version`` and ``--help`` answer without loading it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from twisted.application.service import ServiceMaker
from twisted.python import usage

from nsq_service.options import ConfigError, Kind, build_argparser, exit_fatal, flag_fields, resolve_namespace


class StopSignals:
    """What SIGTERM and SIGINT do to a server process, under either front end.

    The first stops the reactor cleanly, as Go's nsqd; the server may take
    SIGTERM itself instead (nsqd's ``--sigterm-mode drain``: the top service's
    ``on_sigterm`` returns True), and ask for the same stop later
    (:meth:`stop`, which :meth:`serve` hands it as its ``stopper``). Once a stop
    has begun, further signals are ignored (Go's nsqd, too).
    """

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.stopping = False
        self.server: Any = None
        self._sig_int, self._sig_term = reactor.sigInt, reactor.sigTerm

    def serve(self, server: Any) -> None:
        """From now on ``server`` (the top service) sees SIGTERM first and may stop the process."""
        self.server = server
        if hasattr(server, "stopper"):
            server.stopper = self.stop

    def handler(self, signum: int, frame: Any) -> None:
        import signal

        if self.stopping:
            return
        if signum == signal.SIGTERM and getattr(self.server, "on_sigterm", None) is not None:
            if self.server.on_sigterm():
                return
        self.stopping = True
        (self._sig_int if signum == signal.SIGINT else self._sig_term)(signum, frame)

    def stop(self) -> None:
        """Stop the process as a signal would, without one (the reactor stops; exit 0)."""
        if self.stopping:
            return
        self.stopping = True
        self.reactor.callFromThread(self.reactor.stop)


def install_stop_signals(reactor: Any) -> StopSignals:
    """SIGTERM and SIGINT stop the reactor cleanly from now on (see :class:`StopSignals`).

    A signal that comes before the reactor runs queues the stop for when it
    does; SIGINT is caught even when the process inherited it ignored (started
    with ``&``), as Go's signal.Notify does. The reactor installs handlers of
    its own when it starts (they call ``reactor.sigTerm``...): those are ours
    too, and ours go back in place once it runs. :func:`ignore_stop_signals`
    covers the process's exit.
    """
    import signal

    signals = StopSignals(reactor)

    def install() -> None:
        signal.signal(signal.SIGTERM, signals.handler)
        signal.signal(signal.SIGINT, signals.handler)

    reactor.sigInt = reactor.sigTerm = signals.handler
    install()
    reactor.callWhenRunning(install)
    return signals


def ignore_stop_signals() -> None:
    """Signals that arrive once the reactor has stopped change nothing.

    Python gives a signal it handled in Python back its default action (death)
    as the interpreter finalizes, where an ignored one stays ignored.
    """
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


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
        signals = install_stop_signals(reactor)
        try:
            top = super().makeService(options)
        except ConfigError as e:
            resolved = getattr(options, "resolved", None)
            prefix = getattr(resolved, "log_prefix", f"[{self.tapname}] ")
            exit_fatal(prefix, f"failed to instantiate {self.tapname} - {e}")
        if hasattr(top, "exit_on_start_failure"):
            top.exit_on_start_failure = True
        signals.serve(top)
        return top
