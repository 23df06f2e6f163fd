"""The service hierarchy, shared by ``twistd nsqd`` and the ``nsqd`` command.

``makeService`` builds a MultiService: the NSQD core first (so it stops last,
after the listeners, and can hand what it holds to its backends), then the
TCP listener, HTTP, and the queue-scan timer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from nsq_service.limits import raise_fd_limit
from nsq_service.listen import Bound, ListeningService, ServerService
from nsq_service.memstats import GCPauses
from nsq_service.runtime import tune_gc
from nsq_service.serving import usage_options
from nsq_wire.version import version_string
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.options import NSQD_DEPRECATED_FLAGS, NSQDOptions

_BaseOptions = usage_options(
    NSQDOptions, "NSQ daemon (nsqd): the V2 TCP protocol and the HTTP API.", "twistd nsqd", NSQD_DEPRECATED_FLAGS
)


class Options(_BaseOptions):  # type: ignore[misc,valid-type]
    """``twistd nsqd`` options: the same table as the ``nsqd`` command."""

    def opt_version(self) -> None:
        """print version string"""
        print(version_string("nsqd"))
        sys.exit(0)


class Ticker(Service):
    """``fn()`` every ``interval`` seconds while running, first at start (what
    twisted.application.internet.TimerService does, without that module's import)."""

    def __init__(self, interval: float, fn: Callable[[], Any], reactor: Any, name: str) -> None:
        self.interval = interval
        self.loop = LoopingCall(fn)
        self.loop.clock = reactor
        self.log = Logger(namespace="nsqd_tw.tap")
        self.setName(name)

    def startService(self) -> None:
        super().startService()
        self.loop.start(self.interval, now=True).addErrback(
            lambda f: self.log.failure("{name} stopped", f, name=self.name)
        )

    def stopService(self) -> Any:
        super().stopService()
        if self.loop.running:
            self.loop.stop()


def makeService(config: Any, reactor: Any = None) -> ServerService:
    """Build nsqd's services from NSQDOptions (or twistd's parsed Options)."""
    opts: NSQDOptions = config if isinstance(config, NSQDOptions) else config.resolved
    if reactor is None:
        from twisted.internet import reactor as _reactor

        reactor = _reactor
    opts.validate()
    tune_gc()

    from nsqd_tw.http.api import make_site
    from nsqd_tw.http.statsd import StatsdService
    from nsqd_tw.lookup import LookupService
    from nsqd_tw.tcp.protocol import V2Factory

    top = ServerService("failed to instantiate nsqd", opts.log_prefix)
    nsqd = NSQD(opts, reactor)
    raise_fd_limit(nsqd.log_gate.logger("nsq_service.limits"))
    nsqd.setServiceParent(top)
    top.on_sigterm = nsqd.sigterm  # --sigterm-mode drain
    nsqd.request_stop = top.stop_process  # a drain's end, PUT /config/shutdown
    gc_pauses = GCPauses()  # the GC pauses /stats, statsd and /metrics report
    gc_pauses.setServiceParent(top)
    bound = Bound()

    def tcp_bound(host: Any) -> None:
        bound.tcp = Bound.of(host)
        if not opts.broadcast_tcp_port:
            opts.broadcast_tcp_port = bound.tcp[1]

    def http_bound(host: Any) -> None:
        bound.http = Bound.of(host)
        if not opts.broadcast_http_port:
            opts.broadcast_http_port = bound.http[1]

    def https_bound(host: Any) -> None:
        bound.https = Bound.of(host)

    tls = None
    if opts.tls_cert or opts.tls_key:  # pyOpenSSL only then (nsq_service.runtime.import_reactor)
        from nsqd_tw.tls import server_tls

        tls = server_tls(opts, nsqd.log_gate.logger("nsqd_tw.tls"))
    log = nsqd.log_gate.logger("nsq_service.listen")
    v2 = V2Factory(nsqd, tls)
    tcp = ListeningService("TCP", reactor, opts.tcp_address, v2, tcp_bound, log=log)
    tcp.setServiceParent(top)
    if opts.http_address:
        site = make_site(nsqd, bound, gc_pauses=gc_pauses)
        ListeningService("HTTP", reactor, opts.http_address, site, http_bound, log=log).setServiceParent(top)
    if tls is not None and opts.https_address:
        site = make_site(nsqd, bound, tls_enabled=True, gc_pauses=gc_pauses)
        ListeningService("HTTPS", reactor, opts.https_address, site, https_bound, tls=tls, log=log).setServiceParent(
            top
        )
    if opts.statsd_address:
        StatsdService(nsqd, gc_pauses).setServiceParent(top)
    lookup = LookupService(nsqd)
    if opts.replicated:  # beyond Go: after the listeners (it announces their ports), before lookup
        from nsqd_tw.replication import wire
        from nsqd_tw.replication.service import ReplicationService

        replication = ReplicationService(nsqd, lookup, tls)
        v2.magics[wire.MAGIC] = replication.accept
        replication.setServiceParent(top)
    lookup.setServiceParent(top)  # after the listeners: it announces their ports

    Ticker(opts.queue_scan_interval, nsqd.queue_scan, reactor, "queue-scan").setServiceParent(top)
    Ticker(opts.sync_timeout, nsqd.syncer.tick, reactor, "disk-sync").setServiceParent(top)
    top.nsqd = nsqd  # type: ignore[attr-defined]
    top.bound = bound  # type: ignore[attr-defined]
    return top
