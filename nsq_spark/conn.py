"""A blocking NSQ V2 connection for Spark's driver and executors.

Spark runs data source code in plain Python worker processes, where a thread
per connection is simpler than a reactor. This client negotiates like the
official libraries: IDENTIFY with feature negotiation, then TLS (``ssl``),
then snappy or deflate (:mod:`nsq_wire.compression`), then AUTH.

Writes are serialised by a lock (a consumer thread answers heartbeats while
the driver sends FIN/TOUCH); reads belong to one thread at a time.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
from dataclasses import dataclass
from typing import Any

from nsq_wire.commands import encode_command, encode_mpub
from nsq_wire.compression import DeflateCodec, SnappyCodec
from nsq_wire.frames import (
    CLOSE_WAIT,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
)

_FRAME = struct.Struct(">ii")
_MESSAGE = struct.Struct(">qH16s")
USER_AGENT = "nsq_spark/1.0"


class NSQError(Exception):
    """An error frame from nsqd (``E_INVALID ...``) or a broken exchange."""

    def __init__(self, text: str, address: str = "") -> None:
        super().__init__(f"{address}: {text}" if address else text)
        self.text = text
        self.code = text.split(" ", 1)[0]
        self.address = address


@dataclass
class TLSConfig:
    """What the ``tls*`` options ask for; the ssl context is built where it is used."""

    enabled: bool = False
    root_ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure_skip_verify: bool = False

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.root_ca_file or None)
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file or None)
        return ctx


@dataclass
class ConnectOptions:
    tls: TLSConfig
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | None = None
    msg_timeout_ms: int = 0  # 0: nsqd's --msg-timeout
    heartbeat_interval_ms: int = 0  # 0: nsqd's default
    connect_timeout: float = 5.0
    client_id: str = ""


@dataclass
class Message:
    id: bytes
    body: bytes
    timestamp: int  # ns since the epoch, as nsqd stamped it
    attempts: int


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid address {address!r}: want host:port")
    return host.strip("[]"), int(port)


class Connection:
    """One V2 connection: :meth:`open`, then publish or subscribe."""

    def __init__(self, address: str, options: ConnectOptions) -> None:
        self.address = address
        self.options = options
        self.sock: Any = None
        self.codec: SnappyCodec | DeflateCodec | None = None
        self.identify_response: dict[str, Any] = {}
        self.auth_response: dict[str, Any] | None = None
        self._buf = bytearray()
        self._wlock = threading.Lock()
        self.closed = False

    # -- setup -------------------------------------------------------------------

    def open(self) -> Connection:
        opts = self.options
        host, port = split_address(self.address)
        sock = socket.create_connection((host, port), timeout=opts.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        identify: dict[str, Any] = {
            "client_id": opts.client_id or socket.gethostname().split(".")[0],
            "hostname": socket.gethostname(),
            "user_agent": USER_AGENT,
            "feature_negotiation": True,
            "tls_v1": opts.tls.enabled,
            "snappy": opts.snappy,
            "deflate": opts.deflate,
            "deflate_level": opts.deflate_level,
        }
        if opts.msg_timeout_ms:
            identify["msg_timeout"] = opts.msg_timeout_ms
        if opts.heartbeat_interval_ms:
            identify["heartbeat_interval"] = opts.heartbeat_interval_ms
        sock.sendall(MAGIC_V2 + encode_command(b"IDENTIFY", body=json.dumps(identify).encode()))
        resp = self.read_response()
        info = json.loads(resp) if resp.startswith(b"{") else {}
        self.identify_response = info
        if opts.tls.enabled and not info.get("tls_v1"):
            raise NSQError("TLS was asked for but nsqd has no certificate (tls_v1 false)", self.address)
        if info.get("tls_v1"):
            rest = bytes(self._buf)
            if rest:
                raise NSQError("unexpected bytes before the TLS handshake", self.address)
            self.sock = opts.tls.context().wrap_socket(sock, server_hostname=host)
            self._expect_ok()
        if info.get("snappy"):
            self._set_codec(SnappyCodec())
        elif info.get("deflate"):
            self._set_codec(DeflateCodec(int(info.get("deflate_level", 6))))
        if info.get("auth_required"):
            if opts.auth_secret is None:
                raise NSQError("nsqd requires AUTH: set the authSecret option", self.address)
            self.send(encode_command(b"AUTH", body=opts.auth_secret.encode()))
            self.auth_response = json.loads(self.read_response())
        self.sock.settimeout(None)
        return self

    def _set_codec(self, codec: SnappyCodec | DeflateCodec) -> None:
        self.codec = codec
        rest = bytes(self._buf)
        self._buf = bytearray(b"".join(codec.decode(rest))) if rest else bytearray()
        self._expect_ok()

    def _expect_ok(self) -> None:
        resp = self.read_response()
        if resp != OK:
            raise NSQError(f"expected OK, got {resp[:100]!r}", self.address)

    # -- I/O ---------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        with self._wlock:
            if self.closed:
                raise NSQError("connection closed", self.address)
            if self.codec is not None:
                data = self.codec.encode(data)
            self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 18)
        if not chunk:
            raise NSQError("connection closed by nsqd", self.address)
        if self.codec is not None:
            for part in self.codec.decode(chunk):
                self._buf += part
        else:
            self._buf += chunk

    def read_frame(self) -> tuple[int, bytes]:
        buf = self._buf
        while True:
            if len(buf) >= 8:
                size, frame_type = _FRAME.unpack_from(buf)
                if len(buf) >= size + 4:
                    data = bytes(buf[8 : size + 4])
                    del buf[: size + 4]
                    return frame_type, data
            self._fill()
            buf = self._buf

    def read_frames(self) -> list[tuple[int, bytes]]:
        """Every complete frame buffered, after at least one (a consumer's bulk read)."""
        frames: list[tuple[int, bytes]] = []
        while not frames:
            buf = self._buf
            pos = 0
            end = len(buf)
            unpack = _FRAME.unpack_from
            while end - pos >= 8:
                size, frame_type = unpack(buf, pos)
                if end - pos - 4 < size:
                    break
                frames.append((frame_type, bytes(buf[pos + 8 : pos + 4 + size])))
                pos += 4 + size
            if pos:
                del buf[:pos]
            if not frames:
                self._fill()
        return frames

    def read_response(self) -> bytes:
        """The next response, answering heartbeats; an error frame raises."""
        while True:
            frame_type, data = self.read_frame()
            if frame_type == FRAME_TYPE_RESPONSE:
                if data == HEARTBEAT:
                    self.send(b"NOP\n")
                    continue
                return data
            if frame_type == FRAME_TYPE_ERROR:
                raise NSQError(data.decode("utf-8", "replace"), self.address)
            raise NSQError("a message arrived on a connection that is not subscribed", self.address)

    def close(self) -> None:
        with self._wlock:
            if self.closed:
                return
            self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    # -- publishing ----------------------------------------------------------------

    def publish(self, topic: str, batches: list[list[bytes]], window: int = 4) -> None:
        """MPUB each batch, keeping up to ``window`` in flight; all must be OK."""
        pending = 0
        for bodies in batches:
            self.send(encode_mpub(topic, bodies) if len(bodies) > 1 else encode_command(b"PUB", topic, body=bodies[0]))
            pending += 1
            if pending >= window:
                self._publish_ok()
                pending -= 1
        while pending:
            self._publish_ok()
            pending -= 1

    def _publish_ok(self) -> None:
        resp = self.read_response()
        if resp != OK:
            raise NSQError(f"unexpected answer to MPUB: {resp[:100]!r}", self.address)

    # -- consuming ---------------------------------------------------------------------

    def subscribe(self, topic: str, channel: str) -> None:
        self.send(encode_command(b"SUB", topic, channel))
        self._expect_ok()

    def rdy(self, count: int) -> None:
        self.send(b"RDY %d\n" % count)

    def fin(self, ids: list[bytes]) -> None:
        if ids:
            self.send(b"".join(b"FIN " + i + b"\n" for i in ids))

    def touch(self, ids: list[bytes]) -> None:
        if ids:
            self.send(b"".join(b"TOUCH " + i + b"\n" for i in ids))

    def req(self, msg_id: bytes, delay_ms: int = 0) -> None:
        self.send(b"REQ " + msg_id + b" %d\n" % delay_ms)


def decode_message(data: bytes) -> Message:
    timestamp, attempts, msg_id = _MESSAGE.unpack_from(data)
    return Message(msg_id, data[26:], timestamp, attempts)


__all__ = [
    "CLOSE_WAIT",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "HEARTBEAT",
    "ConnectOptions",
    "Connection",
    "Message",
    "NSQError",
    "TLSConfig",
    "decode_message",
    "split_address",
]
