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
import re
import struct
from typing import TYPE_CHECKING, Any

from twisted.internet import protocol
from twisted.internet.interfaces import IPushProducer
from twisted.python.failure import Failure
from zope.interface import implementer

from lookupd_tw.registration_db import PeerInfo, Producer, Registration
from nsq_service.options import hostname
from nsq_wire.errors import FatalClientError
from nsq_wire.gofmt import join_host_port
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name
from nsq_wire.v1 import MAGIC_V1, pack_response
from nsq_wire.version import VERSION

if TYPE_CHECKING:
    from lookupd_tw.nsqlookupd import NSQLookupd

_SIZE = struct.Struct(">i")
MAX_LINE = 16 * 1024
MAX_IDENTIFY_BODY = 1 << 20
COMMANDS_PER_TURN = 128  # per connection and reactor turn


# what Go's strings.TrimSpace trims (unicode.IsSpace); str.strip() would also trim \x1c-\x1f
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


class V1Parser:
    """The V1 stream after the magic, as commands; no I/O.

    :meth:`feed` bytes, then :meth:`next` until it returns None: a command line
    split into its parameters, or (after :meth:`expect_body`) an IDENTIFY body.
    The work is linear in the bytes fed: the newline search never looks at a
    byte twice, and consumed bytes are dropped only once they are at least as
    many as the bytes kept, so each byte is moved at most once on average.
    ``work`` counts the bytes searched and moved.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # the first byte not consumed
        self._scan = 0  # where the newline search goes on
        self._want_body = False
        self._body_size: int | None = None
        self.work = 0

    def feed(self, data: bytes) -> None:
        buf = self._buf
        pos = self._pos
        if pos and pos * 2 >= len(buf):
            self.work += len(buf) - pos
            del buf[:pos]
            self._scan -= pos
            self._pos = 0
        buf += data

    def expect_body(self) -> None:
        """The next item is an IDENTIFY body: a 4-byte size, then that many bytes."""
        self._want_body = True

    def next(self) -> list[str] | bytes | None:
        buf = self._buf
        pos = self._pos
        if self._want_body:
            if self._body_size is None:
                if len(buf) - pos < 4:
                    return None
                (size,) = _SIZE.unpack_from(buf, pos)
                pos = self._pos = self._scan = pos + 4
                if size < 0 or size > MAX_IDENTIFY_BODY:
                    raise FatalClientError("E_BAD_BODY", "IDENTIFY failed to read body")
                self._body_size = size
            end = pos + self._body_size
            if len(buf) < end:
                return None
            self._pos = self._scan = end
            self._want_body = False
            self._body_size = None
            return bytes(buf[pos:end])
        start = self._scan
        idx = buf.find(b"\n", start)
        if idx < 0:
            self.work += len(buf) - start
            self._scan = len(buf)
            if len(buf) - pos > MAX_LINE:
                raise FatalClientError("E_INVALID", "line too long")
            return None
        self.work += idx + 1 - start
        self._pos = self._scan = idx + 1
        return buf[pos:idx].decode("utf-8", "surrogateescape").strip(GO_SPACE).split(" ")


@implementer(IPushProducer)
class LookupProtocolV1(protocol.Protocol):
    """One peer's V1 connection.

    Commands are handled at most ``COMMANDS_PER_TURN`` at a time: past that,
    reading stops and the rest waits for the next reactor turn, so a peer
    pipelining commands cannot hold the reactor. The connection is its
    transport's streaming producer: when the answers the peer has not read
    fill the transport's buffer (``bufferSize``), reading stops until they
    are sent, so a peer that never reads costs a bounded amount of memory.
    """

    transport: Any

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.log = lookupd.log_gate.logger("lookupd_tw.protocol_v1", self)
        self.peer_info: PeerInfo | None = None
        self.remote_address = ""
        self._magic = b""
        self._parser: V1Parser | None = None
        self._closed = False
        self._out: list[bytes] = []  # answers of the current batch, written together
        self._write_paused = False  # the transport holds more unsent answers than its bufferSize
        self._next_turn: Any = None  # the delayed call that handles the next batch of commands
        self._reading = True
        self._registered = False

    def __str__(self) -> str:
        return self.remote_address

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        host = getattr(peer, "host", "")
        self.remote_address = join_host_port(host, getattr(peer, "port", ""))
        self.log.info("TCP: new client({addr})", addr=self.remote_address)
        self.transport.registerProducer(self, True)
        self._registered = True

    def dataReceived(self, data: bytes) -> None:
        if self._closed:
            return
        if self._parser is None:
            self._magic += data
            if len(self._magic) < 4:
                return
            magic, data = self._magic[:4], self._magic[4:]
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
                self._out.append(pack_response(b"E_BAD_PROTOCOL"))
                self._close()
                return
            self._parser = V1Parser()
        self._parser.feed(data)
        if self._next_turn is None:
            self._run()

    # -- IPushProducer: the transport's view of us ---------------------------------

    def pauseProducing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resumeProducing(self) -> None:
        self._write_paused = False
        self._schedule()

    def stopProducing(self) -> None:
        pass

    # -- batches of commands ---------------------------------------------------------

    def _schedule(self) -> None:
        if self._next_turn is None and not self._closed:
            self._next_turn = self.lookupd.reactor.callLater(0, self._run)
        self._update_reading()

    def _update_reading(self) -> None:
        """Read while no commands wait for a turn and the peer reads its answers."""
        if self._closed:
            return
        want = not (self._write_paused or self._next_turn is not None)
        if want != self._reading:
            self._reading = want
            if want:
                self.transport.resumeProducing()
            else:
                self.transport.pauseProducing()

    def _run(self) -> None:
        """Handle the commands received, ``COMMANDS_PER_TURN`` at most."""
        self._next_turn = None
        parser = self._parser
        if parser is None:  # the magic has not come yet
            return
        try:
            budget = COMMANDS_PER_TURN
            while not self._closed and not self._write_paused:
                if not budget:
                    self._schedule()
                    break
                cmd = parser.next()
                if cmd is None:
                    break
                budget -= 1
                if isinstance(cmd, bytes):
                    self._out.append(pack_response(self.IDENTIFY(cmd)))
                else:
                    self._exec(cmd)
        except FatalClientError as e:
            self.log.error("[{client}] - {err}", client=self, err=e)
            self._out.append(pack_response(e.wire()))
            self._close()
            return
        except Exception:
            self.log.failure("[{client}] - internal error", client=self)
            self._close()
            return
        self._flush()
        self._update_reading()

    def _exec(self, params: list[str]) -> None:
        name = params[0]
        if name == "PING":
            self._out.append(pack_response(self.PING()))
        elif name == "IDENTIFY":
            if self.peer_info is not None:
                raise FatalClientError("E_INVALID", "cannot IDENTIFY again")
            assert self._parser is not None
            self._parser.expect_body()
        elif name == "REGISTER":
            self._out.append(pack_response(self.REGISTER(params[1:])))
        elif name == "UNREGISTER":
            self._out.append(pack_response(self.UNREGISTER(params[1:])))
        else:
            raise FatalClientError("E_INVALID", f"invalid command {name}")

    def _flush(self) -> None:
        if self._out:
            out, self._out = self._out, []
            self.transport.writeSequence(out)

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
        fields = decode_peer_info(body)
        info = PeerInfo(
            id=self.remote_address,
            remote_address=self.remote_address,
            hostname=fields["hostname"],
            broadcast_address=fields["broadcast_address"],
            tcp_port=fields["tcp_port"],
            http_port=fields["http_port"],
            version=fields["version"],
        )
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
        """Send what is pending, then close."""
        self._flush()
        self._closed = True
        self._cancel_turn()
        if self._registered:
            # a registered producer would keep a paused transport from closing
            self._registered = False
            self.transport.unregisterProducer()
        self.transport.loseConnection()

    def _cancel_turn(self) -> None:
        if self._next_turn is not None:
            if self._next_turn.active():
                self._next_turn.cancel()
            self._next_turn = None

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._closed = True
        self._registered = False
        self._cancel_turn()
        self.log.info("PROTOCOL(V1): [{client}] exiting ioloop", client=self)
        if self.peer_info is not None:
            self.lookupd.remove_peer(self.peer_info, lambda r: self._logdb("UNREGISTER", r.category, r.key, r.subkey))


# PeerInfo's JSON fields as Go decodes IDENTIFY: name -> is it a string (else an int)
_PEER_FIELDS = {
    "remote_address": True,
    "hostname": True,
    "broadcast_address": True,
    "tcp_port": False,
    "http_port": False,
    "version": True,
}
_INT64 = range(-(1 << 63), 1 << 63)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _Object(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs in order, duplicates kept."""


class _BigInt:
    """An integer literal too long for any int64 (kept out of int(), which limits digits)."""


def _parse_int(text: str) -> int | _BigInt:
    return int(text) if len(text) <= 20 else _BigInt()


def _no_constant(name: str) -> None:
    raise ValueError(f"invalid character in JSON: {name}")


def _fold(key: str) -> str:
    """Go's encoding/json key folding (simple case folding), for ASCII field names."""
    out = []
    for c in key:
        if c < "\x80":
            out.append(c.upper())
        elif c == "\u0130":  # İ: Go folds it to I
            out.append("I")
        else:
            lower = c.lower()
            upper = lower.upper() if len(lower) == 1 else c
            out.append(upper if len(upper) == 1 else c)
    return "".join(out)


_FOLDED = {_fold(name): name for name in _PEER_FIELDS}


def decode_peer_info(body: bytes) -> dict[str, Any]:
    """IDENTIFY's JSON body as Go's json.Unmarshal fills a PeerInfo.

    Keys match field names case-insensitively and later ones win; null leaves a
    field as it is; a value of the wrong type, an int outside int64, NaN or
    Infinity is an error; invalid UTF-8 and lone surrogates in strings become
    U+FFFD. Go ignores unknown keys nested up to 10,000 levels deep; Python's
    parser stops near 1,000, so a body nested deeper is refused here.
    """
    fields: dict[str, Any] = {name: "" if is_str else 0 for name, is_str in _PEER_FIELDS.items()}

    def assign(pairs: _Object) -> None:
        for key, value in pairs:
            name = key if key in _PEER_FIELDS else _FOLDED.get(_fold(key))
            if name is None or value is None:
                continue
            if _PEER_FIELDS[name]:
                if not isinstance(value, str):
                    raise ValueError(f"cannot unmarshal into string field {name}")
                fields[name] = _LONE_SURROGATE.sub("\ufffd", value)
            else:
                if not isinstance(value, int) or isinstance(value, bool) or value not in _INT64:
                    raise ValueError(f"cannot unmarshal into int field {name}")
                fields[name] = value

    try:
        data = json.loads(
            body.decode("utf-8", "replace"),
            object_pairs_hook=_Object,
            parse_int=_parse_int,
            parse_constant=_no_constant,
        )
        if data is not None:
            if not isinstance(data, _Object):
                raise ValueError("not an object")
            assign(data)
    except (ValueError, RecursionError):
        raise FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
    return fields


class LookupFactory(protocol.ServerFactory):
    noisy = False

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd

    def buildProtocol(self, addr: Any) -> LookupProtocolV1:
        p = LookupProtocolV1(self.lookupd)
        p.factory = self
        return p
