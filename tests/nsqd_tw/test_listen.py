"""nsq_service.listen on real loopback sockets: the backlog, and reads that copy
out exactly what arrived."""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import defer, protocol, reactor, ssl, task
from twisted.internet.threads import deferToThread
from twisted.trial import unittest

from nsq_service import listen
from nsq_service.log import LogGate
from tests.certs import make_certs


class BacklogTests(unittest.TestCase):
    def test_every_listener_uses_somaxconn(self) -> None:
        self.patch(listen, "listen_backlog", lambda: 777)
        certs = make_certs(self.mktemp())
        tls = ssl.DefaultOpenSSLContextFactory(certs.key, certs.cert)
        ports = []
        for address, context in (("127.0.0.1:0", None), ("127.0.0.1:0", tls), (self.mktemp(), None)):
            d = listen.server_endpoint(reactor, address, context).listen(protocol.Factory())
            port = self.successResultOf(d)
            self.addCleanup(port.stopListening)
            ports.append(port)
        self.assertEqual([p.backlog for p in ports], [777] * 3)


class Collect(protocol.Protocol):
    """Asks for 1 MiB reads (as nsqd's V2 connections do) and keeps what it gets."""

    def __init__(self, done: defer.Deferred[list[bytes]], size: int) -> None:
        self.done = done
        self.size = size
        self.chunks: list[bytes] = []
        self.got = 0

    def connectionMade(self) -> None:
        self.transport.bufferSize = 1 << 20  # type: ignore[attr-defined]

    def dataReceived(self, data: bytes) -> None:
        self.chunks.append(data)
        self.got += len(data)
        if self.got >= self.size:
            self.done.callback(self.chunks)


class ReadTests(unittest.TestCase):
    @defer.inlineCallbacks
    def test_reads_are_the_bytes_that_arrived(self) -> Any:
        payload = bytes(range(256)) * 12_000  # 3 MB: several 1 MiB reads at least
        done: defer.Deferred[list[bytes]] = defer.Deferred()
        factory = protocol.Factory.forProtocol(lambda: Collect(done, len(payload)))
        port = yield listen.server_endpoint(reactor, "127.0.0.1:0").listen(factory)
        self.addCleanup(port.stopListening)

        def send() -> None:
            with socket.create_connection(("127.0.0.1", port.getHost().port)) as s:
                s.sendall(payload)

        yield deferToThread(send)
        chunks = yield done
        self.assertTrue(all(type(c) is bytes for c in chunks))
        self.assertEqual(b"".join(chunks), payload)


class _Descriptor:
    """What write_through looks for: a transport the reactor writes with doWrite."""

    connected = True
    disconnecting = False

    def __init__(self, result: Any = None) -> None:
        self.calls: list[str] = []
        self.result = result

    def doWrite(self) -> Any:
        self.calls.append("doWrite")
        return self.result

    def startWriting(self) -> None:
        self.calls.append("startWriting")


class _TLS:
    def __init__(self, transport: Any) -> None:
        self.transport = transport


class WriteThroughTests(unittest.TestCase):
    def test_the_tcp_transport_under_any_wrapper_is_written_now(self) -> None:
        tcp = _Descriptor()
        listen.write_through(_TLS(_TLS(tcp)))
        self.assertEqual(tcp.calls, ["doWrite"])

    def test_an_error_is_left_for_the_reactor(self) -> None:
        tcp = _Descriptor(result=ConnectionResetError())
        listen.write_through(tcp)
        self.assertEqual(tcp.calls, ["doWrite", "startWriting"])

    def test_nothing_once_closing_or_without_a_descriptor(self) -> None:
        tcp = _Descriptor()
        tcp.disconnecting = True
        listen.write_through(tcp)
        listen.write_through(_TLS(None))
        listen.write_through(object())
        self.assertEqual(tcp.calls, [])


class Accepted(protocol.Protocol):
    """Hands its accepted transport over."""

    def __init__(self, done: defer.Deferred[Any]) -> None:
        self.done = done

    def connectionMade(self) -> None:
        self.done.callback(self.transport)


class _Loopback(unittest.TestCase):
    """An accepted connection and the client socket it came from."""

    @defer.inlineCallbacks
    def connect(self) -> Any:
        accepted: defer.Deferred[Any] = defer.Deferred()
        port = yield listen.server_endpoint(reactor, "127.0.0.1:0").listen(
            protocol.Factory.forProtocol(lambda: Accepted(accepted))
        )
        self.addCleanup(port.stopListening)
        client = socket.create_connection(("127.0.0.1", port.getHost().port))
        self.addCleanup(client.close)
        transport = yield accepted
        self.addCleanup(transport.abortConnection)
        return transport, client

    @staticmethod
    def receive(client: socket.socket, size: int) -> defer.Deferred[bytes]:
        def read() -> bytes:
            got = bytearray()
            while len(got) < size:
                chunk = client.recv(1 << 20)
                if not chunk:
                    break
                got += chunk
            return bytes(got)

        return deferToThread(read)


class NoDelayTests(_Loopback):
    @defer.inlineCallbacks
    def test_accepted_connections_send_at_once_as_go_s_do(self) -> Any:
        """Go sets TCP_NODELAY on every TCP connection: a small frame (a
        response, a message) is not held back by Nagle's algorithm."""
        transport, _ = yield self.connect()
        self.assertTrue(transport.getHandle().getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


class WriteNowTests(_Loopback):
    """write_now on a real accepted connection: sent from the call when nothing
    waits unsent, else after what waits, and never lost or reordered."""

    @defer.inlineCallbacks
    def test_sent_from_the_call_without_the_reactor(self) -> Any:
        transport, client = yield self.connect()
        registered: list[bool] = []
        self.patch(transport, "startWriting", lambda: registered.append(True))
        listen.write_now(transport, b"OK")
        self.assertEqual(registered, [])  # never registered with the reactor for writing
        client.settimeout(30)
        self.assertEqual(client.recv(2), b"OK")

    @defer.inlineCallbacks
    def test_what_the_socket_does_not_take_waits_in_the_transport(self) -> Any:
        transport, client = yield self.connect()
        payload = bytes(range(256)) * 64_000  # 16 MB: more than a socket buffer holds
        listen.write_now(transport, payload)
        self.assertIn(transport, reactor.getWriters())
        listen.write_now(transport, b"after")  # behind what waits, not before it
        got = yield self.receive(client, len(payload) + 5)
        self.assertEqual(got, payload + b"after")

    @defer.inlineCallbacks
    def test_a_view_of_a_reused_buffer_is_copied_where_it_waits(self) -> Any:
        """The TLS layer hands write_now a view of the buffer it reads every flush's
        records into: what the socket does not take must not change with it."""
        transport, client = yield self.connect()
        buffer = bytearray(bytes(range(256)) * 64_000)  # 16 MB: more than a socket buffer holds
        payload = bytes(buffer)
        listen.write_now(transport, memoryview(buffer))
        self.assertIn(transport, reactor.getWriters())
        buffer[:] = b"\0" * len(buffer)  # the next flush
        listen.write_now(transport, memoryview(buffer)[:5])  # behind what waits
        got = yield self.receive(client, len(payload) + 5)
        self.assertEqual(got, payload + b"\0" * 5)

    @defer.inlineCallbacks
    def test_written_after_what_the_transport_holds(self) -> Any:
        transport, client = yield self.connect()
        transport.write(b"first ")
        listen.write_now(transport, b"second")
        got = yield self.receive(client, 12)
        self.assertEqual(got, b"first second")

    def test_a_transport_that_is_not_plain_tcp_is_written_and_flushed(self) -> None:
        calls: list[Any] = []

        class Wrapper:
            transport = _Descriptor()

            def write(self, data: bytes) -> None:
                calls.append(data)

        wrapper = Wrapper()
        listen.write_now(wrapper, b"OK")
        self.assertEqual(calls, [b"OK"])
        self.assertEqual(wrapper.transport.calls, ["doWrite"])


class WritePiecesNowTests(_Loopback):
    """write_pieces_now: a flush's frames in one sendmsg, never lost or reordered."""

    @defer.inlineCallbacks
    def test_sent_from_the_call_in_one_sendmsg(self) -> Any:
        transport, client = yield self.connect()
        registered: list[bool] = []
        self.patch(transport, "startWriting", lambda: registered.append(True))
        calls: list[int] = []
        sock = transport.socket

        class Counting:
            def sendmsg(self, pieces: list[bytes]) -> int:
                calls.append(len(pieces))
                return sock.sendmsg(pieces)

        self.patch(transport, "socket", Counting())
        listen.write_pieces_now(transport, [b"one ", b"two ", b"three"])
        self.assertEqual((calls, registered), ([3], []))
        got = yield self.receive(client, 13)
        self.assertEqual(got, b"one two three")

    @defer.inlineCallbacks
    def test_what_the_socket_does_not_take_waits_in_the_transport(self) -> Any:
        transport, client = yield self.connect()
        pieces = [bytes([i]) * 1_000_000 for i in range(16)]  # 16 MB: more than a socket buffer holds
        listen.write_pieces_now(transport, pieces)
        self.assertIn(transport, reactor.getWriters())
        listen.write_pieces_now(transport, [b"af", b"ter"])  # behind what waits, not before it
        got = yield self.receive(client, 16_000_005)
        self.assertEqual(got, b"".join(pieces) + b"after")

    @defer.inlineCallbacks
    def test_written_after_what_the_transport_holds(self) -> Any:
        transport, client = yield self.connect()
        transport.write(b"first ")
        listen.write_pieces_now(transport, [b"sec", b"ond"])
        got = yield self.receive(client, 12)
        self.assertEqual(got, b"first second")

    @defer.inlineCallbacks
    def test_more_pieces_than_one_sendmsg_takes_are_joined(self) -> Any:
        transport, client = yield self.connect()
        pieces = [b"%04d" % i for i in range(listen.SENDMSG_PIECES * 3)]
        listen.write_pieces_now(transport, pieces)
        got = yield self.receive(client, 4 * len(pieces))
        self.assertEqual(got, b"".join(pieces))


class ReadNowTests(_Loopback):
    """read_now: what has arrived on a plain TCP connection, read from the call."""

    @defer.inlineCallbacks
    def test_what_arrived_is_read_and_nothing_is_none(self) -> Any:
        transport, client = yield self.connect()
        transport.stopReading()  # read_now alone reads it
        self.assertIsNone(listen.read_now(transport))  # nothing yet: no wait
        client.sendall(b"ACK")
        got = b""
        while len(got) < 3:  # there at once on loopback, unless the machine is busy
            got += listen.read_now(transport) or b""
            if len(got) < 3:
                yield task.deferLater(reactor, 0.001, lambda: None)
        self.assertEqual(got, b"ACK")

    @defer.inlineCallbacks
    def test_the_end_of_the_connection_is_left_for_the_reactor(self) -> Any:
        transport, client = yield self.connect()
        lost: defer.Deferred[None] = defer.Deferred()
        transport.protocol.connectionLost = lambda reason: lost.callback(None)
        client.close()
        self.assertIsNone(listen.read_now(transport))
        yield lost  # the reactor still finds the end

    def test_a_transport_that_is_not_plain_tcp_is_left_alone(self) -> None:
        self.assertIsNone(listen.read_now(_TLS(_Descriptor())))


class PreboundTests(unittest.TestCase):
    """nsq_service.prebind: sockets listening before Twisted, adopted by the listeners."""

    def prebound(self, *addresses: str) -> Any:
        from nsq_service.prebind import Prebound

        bound = Prebound()
        self.addCleanup(bound.close)
        bound.listen(addresses, backlog=5)
        return bound

    @defer.inlineCallbacks
    def test_a_listener_adopts_the_socket_and_serves_what_waited_in_the_backlog(self) -> Any:
        bound = self.prebound("127.0.0.1:0")
        sock = bound.take("127.0.0.1:0")
        self.assertIsNotNone(sock)
        port_number = sock.getsockname()[1]
        early = socket.create_connection(("127.0.0.1", port_number))  # before any listener exists
        self.addCleanup(early.close)
        early.sendall(b"waited")
        done: defer.Deferred[list[bytes]] = defer.Deferred()
        factory = protocol.Factory.forProtocol(lambda: Collect(done, 6))
        log = LogGate().logger("nsq_service.listen")
        service = listen.ListeningService("TCP", reactor, "127.0.0.1:0", factory, log=log)
        service.adopt(sock)
        service.startService()
        self.addCleanup(service.stopService)
        self.assertEqual(service.shown, f"127.0.0.1:{port_number}")
        self.assertEqual(service.port.socket.fileno(), sock.fileno())  # type: ignore[union-attr]
        self.assertEqual(b"".join((yield done)), b"waited")

    def test_the_same_address_twice_is_two_sockets(self) -> None:
        """``127.0.0.1:0`` for TCP and for HTTP: two ports, as the listeners bind them."""
        bound = self.prebound("127.0.0.1:0", "127.0.0.1:0")
        first, second = bound.take("127.0.0.1:0"), bound.take("127.0.0.1:0")
        self.addCleanup(first.close)
        self.addCleanup(second.close)
        self.assertNotEqual(first.getsockname()[1], second.getsockname()[1])
        self.assertIsNone(bound.take("127.0.0.1:0"))

    def test_an_empty_host_is_every_interface_as_the_listeners_bind_it(self) -> None:
        bound = self.prebound(":0")
        sock = bound.take(":0")
        self.assertEqual(sock.family, socket.AF_INET6)
        self.assertEqual(sock.getsockname()[0], "::")
        self.assertEqual(sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR), 1)
        self.assertFalse(sock.getblocking())
        self.assertFalse(sock.get_inheritable())

    def test_what_cannot_be_bound_now_is_left_to_the_listener(self) -> None:
        busy = socket.socket()
        self.addCleanup(busy.close)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        in_use = "127.0.0.1:%d" % busy.getsockname()[1]
        bound = self.prebound(in_use, "/tmp/a-unix-socket-path", "no.such.host.invalid:4150", "")
        self.assertEqual(len(bound), 0)
        log = LogGate().logger("nsq_service.listen")
        service = listen.ListeningService("TCP", reactor, in_use, protocol.Factory(), log=log)
        service.adopt(bound.take(in_use))
        with self.assertRaises(listen.ListenError) as caught:
            service.privilegedStartService()
        self.assertEqual(
            str(caught.exception), f"listen ({in_use}) failed - listen tcp {in_use}: bind: address already in use"
        )

    def test_what_is_not_taken_is_closed(self) -> None:
        bound = self.prebound("127.0.0.1:0")
        (sock,) = bound._sockets["127.0.0.1:0"]
        port_number = sock.getsockname()[1]
        bound.close()
        self.assertEqual(sock.fileno(), -1)
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port_number)).close()
