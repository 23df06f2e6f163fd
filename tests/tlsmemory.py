"""A TLS session in memory, for tests and benchmarks of nsqd's TLS layer
(:mod:`nsqd_tw.tcp.tlslayer`): the transport under it and a pyOpenSSL client."""

from __future__ import annotations

from OpenSSL import SSL


class Wire:
    """The TCP transport under the layer: what the layer wrote."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def abortConnection(self) -> None:
        self.aborted = True

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def take(self) -> bytes:
        data, self.written = b"".join(self.written), []
        return data


def client_bytes(client: SSL.Connection) -> bytes:
    """Everything the client has to send."""
    out = []
    while True:
        try:
            out.append(client.bio_read(1 << 16))
        except SSL.WantReadError:
            return b"".join(out)


def decrypt(client: SSL.Connection, data: bytes) -> bytes:
    """What ``data`` from the server decrypts to, for the client."""
    if data:
        client.bio_write(data)
    out = []
    while True:
        try:
            out.append(client.recv(1 << 16))
        except SSL.WantReadError:
            return b"".join(out)
