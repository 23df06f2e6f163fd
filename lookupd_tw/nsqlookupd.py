"""NSQLookupd: the registration DB and the addresses it serves on."""

from __future__ import annotations

from typing import Any

from twisted.application import service

from lookupd_tw.options import NSQLookupdOptions
from lookupd_tw.registration_db import RegistrationDB
from nsqd_tw.log import Logger
from nsqd_tw.nsqd import python_version
from nsqd_tw.options import VERSION


class NSQLookupd(service.Service):
    name = "nsqlookupd"
    log = Logger(namespace="lookupd_tw.nsqlookupd")

    def __init__(self, opts: NSQLookupdOptions, reactor: Any = None) -> None:
        if reactor is None:
            from twisted.internet import reactor as _reactor

            reactor = _reactor
        self.opts = opts
        self.reactor = reactor
        self.db = RegistrationDB()
        self.tcp_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None

    def now(self) -> float:
        return float(self.reactor.seconds())

    def privilegedStartService(self) -> None:
        self.log.info("nsqlookupd v{version} (built w/{python})", version=VERSION, python=python_version())
        service.Service.privilegedStartService(self)
