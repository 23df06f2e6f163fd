"""nsqlookupd's V1 TCP protocol: how nsqd registers its topics and channels.

After the ``"  V1"`` magic, newline-terminated commands (trimmed, split on
spaces): ``PING``, ``IDENTIFY`` (then a 4-byte size and a JSON body),
``REGISTER topic [channel]``, ``UNREGISTER topic [channel]``. Every answer,
``OK``, the IDENTIFY JSON or an error text, is a 4-byte big-endian size and
the bytes (no frame type, unlike V2). Every error is fatal: the connection
is closed after it, and the peer's registrations are removed.
"""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING, Any

from twisted.internet import protocol
from twisted.python.failure import Failure

from lookupd_tw.registration_db import PeerInfo, Producer, Registration
from nsqd_tw.log import Logger
from nsqd_tw.options import VERSION, hostname
from nsqd_tw.wire import MAGIC_V1, FatalClientError, is_valid_channel_name, is_valid_topic_name

if TYPE_CHECKING:
    from lookupd_tw.nsqlookupd import NSQLookupd

_SIZE = struct.Struct(">i")
MAX_LINE = 16 * 1024
MAX_IDENTIFY_BODY = 1 << 20


def send_response(transport: Any, data: bytes) -> None:
    transport.write(_SIZE.pack(len(data)) + data)


class LookupProtocolV1(protocol.Protocol):
    log = Logger(namespace="lookupd_tw.protocol_v1")
    transport: Any

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.peer_info: PeerInfo | None = None
        self.remote_address = ""
        self._buf = b""
        self._magic = True
        self._closed = False
        self._identify_size: int | None = None
        self._in_identify = False

    def __str__(self) -> str:
        return self.remote_address

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        host = getattr(peer, "host", "")
        self.remote_address = f"[{host}]:{peer.port}" if ":" in host else f"{host}:{getattr(peer, 'port', '')}"
        self.log.info("TCP: new client({addr})", addr=self.remote_address)

    def dataReceived(self, data: bytes) -> None:
        if self._closed:
            return
        self._buf += data
        if self._magic:
            if len(self._buf) < 4:
                return
            magic, self._buf = self._buf[:4], self._buf[4:]
            self._magic = False
            self.log.info(
                "CLIENT({addr}): desired protocol magic '{magic}'",
                addr=self.remote_address,
                magic=magic.decode("latin-1"),
            )
            if magic != MAGIC_V1:
                self.log.error(
                    "client({addr}) bad protocol magic '{magic}'",
                    addr=self.remote_address,
                    magic=magic.decode("latin-1"),
                )
                send_response(self.transport, b"E_BAD_PROTOCOL")
                self._close()
                return
        try:
            self._process()
        except FatalClientError as e:
            self.log.error("[{client}] - {err}", client=self, err=e)
            send_response(self.transport, e.wire())
            self._close()
        except Exception:
            self.log.failure("[{client}] - internal error", client=self)
            self._close()

    def _process(self) -> None:
        while not self._closed:
            if self._in_identify:
                if self._identify_size is None:
                    if len(self._buf) < 4:
                        return
                    (size,) = _SIZE.unpack_from(self._buf)
                    self._buf = self._buf[4:]
                    if size < 0 or size > MAX_IDENTIFY_BODY:
                        raise FatalClientError("E_BAD_BODY", "IDENTIFY failed to read body")
                    self._identify_size = size
                if len(self._buf) < self._identify_size:
                    return
                body = self._buf[: self._identify_size]
                self._buf = self._buf[self._identify_size :]
                self._identify_size = None
                self._in_identify = False
                send_response(self.transport, self.IDENTIFY(body))
                continue
            idx = self._buf.find(b"\n")
            if idx < 0:
                if len(self._buf) > MAX_LINE:
                    raise FatalClientError("E_INVALID", "line too long")
                return
            line, self._buf = self._buf[:idx], self._buf[idx + 1 :]
            params = line.decode("utf-8", "surrogateescape").strip().split(" ")
            name = params[0]
            if name == "PING":
                send_response(self.transport, self.PING())
            elif name == "IDENTIFY":
                if self.peer_info is not None:
                    raise FatalClientError("E_INVALID", "cannot IDENTIFY again")
                self._in_identify = True
            elif name == "REGISTER":
                send_response(self.transport, self.REGISTER(params[1:]))
            elif name == "UNREGISTER":
                send_response(self.transport, self.UNREGISTER(params[1:]))
            else:
                raise FatalClientError("E_INVALID", f"invalid command {name}")

    # -- commands ----------------------------------------------------------------

    def PING(self) -> bytes:
        if self.peer_info is not None:
            now = self.lookupd.now()
            self.log.info(
                "CLIENT({id}): pinged (last ping {ago:.3f}s)",
                id=self.peer_info.id,
                ago=now - self.peer_info.last_update,
            )
            self.peer_info.last_update = now
        return b"OK"

    def IDENTIFY(self, body: bytes) -> bytes:
        try:
            data = json.loads(body)
            if not isinstance(data, dict):
                raise ValueError("not an object")
            info = PeerInfo(
                id=self.remote_address,
                remote_address=self.remote_address,
                hostname=_str(data, "hostname"),
                broadcast_address=_str(data, "broadcast_address"),
                tcp_port=_int(data, "tcp_port"),
                http_port=_int(data, "http_port"),
                version=_str(data, "version"),
            )
        except (ValueError, TypeError):
            raise FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        if not info.broadcast_address or not info.tcp_port or not info.http_port or not info.version:
            raise FatalClientError("E_BAD_BODY", "IDENTIFY missing fields")
        info.last_update = self.lookupd.now()
        self.log.info(
            "CLIENT({client}): IDENTIFY Address:{addr} TCP:{tcp} HTTP:{http} Version:{version}",
            client=self,
            addr=info.broadcast_address,
            tcp=info.tcp_port,
            http=info.http_port,
            version=info.version,
        )
        self.peer_info = info
        if self.lookupd.db.add_producer(Registration("client", "", ""), Producer(info)):
            self._logdb("REGISTER", "client", "", "")
        lookupd = self.lookupd
        response = {
            "broadcast_address": lookupd.opts.broadcast_address,
            "hostname": hostname(),
            "http_port": lookupd.http_address[1] if lookupd.http_address else 0,
            "tcp_port": lookupd.tcp_address[1] if lookupd.tcp_address else 0,
            "version": VERSION,
        }
        return json.dumps(response, separators=(",", ":")).encode()

    def _topic_channel(self, verb: str, params: list[str]) -> tuple[str, str]:
        if not params:
            raise FatalClientError("E_INVALID", f"{verb} insufficient number of params")
        topic = params[0]
        channel = params[1] if len(params) >= 2 else ""
        if not is_valid_topic_name(topic):
            raise FatalClientError("E_BAD_TOPIC", f"{verb} topic name '{topic}' is not valid")
        if channel and not is_valid_channel_name(channel):
            raise FatalClientError("E_BAD_CHANNEL", f"{verb} channel name '{channel}' is not valid")
        return topic, channel

    def REGISTER(self, params: list[str]) -> bytes:
        if self.peer_info is None:
            raise FatalClientError("E_INVALID", "client must IDENTIFY")
        topic, channel = self._topic_channel("REGISTER", params)
        db = self.lookupd.db
        if channel and db.add_producer(Registration("channel", topic, channel), Producer(self.peer_info)):
            self._logdb("REGISTER", "channel", topic, channel)
        if db.add_producer(Registration("topic", topic, ""), Producer(self.peer_info)):
            self._logdb("REGISTER", "topic", topic, "")
        return b"OK"

    def UNREGISTER(self, params: list[str]) -> bytes:
        if self.peer_info is None:
            raise FatalClientError("E_INVALID", "client must IDENTIFY")
        topic, channel = self._topic_channel("UNREGISTER", params)
        db = self.lookupd.db
        peer_id = self.peer_info.id
        if channel:
            key = Registration("channel", topic, channel)
            removed, left = db.remove_producer(key, peer_id)
            if removed:
                self._logdb("UNREGISTER", "channel", topic, channel)
            if left == 0 and channel.endswith("#ephemeral"):
                db.remove_registration(key)
        else:
            # a topic unregistration takes its channels with it
            for r in db.find_registrations("channel", topic, "*"):
                removed, _ = db.remove_producer(r, peer_id)
                if removed:
                    self.log.warn(
                        "client({client}) unexpected UNREGISTER category:channel key:{key} subkey:{subkey}",
                        client=self,
                        key=topic,
                        subkey=r.subkey,
                    )
            key = Registration("topic", topic, "")
            removed, left = db.remove_producer(key, peer_id)
            if removed:
                self._logdb("UNREGISTER", "topic", topic, "")
            if left == 0 and topic.endswith("#ephemeral"):
                db.remove_registration(key)
        return b"OK"

    def _logdb(self, what: str, category: str, key: str, subkey: str) -> None:
        self.log.info(
            "DB: client({client}) {what} category:{category} key:{key} subkey:{subkey}",
            client=self,
            what=what,
            category=category,
            key=key,
            subkey=subkey,
        )

    # -- connection end ----------------------------------------------------------------

    def _close(self) -> None:
        self._closed = True
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._closed = True
        self.log.info("PROTOCOL(V1): [{client}] exiting ioloop", client=self)
        if self.peer_info is not None:
            db = self.lookupd.db
            for r in db.lookup_registrations(self.peer_info.id):
                removed, _ = db.remove_producer(r, self.peer_info.id)
                if removed:
                    self._logdb("UNREGISTER", r.category, r.key, r.subkey)


def _str(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(key)
    return value


def _int(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(key)
    return value


class LookupFactory(protocol.ServerFactory):
    noisy = False

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd

    def buildProtocol(self, addr: Any) -> LookupProtocolV1:
        p = LookupProtocolV1(self.lookupd)
        p.factory = self
        return p
