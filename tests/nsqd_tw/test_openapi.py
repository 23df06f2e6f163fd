"""docs/openapi.yaml is a valid OpenAPI document and the live app answers as it says."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from treq.testing import StubTreq
from twisted.internet import defer
from twisted.trial import unittest

from nsq_service.listen import Bound
from nsqd_tw.http.api import NSQDHTTPAPI
from tests.helpers import FakeClient, make_nsqd

SPEC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"

# a request for each operation: (query, body)
EXAMPLES: dict[tuple[str, str], tuple[str, bytes]] = {
    ("/pub", "post"): ("topic=t&defer=10", b"hello"),
    ("/mpub", "post"): ("topic=t", b"one\ntwo"),
    ("/stats", "get"): ("format=json", b""),
    ("/topic/peek", "get"): ("topic=held&n=5", b""),
    ("/channel/peek", "get"): ("topic=t&channel=c&n=5", b""),
    ("/config/{opt}", "put"): ("", b"info"),
    ("/topic/settings", "put"): ("topic=t", b'{"max_age": "1h", "max_depth": 5}'),
    ("/channel/settings", "put"): ("topic=t&channel=c", b'{"max_attempts": 3, "max_depth": null}'),
    ("/channel/rewind", "post"): ("topic=kept&channel=c&since=earliest", b""),
    ("/channel/create", "post"): ("topic=kept&channel=new&since=0", b""),
    ("/debug/setblockrate", "put"): ("rate=1", b""),
    ("/debug/pprof/profile", "get"): ("seconds=1", b""),
}


def _spec() -> dict[str, Any]:
    with open(SPEC_PATH) as f:
        return yaml.safe_load(f)


class OpenAPITests(unittest.TestCase):
    def setUp(self) -> None:
        self.spec = _spec()
        data = self.mktemp()
        os.makedirs(data)
        self.nsqd = make_nsqd(e2e_processing_latency_percentiles=[0.99], data_path=data)
        self.treq = StubTreq(
            NSQDHTTPAPI(self.nsqd, Bound(tcp=("127.0.0.1", 4150), http=("127.0.0.1", 4151))).resource()
        )
        # something to report: a topic, a channel with a consumer, a producer
        consumer = FakeClient(self.nsqd)
        consumer.sub("t", "c", rdy=1)
        FakeClient(self.nsqd).pub("t", b"x")
        FakeClient(self.nsqd).pub("held", b"y")  # a topic with no channel: something to peek at
        # a retained topic, and a channel rewinding (6,000 to queue again, a paused channel takes 2,500)
        kept = self.nsqd.get_topic("kept")
        kept.update_settings({"retention": 3600.0})
        kept.get_channel("c").pause()
        self.nsqd.publish("kept", [b"z"] * 6000)
        self.nsqd.retention.start_rewind(kept.channels["c"], None)

    def test_document_is_valid(self) -> None:
        validate(self.spec)

    def test_every_route_is_documented(self) -> None:
        documented = {p.replace("{opt}", "<opt>") for p in self.spec["paths"]}
        routes = NSQDHTTPAPI(self.nsqd).router.routes
        self.assertEqual(set(routes), documented)
        for path, methods in routes.items():
            ops = self.spec["paths"][path.replace("<opt>", "{opt}")]
            self.assertEqual({m.lower() for m in methods}, set(ops) - {"parameters"}, path)

    def check(self, resp: Any, content: bytes, operation: dict[str, Any], what: str) -> None:
        responses = operation["responses"]
        status = str(resp.code)
        self.assertIn(status, responses, f"{what} answered an undocumented {status}: {content[:200]!r}")
        response = responses[status]
        if "$ref" in response:
            response = self.spec["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
        media = response.get("content", {})
        ctype = (resp.headers.getRawHeaders("content-type") or [""])[0].split(";")[0]
        if not media:
            self.assertEqual(content, b"", what)
            return
        self.assertIn(ctype, media, f"{what}: undocumented content type {ctype}")
        if ctype == "application/json":
            schema = dict(media[ctype].get("schema", {}))
            schema["components"] = self.spec["components"]
            Draft202012Validator(schema).validate(json.loads(content))

    @defer.inlineCallbacks
    def test_live_app_matches(self):
        for path, ops in self.spec["paths"].items():
            for method, operation in ops.items():
                if method == "parameters":
                    continue
                query, body = EXAMPLES.get((path, method), ("", b""))
                params = [p for p in operation.get("parameters", []) if "$ref" in p]
                if params and not query:
                    query = "&".join(f"{p['$ref'].rsplit('/', 1)[1]}=" + p["$ref"].rsplit("/", 1)[1][0] for p in params)
                url = "http://nsqd" + path.replace("{opt}", "log_level") + ("?" + query if query else "")
                d = self.treq.request(method.upper(), url, data=body, allow_redirects=False)
                if path == "/debug/pprof/profile":
                    self.nsqd.reactor.advance(1.1)
                    self.treq.flush()
                resp = yield d
                content = yield resp.content()
                self.check(resp, content, operation, f"{method.upper()} {url}")

    @defer.inlineCallbacks
    def test_documented_errors(self):
        for method, url, status in [
            ("POST", "/pub?topic=t", "400"),
            ("POST", "/topic/delete?topic=nope", "404"),
            ("POST", "/channel/create?topic=t&channel=bad!", "400"),
            ("GET", "/config/nope", "400"),
            ("PUT", "/config/log_level", "413"),
        ]:
            resp = yield self.treq.request(method, "http://nsqd" + url, data=b"", allow_redirects=False)
            content = yield resp.content()
            path = url.split("?")[0]
            key = "/config/{opt}" if path.startswith("/config/") else path
            self.assertEqual(str(resp.code), status)
            self.check(resp, content, self.spec["paths"][key][method.lower()], f"{method} {url}")

    @defer.inlineCallbacks
    def test_draining_answers_as_documented(self):
        self.nsqd.start_drain("test")
        for method, url, status in [
            ("GET", "/ping", "503"),
            ("GET", "/info", "200"),
            ("GET", "/stats?format=json", "200"),
            ("POST", "/pub?topic=t", "503"),
            ("POST", "/mpub?topic=t", "503"),
            ("POST", "/topic/create?topic=new", "503"),
            ("POST", "/channel/create?topic=t&channel=new", "503"),
            ("GET", "/config/drain", "200"),
        ]:
            resp = yield self.treq.request(method, "http://nsqd" + url, data=b"x", allow_redirects=False)
            content = yield resp.content()
            path = url.split("?")[0]
            key = "/config/{opt}" if path.startswith("/config/") else path
            self.assertEqual(str(resp.code), status, url)
            self.check(resp, content, self.spec["paths"][key][method.lower()], f"{method} {url}")
