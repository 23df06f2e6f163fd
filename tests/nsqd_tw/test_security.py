"""TLS upgrades, client certificates, snappy, deflate and AUTH.

nsqd runs in the test's reactor (the real service hierarchy on 127.0.0.1, port
0); the client is nsq_client.twisted_client, which negotiates like the official
libraries, or raw bytes where a misbehaving client is the point. AUTH is
answered by a small Klein auth server: in memory (iosim to nsqd, StubTreq to
the auth server) unless TLS or HTTP itself is what is tested.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any
from urllib.parse import urlsplit

import treq
from klein import Klein
from OpenSSL import SSL
from treq.testing import StubTreq
from twisted.internet import defer, endpoints, protocol, reactor, ssl, task
from twisted.internet.error import ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.task import deferLater
from twisted.trial import unittest
from twisted.web.server import Site

from nsq_client.twisted_client import NSQClientProtocol, connect
from nsq_service.options import ConfigError
from nsq_wire.commands import encode_command
from nsq_wire.errors import NSQError
from nsqd_tw.auth import AuthClient
from nsqd_tw.http.stats import get_stats
from nsqd_tw.options import TLS_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, NSQDOptions
from nsqd_tw.tcp import upgrade
from nsqd_tw.tcp.protocol import V2Factory
from nsqd_tw.tls import ServerTLS
from tests.certs import Files, Identity, make_certs, make_identity
from tests.helpers import InProcessNSQD, MemoryNetwork, make_nsqd

_CERTS: Files | None = None
# how a refused TLS handshake reaches a client: the TLS alert, or the close
HANDSHAKE_REFUSED = (SSL.Error, ConnectionDone, ConnectionLost)


def certs() -> Files:
    global _CERTS
    if _CERTS is None:
        _CERTS = make_certs(tempfile.mkdtemp(prefix="nsq-tw-certs-"))
    return _CERTS


def client_tls(cert: str | None = None, key: str | None = None, **extra: Any) -> Any:
    """What a client configures: trust our CA, maybe present a certificate."""
    files = certs()
    with open(files.ca, "rb") as f:
        trust = ssl.Certificate.loadPEM(f.read())
    client_cert = None
    if cert is not None and key is not None:
        with open(cert, "rb") as f1, open(key, "rb") as f2:
            client_cert = ssl.PrivateCertificate.loadPEM(f1.read() + f2.read())
    return ssl.optionsForClientTLS(
        "127.0.0.1", trustRoot=trust, clientCertificate=client_cert, extraCertificateOptions=extra or None
    )


def tls_opts(**kwargs: Any) -> dict[str, Any]:
    files = certs()
    return {"tls_cert": files.cert, "tls_key": files.key, **kwargs}


@defer.inlineCallbacks
def raw_connect(port: int) -> Any:
    """A connection that has sent the magic and nothing else."""
    factory = protocol.Factory.forProtocol(NSQClientProtocol)
    factory.noisy = False
    conn = yield endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(factory)
    return conn


def identify_body(**fields: Any) -> bytes:
    return encode_command(b"IDENTIFY", body=json.dumps({"feature_negotiation": True, **fields}).encode())


@defer.inlineCallbacks
def get_json(url: str) -> Any:
    resp = yield treq.get(url, persistent=False)
    body = yield resp.content()
    return json.loads(body)


class NSQDTestCase(unittest.TestCase):
    timeout = 30

    def start_nsqd(self, **kwargs: Any) -> InProcessNSQD:
        server = InProcessNSQD(**kwargs).start()
        self.addCleanup(server.stop)
        return server

    @defer.inlineCallbacks
    def connect(self, server: InProcessNSQD, **kwargs: Any) -> Any:
        conn = yield connect(reactor, "127.0.0.1", server.tcp_port, **kwargs)
        self.addCleanup(conn.close)
        return conn

    @defer.inlineCallbacks
    def assert_handshake_refused(self, server: InProcessNSQD, tls_options: Any) -> Any:
        with self.assertRaises(HANDSHAKE_REFUSED):
            yield connect(reactor, "127.0.0.1", server.tcp_port, tls_v1=True, tls_options=tls_options)

    @defer.inlineCallbacks
    def assert_roundtrip(self, server: InProcessNSQD, topic: str, **kwargs: Any) -> Any:
        """PUB, MPUB (a large one too) and SUB over one negotiated connection."""
        conn = yield self.connect(server, **kwargs)
        big = os.urandom(300_000) + b"x" * 700_000  # incompressible and compressible parts
        self.assertEqual((yield conn.pub(topic, b"one")), b"OK")
        self.assertEqual((yield conn.mpub(topic, [b"two", big])), b"OK")
        got: list[bytes] = []
        all_in = defer.Deferred()

        def on_message(msg: Any) -> None:
            got.append(msg.body)
            msg.finish()
            if len(got) == 3:
                all_in.callback(None)

        consumer = yield self.connect(server, **kwargs)
        consumer.on_message = on_message
        self.assertEqual((yield consumer.sub(topic, "ch")), b"OK")
        consumer.rdy(10)
        yield all_in
        self.assertEqual(got, [b"one", b"two", big])
        return conn

    @defer.inlineCallbacks
    def client_stats(self, server: InProcessNSQD, topic: str) -> Any:
        stats = yield get_json(f"http://127.0.0.1:{server.http_port}/stats?format=json&topic={topic}")
        # producers are every client that published; keep those of this topic
        producers = [p for p in stats.get("producers") or [] if p.get("pub_counts")]
        return [c for t in stats["topics"] for ch in t["channels"] for c in ch["clients"]] + producers


class TLSTests(NSQDTestCase):
    @defer.inlineCallbacks
    def test_upgrade_then_publish_and_consume(self):
        server = self.start_nsqd(**tls_opts())
        conn = yield self.assert_roundtrip(server, "secure", tls_v1=True, tls_options=client_tls())
        self.assertTrue(conn.identify_response["tls_v1"])
        clients = yield self.client_stats(server, "secure")
        self.assertTrue(clients)
        for c in clients:
            self.assertTrue(c["tls"])
            self.assertEqual(c["tls_version"], "TLS1.3")
            # Go 1.3's table has no TLS 1.3 names: it reports the suite's number
            self.assertIn(c["tls_cipher_suite"], ("Unknown 4865", "Unknown 4866", "Unknown 4867"))
            self.assertEqual(c["tls_negotiated_protocol"], "")
            self.assertTrue(c["tls_negotiated_protocol_is_mutual"])

    @defer.inlineCallbacks
    def test_tls_1_2_reports_go_names(self):
        server = self.start_nsqd(**tls_opts())
        opts = client_tls(lowerMaximumSecurityTo=ssl.TLSVersion.TLSv1_2)
        yield self.assert_roundtrip(server, "tls12", tls_v1=True, tls_options=opts)
        clients = yield self.client_stats(server, "tls12")
        self.assertEqual({c["tls_version"] for c in clients}, {"TLS1.2"})
        self.assertTrue(all(c["tls_cipher_suite"].startswith(("TLS_ECDHE_ECDSA", "Unknown 49")) for c in clients))

    @defer.inlineCallbacks
    def test_no_upgrade_without_a_certificate(self):
        server = self.start_nsqd()
        conn = yield self.connect(server, tls_v1=True)
        self.assertFalse(conn.identify_response["tls_v1"])
        self.assertEqual((yield conn.pub("plain", b"x")), b"OK")

    @defer.inlineCallbacks
    def test_tls_required_refuses_commands_before_the_upgrade(self):
        server = self.start_nsqd(**tls_opts(tls_required=TLS_REQUIRED))
        conn = yield raw_connect(server.tcp_port)
        with self.assertRaises(NSQError) as e:
            yield conn.pub("t", b"x")
        self.assertEqual(str(e.exception), "E_INVALID cannot PUB in current state (TLS required)")
        yield conn.closed_d
        # SUB is refused too, after a plain IDENTIFY
        conn = yield raw_connect(server.tcp_port)
        yield conn._request(identify_body())
        with self.assertRaises(NSQError) as e:
            yield conn.sub("t", "c")
        self.assertEqual(str(e.exception), "E_INVALID cannot SUB in current state (TLS required)")
        # and after the upgrade everything works
        yield self.assert_roundtrip(server, "t", tls_v1=True, tls_options=client_tls())

    @defer.inlineCallbacks
    def test_tls_required_except_http(self):
        server = self.start_nsqd(**tls_opts(tls_required=TLS_REQUIRED_EXCEPT_HTTP))
        resp = yield treq.post(f"http://127.0.0.1:{server.http_port}/pub?topic=h", data=b"plain http", persistent=False)
        self.assertEqual((yield resp.content()), b"OK")
        conn = yield raw_connect(server.tcp_port)
        with self.assertRaises(NSQError) as e:
            yield conn.pub("h", b"x")
        self.assertEqual(str(e.exception), "E_INVALID cannot PUB in current state (TLS required)")

    @defer.inlineCallbacks
    def test_min_version(self):
        server = self.start_nsqd(**tls_opts(tls_min_version="tls1.3"))
        yield self.assert_handshake_refused(server, client_tls(lowerMaximumSecurityTo=ssl.TLSVersion.TLSv1_2))
        yield self.assert_roundtrip(server, "v13", tls_v1=True, tls_options=client_tls())

    @defer.inlineCallbacks
    def test_client_auth_require_wants_any_certificate(self):
        files = certs()
        server = self.start_nsqd(**tls_opts(tls_client_auth_policy="require"))
        yield self.assert_handshake_refused(server, client_tls())
        # "require" does not verify: a certificate from another CA will do
        opts = client_tls(files.other_client_cert, files.other_client_key)
        yield self.assert_roundtrip(server, "anycert", tls_v1=True, tls_options=opts)

    @defer.inlineCallbacks
    def test_client_auth_require_verify(self):
        files = certs()
        server = self.start_nsqd(**tls_opts(tls_client_auth_policy="require-verify", tls_root_ca_file=files.ca))
        bystander = yield self.connect(server, tls_v1=True, tls_options=client_tls(files.client_cert, files.client_key))
        yield self.assert_handshake_refused(server, client_tls(files.other_client_cert, files.other_client_key))
        yield self.assert_handshake_refused(server, client_tls())
        # the refused clients did not disturb anyone else
        self.assertEqual((yield bystander.pub("bystander", b"x")), b"OK")
        yield self.assert_roundtrip(
            server, "verified", tls_v1=True, tls_options=client_tls(files.client_cert, files.client_key)
        )

    @defer.inlineCallbacks
    def test_garbage_instead_of_a_handshake(self):
        server = self.start_nsqd(**tls_opts())
        conn = yield raw_connect(server.tcp_port)
        resp = yield conn._request(identify_body(tls_v1=True))
        self.assertTrue(json.loads(resp)["tls_v1"])
        with self.assertRaises(NSQError) as e:
            yield conn._request(b"PUB t\n\x00\x00\x00\x01x")
        self.assertEqual(
            str(e.exception), "E_IDENTIFY_FAILED IDENTIFY failed tls: first record does not look like a TLS handshake"
        )
        yield conn.closed_d
        yield self.assert_roundtrip(server, "after-garbage", tls_v1=True, tls_options=client_tls())

    @defer.inlineCallbacks
    def test_handshake_that_never_starts(self):
        self.patch(upgrade, "TLS_HANDSHAKE_TIMEOUT", 0.3)
        server = self.start_nsqd(**tls_opts())
        conn = yield raw_connect(server.tcp_port)
        yield conn._request(identify_body(tls_v1=True))
        waiting = conn._request(b"")  # catches the error frame
        bystander = yield self.connect(server)
        self.assertEqual((yield bystander.pub("stall", b"x")), b"OK")
        with self.assertRaises(NSQError) as e:
            yield waiting
        self.assertTrue(
            str(e.exception).startswith("E_IDENTIFY_FAILED IDENTIFY failed read tcp 127.0.0.1:"), e.exception
        )
        self.assertTrue(str(e.exception).endswith(": i/o timeout"))
        yield conn.closed_d

    @defer.inlineCallbacks
    def test_handshake_that_stalls_halfway(self):
        self.patch(upgrade, "TLS_HANDSHAKE_TIMEOUT", 0.3)
        server = self.start_nsqd(**tls_opts())
        conn = yield raw_connect(server.tcp_port)
        yield conn._request(identify_body(tls_v1=True))
        conn.transport.write(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, then nothing
        yield conn.closed_d
        self.assertEqual(server.nsqd.clients, {})

    @defer.inlineCallbacks
    def test_heartbeats_wait_for_the_handshake(self):
        """A heartbeat due during the upgrade must not be written in clear
        text into the handshake; it follows the OK, over TLS."""
        server = self.start_nsqd(**tls_opts())
        conn = yield self.connect(server, tls_v1=True, tls_options=client_tls(), heartbeat_interval=1000)
        yield deferLater(reactor, 1.2, lambda: None)
        self.assertEqual((yield conn.pub("hb", b"x")), b"OK")


class Warnings:
    """A logger that keeps the text of its warnings."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warn(self, fmt: str, **kw: Any) -> None:
        self.lines.append(fmt.format(**kw))


def negotiated(server: ServerTLS, client_ctx: SSL.Context) -> str:
    """The cipher suite a handshake of ``client_ctx`` with ``server`` agrees, in memory."""
    server_side = SSL.Connection(server.getContext(), None)
    server_side.set_accept_state()
    client = SSL.Connection(client_ctx, None)
    client.set_connect_state()
    for _ in range(10):
        for side, other in ((client, server_side), (server_side, client)):
            try:
                side.do_handshake()
            except SSL.WantReadError:
                pass
            try:
                other.bio_write(side.bio_read(1 << 16))
            except SSL.WantReadError:
                pass
    return client.get_cipher_name() or ""


class CipherSuiteChoiceTests(unittest.TestCase):
    """The suite nsqd picks is the one Go's crypto/tls picks (Go 1.19-1.21, on a CPU
    with AES instructions): AES-128-GCM before AES-256-GCM, ChaCha20-Poly1305 first
    for a client that lists it first. OpenSSL's own order put AES-256 first: /stats
    and the handshake showed another suite than Go's, and encrypted 14 rounds for 10."""

    def server(self, kind: str) -> ServerTLS:
        identity = make_identity(self.mktemp(), kind)
        return ServerTLS(NSQDOptions(tls_cert=identity.cert, tls_key=identity.key))

    def client(self, tls12: bool = False, ciphers: bytes = b"", tls13: bytes = b"") -> SSL.Context:
        ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
        if tls12:
            ctx.set_max_proto_version(SSL.TLS1_2_VERSION)
        if ciphers:
            ctx.set_cipher_list(ciphers)
        if tls13:
            ctx.set_tls13_ciphersuites(tls13)
        return ctx

    def test_tls_1_3_a_client_in_openssl_s_order(self) -> None:
        self.assertEqual(negotiated(self.server("rsa2048-pkcs8"), self.client()), "TLS_AES_128_GCM_SHA256")

    def test_tls_1_3_a_client_that_prefers_chacha20(self) -> None:
        client = self.client(tls13=b"TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256")
        self.assertEqual(negotiated(self.server("rsa2048-pkcs8"), client), "TLS_CHACHA20_POLY1305_SHA256")

    def test_tls_1_2_ecdsa_and_rsa_certificates(self) -> None:
        tls12 = self.client(tls12=True)
        self.assertEqual(negotiated(self.server("ec-p256-sec1"), tls12), "ECDHE-ECDSA-AES128-GCM-SHA256")
        self.assertEqual(negotiated(self.server("rsa2048-pkcs8"), tls12), "ECDHE-RSA-AES128-GCM-SHA256")

    def test_tls_1_2_a_client_that_prefers_chacha20(self) -> None:
        client = self.client(tls12=True, ciphers=b"ECDHE+CHACHA20:ECDHE+AESGCM")
        self.assertEqual(negotiated(self.server("rsa2048-pkcs8"), client), "ECDHE-RSA-CHACHA20-POLY1305")

    def test_tls_1_2_a_client_without_ecdhe_gets_go_s_next_choice(self) -> None:
        client = self.client(tls12=True, ciphers=b"AES256-GCM-SHA384:AES128-GCM-SHA256:AES128-SHA")
        self.assertEqual(negotiated(self.server("rsa2048-pkcs8"), client), "AES128-GCM-SHA256")

    def test_the_set_is_openssl_s_default_in_go_s_order(self) -> None:
        ours = SSL.Connection(self.server("rsa2048-pkcs8").getContext()).get_cipher_list()
        default = SSL.Connection(SSL.Context(SSL.TLS_SERVER_METHOD)).get_cipher_list()
        self.assertEqual(sorted(ours), sorted(default))


class CertificateLevelTests(unittest.TestCase):
    """What Go loads and OpenSSL's default security level refuses: nsqd lowers the
    level as far as the files need, keeps its ciphers, and names the weak part."""

    def server_tls(self, kind: str, **kwargs: Any) -> tuple[ServerTLS, Warnings, Identity]:
        identity = make_identity(self.mktemp(), kind)
        log = Warnings()
        tls = ServerTLS(NSQDOptions(tls_cert=identity.cert, tls_key=identity.key, **kwargs), log)
        return tls, log, identity

    def test_a_strong_key_is_loaded_at_the_default_level_in_silence(self) -> None:
        _, log, _ = self.server_tls("rsa2048-pkcs8")
        self.assertEqual(log.lines, [])

    def test_a_weak_intermediate_is_named(self) -> None:
        _, log, identity = self.server_tls("weak-intermediate")
        self.assertEqual(
            log.lines,
            [
                f"TLS: --tls-cert {identity.cert}: certificate 2 of the chain has a 1024-bit RSA key "
                "(ca key too small at OpenSSL's default security level): using security level 1, "
                "as Go's crypto/tls loads it"
            ],
        )

    def test_the_ciphers_are_those_of_the_default_level(self) -> None:
        strong, _, _ = self.server_tls("rsa2048-pkcs8")
        weak, _, _ = self.server_tls("rsa1024-pkcs1")
        self.assertEqual(
            SSL.Connection(weak.getContext()).get_cipher_list(), SSL.Connection(strong.getContext()).get_cipher_list()
        )

    def test_other_refusals_are_fatal_as_before(self) -> None:
        one = make_identity(self.mktemp(), "rsa1024-pkcs1")
        other = make_identity(self.mktemp(), "rsa2048-pkcs8")
        with self.assertRaises(ConfigError) as e:
            ServerTLS(NSQDOptions(tls_cert=one.cert, tls_key=other.key), Warnings())
        self.assertTrue(str(e.exception).startswith("failed to build TLS config - "), str(e.exception))
        self.assertNotIn("too small", str(e.exception))


class CompressionTests(NSQDTestCase):
    @defer.inlineCallbacks
    def test_snappy(self):
        server = self.start_nsqd()
        conn = yield self.assert_roundtrip(server, "snappy", snappy=True)
        self.assertTrue(conn.identify_response["snappy"])
        clients = yield self.client_stats(server, "snappy")
        self.assertTrue(clients and all(c["snappy"] and not c["deflate"] for c in clients))

    @defer.inlineCallbacks
    def test_deflate_level_is_bounded(self):
        server = self.start_nsqd(max_deflate_level=3)
        conn = yield self.assert_roundtrip(server, "deflate", deflate=True, deflate_level=9)
        resp = conn.identify_response
        self.assertEqual((resp["deflate"], resp["deflate_level"], resp["max_deflate_level"]), (True, 3, 3))
        clients = yield self.client_stats(server, "deflate")
        self.assertTrue(clients and all(c["deflate"] and not c["snappy"] for c in clients))

    @defer.inlineCallbacks
    def test_deflate_default_level(self):
        server = self.start_nsqd()
        conn = yield self.connect(server, deflate=True)
        self.assertEqual(conn.identify_response["deflate_level"], 6)

    @defer.inlineCallbacks
    def test_both_is_refused(self):
        server = self.start_nsqd()
        conn = yield raw_connect(server.tcp_port)
        with self.assertRaises(NSQError) as e:
            yield conn._request(identify_body(snappy=True, deflate=True))
        self.assertEqual(str(e.exception), "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
        yield conn.closed_d

    @defer.inlineCallbacks
    def test_switched_off(self):
        server = self.start_nsqd(snappy=False, deflate=False)
        conn = yield self.connect(server, snappy=True)
        self.assertFalse(conn.identify_response["snappy"])
        conn2 = yield self.connect(server, deflate=True)
        self.assertFalse(conn2.identify_response["deflate"])
        self.assertEqual((yield conn.pub("off", b"x")), b"OK")

    @defer.inlineCallbacks
    def test_compression_inside_tls(self):
        server = self.start_nsqd(**tls_opts())
        for codec in ("snappy", "deflate"):
            topic = f"tls-{codec}"
            yield self.assert_roundtrip(server, topic, tls_v1=True, tls_options=client_tls(), **{codec: True})
            clients = yield self.client_stats(server, topic)
            self.assertTrue(clients and all(c["tls"] and c[codec] for c in clients), clients)

    @defer.inlineCallbacks
    def test_corrupt_compressed_input_closes_that_connection_only(self):
        server = self.start_nsqd()
        bystander = yield self.connect(server, snappy=True)
        for fields, junk in (
            ({"snappy": True}, b"\x00\x05\x00\x00abcde"),  # a bad checksum
            ({"snappy": True}, b"\x00\xff\xff\xff"),  # a 16 MiB chunk
            ({"deflate": True}, b"\xff" * 64),
        ):
            conn = yield self.connect(server, **fields)
            conn.transport.write(junk)
            yield conn.closed_d
        self.assertEqual((yield bystander.pub("fine", b"x")), b"OK")

    @defer.inlineCallbacks
    def test_deflate_bomb_is_read_in_slices(self):
        import zlib

        server = self.start_nsqd()
        conn = yield self.connect(server, deflate=True)
        # 100 MB of PUB bodies (100 x 1 MB) from about 100 KB on the wire
        body = b"\x00" * 1_000_000
        cmd = encode_command(b"PUB", "bomb", body=body) * 100
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        conn.transport.write(c.compress(cmd) + c.flush(zlib.Z_SYNC_FLUSH))
        replies = []
        for _ in range(100):
            d: defer.Deferred[bytes] = defer.Deferred()
            conn._pending.append(d)
            replies.append(d)
        got = yield defer.gatherResults(replies)
        self.assertEqual(got, [b"OK"] * 100)
        self.assertEqual(server.nsqd.get_existing_topic("bomb").message_count, 100)


class AuthServer:
    """A Klein auth server: records each query, answers ``response``."""

    app = Klein()

    def __init__(self) -> None:
        self.queries: list[dict[str, Any]] = []
        self.response: Any = {
            "ttl": 3600,
            "identity": "alice",
            "identity_url": "https://example.com/alice",
            "authorizations": [
                {"topic": "^pub-.*", "channels": [".*"], "permissions": ["publish"]},
                {"topic": "^events$", "channels": ["^archive$", "^audit-[0-9]+$"], "permissions": ["subscribe"]},
            ],
        }
        self.status = 200
        self.delay = 0.0
        self.port: Any = None

    @app.route("/auth", methods=["GET", "POST"])
    def auth(self, request: Any) -> Any:
        if request.method == b"POST":
            values = json.loads(request.content.read())
        else:
            values = {k.decode(): [v.decode() for v in vs] for k, vs in request.args.items()}
        self.queries.append({"method": request.method.decode(), **{k: v[0] for k, v in values.items()}})
        request.setResponseCode(self.status)
        body = self.response if isinstance(self.response, bytes) else json.dumps(self.response).encode()
        if self.delay:
            return deferLater(reactor, self.delay, lambda: body)
        return body

    def listen(self, tls: bool = False) -> str:
        site = Site(self.app.resource())
        site.noisy = False
        if tls:
            files = certs()
            with open(files.cert, "rb") as f1, open(files.key, "rb") as f2:
                server_cert = ssl.PrivateCertificate.loadPEM(f1.read() + f2.read())
            self.port = reactor.listenSSL(0, site, server_cert.options(), interface="127.0.0.1")
            return f"https://127.0.0.1:{self.port.getHost().port}/auth"
        self.port = reactor.listenTCP(0, site, interface="127.0.0.1")
        return f"127.0.0.1:{self.port.getHost().port}"


class AuthServers:
    """The HTTP client nsqd's AuthClient is given: StubTreq on each auth
    server's Klein app by ``host:port``; a request to any other is refused."""

    def __init__(self) -> None:
        self.stubs: dict[str, StubTreq] = {}

    def add(self, auth: AuthServer) -> str:
        address = f"auth{len(self.stubs)}:80"
        self.stubs[address] = StubTreq(auth.app.resource())
        return address

    def stop(self, address: str) -> None:
        del self.stubs[address]

    def flush(self) -> None:
        for stub in list(self.stubs.values()):
            stub.flush()

    def get(self, url: str, **kwargs: Any) -> Any:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> Any:
        return self.request("POST", url, **kwargs)

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        stub = self.stubs.get(urlsplit(url).netloc)
        if stub is None:
            return defer.fail(ConnectionRefusedError())
        return stub.request(method, url, **kwargs)


class MemoryNSQD:
    """An nsqd (core and TCP protocol) on the tests' reactor, for a MemoryNetwork's endpoints."""

    def __init__(self, servers: AuthServers, **kwargs: Any) -> None:
        self.nsqd = make_nsqd(clock=reactor, **kwargs)
        self.factory = V2Factory(self.nsqd, auth=AuthClient(self.nsqd, http_client=servers))


class AuthFailure:
    """``auth_failure``: the error text of an AUTH that nsqd refuses (it then closes)."""

    @defer.inlineCallbacks
    def auth_failure(self, server: Any, secret: bytes = b"s3cret", **kwargs: Any) -> Any:
        conn = yield self.connect(server, **kwargs)  # type: ignore[attr-defined]
        with self.assertRaises(NSQError) as e:  # type: ignore[attr-defined]
            yield conn.auth(secret)
        yield conn.closed_d
        return str(e.exception)


class AuthTests(AuthFailure, unittest.TestCase):
    """AUTH in memory: the client reaches nsqd through iosim, nsqd's AuthClient
    the auth servers through StubTreq; the reactor moves the bytes."""

    timeout = 30

    def setUp(self) -> None:
        self.net = MemoryNetwork(reactor)
        self.servers = AuthServers()

        def pump() -> None:
            self.servers.flush()
            self.net.settle()

        pumping = task.LoopingCall(pump)
        pumping.start(0.002)
        self.addCleanup(pumping.stop)

    def start_auth(self) -> tuple[AuthServer, str]:
        auth = AuthServer()
        return auth, self.servers.add(auth)

    def start_nsqd(self, **kwargs: Any) -> MemoryNSQD:
        return MemoryNSQD(self.servers, **kwargs)

    @defer.inlineCallbacks
    def connect(self, server: MemoryNSQD, **kwargs: Any) -> Any:
        conn = yield connect(reactor, "", 0, endpoint=self.net.endpoint(server.factory), **kwargs)
        self.addCleanup(conn.close)
        return conn

    @defer.inlineCallbacks
    def test_authorized_publish_and_subscribe(self):
        auth, address = self.start_auth()
        server = self.start_nsqd(auth_http_addresses=[address])
        conn = yield self.connect(server)
        self.assertTrue(conn.identify_response["auth_required"])
        reply = yield conn.auth(b"s3cret")
        self.assertEqual(
            json.loads(reply), {"identity": "alice", "identity_url": "https://example.com/alice", "permission_count": 2}
        )
        self.assertEqual(reply, b'{"identity":"alice","identity_url":"https://example.com/alice","permission_count":2}')
        self.assertEqual((yield conn.pub("pub-orders", b"x")), b"OK")
        self.assertEqual((yield conn.mpub("pub-orders", [b"y", b"z"])), b"OK")
        self.assertEqual((yield conn.dpub("pub-orders", 10, b"w")), b"OK")
        sub = yield self.connect(server, auth_secret=b"s3cret")
        self.assertEqual((yield sub.sub("events", "audit-42")), b"OK")
        query = auth.queries[0]
        self.assertEqual(
            query, {"method": "GET", "common_name": "", "remote_ip": "127.0.0.1", "secret": "s3cret", "tls": "false"}
        )
        stats = get_stats(server.nsqd, "events")
        clients = stats["topics"][0]["channels"][0]["clients"]
        self.assertEqual(len(clients), 1)
        self.assertTrue(clients[0]["authed"])
        self.assertEqual(clients[0]["auth_identity"], "alice")
        self.assertEqual(clients[0]["auth_identity_url"], "https://example.com/alice")

    @defer.inlineCallbacks
    def test_refusals(self):
        _auth, address = self.start_auth()
        server = self.start_nsqd(auth_http_addresses=[address])
        cases = [
            (lambda c: c.pub("pub-x", b"x"), False, "E_AUTH_FIRST AUTH required before PUB"),
            (lambda c: c.mpub("pub-x", [b"x"]), False, "E_AUTH_FIRST AUTH required before MPUB"),
            (lambda c: c.sub("events", "archive"), False, "E_AUTH_FIRST AUTH required before SUB"),
            (lambda c: c.pub("events", b"x"), True, 'E_UNAUTHORIZED AUTH failed for PUB on "events" ""'),
            (lambda c: c.mpub("other", [b"x"]), True, 'E_UNAUTHORIZED AUTH failed for MPUB on "other" ""'),
            (lambda c: c.dpub("other", 5, b"x"), True, 'E_UNAUTHORIZED AUTH failed for DPUB on "other" ""'),
            (lambda c: c.sub("events", "other"), True, 'E_UNAUTHORIZED AUTH failed for SUB on "events" "other"'),
            (lambda c: c.sub("pub-x", "ch"), True, 'E_UNAUTHORIZED AUTH failed for SUB on "pub-x" "ch"'),
            (lambda c: c.auth(b"again"), True, "E_INVALID AUTH already set"),
        ]
        for command, authed, expected in cases:
            conn = yield self.connect(server, auth_secret=b"s3cret" if authed else None)
            with self.assertRaises(NSQError) as e:
                yield command(conn)
            self.assertEqual(str(e.exception), expected)
            yield conn.closed_d
        self.assertNotIn("other", server.nsqd.topics)

    @defer.inlineCallbacks
    def test_auth_disabled(self):
        server = self.start_nsqd()
        conn = yield self.connect(server)
        self.assertFalse(conn.identify_response["auth_required"])
        self.assertEqual((yield self.auth_failure(server)), "E_AUTH_DISABLED AUTH disabled")

    @defer.inlineCallbacks
    def test_no_authorizations(self):
        auth, address = self.start_auth()
        auth.response = {"ttl": 60, "identity": "nobody", "authorizations": []}
        server = self.start_nsqd(auth_http_addresses=[address])
        self.assertEqual((yield self.auth_failure(server)), "E_UNAUTHORIZED AUTH no authorizations found")

    @defer.inlineCallbacks
    def test_server_down_slow_or_nonsense(self):
        auth, address = self.start_auth()
        server = self.start_nsqd(auth_http_addresses=[address], http_client_request_timeout=0.5)
        bystander = yield self.connect(server, auth_secret=b"s3cret")
        answers = [
            b"not json",
            b"[1, 2]",
            {"ttl": 0, "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}]},
            {"ttl": 60, "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["admin"]}]},
            {"ttl": 60, "authorizations": [{"topic": "(", "channels": [".*"], "permissions": ["publish"]}]},
            {"ttl": 60, "authorizations": [{"topic": ".*", "channels": ["["], "permissions": ["publish"]}]},
            {"ttl": "60", "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}]},
            {"ttl": 60, "authorizations": "everything"},
        ]
        for answer in answers:
            auth.response = answer
            self.assertEqual((yield self.auth_failure(server)), "E_AUTH_FAILED AUTH failed", answer)
        auth.response = AuthServer().response
        auth.status = 500
        self.assertEqual((yield self.auth_failure(server)), "E_AUTH_FAILED AUTH failed")
        auth.status = 200
        # slow: the client waits, and only that client
        auth.delay = 2.0
        slow = self.auth_failure(server)
        self.assertEqual((yield bystander.pub("pub-bystander", b"x")), b"OK")
        self.assertEqual((yield slow), "E_AUTH_FAILED AUTH failed")
        # down
        self.servers.stop(address)
        self.assertEqual((yield self.auth_failure(server)), "E_AUTH_FAILED AUTH failed")
        self.assertEqual((yield bystander.pub("pub-bystander", b"x")), b"OK")

    @defer.inlineCallbacks
    def test_post_method(self):
        auth, address = self.start_auth()
        server = self.start_nsqd(auth_http_addresses=[address], auth_http_request_method="post")
        conn = yield self.connect(server, auth_secret=b"s3cret")
        self.assertEqual((yield conn.pub("pub-a", b"x")), b"OK")
        self.assertEqual(
            auth.queries,
            [{"method": "POST", "common_name": "", "remote_ip": "127.0.0.1", "secret": "s3cret", "tls": "false"}],
        )

    @defer.inlineCallbacks
    def test_servers_are_tried_in_turn(self):
        auth, address = self.start_auth()
        server = self.start_nsqd(auth_http_addresses=["auth-down:80", address, "auth-down:81"])
        for _ in range(4):
            conn = yield self.connect(server, auth_secret=b"s3cret")
            self.assertEqual((yield conn.pub("pub-a", b"x")), b"OK")
        self.assertEqual(len(auth.queries), 4)

    @defer.inlineCallbacks
    def test_reauth_when_the_ttl_expires(self):
        auth, address = self.start_auth()
        server = self.start_nsqd(auth_http_addresses=[address])
        conn = yield self.connect(server, auth_secret=b"s3cret")
        self.assertEqual((yield conn.pub("pub-a", b"1")), b"OK")
        (client,) = server.nsqd.clients.values()
        client.auth_state.expires = 0  # the TTL has run out
        self.assertEqual((yield conn.pub("pub-a", b"2")), b"OK")
        self.assertEqual(len(auth.queries), 2)
        # the auth server changed its mind: the next refresh refuses
        auth.response = {
            "ttl": 60,
            "authorizations": [{"topic": "^elsewhere$", "channels": [".*"], "permissions": ["publish"]}],
        }
        client.auth_state.expires = 0
        with self.assertRaises(NSQError) as e:
            yield conn.pub("pub-a", b"3")
        self.assertEqual(str(e.exception), 'E_UNAUTHORIZED AUTH failed for PUB on "pub-a" ""')
        self.assertEqual(server.nsqd.get_existing_topic("pub-a").message_count, 2)

    @defer.inlineCallbacks
    def test_failed_refresh(self):
        auth, address = self.start_auth()
        server = self.start_nsqd(auth_http_addresses=[address])
        conn = yield self.connect(server, auth_secret=b"s3cret")
        (client,) = server.nsqd.clients.values()
        client.auth_state.expires = 0
        auth.status = 502
        with self.assertRaises(NSQError) as e:
            yield conn.mpub("pub-a", [b"x"])
        self.assertEqual(str(e.exception), "E_AUTH_FAILED AUTH failed")
        self.assertNotIn("pub-a", server.nsqd.topics)

    @defer.inlineCallbacks
    def test_commands_behind_auth_wait_for_it(self):
        auth, address = self.start_auth()
        auth.delay = 0.2
        server = self.start_nsqd(auth_http_addresses=[address])
        conn = yield self.connect(server)
        # AUTH and PUB in one write: PUB must see the authorisation
        replies = [defer.Deferred(), defer.Deferred()]
        conn._pending.extend(replies)
        conn.transport.write(encode_command(b"AUTH", body=b"s3cret") + encode_command(b"PUB", "pub-b", body=b"x"))
        auth_reply, pub_reply = yield defer.gatherResults(replies)
        self.assertIn(b'"identity":"alice"', auth_reply)
        self.assertEqual(pub_reply, b"OK")


class AuthRealSocketTests(AuthFailure, NSQDTestCase):
    """AUTH where the sockets matter: TLS to nsqd or to the auth server, a request line too long for HTTP."""

    def start_auth(self, tls: bool = False) -> tuple[AuthServer, str]:
        auth = AuthServer()
        address = auth.listen(tls)
        self.addCleanup(auth.port.stopListening)
        return auth, address

    @defer.inlineCallbacks
    def test_huge_secret(self):
        auth, address = self.start_auth()
        server = self.start_nsqd(auth_http_addresses=[address])
        self.assertEqual((yield self.auth_failure(server, secret=b"s" * 1_000_000)), "E_AUTH_FAILED AUTH failed")
        self.assertEqual(auth.queries, [])
        # by POST the auth server sees it and may answer as it likes
        server2 = self.start_nsqd(auth_http_addresses=[address], auth_http_request_method="post")
        auth.response = {"ttl": 60, "authorizations": []}
        self.assertEqual(
            (yield self.auth_failure(server2, secret=b"s" * 1_000_000)), "E_UNAUTHORIZED AUTH no authorizations found"
        )
        self.assertEqual(len(auth.queries[0]["secret"]), 1_000_000)

    @defer.inlineCallbacks
    def test_tls_client_certificate_reaches_the_auth_server(self):
        files = certs()
        auth, address = self.start_auth()
        server = self.start_nsqd(
            auth_http_addresses=[address],
            **tls_opts(tls_client_auth_policy="require-verify", tls_root_ca_file=files.ca),
        )
        conn = yield self.connect(
            server,
            tls_v1=True,
            snappy=True,
            tls_options=client_tls(files.client_cert, files.client_key),
            auth_secret=b"s3cret",
        )
        self.assertEqual((yield conn.pub("pub-tls", b"x")), b"OK")
        self.assertEqual(auth.queries[0]["tls"], "true")
        self.assertEqual(auth.queries[0]["common_name"], "test-client")

    @defer.inlineCallbacks
    def test_https_auth_server_verified_with_the_root_ca(self):
        files = certs()
        auth, url = self.start_auth(tls=True)
        server = self.start_nsqd(auth_http_addresses=[url], tls_root_ca_file=files.ca)
        conn = yield self.connect(server, auth_secret=b"s3cret")
        self.assertEqual((yield conn.pub("pub-https", b"x")), b"OK")
        # without the CA the auth server's certificate is not trusted
        server2 = self.start_nsqd(auth_http_addresses=[url])
        self.assertEqual((yield self.auth_failure(server2)), "E_AUTH_FAILED AUTH failed")
        self.assertEqual(len(auth.queries), 1)

    @defer.inlineCallbacks
    def test_403_with_an_https_port_moves_to_https(self):
        files = certs()
        https_auth, url = self.start_auth(tls=True)
        https_port = int(url.split(":")[2].split("/")[0])
        plain, address = self.start_auth()
        plain.status = 403
        plain.response = {"message": "TLS_REQUIRED", "https_port": https_port}
        server = self.start_nsqd(auth_http_addresses=[address], tls_root_ca_file=files.ca)
        conn = yield self.connect(server, auth_secret=b"s3cret")
        self.assertEqual((yield conn.pub("pub-redirect", b"x")), b"OK")
        self.assertEqual((len(plain.queries), len(https_auth.queries)), (1, 1))
