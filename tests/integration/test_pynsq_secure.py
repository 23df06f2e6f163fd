"""pynsq through TLS, TLS+snappy, TLS+deflate, client certificates and an auth
server, against nsqd running as a process (the way a deployment runs it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from twisted.internet import defer
from twisted.trial import unittest

from tests.certs import make_certs
from tests.integration.procs import ServerProcess
from tests.integration.test_pynsq import _run
from tests.nsqd_tw.test_security import AuthServer

SCRIPT = Path(__file__).with_name("pynsq_secure.py")


class PynsqSecureTests(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.certs = make_certs(os.path.join(self.dir, "certs"))

    def start_nsqd(self, *args: str) -> int:
        proc = ServerProcess(
            "nsqd",
            "-tcp-address",
            "127.0.0.1:0",
            "-http-address",
            "127.0.0.1:0",
            "-https-address",
            "127.0.0.1:0",
            "-tls-cert",
            self.certs.cert,
            "-tls-key",
            self.certs.key,
            *args,
            cwd=self.dir,
        )
        proc.start()
        self.addCleanup(proc.kill)
        return proc.port()

    def tls_options(self, client_cert: bool = False) -> dict[str, Any]:
        options: dict[str, Any] = {"ca_certs": self.certs.ca}
        if client_cert:
            options.update(certfile=self.certs.client_cert, keyfile=self.certs.client_key)
        return options

    @defer.inlineCallbacks
    def run_pynsq(self, port: int, topic: str, count: int = 40, **conn: Any) -> Any:
        config = {"addr": f"127.0.0.1:{port}", "topic": topic, "channel": "ch", "count": count, "conn": conn}
        out = yield _run([sys.executable, str(SCRIPT), json.dumps(config)])
        return json.loads(out.strip().splitlines()[-1])

    @defer.inlineCallbacks
    def assert_all_delivered(self, port: int, topic: str, **conn: Any) -> Any:
        result = yield self.run_pynsq(port, topic, **conn)
        self.assertEqual(result["errors"], [])
        self.assertEqual(result["pub"], ["OK"] * 21)
        self.assertEqual(result["received"], sorted(f"msg-{i}" for i in range(40)))

    @defer.inlineCallbacks
    def test_tls_and_compression(self):
        port = self.start_nsqd("-tls-required", "true")
        yield self.assert_all_delivered(port, "tls", tls_v1=True, tls_options=self.tls_options())
        yield self.assert_all_delivered(port, "tls_snappy", tls_v1=True, snappy=True, tls_options=self.tls_options())
        yield self.assert_all_delivered(
            port, "tls_deflate", tls_v1=True, deflate=True, deflate_level=9, tls_options=self.tls_options()
        )

    @defer.inlineCallbacks
    def test_plain_compression(self):
        port = self.start_nsqd()
        yield self.assert_all_delivered(port, "snappy", snappy=True)
        yield self.assert_all_delivered(port, "deflate", deflate=True)

    @defer.inlineCallbacks
    def test_client_certificate(self):
        port = self.start_nsqd("-tls-client-auth-policy", "require-verify", "-tls-root-ca-file", self.certs.ca)
        yield self.assert_all_delivered(port, "mtls", tls_v1=True, tls_options=self.tls_options(client_cert=True))

    @defer.inlineCallbacks
    def test_auth_server(self):
        auth = AuthServer()
        address = auth.listen()
        self.addCleanup(auth.port.stopListening)
        auth.response = {
            "ttl": 3600,
            "identity": "pynsq",
            "authorizations": [{"topic": "^granted", "channels": [".*"], "permissions": ["publish", "subscribe"]}],
        }
        port = self.start_nsqd("-auth-http-address", address, "-tls-root-ca-file", self.certs.ca)
        yield self.assert_all_delivered(
            port, "granted", tls_v1=True, snappy=True, tls_options=self.tls_options(), auth_secret="open sesame"
        )
        self.assertTrue(all(q["secret"] == "open sesame" and q["tls"] == "true" for q in auth.queries))
        # a topic the auth server did not grant
        result = yield self.run_pynsq(port, "denied", count=2, auth_secret="open sesame")
        self.assertEqual(result["received"], [])
        self.assertTrue(result["errors"], result)
        self.assertTrue(all("E_UNAUTHORIZED" in e for e in result["errors"]), result["errors"])
