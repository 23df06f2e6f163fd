"""TLS on a V2 connection: a stream layer of the connection, as snappy and deflate are.

After IDENTIFY negotiates ``tls_v1``, the connection encrypts and decrypts in
itself, with pyOpenSSL over memory BIOs, instead of handing its transport to
Twisted's ``startTLS``. What that changes, for a consumer's throughput:

- Everything one read of the socket brought reaches the parser as one piece.
  Twisted's TLS layer delivers one TLS record at a time, and a consumer sends
  its FINs per record it read (16 KiB, ~70 messages of 200 bytes): each piece
  was a round of FIN handling, dispatch and flush of its own.
- A flush is encrypted when nsqd flushes and goes to the socket from there
  (:func:`nsq_service.listen.write_now`, as without TLS). Twisted's TLS
  transport gathers the writes of a turn and encrypts them a turn later, and the
  socket was written a turn after that.
- The output is the TCP transport's producer itself, as without TLS.

On the wire nothing changes: the same handshake, records and alerts (a failed
handshake still sends its alert; closing sends ``close_notify``, as Go's
``tls.Conn.Close``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from OpenSSL import SSL

# the most a recv takes from the session at once (a record holds at most 16 KiB)
_READ_SIZE = 1 << 16
# ciphertext beyond the plaintext: a record's header, tag and padding, generously
_RECORD_OVERHEAD = 64
_RECORD_SIZE = 1 << 14


class TLSLayer:
    """One connection's TLS session (nsqd is the server side).

    ``receive`` takes what the socket brought and returns the application bytes
    it completes; ``encrypt`` turns a flush into records. Handshake messages and
    alerts are written to ``transport`` directly. ``handshake_done`` is called
    once, when the handshake completes, before any application bytes are returned.
    """

    __slots__ = ("_handshake_done", "failure", "handshaking", "peer_closed", "ssl", "transport")

    def __init__(self, context: Any, transport: Any, handshake_done: Callable[[], None]) -> None:
        self.ssl = SSL.Connection(context, None)
        self.ssl.set_accept_state()
        self.transport = transport
        self._handshake_done = handshake_done
        self.handshaking = True
        self.failure: BaseException | None = None  # the TLS error that ended the session
        self.peer_closed = False  # the client sent close_notify

    def receive(self, data: bytes) -> bytes:
        """The application bytes ``data`` completes (b"" for none). A TLS error
        is kept in :attr:`failure` (its alert is sent) and ends the session."""
        if self.failure is not None or self.peer_closed or not data:
            return b""
        ssl = self.ssl
        try:
            ssl.bio_write(data)
            if self.handshaking:
                try:
                    ssl.do_handshake()
                except SSL.WantReadError:
                    self._send_pending()
                    return b""
                self.handshaking = False
                self._send_pending()  # the last flight, TLS 1.3's session tickets
                self._handshake_done()
            got = []
            while True:
                try:
                    got.append(ssl.recv(_READ_SIZE))
                except SSL.WantReadError:
                    break
                except SSL.ZeroReturnError:
                    self.peer_closed = True
                    break
        except SSL.Error as e:
            self.failure = e
            self._send_pending()  # the alert
            return b""
        if not self.handshaking:
            self._send_pending()  # a read can make output of its own (a key update's answer)
        return got[0] if len(got) == 1 else b"".join(got)

    def encrypt(self, data: bytes) -> bytes:
        """``data`` as TLS records (b"" once the session has failed: a session
        that cannot encrypt drops its connection)."""
        if self.failure is not None:
            return b""
        try:
            self.ssl.sendall(data)
        except SSL.Error as e:
            self.failure = e
            self.transport.abortConnection()
            return b""
        n = len(data)
        return self._take(n + (n // _RECORD_SIZE + 1) * _RECORD_OVERHEAD)

    def close_notify(self) -> bytes:
        """The ``close_notify`` alert ending the session (b"" if it cannot be sent)."""
        if self.failure is not None or self.handshaking:
            return b""
        try:
            self.ssl.shutdown()
        except SSL.Error:
            return b""
        return self._take(_RECORD_OVERHEAD * 2)

    def _take(self, size: int) -> bytes:
        """Everything waiting in the outgoing BIO, read ``size`` bytes at a time."""
        ssl = self.ssl
        parts = []
        while True:
            try:
                part = ssl.bio_read(size)
            except SSL.WantReadError:  # empty
                break
            parts.append(part)
            if len(part) < size:  # a memory BIO gives all it has: it is empty now
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _send_pending(self) -> None:
        data = self._take(_READ_SIZE)
        if data:
            self.transport.write(data)
