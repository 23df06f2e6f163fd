"""``twistd nsqlookupd`` and the service hierarchy the ``nsqlookupd`` command runs."""

from __future__ import annotations

import sys
from typing import Any

from lookupd_tw.nsqlookupd import NSQLookupd
from lookupd_tw.options import DEPRECATED_FLAGS, NSQLookupdOptions
from nsq_service.limits import raise_fd_limit
from nsq_service.listen import ListeningService, ServerService
from nsq_service.serving import usage_options
from nsq_wire.version import version_string

_BaseOptions = usage_options(
    NSQLookupdOptions,
    "NSQ discovery service (nsqlookupd): V1 TCP protocol and HTTP API.",
    "twistd nsqlookupd",
    DEPRECATED_FLAGS,
)


class Options(_BaseOptions):  # type: ignore[misc,valid-type]
    """``twistd nsqlookupd`` options: the same table as the ``nsqlookupd`` command."""

    def opt_version(self) -> None:
        """print version string"""
        print(version_string("nsqlookupd"))
        sys.exit(0)


def makeService(config: Any, reactor: Any = None) -> ServerService:
    opts: NSQLookupdOptions = config if isinstance(config, NSQLookupdOptions) else config.resolved
    if reactor is None:
        from twisted.internet import reactor as _reactor

        reactor = _reactor
    opts.validate()

    from lookupd_tw.http_api import make_site
    from lookupd_tw.protocol_v1 import LookupFactory

    top = ServerService("failed to instantiate nsqlookupd", opts.log_prefix)
    lookupd = NSQLookupd(opts, reactor)
    raise_fd_limit(lookupd.log_gate.logger("nsq_service.limits"))
    lookupd.setServiceParent(top)

    def tcp_bound(host: Any) -> None:
        lookupd.tcp_address = (getattr(host, "host", ""), getattr(host, "port", 0))

    def http_bound(host: Any) -> None:
        lookupd.http_address = (getattr(host, "host", ""), getattr(host, "port", 0))

    # Go's nsqlookupd listens on TCP only: a path is an error, not a unix socket
    log = lookupd.log_gate.logger("nsq_service.listen")
    tcp = ListeningService("TCP", reactor, opts.tcp_address, LookupFactory(lookupd), tcp_bound, unix=False, log=log)
    tcp.setServiceParent(top)
    http = ListeningService("HTTP", reactor, opts.http_address, make_site(lookupd), http_bound, unix=False, log=log)
    http.setServiceParent(top)
    top.lookupd = lookupd  # type: ignore[attr-defined]
    return top
