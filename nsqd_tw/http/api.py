"""nsqd's HTTP API: routes answering every route of Go nsqd 1.3 as Go does.

Go's response conventions and httprouter's routing come from
:mod:`nsq_service.web`; this module has nsqd's routes, Go's. Those beyond Go are
each feature's module, a mixin of :class:`NSQDHTTPAPI` whose marked methods are
registered on the same Klein app (:mod:`nsqd_tw.http.routes` lists them).
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.web.server import Request, Site

from nsq_service.listen import Bound
from nsq_service.memstats import GCPauses
from nsq_service.options import DURATION
from nsq_service.pprof import add_debug_routes
from nsq_service.web import (
    BOOL_PARAMS,
    JSON_TYPE,
    GoHTTPAPI,
    HTTPError,
    Router,
    content_length,
    go_parse_int,
    read_to_cut,
    route,
)
from nsq_service.web import body as read_body
from nsq_wire.errors import FatalClientError
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name
from nsq_wire.version import VERSION, version_string
from nsqd_tw.core.nsqd import NSQD
from nsqd_tw.core.queue import QueueFull
from nsqd_tw.core.topic import DrainingError, Topic, TopicError
from nsqd_tw.http.deadletters import DeadLetterRoutes
from nsqd_tw.http.drain import DRAINING, DrainRoutes
from nsqd_tw.http.inspect import PeekRoutes
from nsqd_tw.http.prometheus import MetricsRoutes
from nsqd_tw.http.replication import STANDBY_REFUSED, ReplicationRoutes, standby_json
from nsqd_tw.http.rewinds import RewindRoutes
from nsqd_tw.http.settings import SettingsRoutes
from nsqd_tw.http.stats import get_stats, print_stats
from nsqd_tw.lookup import split_host_port
from nsqd_tw.options import TLS_REQUIRED
from nsqd_tw.replication.errors import NoLease, NotInSync, ReplicaLost
from nsqd_tw.storage.errors import DiskBudgetFull


class NSQDHTTPAPI(
    GoHTTPAPI,
    PeekRoutes,
    SettingsRoutes,
    RewindRoutes,
    DeadLetterRoutes,
    DrainRoutes,
    ReplicationRoutes,
    MetricsRoutes,
):
    log_namespace = "nsqd_tw.http.api"
    settable_options = ("nsqlookupd_tcp_addresses", "log_level")

    def __init__(
        self,
        nsqd: NSQD,
        bound: Bound | None = None,
        tls_enabled: bool = False,
        gc_pauses: GCPauses | None = None,
    ) -> None:
        self.nsqd = nsqd
        self.bound = bound if bound is not None else Bound()
        self.tls_enabled = tls_enabled
        super().__init__(nsqd.reactor, nsqd.log_gate, gc_pauses)

    def add_routes(self, router: Router) -> None:
        add_debug_routes(router, "/debug/pprof/", nsqd_extras=True)
        super().add_routes(router)

    def refuse(self, request: Request) -> bytes | None:
        """With --tls-required, the plain HTTP port answers 403 to everything; a
        replication standby answers 503 to whatever would change its queues."""
        standby = self.nsqd.standby
        if (
            standby is not None
            and request.method in (b"POST", b"PUT")
            and request.path.decode("utf-8", "replace") in STANDBY_REFUSED
        ):
            return self.v1(request, 503, standby.code, standby_json(standby))
        if self.tls_enabled or self.nsqd.opts.tls_required != TLS_REQUIRED:
            return None
        port = self.bound.https[1] if self.bound.https else 0
        data = b'{"message": "TLS_REQUIRED", "https_port": %d}' % port
        return self.finish(request, 403, data, JSON_TYPE)

    # -- routes --------------------------------------------------------------------

    @route("/ping", "GET", style="plain")
    def ping(self, request: Request) -> str:
        if not self.nsqd.is_healthy():
            raise HTTPError(500, self.nsqd.get_health())
        if self.nsqd.draining:
            raise HTTPError(503, f"NOK - {DrainingError()}")  # out of a load balancer's rotation
        standby = self.nsqd.standby
        if standby is not None:  # beyond Go: so is a replication standby
            raise HTTPError(503, f"NOK - {standby.health}")
        return self.nsqd.get_health()

    @route("/info", "GET")
    def info(self, request: Request) -> dict[str, Any]:
        opts = self.nsqd.opts
        tcp = self.bound.tcp
        web = self.bound.http
        return {
            "version": VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": web[1] if web and web[1] else -1,
            "tcp_port": tcp[1] if tcp and tcp[1] else -1,
            "start_time": int(self.nsqd.start_time),
            "max_heartbeat_interval": DURATION.to_http(opts.max_heartbeat_interval),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": DURATION.to_http(opts.max_output_buffer_timeout),
            "max_deflate_level": opts.max_deflate_level,
            **self._draining(),
        }

    def _topic_from_query(self, request: Request) -> tuple[dict[str, list[str]], str]:
        """Go's getTopicFromQuery (the query alone: the body is not read)."""
        params = self.query(request)
        return params, _topic_arg(params)

    def _existing_topic_channel(self, request: Request) -> tuple[Any, str]:
        """Go's getExistingTopicFromQuery (http_api.NewReqParams: the body is read)."""
        params = self.req_params(request)
        if "topic" not in params:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        topic_name = params["topic"][0]
        if not is_valid_topic_name(topic_name):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        if "channel" not in params:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        channel_name = params["channel"][0]
        if not is_valid_channel_name(channel_name):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        try:
            topic = self.nsqd.get_existing_topic(topic_name)
        except TopicError:
            raise HTTPError(404, "TOPIC_NOT_FOUND") from None
        return topic, channel_name

    def _publish(self, topic: str, bodies: list[bytes], delay: float = 0.0) -> Any:
        try:
            # a topic this request creates: answered once the lookupds' channels exist (Go's GetTopic)
            started = self.nsqd.topic_ready(topic) if is_valid_topic_name(topic) else None
            committed = self.nsqd.publish(topic, bodies, delay)
        except DrainingError:
            raise HTTPError(503, DRAINING) from None
        except Exception as e:
            self.log.error("HTTP: failed to publish to {topic} - {err}", topic=topic, err=e)
            # Go answers EXITING to any failed put; the budget and the bounds (beyond Go) are named
            raise HTTPError(503, _publish_refusal(e)) from None
        if committed is None:
            return "OK" if started is None else started.addCallback(lambda _: "OK")

        def failed(f: Any) -> None:
            self.log.error("HTTP: publish to {topic} not synced - {err}", topic=topic, err=f.value)
            raise HTTPError(
                503,
                _publish_refusal(f.value)
                if isinstance(f.value, NoLease)
                else "REPLICA_LOST"
                if isinstance(f.value, ReplicaLost)
                else "EXITING",
            )

        committed.addCallbacks(lambda _: "OK", failed)
        return committed if started is None else started.addCallback(lambda _: committed)

    @route("/pub", "POST", access_log=False, body=lambda api: api.nsqd.opts.max_msg_size)
    def pub(self, request: Request) -> Any:
        max_size = self.nsqd.opts.max_msg_size
        if content_length(request) > max_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        body = read_body(request, max_size + 1)
        if len(body) == max_size + 1:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        params, topic = self._topic_from_query(request)
        delay = 0.0
        if "defer" in params:
            try:
                ms = go_parse_int(params["defer"][0])
            except ValueError:
                raise HTTPError(400, "INVALID_DEFER") from None
            if ms < 0 or ms > self.nsqd.opts.max_req_timeout * 1000:
                raise HTTPError(400, "INVALID_DEFER")
            delay = ms / 1000.0
        return self._publish(topic, [body], delay)

    @route("/mpub", "POST", access_log=False, body=lambda api: api.nsqd.opts.max_body_size)
    def mpub(self, request: Request) -> Any:
        opts = self.nsqd.opts
        if content_length(request) > opts.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        params, topic = self._topic_from_query(request)
        binary = False
        if "binary" in params:
            value = params["binary"][0]
            binary = BOOL_PARAMS.get(value, True)
            if value not in BOOL_PARAMS:
                self.log.warn("deprecated value '{v}' used for /mpub binary param", v=value)
        if binary:
            # readMPUB reads what it needs: a body cut short is a short body to it
            try:
                bodies = _read_binary_mpub(read_body(request, whole=False), opts.max_msg_size, opts.max_body_size)
            except _ShortBody:
                read_to_cut(request)
                raise
        else:
            data = read_body(request, opts.max_body_size + 1)
            if len(data) == opts.max_body_size + 1:
                raise HTTPError(413, "BODY_TOO_BIG")
            bodies = []
            for block in data.split(b"\n"):
                if not block:
                    continue  # empty lines are skipped, as in Go
                if len(block) > opts.max_msg_size:
                    raise HTTPError(413, "MSG_TOO_BIG")
                bodies.append(block)
        if not bodies:
            return "OK"
        return self._publish(topic, bodies)

    @route("/topic/create", "POST")
    def topic_create(self, request: Request) -> Any:
        _, name = self._topic_from_query(request)
        try:
            return self.nsqd.topic_ready(name)  # answered once started, as Go's GetTopic returns
        except DrainingError:
            raise HTTPError(503, DRAINING) from None

    @route("/topic/delete", "POST")
    def topic_delete(self, request: Request) -> None:
        params = self.req_params(request)
        if "topic" not in params:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        try:
            self.nsqd.delete_existing_topic(params["topic"][0])
        except TopicError:
            raise HTTPError(404, "TOPIC_NOT_FOUND") from None

    def _existing_topic(self, request: Request) -> Topic:
        name = _topic_arg(self.req_params(request))  # as doEmptyTopic
        try:
            return self.nsqd.get_existing_topic(name)
        except TopicError:
            raise HTTPError(404, "TOPIC_NOT_FOUND") from None

    @route("/topic/empty", "POST")
    def topic_empty(self, request: Request) -> None:
        topic = self._existing_topic(request)
        try:
            topic.empty()
        except Exception as e:
            self.log.error("failure in {path} - {err}", path=request.path.decode(), err=e)
            raise HTTPError(500, "INTERNAL_ERROR") from None

    def _pause_topic(self, request: Request, pause: bool) -> Any:
        params = self.req_params(request)
        if "topic" not in params:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        try:
            topic = self.nsqd.get_existing_topic(params["topic"][0])
        except TopicError:
            raise HTTPError(404, "TOPIC_NOT_FOUND") from None
        topic.pause() if pause else topic.unpause()
        return self._persisted()

    def _persisted(self) -> Any:
        # like Go, answer once nsqd.dat is written, so a crash can't undo a (un)pause
        d = self.nsqd.metadata_synced()
        if d is None:
            return None

        def failed(f: Any) -> None:
            self.log.error("failed to persist metadata - {err}", err=f.value)
            raise HTTPError(500, "INTERNAL_ERROR")

        return d.addCallbacks(lambda _: None, failed)

    @route("/topic/pause", "POST")
    def topic_pause(self, request: Request) -> Any:
        return self._pause_topic(request, True)

    @route("/topic/unpause", "POST")
    def topic_unpause(self, request: Request) -> Any:
        return self._pause_topic(request, False)

    @route("/channel/create", "POST")
    def channel_create(self, request: Request) -> Any:
        topic, name = self._existing_topic_channel(request)
        params = self.query(request)
        if "since" in params and name not in topic.channels:
            return self._create_since(topic, name, params)
        try:
            topic.get_channel(name)
        except DrainingError:
            raise HTTPError(503, DRAINING) from None
        return None

    @route("/channel/delete", "POST")
    def channel_delete(self, request: Request) -> None:
        topic, name = self._existing_topic_channel(request)
        try:
            topic.delete_existing_channel(name)
        except TopicError:
            raise HTTPError(404, "CHANNEL_NOT_FOUND") from None

    def _existing_channel(self, request: Request) -> Any:
        topic, name = self._existing_topic_channel(request)
        try:
            return topic.get_existing_channel(name)
        except TopicError:
            raise HTTPError(404, "CHANNEL_NOT_FOUND") from None

    @route("/channel/empty", "POST")
    def channel_empty(self, request: Request) -> None:
        channel = self._existing_channel(request)
        try:
            channel.empty()
        except Exception as e:
            self.log.error("failure in {path} - {err}", path=request.path.decode(), err=e)
            raise HTTPError(500, "INTERNAL_ERROR") from None

    @route("/channel/pause", "POST")
    def channel_pause(self, request: Request) -> Any:
        self._existing_channel(request).pause()
        return self._persisted()

    @route("/channel/unpause", "POST")
    def channel_unpause(self, request: Request) -> Any:
        self._existing_channel(request).unpause()
        return self._persisted()

    @route("/stats", "GET")
    def stats(self, request: Request) -> Any:
        params = self.req_params(request)

        def get(key: str) -> str:
            return params[key][0] if key in params else ""

        include_clients = BOOL_PARAMS.get(get("include_clients"), True)
        include_mem = BOOL_PARAMS.get(get("include_mem"), True)
        stats = get_stats(self.nsqd, get("topic"), get("channel"), include_clients)
        health = self.nsqd.get_health()
        mem = self.mem_stats() if include_mem else None
        if get("format") != "json":
            now = self.nsqd.now()
            replication = self.nsqd.replication.status() if self.nsqd.replication is not None else None
            text = print_stats(stats, mem, health, self.nsqd.start_time, now, version_string("nsqd"), replication)
            return text.encode()
        out: dict[str, Any] = {
            "version": VERSION,
            "health": health,
            "start_time": int(self.nsqd.start_time),
            "topics": stats["topics"],
        }
        if mem is not None:
            out["memory"] = mem
        out["producers"] = stats["producers"]
        out.update(self._draining())
        if self.nsqd.replication is not None:  # beyond Go, after Go's keys
            out["replication"] = self.nsqd.replication.status()
        return out

    @route("/config/<opt>", "GET", "PUT", body=lambda api: api.nsqd.opts.max_msg_size)
    def config(self, request: Request, opt: str) -> Any:
        opts = self.nsqd.opts
        if opt in ("drain", "shutdown"):
            return self._stop_config(request, opt)
        if request.method == b"PUT":
            body = self._config_body(request)
            field, value = self.parse_option(opts, opt, body)
            if field == "lookupd_tcp_addresses":
                # the whole list or nothing: a peer per address is made from it
                for address in value:
                    try:
                        split_host_port(address)
                    except ValueError as e:
                        self.log.info("PUT /config/nsqlookupd_tcp_addresses refused - {err}", err=e)
                        raise HTTPError(400, "INVALID_VALUE") from None
            self.set_option(opts, field, value)
            self.nsqd.options_changed(field)
        return self.get_option(opts, opt)

    def _config_body(self, request: Request) -> bytes:
        max_size = self.nsqd.opts.max_msg_size
        body = read_body(request, max_size + 1)
        if len(body) == max_size + 1 or not body:
            raise HTTPError(413, "INVALID_VALUE")
        return body


def _publish_refusal(e: Exception) -> str:
    if isinstance(e, DiskBudgetFull):
        return "DISK_BUDGET_FULL"
    if isinstance(e, NotInSync):
        return "REPLICA_NOT_IN_SYNC"
    if isinstance(e, NoLease):
        return "REPLICA_NO_LEASE"
    if isinstance(e, QueueFull):
        return f"QUEUE_FULL: {e}"
    return "EXITING"


def _topic_arg(params: dict[str, list[str]]) -> str:
    if "topic" not in params:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    name = params["topic"][0]
    if not is_valid_topic_name(name):
        raise HTTPError(400, "INVALID_TOPIC")
    return name


class _ShortBody(HTTPError):
    """readMPUB read past the end of the body."""


def _read_binary_mpub(data: bytes, max_msg: int, max_body: int) -> list[bytes]:
    """readMPUB over a request body; errors are 413 with the code minus ``E_``."""
    from nsq_wire.parser import V2Parser

    parser = V2Parser(max_msg, max_body)
    # the body is whole already (at most max_body bytes): any declared size the
    # parser accepts will do, as the messages are read by their count
    parser.feed(b"MPUB x\n" + max(max_body, 1).to_bytes(4, "big") + data)
    try:
        cmd = parser.next()  # the line
        cmd = parser.next()  # the body
    except FatalClientError as e:
        raise HTTPError(413, e.code[2:]) from None
    if cmd is None:
        # the body ended inside the count or a message
        code = "BAD_BODY" if len(data) < 4 else "BAD_MESSAGE"
        raise _ShortBody(413, code)
    assert cmd.bodies is not None
    return cmd.bodies


def make_site(
    nsqd: NSQD, bound: Bound | None = None, tls_enabled: bool = False, gc_pauses: GCPauses | None = None
) -> Site:
    return NSQDHTTPAPI(nsqd, bound, tls_enabled, gc_pauses).site()
