"""nsqd starts with every certificate and key Go's crypto/tls loads, and serves TLS with it.

Go loads any chain and key it can parse: RSA of any size, ECDSA, Ed25519, in PKCS#1,
PKCS#8 or SEC1 files, a chain file (leaf then intermediates) served whole. OpenSSL's
default security level refuses a 1024-bit RSA key at load; nsqd lowers the level as
far as the files need, says so in one WARNING, and keeps its ciphers and lowest TLS
version. Each kind: the ``nsqd`` command starts, and a client (Python's ssl, TLS 1.2
as clients force, verifying against the test root) upgrades after IDENTIFY and gets OK.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import struct

from twisted.trial import unittest

from nsq_wire.commands import encode_command
from tests.certs import Identity, make_identity
from tests.integration.procs import ServerProcess

LOOPBACK = ("-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0", "-https-address", "127.0.0.1:0")
OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


def read_frame(s: socket.socket | ssl.SSLSocket) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    return data


def client_context(identity: Identity, version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(identity.ca)
    ctx.minimum_version = ctx.maximum_version = version
    # the client's own library must take the weak key too (its test setup made it)
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    return ctx


def upgrade(port: int, ctx: ssl.SSLContext) -> tuple[dict, bytes, ssl.SSLSocket]:
    """IDENTIFY with tls_v1, the handshake: the answer, the OK over TLS, the socket."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(10)
    s.sendall(b"  V2" + encode_command(b"IDENTIFY", body=b'{"feature_negotiation":true,"tls_v1":true}'))
    answer = json.loads(read_frame(s)[8:])
    t = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    return answer, read_frame(t), t


class KeyKindTests(unittest.TestCase):
    timeout = 60

    def start(self, kind: str) -> tuple[ServerProcess, Identity]:
        path = os.path.abspath(self.mktemp())
        identity = make_identity(os.path.join(path, "certs"), kind)
        proc = ServerProcess(
            "nsqd", *LOOPBACK, "--data-path", path, "--tls-cert", identity.cert, "--tls-key", identity.key
        ).start()
        self.addCleanup(proc.kill)
        return proc, identity

    def assert_serves(self, kind: str) -> tuple[ServerProcess, Identity]:
        proc, identity = self.start(kind)
        answer, ok, t = upgrade(proc.port(), client_context(identity))
        with t:
            self.assertTrue(answer["tls_v1"])
            self.assertEqual(ok, OK_FRAME)
            self.assertEqual(t.version(), "TLSv1.2")
            t.sendall(encode_command(b"PUB", "t", body=b"over TLS"))
            self.assertEqual(read_frame(t), OK_FRAME)
        return proc, identity

    def warnings(self, proc: ServerProcess) -> list[str]:
        return [line for line in proc.lines if " WARNING: " in line]

    def test_rsa_1024_pkcs1(self) -> None:
        proc, identity = self.assert_serves("rsa1024-pkcs1")
        self.assertEqual(
            [line.split(" WARNING: ", 1)[1] for line in self.warnings(proc)],
            [
                f"TLS: --tls-cert {identity.cert}: its key is a 1024-bit RSA key (ee key too small at "
                "OpenSSL's default security level): using security level 1, as Go's crypto/tls loads it"
            ],
        )

    def test_rsa_512_pkcs1_keeps_tls_1_2_the_lowest_version(self) -> None:
        proc, identity = self.assert_serves("rsa512-pkcs1")
        (warning,) = self.warnings(proc)
        self.assertIn("a 512-bit RSA key", warning)
        self.assertIn("using security level 0", warning)
        with self.assertRaises(ssl.SSLError):
            upgrade(proc.port(), client_context(identity, ssl.TLSVersion.TLSv1_1))

    def test_rsa_2048_pkcs8(self) -> None:
        proc, _ = self.assert_serves("rsa2048-pkcs8")
        self.assertEqual(self.warnings(proc), [])

    def test_ec_p256_sec1(self) -> None:
        proc, _ = self.assert_serves("ec-p256-sec1")
        self.assertEqual(self.warnings(proc), [])

    def test_ec_p384_pkcs8(self) -> None:
        proc, _ = self.assert_serves("ec-p384-pkcs8")
        self.assertEqual(self.warnings(proc), [])

    def test_ed25519_pkcs8(self) -> None:
        proc, _ = self.assert_serves("ed25519-pkcs8")
        self.assertEqual(self.warnings(proc), [])

    def test_a_chain_file_is_served_whole(self) -> None:
        # the client trusts the root only: it verifies the leaf through the intermediate
        proc, _ = self.assert_serves("chain")
        self.assertEqual(self.warnings(proc), [])


class EncryptedKeyTests(unittest.TestCase):
    timeout = 60

    def test_an_encrypted_key_is_refused_at_once_even_at_a_terminal(self) -> None:
        """Go's crypto/tls reads no encrypted key; OpenSSL would ask for its passphrase on
        the controlling terminal and wait. nsqd, started on a terminal, refuses it."""
        import pty
        import select
        import subprocess
        import time

        from cryptography.hazmat.primitives import serialization

        from tests.integration.procs import command

        path = os.path.abspath(self.mktemp())
        identity = make_identity(os.path.join(path, "certs"), "rsa2048-pkcs8")
        with open(identity.key, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), None)
        encrypted = os.path.join(path, "encrypted.key")
        with open(encrypted, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.BestAvailableEncryption(b"secret"),
                )
            )
        master, slave = pty.openpty()
        slave_name = os.ttyname(slave)

        def controlling_terminal() -> None:
            os.setsid()
            os.close(os.open(slave_name, os.O_RDWR))  # the first tty opened by a session leader: its terminal

        proc = subprocess.Popen(
            [*command("nsqd"), *LOOPBACK, "--data-path", path, "--tls-cert", identity.cert, "--tls-key", encrypted],
            stdin=slave,
            stdout=slave,
            stderr=subprocess.PIPE,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        self.addCleanup(os.close, master)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        deadline = time.monotonic() + 30
        seen = b""
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(master, 1024)
                except OSError:
                    break
            if b"pass phrase" in seen:
                break
        self.assertNotIn(b"pass phrase", seen, "asked for a passphrase on the terminal")
        self.assertEqual(proc.wait(30), 1)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        self.assertIn(
            f"FATAL: failed to instantiate nsqd - failed to build TLS config - --tls-key {encrypted} is encrypted "
            "with a passphrase (not supported)",
            err,
        )
