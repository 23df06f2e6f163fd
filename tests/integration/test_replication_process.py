"""Replication between nsqd processes: the link on the standby's TCP port, with
nsqd's TLS options; a primary that cannot prove itself gets nothing."""

from __future__ import annotations

import json
import os

import treq
from twisted.internet import defer
from twisted.trial import unittest

from tests.certs import Files, make_certs
from tests.integration.procs import ServerProcess, eventually

LOOPBACK = (
    "--tcp-address",
    "127.0.0.1:0",
    "--http-address",
    "127.0.0.1:0",
    "--https-address",
    "127.0.0.1:0",
    "--broadcast-address",
    "127.0.0.1",
)


def tls_standby(certs: Files) -> list[str]:
    """A standby's TLS flags: its own certificate, and a primary's client certificate
    required and verified against the test CA."""
    return [
        f"--tls-cert={certs.cert}",
        f"--tls-key={certs.key}",
        f"--tls-root-ca-file={certs.ca}",
        "--tls-client-auth-policy=require-verify",
        "--tls-required=tcp-https",  # plain HTTP for the test to read /replication
    ]


class ReplicationProcessTests(unittest.TestCase):
    timeout = 90

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)
        self.secret = os.path.join(self.dir, "secret")
        with open(self.secret, "w") as f:
            f.write("a shared secret\n")

    def nsqd(self, name: str, *args: str) -> ServerProcess:
        path = os.path.join(self.dir, name)
        os.makedirs(path, exist_ok=True)
        proc = ServerProcess("nsqd", *LOOPBACK, "--data-path", path, *args, cwd=path).start()
        self.addCleanup(proc.kill)
        return proc

    @defer.inlineCallbacks
    def get_json(self, proc: ServerProcess, path: str) -> defer.Deferred[dict]:
        resp = yield treq.get(f"http://{proc.addresses['HTTP']}{path}", persistent=False)
        body = yield resp.content()
        return json.loads(body)

    @defer.inlineCallbacks
    def in_sync(self, proc: ServerProcess) -> defer.Deferred[bool]:
        status = yield self.get_json(proc, "/replication")
        return status["state"] == "in_sync"

    @defer.inlineCallbacks
    def test_a_tls_link_with_client_certificates(self):
        certs = make_certs(os.path.join(self.dir, "certs"))
        standby = self.nsqd(
            "standby", "--replication-role=standby", f"--replication-secret-file={self.secret}", *tls_standby(certs)
        )
        primary = self.nsqd(
            "primary",
            f"--replica={standby.addresses['TCP']}",
            f"--replication-secret-file={self.secret}",
            f"--tls-cert={certs.client_cert}",
            f"--tls-key={certs.client_key}",
            f"--tls-root-ca-file={certs.ca}",
        )
        yield eventually(lambda: self.in_sync(standby))
        self.assertTrue(any("REPLICATION: linked to primary" in line and "(TLS)" in line for line in standby.lines))
        resp = yield treq.post(f"http://{primary.addresses['HTTP']}/pub?topic=t", b"over tls", persistent=False)
        self.assertEqual((yield resp.content()), b"OK")

        @defer.inlineCallbacks
        def arrived() -> defer.Deferred[bool]:
            stats = yield self.get_json(standby, "/stats?format=json&topic=t")
            return bool(stats["topics"]) and stats["topics"][0]["depth"] == 1

        yield eventually(arrived)

    @defer.inlineCallbacks
    def test_a_primary_without_a_certificate_starts_tls_to_a_standby_with_one(self):
        """The primary dials and starts TLS as a client: it needs startTLS though it has
        no --tls-cert of its own (nsq_service.runtime.import_reactor)."""
        certs = make_certs(os.path.join(self.dir, "certs"))
        standby = self.nsqd(
            "standby",
            "--replication-role=standby",
            f"--replication-secret-file={self.secret}",
            f"--tls-cert={certs.cert}",
            f"--tls-key={certs.key}",
        )
        self.nsqd(
            "primary",
            f"--replica={standby.addresses['TCP']}",
            f"--replication-secret-file={self.secret}",
            f"--tls-root-ca-file={certs.ca}",
        )
        yield eventually(lambda: self.in_sync(standby))
        self.assertTrue(any("REPLICATION: linked to primary" in line and "(TLS)" in line for line in standby.lines))

    @defer.inlineCallbacks
    def test_a_primary_without_the_secret_or_a_trusted_certificate_gets_nothing(self):
        certs = make_certs(os.path.join(self.dir, "certs"))
        standby = self.nsqd(
            "standby", "--replication-role=standby", f"--replication-secret-file={self.secret}", *tls_standby(certs)
        )
        wrong = os.path.join(self.dir, "wrong")
        with open(wrong, "w") as f:
            f.write("not the secret\n")
        intruder = self.nsqd(
            "intruder",
            f"--replica={standby.addresses['TCP']}",
            f"--replication-secret-file={wrong}",
            f"--tls-cert={certs.client_cert}",
            f"--tls-key={certs.client_key}",
        )
        stranger = self.nsqd(
            "stranger",
            f"--replica={standby.addresses['TCP']}",
            f"--replication-secret-file={self.secret}",
            f"--tls-cert={certs.other_client_cert}",
            f"--tls-key={certs.other_client_key}",
        )
        yield eventually(lambda: any("failed to authenticate" in line for line in standby.lines))
        for proc in (intruder, stranger):

            @defer.inlineCallbacks
            def alone(proc: ServerProcess = proc) -> defer.Deferred[bool]:
                resp = yield treq.post(f"http://{proc.addresses['HTTP']}/pub?topic=t", b"x", persistent=False)
                return (yield resp.content()) == b'{"message":"REPLICA_NO_LEASE"}'

            # serving once its replica refused it (until then: 503 STARTING), but with no standby and
            # no witness it holds no lease: it acknowledges nothing the standby does not hold
            yield eventually(alone)
            status = yield self.get_json(proc, "/replication")
            self.assertEqual(status["state"], "disconnected")
        status = yield self.get_json(standby, "/replication")
        self.assertEqual(status["state"], "disconnected")
        stats = yield self.get_json(standby, "/stats?format=json")
        self.assertEqual(stats["topics"], [])
