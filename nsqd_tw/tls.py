"""TLS contexts from nsqd's options (Go's buildTLSConfig).

``--tls-cert``/``--tls-key`` (PEM), ``--tls-min-version``, and the client
certificate policy: none by default, ``require`` (any certificate) or
``require-verify`` (signed by ``--tls-root-ca-file``).

Go's crypto/tls loads any certificate chain and key it can parse (RSA of any
size, ECDSA, Ed25519; PKCS#1, PKCS#8 or SEC1 keys); OpenSSL's security level
refuses weak ones at load (a 1024-bit RSA key: ``ee key too small``). nsqd starts
with what Go starts with: it lowers the level only as far as the files need,
keeps the ciphers it had, and the lowest TLS version (OpenSSL refuses TLS 1.0 and
1.1 at every level but 0), and says so in one WARNING naming the weak key.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from OpenSSL import SSL, crypto
from twisted.internet.interfaces import IOpenSSLContextFactory
from zope.interface import implementer

from nsq_service.options import ConfigError
from nsqd_tw.options import NSQDOptions

# The order Go's crypto/tls (1.17 and later, on a CPU with AES instructions) picks
# a server's suite in, where nsqd 1.3 leaves its tls.Config's CipherSuites unset:
# TLS 1.3's three, and TLS 1.2's of its defaults that OpenSSL has by these names.
# OpenSSL's own order put AES-256 first (Go picks AES-128-GCM: /stats and the
# handshake showed another suite than Go's, and encrypted 14 rounds where Go's 10).
GO_TLS13_SUITES = b"TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
GO_TLS12_ORDER = (
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA",
    "AES256-SHA",
    "ECDHE-RSA-DES-CBC3-SHA",
    "DES-CBC3-SHA",
)
# Go puts ChaCha20-Poly1305 first for a client that does not list AES-GCM first;
# OpenSSL's SSL_OP_PRIORITIZE_CHACHA (not in pyOpenSSL's names; the same bit in
# OpenSSL 1.1.1 and 3) does for a client that lists ChaCha20 first
OP_PRIORITIZE_CHACHA = 1 << 21


def go_cipher_order(names: list[str]) -> str:
    """OpenSSL's TLS 1.2 cipher ``names`` (its default list: the same set) as a cipher
    string in Go's order: Go's choices first, the rest after them in OpenSSL's order."""
    tls12 = [n for n in names if not n.startswith("TLS_")]
    first = [n for n in GO_TLS12_ORDER if n in tls12]
    return ":".join(first + [n for n in tls12 if n not in first])


MIN_VERSIONS = {
    "tls1.0": SSL.TLS1_VERSION,
    "tls1.1": SSL.TLS1_1_VERSION,
    "tls1.2": SSL.TLS1_2_VERSION,
    "tls1.3": SSL.TLS1_3_VERSION,
}


@implementer(IOpenSSLContextFactory)
class ServerTLS:
    """A context factory for Twisted's TLS (``getContext``), built once."""

    def __init__(self, opts: NSQDOptions, log: Any = None) -> None:
        """``log`` hears of a key OpenSSL would refuse at its default security level."""

        def make() -> SSL.Context:
            ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
            ctx.set_min_proto_version(MIN_VERSIONS[opts.tls_min_version])
            ctx.set_options(SSL.OP_NO_COMPRESSION | SSL.OP_CIPHER_SERVER_PREFERENCE | OP_PRIORITIZE_CHACHA)
            ctx.set_tls13_ciphersuites(GO_TLS13_SUITES)
            ctx.set_cipher_list(_go_order().encode())
            return ctx

        for path in (opts.tls_cert, opts.tls_key, opts.tls_root_ca_file):
            if path:
                _check_readable(path)
        ctx = with_identity(make, opts, log)
        if opts.tls_root_ca_file:
            try:
                ctx.load_verify_locations(opts.tls_root_ca_file.encode())
            except (SSL.Error, OSError) as e:
                raise ConfigError(f"failed to build TLS config - {ssl_error(e)}") from None
        policy = opts.tls_client_auth_policy
        if policy == "require":
            ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _accept_any)
        elif policy == "require-verify":
            ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _verified)
        ctx.set_session_id(b"nsq-tw")
        self.context = ctx

    def getContext(self) -> SSL.Context:
        return self.context


@implementer(IOpenSSLContextFactory)
class ClientTLS:
    """Beyond Go: the context a replication primary dials its standby with: nsqd's
    own certificate (for a standby that verifies its primary's), and the standby's
    checked against ``--tls-root-ca-file`` when one is given."""

    def __init__(self, opts: NSQDOptions) -> None:
        def make() -> SSL.Context:
            ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
            ctx.set_min_proto_version(MIN_VERSIONS[opts.tls_min_version])
            return ctx

        # the level nsqd's own certificate needs (ServerTLS said so at start)
        ctx = with_identity(make, opts, None) if opts.tls_cert and opts.tls_key else make()
        try:
            if opts.tls_root_ca_file:
                ctx.load_verify_locations(opts.tls_root_ca_file.encode())
                ctx.set_verify(SSL.VERIFY_PEER, _verified)
            else:
                ctx.set_verify(SSL.VERIFY_NONE, _accept_any)
        except (SSL.Error, OSError) as e:
            raise ConfigError(f"failed to build TLS config - {ssl_error(e)}") from None
        self.context = ctx

    def getContext(self) -> SSL.Context:
        return self.context


_GO_ORDER: list[str] = []


def _go_order() -> str:
    """OpenSSL's default TLS 1.2 ciphers in Go's order (worked out once)."""
    if not _GO_ORDER:
        _GO_ORDER.append(go_cipher_order(SSL.Connection(SSL.Context(SSL.TLS_SERVER_METHOD)).get_cipher_list()))
    return _GO_ORDER[0]


def with_identity(make: Callable[[], SSL.Context], opts: NSQDOptions, log: Any) -> SSL.Context:
    """A context from ``make()`` holding --tls-cert's chain and --tls-key: at
    OpenSSL's default security level, or at the highest level below it that
    accepts them (what Go loads, OpenSSL may refuse)."""
    try:
        return _load_identity(make(), opts)
    except SSL.Error as e:
        if not _too_weak(e):
            raise ConfigError(f"failed to build TLS config - {ssl_error(e)}") from None
        refused = e
    except OSError as e:
        raise ConfigError(f"failed to build TLS config - {ssl_error(e)}") from None
    # the same ciphers, in the same order (a context that made a Connection is frozen)
    ciphers = ":".join(SSL.Connection(make()).get_cipher_list())
    for level in range(4, -1, -1):  # the first to accept is at most the default
        try:
            ctx = make()
            ctx.set_cipher_list(f"{ciphers}:@SECLEVEL={level}".encode())
            if level == 0:  # TLS 1.0 and 1.1 stay refused, as at every other level
                ctx.set_min_proto_version(max(MIN_VERSIONS[opts.tls_min_version], SSL.TLS1_2_VERSION))
            ctx = _load_identity(ctx, opts)
        except SSL.Error as e:
            if _too_weak(e):
                continue
            raise ConfigError(f"failed to build TLS config - {ssl_error(e)}") from None
        if log is not None:
            log.warn(
                "TLS: --tls-cert {path}: {what} ({reason} at OpenSSL's default security level): "
                "using security level {seclevel}, as Go's crypto/tls loads it",
                path=opts.tls_cert,
                what=weak_part(opts.tls_cert),
                reason=ssl_error(refused),
                seclevel=level,
            )
        return ctx
    raise ConfigError(f"failed to build TLS config - {ssl_error(refused)}") from None


class _EncryptedKey(Exception):
    pass


def _no_passphrase(maxlen: int, verify: bool, extra: Any) -> bytes:
    """OpenSSL asks for a passphrase (an encrypted key): none is given. Without a
    callback it would prompt on the terminal and wait; Go's crypto/tls reads no
    encrypted key either."""
    raise _EncryptedKey()


def _load_identity(ctx: SSL.Context, opts: NSQDOptions) -> SSL.Context:
    ctx.use_certificate_chain_file(opts.tls_cert.encode())
    ctx.set_passwd_cb(_no_passphrase)
    try:
        ctx.use_privatekey_file(opts.tls_key.encode())
    except _EncryptedKey:
        raise ConfigError(
            f"failed to build TLS config - --tls-key {opts.tls_key} is encrypted with a passphrase (not supported)"
        ) from None
    ctx.check_privatekey()
    return ctx


def _too_weak(e: SSL.Error) -> bool:
    """A refusal of the security level ("ee key too small", "ca md too weak")."""
    text = ssl_error(e)
    return "too small" in text or "too weak" in text


def weak_part(cert_path: str) -> str:
    """What OpenSSL's default security level refuses in a chain file: ``its key is
    a 1024-bit RSA key``, ``certificate 2 of the chain is signed with SHA1``..."""
    try:
        with open(cert_path, "rb") as f:
            chain = x509.load_pem_x509_certificates(f.read())
    except (OSError, ValueError):
        return "refused"
    for i, cert in enumerate(chain):
        probe = SSL.Context(SSL.TLS_SERVER_METHOD)
        try:
            probe.use_certificate(crypto.X509.from_cryptography(cert))
        except SSL.Error as e:
            if "md too weak" in ssl_error(e):
                digest = cert.signature_hash_algorithm
                signed = f"signed with {digest.name.upper() if digest else 'a weak digest'}"
                return f"its certificate is {signed}" if i == 0 else f"certificate {i + 1} of the chain is {signed}"
            key = describe_key(cert.public_key())
            return f"its key is {key}" if i == 0 else f"certificate {i + 1} of the chain has {key}"
    return "refused"


def describe_key(key: Any) -> str:
    if isinstance(key, rsa.RSAPublicKey):
        return f"a {key.key_size}-bit RSA key"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"a {key.curve.key_size}-bit ECDSA key ({key.curve.name})"
    if isinstance(key, dsa.DSAPublicKey):
        return f"a {key.key_size}-bit DSA key"
    if isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        return f"an {type(key).__name__.removesuffix('PublicKey')} key"
    return f"a {type(key).__name__} key"


def _accept_any(conn: Any, cert: Any, errnum: int, depth: int, ok: int) -> bool:
    return True


def _verified(conn: Any, cert: Any, errnum: int, depth: int, ok: int) -> bool:
    return bool(ok)


def _check_readable(path: str) -> None:
    """Go's text for a file it cannot open (OpenSSL's own says only "system lib")."""
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        raise ConfigError(f"failed to build TLS config - open {path}: {reason[:1].lower()}{reason[1:]}") from None


def ssl_error(e: BaseException) -> str:
    if isinstance(e, SSL.Error) and e.args and isinstance(e.args[0], list):
        return "; ".join(str(part[-1]) for part in e.args[0] if part) or str(e)
    return str(e)


def server_tls(opts: NSQDOptions, log: Any = None) -> ServerTLS | None:
    if not opts.tls_cert and not opts.tls_key:
        return None
    return ServerTLS(opts, log)


# crypto/tls names nsqd 1.3 reports in /stats; other suites are "Unknown <id>"
_GO_CIPHER_NAMES = {
    "RC4-SHA": (0x0005, "TLS_RSA_WITH_RC4_128_SHA"),
    "DES-CBC3-SHA": (0x000A, "TLS_RSA_WITH_3DES_EDE_CBC_SHA"),
    "AES128-SHA": (0x002F, "TLS_RSA_WITH_AES_128_CBC_SHA"),
    "AES256-SHA": (0x0035, "TLS_RSA_WITH_AES_256_CBC_SHA"),
    "ECDHE-ECDSA-RC4-SHA": (0xC007, "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA"),
    "ECDHE-ECDSA-AES128-SHA": (0xC009, "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"),
    "ECDHE-ECDSA-AES256-SHA": (0xC00A, "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"),
    "ECDHE-RSA-RC4-SHA": (0xC011, "TLS_ECDHE_RSA_WITH_RC4_128_SHA"),
    "ECDHE-RSA-DES-CBC3-SHA": (0xC012, "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"),
    "ECDHE-RSA-AES128-SHA": (0xC013, "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"),
    "ECDHE-RSA-AES256-SHA": (0xC014, "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"),
    "ECDHE-RSA-AES128-GCM-SHA256": (0xC02F, "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
    "ECDHE-ECDSA-AES128-GCM-SHA256": (0xC02B, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
}
_CIPHER_IDS = {
    "TLS_AES_128_GCM_SHA256": 0x1301,
    "TLS_AES_256_GCM_SHA384": 0x1302,
    "TLS_CHACHA20_POLY1305_SHA256": 0x1303,
    "AES128-GCM-SHA256": 0x009C,
    "AES256-GCM-SHA384": 0x009D,
    "DHE-RSA-AES128-GCM-SHA256": 0x009E,
    "DHE-RSA-AES256-GCM-SHA384": 0x009F,
    "ECDHE-ECDSA-AES256-GCM-SHA384": 0xC02C,
    "ECDHE-RSA-AES256-GCM-SHA384": 0xC030,
    "ECDHE-RSA-AES128-SHA256": 0xC027,
    "ECDHE-RSA-AES256-SHA384": 0xC028,
    "ECDHE-ECDSA-AES128-SHA256": 0xC023,
    "ECDHE-ECDSA-AES256-SHA384": 0xC024,
    "ECDHE-RSA-CHACHA20-POLY1305": 0xCCA8,
    "ECDHE-ECDSA-CHACHA20-POLY1305": 0xCCA9,
    "DHE-RSA-CHACHA20-POLY1305": 0xCCAA,
}


def go_cipher_suite(openssl_name: str) -> str:
    """The ``tls_cipher_suite`` Go's nsqd would report for a negotiated suite."""
    known = _GO_CIPHER_NAMES.get(openssl_name)
    if known is not None:
        return known[1]
    suite_id = _CIPHER_IDS.get(openssl_name)
    return f"Unknown {suite_id}" if suite_id is not None else f"Unknown {openssl_name}"


def go_tls_version(openssl_version: str) -> str:
    return {"TLSv1": "TLS1.0", "TLSv1.1": "TLS1.1", "TLSv1.2": "TLS1.2", "TLSv1.3": "TLS1.3"}.get(
        openssl_version, f"Unknown {openssl_version}"
    )


def session_info(conn: SSL.Connection) -> dict[str, Any]:
    """Cipher suite, version and ALPN of a TLS session, as Go's /stats shows them."""
    return {
        "cipher_suite": go_cipher_suite(conn.get_cipher_name() or ""),
        "version": go_tls_version(conn.get_protocol_version_name() or ""),
        "negotiated_protocol": (conn.get_alpn_proto_negotiated() or b"").decode("ascii", "replace"),
        # crypto/tls: "Deprecated: this value is always true"
        "negotiated_protocol_is_mutual": True,
    }


def peer_common_name(conn: SSL.Connection) -> str:
    """The subject common name of the peer's TLS certificate, if any."""
    cert = conn.get_peer_certificate()
    if cert is None:
        return ""
    return cert.get_subject().commonName or ""
