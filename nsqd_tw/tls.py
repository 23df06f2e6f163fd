"""TLS contexts from nsqd's options (Go's buildTLSConfig).

``--tls-cert``/``--tls-key`` (PEM), ``--tls-min-version``, and the client
certificate policy: none by default, ``require`` (any certificate) or
``require-verify`` (signed by ``--tls-root-ca-file``).
"""

from __future__ import annotations

import os
from typing import Any

from OpenSSL import SSL
from twisted.internet.interfaces import IOpenSSLContextFactory
from zope.interface import implementer

from nsq_service.options import ConfigError
from nsqd_tw.options import NSQDOptions

MIN_VERSIONS = {
    "tls1.0": SSL.TLS1_VERSION,
    "tls1.1": SSL.TLS1_1_VERSION,
    "tls1.2": SSL.TLS1_2_VERSION,
    "tls1.3": SSL.TLS1_3_VERSION,
}


@implementer(IOpenSSLContextFactory)
class ServerTLS:
    """A context factory for Twisted's TLS (``getContext``), built once."""

    def __init__(self, opts: NSQDOptions) -> None:
        ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
        ctx.set_min_proto_version(MIN_VERSIONS[opts.tls_min_version])
        ctx.set_options(SSL.OP_NO_COMPRESSION | SSL.OP_CIPHER_SERVER_PREFERENCE)
        for path in (opts.tls_cert, opts.tls_key, opts.tls_root_ca_file):
            if path:
                _check_readable(path)
        try:
            ctx.use_certificate_chain_file(opts.tls_cert.encode())
            ctx.use_privatekey_file(opts.tls_key.encode())
            ctx.check_privatekey()
        except (SSL.Error, OSError) as e:
            raise ConfigError(f"failed to build TLS config - {ssl_error(e)}") from None
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


def server_tls(opts: NSQDOptions) -> ServerTLS | None:
    if not opts.tls_cert and not opts.tls_key:
        return None
    return ServerTLS(opts)
