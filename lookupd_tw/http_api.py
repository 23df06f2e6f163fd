"""nsqlookupd's HTTP API (Klein): discovery for consumers, administration.

Go nsqlookupd 1.3's routes, statuses and JSON; the response conventions are
:mod:`nsq_service.web`'s, shared with nsqd.
"""

from __future__ import annotations

from typing import Any

from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from lookupd_tw.nsqlookupd import NSQLookupd
from lookupd_tw.registration_db import GO_ZERO_TIME_NS, Registration, filter_by_active
from nsq_service.log import LEVEL_NUMBERS, Logger, set_log_level
from nsq_service.options import LOG_LEVELS, flag_fields
from nsq_service.web import GoHTTPAPI, HTTPError, JSONValue, Router, add_debug_routes, query
from nsq_service.web import body as read_body
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name
from nsq_wire.version import VERSION

log = Logger(namespace="lookupd_tw.http_api")

router = Router()
handler = router.handler
ROUTES = router.routes
add_debug_routes(router, "/debug/pprof")


def _arg(params: dict[str, list[str]], name: str, missing: str) -> str:
    if name not in params:
        raise HTTPError(400, missing)
    return params[name][0]


def _topic_channel(params: dict[str, list[str]]) -> tuple[str, str]:
    """Go's http_api.GetTopicChannelArgs."""
    topic = _arg(params, "topic", "MISSING_ARG_TOPIC")
    if not is_valid_topic_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    channel = _arg(params, "channel", "MISSING_ARG_CHANNEL")
    if not is_valid_channel_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


class LookupdHTTPAPI(GoHTTPAPI):
    app = router.app
    router = router
    log = log

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.reactor = lookupd.reactor
        self.profiling = False

    def resource(self) -> Any:
        return _GoURLs(self, super().resource())

    @handler("/ping", "GET", style="plain")
    def ping(self, request: Request) -> str:
        return "OK"

    @handler("/info", "GET")
    def info(self, request: Request) -> dict[str, Any]:
        return {"version": VERSION}

    @handler("/topics", "GET")
    def topics(self, request: Request) -> dict[str, Any]:
        return {"topics": [r.key for r in self.db.find_registrations("topic", "*", "")]}

    @handler("/channels", "GET")
    def channels(self, request: Request) -> dict[str, Any]:
        topic = _arg(query(request), "topic", "MISSING_ARG_TOPIC")
        return {"channels": [r.subkey for r in self.db.find_registrations("channel", topic, "*")]}

    @handler("/lookup", "GET")
    def lookup(self, request: Request) -> dict[str, Any]:
        topic = _arg(query(request), "topic", "MISSING_ARG_TOPIC")
        if not self.db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        channels = [r.subkey for r in self.db.find_registrations("channel", topic, "*")]
        opts = self.lookupd.opts
        producers = filter_by_active(
            self.db.find_producers("topic", topic, ""),
            opts.inactive_producer_timeout,
            opts.tombstone_lifetime,
            self.lookupd.now(),
        )
        return {"channels": channels, "producers": [p.peer_info.to_json() for p in producers]}

    @handler("/nodes", "GET")
    def nodes(self, request: Request) -> dict[str, Any]:
        opts = self.lookupd.opts
        now = self.lookupd.now()
        # tombstoned nodes are listed, with their tombstones
        producers = filter_by_active(self.db.find_producers("client", "", ""), opts.inactive_producer_timeout, 0, now)
        nodes = []
        for p in producers:
            topics = [r.key for r in self.db.lookup_registrations(p.peer_info.id) if r.is_match("topic", "*", "")]
            tombstones = []
            for t in topics:
                tombstoned = False
                for tp in self.db.find_producers("topic", t, ""):
                    if tp.peer_info is p.peer_info:
                        tombstoned = tp.is_tombstoned(opts.tombstone_lifetime, now)
                        break
                tombstones.append(tombstoned)
            node = p.peer_info.to_json()
            node["tombstones"] = tombstones
            node["topics"] = topics
            nodes.append(node)
        return {"producers": nodes}

    @handler("/debug", "GET")
    def debug(self, request: Request) -> dict[str, Any]:
        data: dict[str, list[dict[str, Any]]] = {}
        for r, producers in sorted(self.db.registrations.items()):
            for p in producers.values():
                info = p.peer_info
                if info.gone:
                    continue
                data.setdefault(f"{r.category}:{r.key}:{r.subkey}", []).append(
                    {
                        "broadcast_address": info.broadcast_address,
                        "hostname": info.hostname,
                        "http_port": info.http_port,
                        "id": info.id,
                        "last_update": int(info.last_update * 1e9),
                        "tcp_port": info.tcp_port,
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": int(p.tombstoned_at * 1e9) if p.tombstoned else GO_ZERO_TIME_NS,
                        "version": info.version,
                    }
                )
        return data

    @handler("/topic/create", "POST")
    def topic_create(self, request: Request) -> None:
        topic = _arg(query(request), "topic", "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        self.log.info("DB: adding topic({topic})", topic=topic)
        self.db.add_registration(Registration("topic", topic, ""))

    @handler("/topic/delete", "POST")
    def topic_delete(self, request: Request) -> None:
        topic = _arg(query(request), "topic", "MISSING_ARG_TOPIC")
        for r in self.db.find_registrations("channel", topic, "*"):
            self.log.info("DB: removing channel({channel}) from topic({topic})", channel=r.subkey, topic=topic)
            self.db.remove_registration(r)
        for r in self.db.find_registrations("topic", topic, ""):
            self.log.info("DB: removing topic({topic})", topic=topic)
            self.db.remove_registration(r)

    @handler("/topic/tombstone", "POST")
    def topic_tombstone(self, request: Request) -> None:
        params = query(request)
        topic = _arg(params, "topic", "MISSING_ARG_TOPIC")
        node = _arg(params, "node", "MISSING_ARG_NODE")
        self.log.info("DB: setting tombstone for producer@{node} of topic({topic})", node=node, topic=topic)
        for p in self.db.find_producers("topic", topic, ""):
            if f"{p.peer_info.broadcast_address}:{p.peer_info.http_port}" == node:
                p.tombstone(self.lookupd.now())

    @handler("/channel/create", "POST")
    def channel_create(self, request: Request) -> None:
        topic, channel = _topic_channel(query(request))
        self.log.info("DB: adding channel({channel}) in topic({topic})", channel=channel, topic=topic)
        self.db.add_registration(Registration("channel", topic, channel))
        self.log.info("DB: adding topic({topic})", topic=topic)
        self.db.add_registration(Registration("topic", topic, ""))

    @handler("/channel/delete", "POST")
    def channel_delete(self, request: Request) -> None:
        topic, channel = _topic_channel(query(request))
        registrations = self.db.find_registrations("channel", topic, channel)
        if not registrations:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        self.log.info("DB: removing channel({channel}) from topic({topic})", channel=channel, topic=topic)
        for r in registrations:
            self.db.remove_registration(r)

    @handler("/config/<opt>", "GET", "PUT", body=lambda api: 1 << 16)
    def config(self, request: Request, opt: str) -> Any:
        """Beyond Go's nsqlookupd: options by --config key; PUT log_level."""
        opts = self.lookupd.opts
        if request.method == b"PUT":
            data = read_body(request, 1 << 16)
            if not data:
                raise HTTPError(413, "INVALID_VALUE")
            if opt != "log_level":
                raise HTTPError(400, "INVALID_OPTION")
            level = data.decode("utf-8", "replace").lower()
            if level not in LOG_LEVELS:
                raise HTTPError(400, "INVALID_VALUE")
            opts.log_level = level
            set_log_level(level)
        for f in flag_fields(type(opts)):
            if f.metadata["cfg"] == opt:
                value = getattr(opts, f.name)
                kind = type(f.metadata["kind"]).__name__
                if kind == "_Duration":
                    value = round(value * 1e9)
                elif kind == "_LogLevel":
                    value = LEVEL_NUMBERS[value]
                return JSONValue(value)
        raise HTTPError(400, "INVALID_OPTION")


class _GoURLs(Resource):
    """Go's answers to what Klein cannot route: a Host header or a path that is
    not UTF-8 (Klein answered 400 and logged a traceback)."""

    isLeaf = True

    def __init__(self, api: LookupdHTTPAPI, routed: Resource) -> None:
        super().__init__()
        self.api = api
        self.routed = routed

    def render(self, request: Request) -> Any:
        try:
            request.getRequestHostname().decode("utf-8")
        except UnicodeDecodeError:
            request.setResponseCode(400, b"Bad Request: malformed Host header")
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            request.setHeader(b"connection", b"close")
            return b"400 Bad Request: malformed Host header"
        try:
            b"/".join([*(request.prepath or ()), *(request.postpath or ())]).decode("utf-8")
        except UnicodeDecodeError:
            return self.api.not_found(request, ROUTES)
        return self.routed.render(request)


def make_site(lookupd: NSQLookupd) -> Site:
    return LookupdHTTPAPI(lookupd).site()
