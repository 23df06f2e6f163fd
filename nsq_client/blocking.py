"""A blocking NSQ V2 connection, without Twisted (Spark's driver and executors use it).

Spark runs data source code in plain Python worker processes, where a thread
per connection is simpler than a reactor. This client negotiates like the
official libraries: IDENTIFY with feature negotiation, then TLS (``ssl``),
then snappy or deflate (:mod:`nsq_wire.compression`), then AUTH.

Writes are serialised by a lock (a consumer thread answers heartbeats while
the driver sends FIN/TOUCH); reads belong to one thread at a time.
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any

from nsq_wire import commands
from nsq_wire.compression import DeflateCodec, SnappyCodec
from nsq_wire.errors import NSQError
from nsq_wire.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, HEARTBEAT, MAGIC_V2, OK, FrameReader

USER_AGENT = "nsq_spark/1.0"


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
        self._reader = FrameReader()
        self._wlock = threading.Lock()
        self.closed = False

    # -- setup -------------------------------------------------------------------

    def open(self) -> Connection:
        opts = self.options
        host, port = split_address(self.address)
        sock = socket.create_connection((host, port), timeout=opts.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        identify = {
            **commands.identify_defaults(USER_AGENT, opts.client_id),
            "tls_v1": opts.tls.enabled,
            "snappy": opts.snappy,
            "deflate": opts.deflate,
            "deflate_level": opts.deflate_level,
        }
        if opts.msg_timeout_ms:
            identify["msg_timeout"] = opts.msg_timeout_ms
        if opts.heartbeat_interval_ms:
            identify["heartbeat_interval"] = opts.heartbeat_interval_ms
        sock.sendall(MAGIC_V2 + commands.identify(identify))
        resp = self.read_response()
        info = json.loads(resp) if resp.startswith(b"{") else {}
        self.identify_response = info
        if opts.tls.enabled and not info.get("tls_v1"):
            raise NSQError("TLS was asked for but nsqd has no certificate (tls_v1 false)", self.address)
        if info.get("tls_v1"):
            if self._reader.rest():
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
            self.send(commands.auth(opts.auth_secret.encode()))
            self.auth_response = json.loads(self.read_response())
        self.sock.settimeout(None)
        return self

    def _set_codec(self, codec: SnappyCodec | DeflateCodec) -> None:
        self.codec = codec
        rest = self._reader.rest()
        if rest:
            self._reader.feed(b"".join(codec.decode(rest)))
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
            chunk = b"".join(self.codec.decode(chunk))
        self._reader.feed(chunk)

    def read_frame(self) -> tuple[int, bytes]:
        while (frame := self._reader.next()) is None:
            self._fill()
        return frame

    def read_frames(self) -> list[tuple[int, bytes]]:
        """Every complete frame buffered, after at least one (a consumer's bulk read)."""
        while not (frames := self._reader.frames()):
            self._fill()
        return frames

    def poll_frames(self, timeout: float) -> list[tuple[int, bytes]]:
        """The complete frames buffered, else those one read brings if the
        socket becomes readable within ``timeout`` (possibly none). The socket
        stays blocking, so writes from another thread never time out."""
        frames = self._reader.frames()
        if frames:
            return frames
        pending = getattr(self.sock, "pending", None)  # TLS: bytes decrypted, not read yet
        if not (pending is not None and pending()):
            readable, _, _ = select.select([self.sock], [], [], timeout)
            if not readable:
                return []
        self._fill()
        return self._reader.frames()

    def read_response(self) -> bytes:
        """The next response, answering heartbeats; an error frame raises."""
        while True:
            frame_type, data = self.read_frame()
            if frame_type == FRAME_TYPE_RESPONSE:
                if data == HEARTBEAT:
                    self.send(commands.NOP)
                    continue
                return data
            if frame_type == FRAME_TYPE_ERROR:
                raise NSQError.from_frame(data, self.address)
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
            self.send(commands.mpub(topic, bodies) if len(bodies) > 1 else commands.pub(topic, bodies[0]))
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
        self.send(commands.sub(topic, channel))
        self._expect_ok()

    def rdy(self, count: int) -> None:
        self.send(commands.rdy(count))

    def fin(self, ids: list[bytes]) -> None:
        if ids:
            self.send(b"".join(map(commands.fin, ids)))

    def touch(self, ids: list[bytes]) -> None:
        if ids:
            self.send(b"".join(map(commands.touch, ids)))

    def req(self, msg_id: bytes, delay_ms: int = 0) -> None:
        self.send(commands.req(msg_id, delay_ms))
