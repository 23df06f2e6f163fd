"""Certificates for the TLS tests, generated on the fly (a CA, a server, clients)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
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


def _leaf(cn: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, server: bool):
    key = _key()
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
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
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
