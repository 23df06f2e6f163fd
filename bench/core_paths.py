"""The core's per-message paths in one process, without sockets: publish, and deliver + FIN.

    python bench/core_paths.py                      # this checkout
    python bench/core_paths.py --tree /other/checkout --runs 5
    python bench/core_paths.py --calls              # function calls per consumed message (cProfile)
    python bench/core_paths.py --disk [--calls]     # consume with half the backlog in a disk queue
    python bench/core_paths.py --retention          # publish with a retained log (issue 24) too
    python bench/core_paths.py --overflow           # publish to a channel whose memory queue is full
    python bench/core_paths.py --parse              # the V2 parser alone, on MPUB bytes
    python bench/core_paths.py --tls                # the V2 TLS layer alone: a flush out, a read of FINs in

``publish``: 500,000 messages of 200 bytes as MPUBs of 200 straight into
``NSQD.publish_to`` (a topic with no channel: what bench_writer measures).
``consume``: 200,000 queued messages delivered to a consumer on a test transport
(``tests.helpers.FakeClient``) with RDY 2500, each read of frames answered with
one batch of FINs. ``parse``: the same 500,000 messages as the bytes of MPUB
commands, fed to ``V2Parser`` in reads of 64 KiB (what a publisher's socket gives
nsqd) until every command is out. ``tls``: nsqd's TLS layer after a handshake
with a pyOpenSSL client in memory: 20,000 flushes of 72 message frames (16.5 KB)
encrypted, and 20,000 reads of 72 FINs (one record each, what a consumer sends per
record it read) decrypted, and 1,000 flushes of 2,592 frames (597 KB, what a
consumer with RDY 2500 is sent at once) encrypted, µs each.
A figure per run, msg/s; ``--tree`` measures another checkout
(its own code and test helpers), for a before/after on one machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BODY = b"a" * 200


def publish(make_nsqd: Any, retention: bool = False, overflow: bool = False) -> float:
    """``retention``: the topic keeps a retained log (written to a temporary data
    path). ``overflow``: the topic has a channel whose memory queue (10,000) is
    full, so that every message goes on to its disk queue (a consumer far behind)."""
    data = tempfile.mkdtemp(prefix="core_paths.")
    kw: dict[str, Any] = {"retention": 3600.0} if retention else {}
    if overflow:
        kw.update(mem_queue_size=10_000, backend_factory=None)
    nsqd = make_nsqd(**{"mem_queue_size": 2_000_000, "data_path": data, **kw})
    topic = nsqd.get_topic("t")
    if overflow:
        topic.get_channel("c")
        for _ in range(50):
            nsqd.publish_to(topic, [BODY] * 200)  # fill its memory queue first
    bodies = [BODY] * 200
    started = time.perf_counter()
    for _ in range(2500):
        nsqd.publish_to(topic, bodies)
    rate = 500_000 / (time.perf_counter() - started)
    shutil.rmtree(data, ignore_errors=True)
    return rate


def consume(make_nsqd: Any, fake_client: Any, message_type: int, profile: Any = None, disk: bool = False) -> float:
    if disk:  # half of the backlog in memory, half in a disk queue, as in go_compare's runs
        data = tempfile.mkdtemp(prefix="core_paths.")
        nsqd = make_nsqd(mem_queue_size=100_000, backend_factory=None, data_path=data)
    else:
        nsqd = make_nsqd(mem_queue_size=2_000_000)
    topic = nsqd.get_topic("t")
    client = fake_client(nsqd)
    client.sub("t", "c", 0)
    for _ in range(1000):
        nsqd.publish_to(topic, [BODY] * 200)
    channel = topic.channels["c"]
    while topic.depth():
        nsqd.reactor.advance(0)  # the topic's pump hands its backlog to the channel
    started = time.perf_counter()
    n = 0
    if profile is not None:
        profile.enable()
    while channel.depth() or len(channel.in_flight):
        client.command(b"RDY", b"2500")
        ids = [data[10:26] for frame_type, data in client.frames() if frame_type == message_type]
        client.send(b"".join(b"FIN " + msg_id + b"\n" for msg_id in ids))
        n += len(ids)
    elapsed = time.perf_counter() - started
    if profile is not None:
        profile.disable()
    if disk:
        shutil.rmtree(data, ignore_errors=True)
    return n if profile is not None else n / elapsed


def parse(parser_class: Any) -> float:
    """MPUBs of 200 messages of 200 bytes through the V2 parser, read by read."""
    one = struct.pack(">I", len(BODY)) + BODY
    payload = struct.pack(">I", 200) + one * 200
    command = b"MPUB t\n" + struct.pack(">I", len(payload)) + payload
    data = command * 2500
    reads = [data[at : at + 65536] for at in range(0, len(data), 65536)]
    parser = parser_class(1 << 20, 5 << 20)
    n = 0
    started = time.perf_counter()
    for read in reads:
        parser.feed(read)
        while (cmd := parser.next()) is not None:
            if cmd.complete:
                n += len(cmd.bodies)
    elapsed = time.perf_counter() - started
    if n != 500_000:
        raise AssertionError(f"parsed {n} messages")
    return n / elapsed


def tls_layer(tls_layer_class: Any, server_context: Any, rounds: int = 20_000) -> tuple[float, float, float]:
    """µs per flush encrypted, µs per read of FINs decrypted, µs per big flush
    encrypted (see the module's doc)."""
    from OpenSSL import SSL

    # this checkout's helpers, also under --tree (a checkout from before them has none)
    helpers = Path(__file__).resolve().parents[1] / "tests" / "tlsmemory.py"
    spec = importlib.util.spec_from_file_location("_tlsmemory", helpers)
    assert spec is not None and spec.loader is not None
    tlsmemory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tlsmemory)
    Wire, client_bytes = tlsmemory.Wire, tlsmemory.client_bytes

    wire = Wire()
    layer = tls_layer_class(server_context, wire, lambda: None)
    client = SSL.Connection(SSL.Context(SSL.TLS_CLIENT_METHOD), None)
    client.set_connect_state()
    while layer.handshaking:
        try:
            client.do_handshake()
        except SSL.WantReadError:
            pass
        layer.receive(client_bytes(client))
        if wire.written:
            client.bio_write(b"".join(wire.written))
            wire.written.clear()
    frames = [struct.pack(">ii", 226, 2) + b"m" * 222] * 72
    encrypt_flush = getattr(layer, "encrypt_view", layer.encrypt)  # what a flush calls (a tree before it: encrypt)
    started = time.perf_counter()
    for _ in range(rounds):
        encrypt_flush(b"".join(frames))
    encrypt = (time.perf_counter() - started) / rounds * 1e6
    big = frames * 36
    started = time.perf_counter()
    for _ in range(rounds // 20):
        encrypt_flush(b"".join(big))
    encrypt_big = (time.perf_counter() - started) / (rounds // 20) * 1e6
    fins = b"".join(b"FIN %016x\n" % n for n in range(72))
    reads = []
    for _ in range(rounds):
        client.sendall(fins)
        reads.append(client_bytes(client))
    started = time.perf_counter()
    for read in reads:
        if len(layer.receive(read)) != len(fins):
            raise AssertionError("a read of FINs did not come out whole")
    receive = (time.perf_counter() - started) / rounds * 1e6
    if wire.aborted:
        raise AssertionError("the TLS layer dropped the connection")
    return encrypt, receive, encrypt_big


def calls_per_message(make_nsqd: Any, fake_client: Any, message_type: int, disk: bool = False) -> float:
    """Function calls (Python and built-in, cProfile's count) per message delivered and FINed,
    the harness's two (a list comprehension and a generator expression) included."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    n = consume(make_nsqd, fake_client, message_type, profile, disk)
    return sum(row[1] for row in pstats.Stats(profile).stats.values()) / n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="core_paths", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="the checkout to measure")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--calls", action="store_true", help="count the function calls per consumed message instead")
    p.add_argument("--disk", action="store_true", help="consume: half the backlog in a disk queue (100K in memory)")
    p.add_argument("--retention", action="store_true", help="publish: also with a retained log (this tree only)")
    p.add_argument("--overflow", action="store_true", help="publish: to a channel whose memory queue is full (disk)")
    p.add_argument("--parse", action="store_true", help="time the V2 parser on MPUB bytes instead")
    p.add_argument("--tls", action="store_true", help="time the V2 TLS layer (a flush out, a read of FINs in) instead")
    a = p.parse_args(argv)
    sys.path.insert(0, a.tree)
    if a.tls:
        from nsqd_tw.options import NSQDOptions
        from nsqd_tw.tcp.tlslayer import TLSLayer
        from nsqd_tw.tls import ServerTLS
        from tests.certs import make_certs

        certs = tempfile.mkdtemp(prefix="core_paths.")
        try:
            files = make_certs(certs)
            context = ServerTLS(NSQDOptions(tls_cert=files.cert, tls_key=files.key)).getContext()
            times = []
            for _ in range(a.runs):
                encrypt, receive, big = tls_layer(TLSLayer, context)
                times.append((encrypt, receive, big))
                print(
                    f"encrypt a flush {encrypt:.2f} µs  decrypt a read of FINs {receive:.2f} µs  "
                    f"encrypt a big flush {big:.1f} µs",
                    flush=True,
                )
        finally:
            shutil.rmtree(certs, ignore_errors=True)
        encrypt = statistics.median(t[0] for t in times)
        receive = statistics.median(t[1] for t in times)
        big = statistics.median(t[2] for t in times)
        print(
            f"median: encrypt a flush {encrypt:.2f} µs  decrypt a read of FINs {receive:.2f} µs  "
            f"encrypt a big flush {big:.1f} µs"
        )
        return
    if a.parse:
        from nsq_wire.parser import V2Parser

        rates = []
        for _ in range(a.runs):
            rates.append(parse(V2Parser))
            print(f"parse MPUB {rates[-1]:,.0f} msg/s", flush=True)
        print(f"median: parse MPUB {statistics.median(rates):,.0f} msg/s")
        return
    from nsq_wire.frames import FRAME_TYPE_MESSAGE
    from tests.helpers import FakeClient, make_nsqd

    if a.calls:
        calls = calls_per_message(make_nsqd, FakeClient, FRAME_TYPE_MESSAGE, a.disk)
        print(f"{calls:.1f} function calls per consumed message")
        return
    pubs, subs, kept = [], [], []
    for _ in range(a.runs):
        pubs.append(publish(make_nsqd, overflow=a.overflow))
        if a.retention:
            kept.append(publish(make_nsqd, retention=True, overflow=a.overflow))
        subs.append(consume(make_nsqd, FakeClient, FRAME_TYPE_MESSAGE, disk=a.disk))
        with_log = f"  publish with a retained log {kept[-1]:,.0f} msg/s" if kept else ""
        print(f"publish {pubs[-1]:,.0f} msg/s{with_log}  consume {subs[-1]:,.0f} msg/s", flush=True)
    line = f"median: publish {statistics.median(pubs):,.0f} msg/s  consume {statistics.median(subs):,.0f} msg/s"
    if kept:
        ratio = statistics.median(kept) / statistics.median(pubs)
        line += f"  publish with a retained log {statistics.median(kept):,.0f} msg/s ({ratio:.3f} of without)"
    print(line)


if __name__ == "__main__":
    main()
