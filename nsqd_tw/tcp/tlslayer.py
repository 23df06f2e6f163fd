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
- Once the handshake is done, a read and a flush call OpenSSL through the
  bindings pyOpenSSL itself calls (``SSL_read``, ``SSL_write``, ``BIO_read``),
  on the connection's own ``SSL`` object and memory BIOs: no exception at the
  end of each read (pyOpenSSL raises ``WantReadError`` when a read is used up,
  twice per read of the socket) and no buffer allocated per call. A flush is
  encrypted a few records at a time, each piece's records read out behind the
  last into a buffer kept between flushes, and sent from it in one write
  (:meth:`TLSLayer.encrypt_view`). An error, and a
  pyOpenSSL without those attributes, take pyOpenSSL's own methods, which raise
  what they raise.

On the wire nothing changes: the same handshake, records and alerts (a failed
handshake still sends its alert; closing sends ``close_notify``, as Go's
``tls.Conn.Close``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from OpenSSL import SSL

try:  # the cffi bindings pyOpenSSL calls OpenSSL through
    from OpenSSL.SSL import _ffi, _lib
except ImportError:  # pragma: no cover - a pyOpenSSL without them: its methods only
    _ffi = _lib = None

# the most a recv takes from the session at once (a record holds at most 16 KiB)
_READ_SIZE = 1 << 16
# what the direct path calls (all in every pyOpenSSL that has _lib)
_CALLS = ("SSL_read", "SSL_write", "SSL_get_error", "SSL_clear_mode", "BIO_read", "BIO_write", "BIO_get_mem_data")
_DIRECT = _lib is not None and all(hasattr(_lib, name) for name in _CALLS)
# the one buffer SSL_read decrypts into and the records are read out through:
# calls happen on the reactor thread, and what it holds is copied out before the next
_read_buffer = _ffi.new("char[]", _READ_SIZE) if _DIRECT else None
# ciphertext beyond the plaintext: a record's header, tag and padding, generously
_RECORD_OVERHEAD = 64
_RECORD_SIZE = 1 << 14
# how much of a flush goes into the memory BIO before its records are read out
# (:meth:`TLSLayer._encrypt_direct`): whole records, and few enough to stay in L2
_PIECE = 4 * _RECORD_SIZE
# the buffer a flush's records are read out into (:meth:`TLSLayer.encrypt_view`),
# kept between flushes up to this size; a bigger flush gets one of its own
_OUT_KEEP = 1 << 22
_out_buffer = bytearray()  # grown by the first flush


def _sealed_size(n: int) -> int:
    """What ``n`` bytes of plaintext come to as records, reckoned generously."""
    return n + (n // _RECORD_SIZE + 1) * _RECORD_OVERHEAD


class TLSLayer:
    """One connection's TLS session (nsqd is the server side).

    ``receive`` takes what the socket brought and returns the application bytes
    it completes; ``encrypt`` turns a flush into records. Handshake messages and
    alerts are written to ``transport`` directly. ``handshake_done`` is called
    once, when the handshake completes, before any application bytes are returned.
    """

    __slots__ = (
        "_from_bio",
        "_handshake_done",
        "_into_bio",
        "_ptr",
        "failure",
        "handshaking",
        "peer_closed",
        "ssl",
        "transport",
    )

    def __init__(
        self, context: Any, transport: Any, handshake_done: Callable[[], None], direct: bool = _DIRECT
    ) -> None:
        """``direct=False``: pyOpenSSL's methods only (the tests run both ways)."""
        self.ssl = SSL.Connection(context, None)
        self.ssl.set_accept_state()
        self.transport = transport
        self._handshake_done = handshake_done
        self.handshaking = True
        self.failure: BaseException | None = None  # the TLS error that ended the session
        self.peer_closed = False  # the client sent close_notify
        # the SSL object and its memory BIOs, for the direct path (None: not taken)
        self._ptr = self._into_bio = self._from_bio = None
        if direct and all(hasattr(self.ssl, a) for a in ("_ssl", "_into_ssl", "_from_ssl", "_raise_ssl_error")):
            self._ptr = self.ssl._ssl
            self._into_bio = self.ssl._into_ssl
            self._from_bio = self.ssl._from_ssl
            # pyOpenSSL's contexts allow partial writes (sendall loops over them, one
            # record each): a write to a memory BIO always completes, in one call
            _lib.SSL_clear_mode(self._ptr, _lib.SSL_MODE_ENABLE_PARTIAL_WRITE)

    def receive(self, data: bytes) -> bytes:
        """The application bytes ``data`` completes (b"" for none). A TLS error
        is kept in :attr:`failure` (its alert is sent) and ends the session."""
        if self.failure is not None or self.peer_closed or not data:
            return b""
        if self._ptr is not None and not self.handshaking:
            return self._receive_direct(data)
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

    def _receive_direct(self, data: bytes) -> bytes:
        """:meth:`receive` after the handshake, through the bindings."""
        ptr = self._ptr
        n = len(data)
        if _lib.BIO_write(self._into_bio, _ffi.from_buffer(data), n) != n:  # a memory BIO takes all
            self.failure = SSL.Error([("", "", "BIO_write took less than it was given")])
            self.transport.abortConnection()
            return b""
        buf = _read_buffer
        got = []
        while True:
            size = _lib.SSL_read(ptr, buf, _READ_SIZE)
            if size > 0:
                got.append(_ffi.buffer(buf, size)[:])
            elif _lib.SSL_get_error(ptr, size) == _lib.SSL_ERROR_WANT_READ:
                break
            else:
                if not self._failed_direct(size):
                    break
                return b""
        # a read can make output of its own (a key update's answer)
        if _lib.BIO_get_mem_data(self._from_bio, _ffi.NULL) > 0:
            self._send_pending()
        return got[0] if len(got) == 1 else b"".join(got)

    def _failed_direct(self, result: int) -> bool:
        """What pyOpenSSL makes of a call that returned ``result``: the peer's
        ``close_notify`` (False: the session ends cleanly) or a failure (True:
        kept, its alert sent)."""
        try:
            self.ssl._raise_ssl_error(self._ptr, result)
            raise SSL.Error([("", "", f"OpenSSL call returned {result}")])
        except SSL.ZeroReturnError:
            self.peer_closed = True
            return False
        except SSL.Error as e:
            self.failure = e
            self._send_pending()  # the alert
            return True

    def encrypt(self, data: bytes) -> bytes:
        """``data`` as TLS records (b"" once the session has failed: a session
        that cannot encrypt drops its connection)."""
        sealed = self.encrypt_view(data)
        return sealed if type(sealed) is bytes else bytes(sealed)

    def encrypt_view(self, data: bytes) -> bytes | memoryview:
        """:meth:`encrypt` for a flush sent at once: through the bindings, a view of
        a buffer kept between flushes, good until the next call (what a write
        leaves unsent is copied out of it). A flush a consumer with RDY 2500 is
        sent is ~600 KB: its records read out into fresh objects that size (a
        64 KiB piece at a time, then joined) cost four times the encryption,
        in copies, page faults and unmapping."""
        if self.failure is not None:
            return b""
        if self._ptr is not None:
            return self._encrypt_direct(data)
        try:
            self.ssl.sendall(data)
        except SSL.Error as e:
            self.failure = e
            self.transport.abortConnection()
            return b""
        return self._take(_sealed_size(len(data)))

    def _encrypt_direct(self, data: bytes) -> bytes | memoryview:
        """:meth:`encrypt` through the bindings, a piece of the flush at a time
        (:data:`_PIECE`): each piece's records are read out of the memory BIO
        behind the pieces before it. OpenSSL zeroes and copies every record into
        that BIO; a flush written whole (~600 KB for a consumer with RDY 2500)
        grew it out of the caches, and the copies in and out then cost more than
        the encryption. The records are the same: a piece is whole records."""
        global _out_buffer
        ptr = self._ptr
        bio = self._from_bio
        plain = _ffi.from_buffer(data)
        n = len(data)
        need = _sealed_size(n)
        out = _out_buffer
        if need > len(out):  # a new one (a view of the old one may live on)
            grown = 1 << (need - 1).bit_length()
            if grown <= _OUT_KEEP:
                out = _out_buffer = bytearray(grown)
            else:  # this flush's own, its size
                out = bytearray(need)
        into = _ffi.from_buffer(out)
        sent = filled = 0
        while sent < n:
            wrote = _lib.SSL_write(ptr, plain + sent, min(n - sent, _PIECE))
            if wrote <= 0:
                try:
                    self.ssl._raise_ssl_error(ptr, wrote)
                    raise SSL.Error([("", "", f"SSL_write returned {wrote}")])
                except SSL.Error as e:
                    self.failure = e
                    self.transport.abortConnection()
                    return b""
            sent += wrote
            size = _lib.BIO_get_mem_data(bio, _ffi.NULL)  # this piece's records
            if filled + size > len(out):  # more overhead than reckoned (TLS 1.2's CBC)
                out = out[:filled] + bytearray(size + n - sent)  # this piece and the rest's plaintext
                into = _ffi.from_buffer(out)
            got = _lib.BIO_read(bio, into + filled, size) if size > 0 else 0
            filled += max(got, 0)
        return memoryview(out)[:filled]

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
