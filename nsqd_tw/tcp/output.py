"""What goes out to one client: buffered frames, heartbeats, and backpressure.

Frames are buffered and written once per reactor turn (the server schedules the
flush), or at once when the negotiated output buffer size fills: Go's buffered
writer. Once a stream codec is negotiated every write goes through it, then
through TLS once that is up (:mod:`nsqd_tw.tcp.tlslayer`); during a TLS
handshake writes are held.

The output is also the transport's producer: the transport pauses it when more
than :data:`UNSENT_LIMIT` bytes wait unsent (the client does not read) and
resumes it once they have drained. Backed up, the client gets no more messages
and its commands are not read; backed up for a whole heartbeat interval (Go's
write deadline) it is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import LoopingCall
from zope.interface import implementer

from nsq_service.listen import write_now, write_pieces_now
from nsq_wire.compression import DeflateCodec, SnappyCodec
from nsq_wire.frames import FRAME_TYPE_RESPONSE, HEARTBEAT, pack_frame

if TYPE_CHECKING:
    from nsqd_tw.tcp.tlslayer import TLSLayer

UNSENT_LIMIT = 1 << 20


def cancel(call: Any) -> None:
    """Cancel a pending DelayedCall (None, or one already run, is fine)."""
    if call is not None and call.active():
        call.cancel()


class Receiver(Protocol):
    """What the output needs of its client (a ClientV2)."""

    output_buffer_size: int
    heartbeat_interval: float
    blocked: bool


class Watcher(Protocol):
    """What the output tells its connection: backed up, drained, dropped."""

    def backed_up(self) -> None: ...
    def drained(self) -> None: ...
    def write_timed_out(self) -> None: ...


@implementer(IPushProducer)
class Output:
    def __init__(
        self,
        transport: Any,
        client: Receiver,
        reactor: Any,
        want_flush: Callable[[Output], None],
        watcher: Watcher,
    ) -> None:
        self.transport = transport
        self.client = client
        self.reactor = reactor
        self._want_flush = want_flush
        self.watcher = watcher
        self.codec: SnappyCodec | DeflateCodec | None = None
        self.tls: TLSLayer | None = None
        self.held = False  # during a TLS handshake
        # frames to go out ahead of the next flush, in the same write, without
        # the codec (the TLS OK before the compressed OK: one TLS record)
        self._clear = b""
        self.backed_up = False
        self._buf: list[bytes] = []
        self._len = 0
        self._flush_pending = False
        self._heartbeat: LoopingCall | None = None
        self._deadline: Any = None
        self.closed = False

    def start(self) -> None:
        """Register with the transport to hear when it is backed up."""
        if hasattr(self.transport, "bufferSize"):
            self.transport.bufferSize = UNSENT_LIMIT
        self.transport.registerProducer(self, True)

    # -- frames ---------------------------------------------------------------

    def frame(self, frame_type: int, data: bytes) -> None:
        """Buffer a frame; it goes out at the end of this reactor turn."""
        frame = pack_frame(frame_type, data)
        self._buf.append(frame)
        self._len += len(frame)
        if not self._flush_pending:
            self._flush_pending = True
            self._want_flush(self)

    def message(self, frame: bytes) -> None:
        """Buffer a message frame; a full output buffer goes out at once."""
        self._buf.append(frame)
        self._len += len(frame)
        if self._len >= self.client.output_buffer_size:
            self.flush()
        elif not self._flush_pending:
            self._flush_pending = True
            self._want_flush(self)

    def first(self, frame_type: int, data: bytes) -> None:
        """A frame that goes before everything buffered (the OK that ends a TLS
        handshake goes before the heartbeats held meanwhile, as Go's write lock orders them)."""
        frame = pack_frame(frame_type, data)
        self._buf.insert(0, frame)
        self._len += len(frame)

    def before_codec(self) -> None:
        """What is buffered goes out as it is, ahead of the frames that follow
        and in the same write, when a codec is set after it (the OK ending a TLS
        handshake and the compressed OK leave in one TLS record)."""
        self._clear += b"".join(self._buf)
        self._buf = []
        self._len = 0

    def flush(self) -> None:
        """What is buffered, onto the wire now (:func:`~nsq_service.listen.write_pieces_now`):
        at the end of the turn, or when the output buffer is full (Go's bufio.Writer)."""
        self._flush_pending = False
        if self._buf and not self.held:
            if self.codec is None and self.tls is None:
                buf = self._buf
                self._buf = []
                write_pieces_now(self.transport, buf)
            else:
                data = self._encode()
                self._buf = []
                write_now(self.transport, data)
            self._len = 0

    def _encode(self) -> bytes | memoryview:
        """The buffered frames through the codec and TLS."""
        data = b"".join(self._buf)
        if self.codec is not None:
            data = self.codec.encode(data)
        if self._clear:
            data = self._clear + data
            self._clear = b""
        if self.tls is not None:
            return self.tls.encrypt_view(data)  # good until the next flush: write_now sends it now
        return data

    def discard(self) -> None:
        self._buf = []
        self._len = 0
        self._clear = b""

    # -- heartbeats -----------------------------------------------------------

    def heartbeat(self, interval: float) -> None:
        """Send ``_heartbeat_`` every ``interval`` seconds (0: never)."""
        if self._heartbeat is not None:
            if self._heartbeat.running:
                self._heartbeat.stop()
            self._heartbeat = None
        if interval > 0 and not self.closed:
            self._heartbeat = LoopingCall(self.frame, FRAME_TYPE_RESPONSE, HEARTBEAT)
            self._heartbeat.clock = self.reactor
            self._heartbeat.start(interval, now=False)

    # -- the transport's producer -----------------------------------------------

    def pauseProducing(self) -> None:
        if self.backed_up or self.closed:
            return
        self.backed_up = True
        self.client.blocked = True
        self.watcher.backed_up()
        interval = self.client.heartbeat_interval
        if interval > 0:
            self._deadline = self.reactor.callLater(interval, self._timed_out)

    def resumeProducing(self) -> None:
        if not self.backed_up:
            return
        self.backed_up = False
        self.client.blocked = False
        cancel(self._deadline)
        self._deadline = None
        if not self.closed:
            self.watcher.drained()

    def stopProducing(self) -> None:
        pass

    def _timed_out(self) -> None:
        self._deadline = None
        self.watcher.write_timed_out()

    def close(self) -> None:
        """Stop the heartbeats and the write deadline; nothing more goes out.
        The transport is let go (a TLS transport holds its producer, this output,
        in a cycle that would keep both in garbage)."""
        self.closed = True
        self.heartbeat(0)
        cancel(self._deadline)
        self._deadline = None
        self.discard()
        self.transport = None
