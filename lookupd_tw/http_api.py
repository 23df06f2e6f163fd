"""nsqlookupd's HTTP API: discovery for consumers, administration.

Go nsqlookupd 1.3's routes, statuses and JSON; the response conventions are
:mod:`nsq_service.web`'s, shared with nsqd.
"""

from __future__ import annotations

from typing import Any

from twisted.web.server import Request, Site

from lookupd_tw.nsqlookupd import NSQLookupd
from lookupd_tw.registration_db import GO_ZERO_TIME_NS, Registration, filter_by_active
from lookupd_tw.witness import WitnessRoutes
from nsq_service.pprof import add_debug_routes
from nsq_service.web import GoHTTPAPI, HTTPError, Router, route
from nsq_service.web import body as read_body
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name
from nsq_wire.version import VERSION


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


class LookupdHTTPAPI(WitnessRoutes, GoHTTPAPI):
    log_namespace = "lookupd_tw.http_api"

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        super().__init__(lookupd.reactor, lookupd.log_gate)

    def add_routes(self, router: Router) -> None:
        add_debug_routes(router, "/debug/pprof")
        super().add_routes(router)

    @route("/ping", "GET", style="plain")
    def ping(self, request: Request) -> str:
        return "OK"

    @route("/info", "GET")
    def info(self, request: Request) -> dict[str, Any]:
        return {"version": VERSION}

    @route("/topics", "GET")
    def topics(self, request: Request) -> dict[str, Any]:
        return {"topics": [r.key for r in self.db.find_registrations("topic", "*", "")]}

    @route("/channels", "GET")
    def channels(self, request: Request) -> dict[str, Any]:
        topic = _arg(self.req_params(request), "topic", "MISSING_ARG_TOPIC")
        return {"channels": [r.subkey for r in self.db.find_registrations("channel", topic, "*")]}

    @route("/lookup", "GET")
    def lookup(self, request: Request) -> dict[str, Any]:
        topic = _arg(self.req_params(request), "topic", "MISSING_ARG_TOPIC")
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

    @route("/nodes", "GET")
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

    @route("/debug", "GET")
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

    @route("/topic/create", "POST")
    def topic_create(self, request: Request) -> None:
        topic = _arg(self.req_params(request), "topic", "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        self.log.info("DB: adding topic({topic})", topic=topic)
        self.db.add_registration(Registration("topic", topic, ""))

    @route("/topic/delete", "POST")
    def topic_delete(self, request: Request) -> None:
        topic = _arg(self.req_params(request), "topic", "MISSING_ARG_TOPIC")
        for r in self.db.find_registrations("channel", topic, "*"):
            self.log.info("DB: removing channel({channel}) from topic({topic})", channel=r.subkey, topic=topic)
            self.db.remove_registration(r)
        for r in self.db.find_registrations("topic", topic, ""):
            self.log.info("DB: removing topic({topic})", topic=topic)
            self.db.remove_registration(r)

    @route("/topic/tombstone", "POST")
    def topic_tombstone(self, request: Request) -> None:
        params = self.req_params(request)
        topic = _arg(params, "topic", "MISSING_ARG_TOPIC")
        node = _arg(params, "node", "MISSING_ARG_NODE")
        self.log.info("DB: setting tombstone for producer@{node} of topic({topic})", node=node, topic=topic)
        for p in self.db.find_producers("topic", topic, ""):
            if f"{p.peer_info.broadcast_address}:{p.peer_info.http_port}" == node:
                p.tombstone(self.lookupd.now())

    @route("/channel/create", "POST")
    def channel_create(self, request: Request) -> None:
        topic, channel = _topic_channel(self.req_params(request))
        self.log.info("DB: adding channel({channel}) in topic({topic})", channel=channel, topic=topic)
        self.db.add_registration(Registration("channel", topic, channel))
        self.log.info("DB: adding topic({topic})", topic=topic)
        self.db.add_registration(Registration("topic", topic, ""))

    @route("/channel/delete", "POST")
    def channel_delete(self, request: Request) -> None:
        topic, channel = _topic_channel(self.req_params(request))
        registrations = self.db.find_registrations("channel", topic, channel)
        if not registrations:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        self.log.info("DB: removing channel({channel}) from topic({topic})", channel=channel, topic=topic)
        for r in registrations:
            self.db.remove_registration(r)

    @route("/config/<opt>", "GET", "PUT", body=lambda api: 1 << 16)
    def config(self, request: Request, opt: str) -> Any:
        """Beyond Go's nsqlookupd: options by --config key; PUT log_level."""
        opts = self.lookupd.opts
        if request.method == b"PUT":
            data = read_body(request, 1 << 16)
            if not data:
                raise HTTPError(413, "INVALID_VALUE")
            self.set_option(opts, *self.parse_option(opts, opt, data))
        return self.get_option(opts, opt)


def make_site(lookupd: NSQLookupd) -> Site:
    return LookupdHTTPAPI(lookupd).site()
