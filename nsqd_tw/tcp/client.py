"""ClientV2: one V2 client as nsqd knows it (Go's clientV2).

What it said in IDENTIFY, its state, its counters and their named transitions
(a message sent, finished, requeued, timed out), its TLS session and its AUTH
state. A channel sees it as its consumer: it sends it messages while it has
RDY capacity and is not blocked (its connection backed up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer
from twisted.python.failure import Failure

from nsq_wire.errors import FatalClientError
from nsq_wire.gofmt import go_quote
from nsq_wire.message import frames
from nsqd_tw.auth import AuthClient, AuthState
from nsqd_tw.core.message import Message

if TYPE_CHECKING:
    from nsqd_tw.core.channel import Channel
    from nsqd_tw.options import NSQDOptions
    from nsqd_tw.tcp.output import Output

STATE_INIT = 0
STATE_DISCONNECTED = 1
STATE_CONNECTED = 2
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

DEFAULT_BUFFER_SIZE = 16 * 1024


class Connection(Protocol):
    """What a client needs of its connection."""

    transport: Any
    tls: Any  # a TLSLayer once the client upgraded

    def close(self) -> None: ...
    def shutdown(self) -> None: ...


class ClientV2:
    def __init__(self, conn: Connection, opts: NSQDOptions, auth: AuthClient, now: float, log: Any) -> None:
        self.conn = conn
        self.log = log
        self.opts = opts
        self.auth = auth
        self.output: Output | None = None
        self.id = 0
        self.state = STATE_INIT
        self.channel: Channel | None = None
        self.blocked = False  # its connection is backed up: send it nothing for now

        self.ready_count = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}

        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.remote_address = ""
        self.connect_time = now

        self.heartbeat_interval = opts.client_timeout / 2
        self.output_buffer_size = DEFAULT_BUFFER_SIZE
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.msg_timeout = opts.msg_timeout
        self.sample_rate = 0

        self.tls = False
        self.snappy = False
        self.deflate = False
        self.auth_state: AuthState | None = None
        self.auth_secret = b""

    def __str__(self) -> str:
        return self.remote_address

    # -- what the channel calls ----------------------------------------------------

    def send_messages(self, msgs: list[Message]) -> None:
        """The messages are now in flight to this client: their frames go out as one buffer."""
        n = len(msgs)
        self.in_flight_count += n
        self.message_count += n
        assert self.output is not None
        self.output.message(frames(msgs))

    def timed_out_message(self) -> None:
        self.in_flight_count -= 1

    def empty(self) -> None:
        """Its channel dropped everything, what was in flight to it too."""
        self.in_flight_count = 0

    def close(self) -> None:
        """Closed by the server (its channel was deleted or nsqd is stopping)."""
        self.conn.close()

    def shutdown(self) -> None:
        """nsqd is stopping: give in-flight messages back now, then close."""
        self.conn.shutdown()

    # -- what its commands do ---------------------------------------------------------

    def finished(self, n: int = 1) -> None:
        self.finish_count += n
        self.in_flight_count -= n

    def requeued(self) -> None:
        self.requeue_count += 1
        self.in_flight_count -= 1

    def published(self, topic: str, count: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + count

    # -- TLS ----------------------------------------------------------------------

    def tls_info(self) -> dict[str, Any]:
        """Cipher suite, version and ALPN of the TLS session (for /stats)."""
        if not self.tls:
            return {}
        from nsqd_tw.tls import session_info  # pyOpenSSL: loaded when TLS is configured

        return session_info(self.conn.tls.ssl)

    def peer_common_name(self) -> str:
        """The subject common name of the client's TLS certificate, if any."""
        if not self.tls:
            return ""
        from nsqd_tw.tls import peer_common_name

        return peer_common_name(self.conn.tls.ssl)

    # -- AUTH -----------------------------------------------------------------------

    def has_authorizations(self) -> bool:
        return self.auth_state is not None and bool(self.auth_state.authorizations)

    def check_auth(self, cmd: str, topic: str, channel: str, now: float) -> defer.Deferred[None] | None:
        """Go's CheckAuth: raises the refusal, or returns a Deferred while an
        expired authorisation is fetched again (the command waits for it)."""
        if not self.opts.auth_http_addresses:
            return None
        state = self.auth_state
        if state is None or not state.authorizations:
            raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if not state.is_expired(now):
            self._authorize(state, cmd, topic, channel)
            return None

        def refreshed(new_state: AuthState) -> None:
            self.auth_state = new_state
            self._authorize(new_state, cmd, topic, channel)

        d: defer.Deferred[Any] = self.query_auth()
        d.addCallback(refreshed)
        return d

    @staticmethod
    def _authorize(state: AuthState, cmd: str, topic: str, channel: str) -> None:
        if not state.is_allowed(topic, channel):
            raise FatalClientError(
                "E_UNAUTHORIZED", f"AUTH failed for {cmd} on {go_quote(topic.encode())} {go_quote(channel.encode())}"
            )

    def query_auth(self) -> defer.Deferred[AuthState]:
        """Ask the auth servers about this client's secret; their errors are logged,
        never shown to an untrusted client (it gets E_AUTH_FAILED)."""
        peer = self.conn.transport.getPeer()
        remote_ip = getattr(peer, "host", "") if getattr(peer, "type", "") in ("TCP", "TCP6") else ""
        d = self.auth.query_any(remote_ip, self.tls, self.peer_common_name(), self.auth_secret)
        d.addErrback(self._auth_failed)
        return d

    def _auth_failed(self, f: Failure) -> None:
        self.log.warn("PROTOCOL(V2): [{client}] AUTH failed {err}", client=self, err=f.getErrorMessage())
        raise FatalClientError("E_AUTH_FAILED", "AUTH failed")
