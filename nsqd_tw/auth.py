"""AUTH: ask an auth server what a client's secret allows (Go's internal/auth).

The server answers ``{"ttl": 3600, "identity": "...", "identity_url": "...",
"authorizations": [{"topic": REGEX, "channels": [REGEX...], "permissions":
["publish", "subscribe"]}]}``. nsqd queries ``--auth-http-address`` servers in
turn (from a random one, as Go) with ``remote_ip``, ``tls``, ``secret`` and
``common_name``, by GET (query string) or POST (JSON) per
``--auth-http-request-method``, within ``--http-client-connect-timeout`` and
``--http-client-request-timeout``, over HTTPS verified with
``--tls-root-ca-file`` when the address says ``https://``.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from twisted.internet import defer

from nsq_wire import gojson
from nsq_wire.gofmt import go_quote, join_host_port

PERMISSIONS = ("subscribe", "publish")


class AuthError(Exception):
    pass


@dataclass
class Authorization:
    topic: str
    channels: list[str]
    permissions: list[str]
    _topic_re: re.Pattern[str] = field(init=False, repr=False)
    _channel_res: list[re.Pattern[str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._topic_re = re.compile(self.topic)
        self._channel_res = [re.compile(c) for c in self.channels]

    def is_allowed(self, topic: str, channel: str) -> bool:
        if channel and "subscribe" not in self.permissions:
            return False
        if not channel and "publish" not in self.permissions:
            return False
        if self._topic_re.search(topic) is None:
            return False
        return any(c.search(channel) is not None for c in self._channel_res)


@dataclass
class AuthState:
    ttl: int
    authorizations: list[Authorization]
    identity: str = ""
    identity_url: str = ""
    expires: float = 0.0

    def is_allowed(self, topic: str, channel: str) -> bool:
        return any(a.is_allowed(topic, channel) for a in self.authorizations)

    def is_expired(self, now: float) -> bool:
        return self.expires < now


def parse_auth_response(body: bytes, now: float) -> AuthState:
    """Decode and validate an auth server's answer, with Go's error texts."""
    try:
        data = json.loads(body)
    except ValueError as e:
        raise AuthError(str(e)) from None
    if not isinstance(data, dict):
        raise AuthError("json: cannot unmarshal into auth.State")
    authorizations = []
    for raw in data.get("authorizations") or []:
        if not isinstance(raw, dict):
            raise AuthError("json: cannot unmarshal into auth.Authorization")
        topic = raw.get("topic") or ""
        channels = raw.get("channels") or []
        permissions = raw.get("permissions") or []
        if not isinstance(topic, str) or not isinstance(channels, list) or not isinstance(permissions, list):
            raise AuthError("json: cannot unmarshal into auth.Authorization")
        for p in permissions:
            if p not in PERMISSIONS:
                raise AuthError(f"unknown permission {p}")
        try:
            re.compile(topic)
        except re.error as e:
            raise AuthError(f'unable to compile topic "{topic}" {e}') from None
        for c in channels:
            if not isinstance(c, str):
                raise AuthError("json: cannot unmarshal into auth.Authorization")
            try:
                re.compile(c)
            except re.error as e:
                raise AuthError(f'unable to compile channel "{c}" {e}') from None
        authorizations.append(Authorization(topic, list(channels), list(permissions)))
    ttl = data.get("ttl", 0)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    identity = data.get("identity") or ""
    identity_url = data.get("identity_url") or ""
    return AuthState(ttl, authorizations, str(identity), str(identity_url), now + ttl)


class AuthClient:
    """Queries the auth servers of ``--auth-http-address`` with ``http_client``
    (treq's HTTPClient or alike; by default one on nsqd's reactor, with the
    ``--http-client-*`` timeouts, verifying HTTPS with ``--tls-root-ca-file``)."""

    def __init__(self, nsqd: Any, http_client: Any = None) -> None:
        self.nsqd = nsqd
        self._http = http_client

    def _client(self) -> Any:
        if self._http is None:
            from treq.client import HTTPClient
            from twisted.internet import ssl
            from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool

            opts = self.nsqd.opts
            trust = None
            if opts.tls_root_ca_file:
                with open(opts.tls_root_ca_file, "rb") as f:
                    trust = ssl.Certificate.loadPEM(f.read())
            agent = Agent(
                self.nsqd.reactor,
                BrowserLikePolicyForHTTPS(trustRoot=trust),
                connectTimeout=opts.http_client_connect_timeout,
                pool=HTTPConnectionPool(self.nsqd.reactor, persistent=False),
            )
            self._http = HTTPClient(agent)
        return self._http

    @defer.inlineCallbacks
    def query_any(self, remote_ip: str, tls: bool, common_name: str, secret: bytes) -> Any:
        """The first auth server's answer, trying each in turn; errors joined as Go does."""
        servers = list(self.nsqd.opts.auth_http_addresses)
        start = random.randrange(len(servers))
        errors: list[str] = []
        for i in range(len(servers)):
            server = servers[(i + start) % len(servers)]
            try:
                state = yield self.query(server, remote_ip, tls, common_name, secret)
            except Exception as e:
                errors.append(f"failed to auth against {server} - {_describe(e)}")
                continue
            return state
        raise AuthError("; ".join(errors))

    @defer.inlineCallbacks
    def query(self, server: str, remote_ip: str, tls: bool, common_name: str, secret: bytes) -> Any:
        opts = self.nsqd.opts
        params: dict[str, Any] = {
            "common_name": common_name,
            "remote_ip": remote_ip,
            "secret": secret,
            "tls": "true" if tls else "false",
        }
        endpoint = server if "://" in server else f"http://{server}/auth"
        post = opts.auth_http_request_method == "post"
        client = self._client()
        headers: Any = {b"Accept": [b"application/vnd.nsq; version=1.0"]}
        timeout = opts.http_client_request_timeout
        reactor = self.nsqd.reactor
        while True:
            if post:
                # Go marshals url.Values: every value is a list
                values = {
                    k: [v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v] for k, v in params.items()
                }
                resp = yield client.post(
                    endpoint,
                    data=gojson.dumps(values),
                    headers={**headers, b"Content-Type": [b"application/json"]},
                    timeout=timeout,
                    reactor=reactor,
                )
            else:
                resp = yield client.get(
                    f"{endpoint}?{urlencode(params)}", headers=headers, timeout=timeout, reactor=reactor
                )
            content = yield resp.content()
            if resp.code == 403 and not endpoint.startswith("https"):
                # a TLS-required nsq-style server names its HTTPS port
                endpoint = _https_endpoint(endpoint, content)
                continue
            if resp.code != 200:
                status = f"{resp.code} {resp.phrase.decode('latin-1')}"
                raise AuthError(f"got response {status} {go_quote(content)}")
            return parse_auth_response(content, self.nsqd.now())


def _https_endpoint(endpoint: str, body: bytes) -> str:
    port = json.loads(body).get("https_port")
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    return urlunsplit(("https", join_host_port(host, port), parts.path, parts.query, ""))


def _describe(e: BaseException) -> str:
    text = str(e)
    return text or type(e).__name__
