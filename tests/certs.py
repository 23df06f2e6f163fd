"""Certificates for the TLS tests, generated on the fly (a CA, a server, clients),
and server certificates of every kind Go's crypto/tls loads (:func:`make_identity`)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import warnings
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Files:
    ca: str
    ca_key: str
    cert: str
    key: str
    client_cert: str
    client_key: str
    other_ca: str
    other_client_cert: str
    other_client_key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(cn: str, ca: x509.Certificate, ca_key: Any, server: bool, key: Any = None, is_ca: bool = False):
    key = key if key is not None else _key()
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
    )
    if is_ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(path: str, cert: x509.Certificate | None = None, key: ec.EllipticCurvePrivateKey | None = None) -> str:
    with open(path, "wb") as f:
        if cert is not None:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        if key is not None:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )
    return path


def make_certs(directory: str) -> Files:
    os.makedirs(directory, exist_ok=True)
    ca, ca_key = _ca("nsq-tw test CA")
    server, server_key = _leaf("127.0.0.1", ca, ca_key, server=True)
    client, client_key = _leaf("test-client", ca, ca_key, server=False)
    other_ca, other_ca_key = _ca("some other CA")
    other_client, other_client_key = _leaf("intruder", other_ca, other_ca_key, server=False)
    j = lambda name: os.path.join(directory, name)  # noqa: E731
    return Files(
        ca=_write(j("ca.pem"), ca),
        ca_key=_write(j("ca.key"), key=ca_key),
        cert=_write(j("server.pem"), server),
        key=_write(j("server.key"), key=server_key),
        client_cert=_write(j("client.pem"), client),
        client_key=_write(j("client.key"), key=client_key),
        other_ca=_write(j("other-ca.pem"), other_ca),
        other_client_cert=_write(j("other-client.pem"), other_client),
        other_client_key=_write(j("other-client.key"), key=other_client_key),
    )


@dataclass
class Identity:
    """A server certificate file (leaf first, then any intermediate), its key, and
    the root CA that verifies it."""

    cert: str
    key: str
    ca: str


# kind -> (the key's generator, how its file is written)
_PKCS1 = serialization.PrivateFormat.TraditionalOpenSSL  # RSA PRIVATE KEY / EC PRIVATE KEY (SEC1)
_PKCS8 = serialization.PrivateFormat.PKCS8  # PRIVATE KEY
IDENTITY_KINDS: dict[str, tuple[Any, Any]] = {
    "rsa1024-pkcs1": (lambda: rsa.generate_private_key(65537, 1024), _PKCS1),
    "rsa512-pkcs1": (lambda: _rsa_below_1024(512), _PKCS1),
    "rsa2048-pkcs8": (lambda: rsa.generate_private_key(65537, 2048), _PKCS8),
    "ec-p256-sec1": (lambda: ec.generate_private_key(ec.SECP256R1()), _PKCS1),
    "ec-p384-pkcs8": (lambda: ec.generate_private_key(ec.SECP384R1()), _PKCS8),
    "ed25519-pkcs8": (ed25519.Ed25519PrivateKey.generate, _PKCS8),
    "chain": (_key, _PKCS8),  # a P-256 leaf signed by an intermediate, the two in the file
    "weak-intermediate": (_key, _PKCS8),  # the same, the intermediate's key a 1024-bit RSA one
}


def _rsa_below_1024(bits: int) -> Any:
    """cryptography makes no RSA key under 1024 bits; Go loads one, so OpenSSL makes it."""
    from OpenSSL import crypto

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        key = crypto.PKey()
        key.generate_key(crypto.TYPE_RSA, bits)
    return key.to_cryptography_key()


def make_identity(directory: str, kind: str) -> Identity:
    """A server certificate for 127.0.0.1 of ``kind`` (one of IDENTITY_KINDS)."""
    os.makedirs(directory, exist_ok=True)
    generate, key_format = IDENTITY_KINDS[kind]
    ca, ca_key = _ca(f"nsq-tw {kind} test CA")
    issuer, issuer_key, chain = ca, ca_key, b""
    if kind in ("chain", "weak-intermediate"):
        key = rsa.generate_private_key(65537, 1024) if kind == "weak-intermediate" else None
        issuer, issuer_key = _leaf("nsq-tw intermediate CA", ca, ca_key, server=False, key=key, is_ca=True)
        chain = issuer.public_bytes(serialization.Encoding.PEM)
    leaf, key = _leaf("127.0.0.1", issuer, issuer_key, server=True, key=generate())
    j = lambda name: os.path.join(directory, name)  # noqa: E731
    with open(j(f"{kind}.pem"), "wb") as f:
        f.write(leaf.public_bytes(serialization.Encoding.PEM) + chain)
    with open(j(f"{kind}.key"), "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, key_format, serialization.NoEncryption()))
    return Identity(cert=j(f"{kind}.pem"), key=j(f"{kind}.key"), ca=_write(j(f"{kind}-ca.pem"), ca))
