"""The HTTP channel nsqd and nsqlookupd serve their APIs on: Go's answers, bounded.

:class:`HTTPChannel` answers ``400`` at once to bytes that cannot start an
HTTP request, and malformed requests with Go's ``400 Bad Request`` text; it
keeps at most what the route reads of a body, in memory (a body over the
route's limit is refused from its Content-Length, or as soon as that many
bytes of a chunked body arrived), and gives every request a header deadline
and a body deadline that bytes dripped one at a time do not extend. A client
that shuts its side down (``shutdown(SHUT_WR)``) is answered as Go answers it:
what it sent whole is served, a body cut short goes to its route as a failed
read, and then the connection closes.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.internet.protocol import connectionDone
from twisted.logger import LogLevel
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.server import Request, Site
from zope.interface import implementer

from nsq_service.limits import RateLimitedLog
from nsq_service.log import Logger
from nsq_wire.gofmt import join_host_port

# Deadlines of an HTTP request, in seconds (Go's net/http has none by default, and Go
# nsqd sets none). The request line and headers must arrive within HEADER_TIMEOUT of
# the connection (or of the first byte of a later request on a kept-alive one); the
# body within BODY_TIMEOUT of the headers: V2's deadline for a whole command is twice
# the default 30 s heartbeat, the same. A kept-alive connection with no request in
# progress is closed after IDLE_TIMEOUT (longer than Go's http.Transport keeps idle
# connections, 90 s, so Go clients close first).
HEADER_TIMEOUT = 10
BODY_TIMEOUT = 60
IDLE_TIMEOUT = 120
# A route that reads no body still reads and drops up to this much of one to keep the
# connection alive (Go's maxPostHandlerReadBytes); past it, the request is answered at
# once and the connection closed.
DISCARD_LIMIT = 256 << 10
# After answering a request whose body was not read, wait this long before closing
# (Go's rstAvoidanceDelay): closing with unread data sends a reset, which can destroy
# the answer before the client has read it.
LINGER = 0.5
MAX_CONTENT_LENGTH = (1 << 63) - 1  # Go: strconv.ParseUint(cl, 10, 63)
# The request line and headers together: Go's http.DefaultMaxHeaderBytes plus the
# 4096 bytes its reader allows beyond it; past that Go answers 431.
MAX_HEADER_BYTES = (1 << 20) + 4096
# Go counts no headers, only their bytes; each header is a few Python objects, so
# their number is bounded too (far above what a client sends), also with a 431.
MAX_HEADERS = 10_000
# Go's chunked reader refuses a chunk size of more than 16 hex digits.
MAX_CHUNK_SIZE = 1 << 64

_GO_ERROR_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"


def go_error_response(status: bytes, text: bytes | None = None) -> bytes:
    """What Go's net/http writes before closing a connection it cannot serve."""
    return b"HTTP/1.1 " + status + _GO_ERROR_HEADERS + (status if text is None else text)


def peer_address(request: Request) -> str:
    peer = request.getClientAddress()
    host = getattr(peer, "host", "")
    port = getattr(peer, "port", "")
    return join_host_port(host, port) if host else str(peer)


# what a request holds that nothing reads once it is answered (see BoundedRequest._cleanup)
_ANSWERED_REQUEST_SHEDS = (
    "_adapterCache",
    "_buffer",
    "args",
    "client",
    "host",
    "transport",
    "requestHeaders",
    "responseHeaders",
    "received_cookies",
    "cookies",
    "site",
    "prepath",
    "postpath",
    "sitepath",
)


class BoundedRequest(Request):
    """A request that keeps at most ``body_keep`` bytes of its body, in memory
    (twisted spools a body over 100 KB to a temporary file), and does not parse
    form bodies (nothing here reads ``request.args``)."""

    body_keep = 0
    body_received = 0
    # the client shut its side down before the body was whole (see cut_short)
    body_cut = False
    _cut_chunked = False
    _cut_said_close = False

    _buffer: io.BytesIO

    def gotLength(self, length: int | None) -> None:
        self.content = self._buffer = io.BytesIO()

    def handleContentChunk(self, data: bytes) -> None:
        self.body_received += len(data)
        room = self.body_keep - self._buffer.tell()
        if room > 0:
            self._buffer.write(data if len(data) <= room else data[:room])

    def cut_short(self, chunked: bool, version: bytes) -> None:
        """The body ended early: a route reading it fails as Go's read does
        (:func:`nsq_service.web.body`). After its handler Go reads what is left of
        a body, to keep the connection; it finds the end early, so its answer says
        ``Connection: close`` (HTTP/1.1) unless :meth:`read_to_cut` is called."""
        self.body_cut = True
        self._cut_chunked = chunked
        if version == b"HTTP/1.1" and not self.responseHeaders.hasHeader(b"connection"):
            self.responseHeaders.setRawHeaders(b"connection", [b"close"])
            self._cut_said_close = True

    def read_to_cut(self) -> None:
        """The route read up to where the body ended. Go's body of a known length
        then holds its end (nothing left to read after the handler: no ``Connection``
        header); a chunked body keeps its error, and the header."""
        if self._cut_said_close and not self._cut_chunked:
            self.responseHeaders.removeHeader(b"connection")
            self._cut_said_close = False

    def _cleanup(self) -> None:
        super()._cleanup()
        # What an answered request holds goes now, once answered and logged: should
        # anything keep the request itself in a reference cycle (Klein did, in its
        # error handler's closure), a collection of the youngest generation, up to
        # ~1,600 requests later, finds only an empty shell.
        for name in _ANSWERED_REQUEST_SHEDS:
            self.__dict__.pop(name, None)


class _ChunkedDecoder(http._ChunkedTransferDecoder):
    """Twisted's, refusing a chunk size Go refuses (more than 16 hex digits) at
    once instead of waiting for that much data until the body deadline."""

    def _dataReceived_CHUNK_LENGTH(self) -> bool:
        done = bool(super()._dataReceived_CHUNK_LENGTH())
        if done and self.length >= MAX_CHUNK_SIZE:
            raise http._MalformedChunkedDataError("http chunk length too large")
        return done


_ABSOLUTE_FORM = re.compile(rb"[a-zA-Z][a-zA-Z0-9+.-]*://")


def _origin_form(target: bytes) -> bytes:
    """``http://host:port/path?q`` -> ``/path?q`` (``/`` for no path)."""
    rest = target.split(b"://", 1)[1]
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    tail = rest[cut:]
    return tail if tail.startswith(b"/") else b"/" + tail


_HIGH_BYTES = re.compile(rb"[\x80-\xff]")
_CONTROL_BYTES = re.compile(rb"[\x00-\x1f\x7f]")


@implementer(IHalfCloseableProtocol)
class HTTPChannel(http.HTTPChannel):
    """Twisted's HTTP/1.1 channel with Go's answers and bounds.

    - bytes that cannot start an HTTP request (like the V2 magic ``"  V2"``) get
      ``400`` at once instead of waiting for a request line;
    - malformed requests get Go's ``400 Bad Request`` text (logged);
    - a request target with raw bytes >= 0x80 is served as Go serves it (they are
      %-escaped for twisted, which refuses them);
    - a body is kept in memory up to one byte more than its route accepts
      (``site.body_limit``); past that, or with a longer Content-Length, the request
      is answered from what arrived, the rest is not read and the connection closes
      (after ``LINGER``);
    - the headers must arrive within ``site.header_timeout`` and the body within
      ``site.body_timeout``, however slowly they drip; ``timeOut`` (twisted's
      idle timeout, reset by every byte) is ``site.idle_timeout``;
    - the end of the client's bytes (:meth:`readConnectionLost`) is Go's EOF.
    """

    site: Any
    transport: Any
    # lines end with LF, a CR before it is dropped: Go reads bare-LF requests too
    delimiter = b"\n"
    MAX_LENGTH = MAX_HEADER_BYTES  # one line: twisted's 16 KiB closed without an answer
    totalHeadersSize = MAX_HEADER_BYTES + 1  # ours (lineReceived) answers 431 first
    maxHeaders = MAX_HEADERS + 1
    _header_bytes = 0
    _header_lines = 0
    _first_bytes_pending = True
    _want_request_line = True
    _between_requests = False
    _refusing = False  # reading nothing more from this connection
    _read_closed = False  # the client shut its side down
    _linger_on_close = False
    _body_limit = 0
    _deadline: Any = None
    _linger: Any = None

    def connectionMade(self) -> None:
        self._first_bytes_pending = True
        self._want_request_line = True
        self._header_bytes = self._header_lines = 0
        super().connectionMade()
        self._start_deadline(self.site.header_timeout, self._header_timed_out)

    def dataReceived(self, data: bytes) -> None:
        if self._refusing:
            return
        if self._between_requests and data:
            self._between_requests = False
            self._start_deadline(self.site.header_timeout, self._header_timed_out)
        if self._first_bytes_pending:
            stripped = data.lstrip(b"\r\n")
            if stripped:
                self._first_bytes_pending = False
                first = stripped[:1]
                if not (first.isalpha() or first in b"!#$%&'*+-.^_`|~0123456789"):
                    self._bad_request("not an HTTP request")
                    return
        super().dataReceived(data)

    def lineLengthExceeded(self, line: bytes) -> None:
        self._too_large("a line")

    def lineReceived(self, line: bytes) -> None:
        if self._refusing:
            return  # the rest of a read already split into lines
        if line.endswith(b"\r"):
            line = line[:-1]
        self._header_bytes += len(line) + 2
        self._header_lines += 1
        if self._header_bytes > MAX_HEADER_BYTES:
            self._too_large("the request line and headers")
            return
        if self._header_lines > MAX_HEADERS + 1:
            self._too_large(f"more than {MAX_HEADERS} headers")
            return
        if self._want_request_line and line:
            self._want_request_line = False
            parts = line.split(b" ")
            if len(parts) == 3:
                if _CONTROL_BYTES.search(parts[1]):
                    self._bad_request("invalid control character in URL")
                    return
                if _ABSOLUTE_FORM.match(parts[1]):
                    # Go routes by the path of an absolute URI ("POST http://host/pub")
                    parts[1] = _origin_form(parts[1])
                    line = b" ".join(parts)
                if _HIGH_BYTES.search(parts[1]):
                    raw = parts[1]
                    parts[1] = _HIGH_BYTES.sub(lambda m: b"%%%02X" % m.group()[0], raw)
                    line = b" ".join(parts)
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        self.site.logger.info(
                            "HTTP: non-UTF-8 bytes in the request target from {addr}: {target}",
                            addr=self.peer_address(),
                            target=parts[1].decode("ascii"),
                        )
        super().lineReceived(line)

    def _maybeChooseTransferDecoder(self, header: bytes, data: bytes) -> bool:
        if header == b"Content-Length":
            value = data.strip(b" \t\r\n")
            if not value.isdigit() or int(value) > MAX_CONTENT_LENGTH:
                self._bad_request(f"bad Content-Length {data.decode('latin-1')!r}")
                self.length = None
                return False
            if self.length is not None and self._transferDecoder is not None and self.length == int(value):
                return True  # the same Content-Length again: Go accepts it (a different one is refused)
            data = value
        elif header == b"Transfer-Encoding" and data.lower() != b"chunked":
            self.site.logger.info(
                "HTTP: 501 Not Implemented to {addr} - unsupported Transfer-Encoding {te!r}",
                addr=self.peer_address(),
                te=data.decode("latin-1"),
            )
            self._refuse(go_error_response(b"501 Not Implemented", b"Unsupported transfer encoding"), linger=False)
            self.length = None
            return False
        chosen = bool(super()._maybeChooseTransferDecoder(header, data))
        if chosen and type(self._transferDecoder) is http._ChunkedTransferDecoder:
            self._transferDecoder = _ChunkedDecoder(self.requests[-1].handleContentChunk, self._finishRequestBody)
        return chosen

    def allHeadersReceived(self) -> None:
        self._cancel_deadline()
        request = self.requests[-1]
        limit = self.site.body_limit(self._command, self._path)
        # one byte more than a valid body may have, for the route to see it is too big
        request.body_keep = 0 if limit is None else limit + 1
        self._body_limit = DISCARD_LIMIT if limit is None else limit
        if self.length is not None and self.length > self._body_limit:
            # answer from the headers (the route refuses or ignores the body): no
            # 100 Continue, no reading
            request.parseCookies()
            request.gotLength(0)
            self._close_after_answer(request)
            self.length = 0  # so that twisted dispatches the request now
            return
        super().allHeadersReceived()
        if self.length != 0:
            self._start_deadline(self.site.body_timeout, self._body_timed_out)

    def rawDataReceived(self, data: bytes) -> None:
        if self._refusing:
            return
        super().rawDataReceived(data)
        if self._handlingRequest or self._refusing or self._transferDecoder is None:
            return
        request = self.requests[-1]
        if request.body_received > self._body_limit:
            # a chunked body reached what the route reads: answer from that
            self._close_after_answer(request)
            self.allContentReceived()

    def allContentReceived(self) -> None:
        self._cancel_deadline()
        self._first_bytes_pending = True
        self._want_request_line = True
        self._header_bytes = self._header_lines = 0
        super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        if self.persistent and not self._refusing:
            self._between_requests = True
        super().requestDone(request)  # serves what was read meanwhile
        if self._read_closed and self.persistent:
            self._end_of_requests()

    def readConnectionLost(self) -> None:
        """The client shut its side down (``shutdown(SHUT_WR)``): no more bytes
        come. Go's server reads EOF where it is: a request being answered is
        answered and the connection closes after it; a body cut short goes to its
        route (a route that reads it answers ``500 INTERNAL_ERROR``); a request
        line or headers cut short get ``400``; between requests it closes."""
        if self._read_closed:
            return  # twisted finds the end again each time reading resumes
        self._read_closed = True
        self._end_of_requests()

    def writeConnectionLost(self) -> None:
        pass  # this side is never shut down alone

    def _end_of_requests(self) -> None:
        """What Go does on reading EOF here, once no request is being answered."""
        if self._refusing or self._handlingRequest or self.transport is None or self.transport.disconnecting:
            return  # an answer is on its way: requestDone comes back here, or closes
        self._cancel_deadline()
        if self._transferDecoder is not None:
            self._cut_body()
        elif not self._want_request_line or self._buffer.strip(b"\r\n"):
            # Go: a request line cut short is malformed, headers cut short ErrUnexpectedEOF: 400
            self._bad_request("request cut short")
        else:
            self.loseConnection()

    def _cut_body(self) -> None:
        request = self.requests[-1]
        chunked = not isinstance(self._transferDecoder, http._IdentityTransferDecoder)
        self.site.logger.info(
            "HTTP: request body from {addr} cut short after {n} bytes: the client shut its side down",
            addr=self.peer_address(),
            n=request.body_received,
        )
        request.cut_short(chunked, self._version)
        self.persistent = False  # closed once answered
        self.allContentReceived()

    def loseConnection(self) -> Any:
        if self._linger_on_close:
            # let the client read the answer before unread data resets the connection
            self._linger_on_close = False
            self._networkProducer.pauseProducing()
            self._linger = self.callLater(self.site.linger, self._close_now)
            return None
        return super().loseConnection()

    def _close_now(self) -> None:
        self._linger = None
        self._abortingCall = self.callLater(self.abortTimeout, self.forceAbortClient)
        super().loseConnection()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._cancel_deadline()
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        self._linger = None
        super().connectionLost(reason)

    def _respondToBadRequestAndDisconnect(self) -> None:
        self._bad_request("malformed request")

    # -- helpers ----------------------------------------------------------------------

    def peer_address(self) -> str:
        peer = self.transport.getPeer() if self.transport is not None else None
        host = getattr(peer, "host", "")
        return join_host_port(host, getattr(peer, "port", "")) if host else str(peer)

    def _bad_request(self, reason: str) -> None:
        self.site.logger.info("HTTP: 400 Bad Request to {addr} - {reason}", addr=self.peer_address(), reason=reason)
        self._refuse(go_error_response(b"400 Bad Request"), linger=False)

    def _too_large(self, what: str) -> None:
        self.site.logger.info(
            "HTTP: 431 Request Header Fields Too Large to {addr} - {what}", addr=self.peer_address(), what=what
        )
        self._refuse(go_error_response(b"431 Request Header Fields Too Large"), linger=True)

    def _refuse(self, answer: bytes, linger: bool) -> None:
        """Write ``answer`` and close, reading nothing more."""
        self._cancel_deadline()
        if self._refusing:
            return
        self._refusing = True
        self._linger_on_close = linger
        self.transport.write(answer)
        self.loseConnection()

    def _close_after_answer(self, request: Any) -> None:
        self._refusing = True
        self._linger_on_close = True
        self.persistent = False
        request.responseHeaders.setRawHeaders(b"connection", [b"close"])
        self._networkProducer.pauseProducing()

    def _start_deadline(self, seconds: float | None, expired: Callable[[], None]) -> None:
        self._cancel_deadline()
        if seconds:
            self._deadline = self.callLater(seconds, expired)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _header_timed_out(self) -> None:
        self._deadline = None
        timeout = self.site.header_timeout
        self.site.note_timeout(
            "headers",
            lambda c: f"HTTP: closed {c['n']} connection(s) that sent no complete request headers within {timeout:g}s",
        )
        self._refusing = True  # as Go: no answer, the request was never read
        self._close_now()

    def _body_timed_out(self) -> None:
        self._deadline = None
        timeout = self.site.body_timeout
        self.site.note_timeout(
            "body", lambda c: f"HTTP: answered 408 to {c['n']} request(s) whose body did not arrive within {timeout:g}s"
        )
        self._refuse(go_error_response(b"408 Request Timeout"), linger=True)


class QuietSite(Site):
    """A Site with our channel and requests and no access log line per request.

    ``body_limit(method, target)``: the largest body that request's route accepts
    (None: it reads none). ``logger``: the server's, for the channel's lines. The
    deadlines are attributes, in seconds.
    """

    noisy = False
    protocol = HTTPChannel  # type: ignore[assignment]
    requestFactory = BoundedRequest
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    linger: float = LINGER

    def __init__(
        self,
        resource: Any,
        logger: Logger,
        body_limit: Callable[[bytes, bytes], int | None] | None = None,
        reactor: Any = None,
    ) -> None:
        super().__init__(
            resource,
            requestFactory=BoundedRequest,
            parsePOSTFormSubmission=False,
            timeout=self.idle_timeout,
            reactor=reactor,
        )
        self.body_limit = body_limit or (lambda method, target: None)
        self.logger = logger
        self._timeouts = RateLimitedLog(self.reactor, self.logger, interval=10.0)

    def note_timeout(self, kind: str, text: Callable[[dict[str, int]], str]) -> None:
        self._timeouts.emit(kind, LogLevel.info, text, n=1)

    def stopFactory(self) -> None:
        self._timeouts.stop()
        super().stopFactory()

    def log(self, request: Any) -> None:
        pass
