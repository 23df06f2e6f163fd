"""Consume (and FIN) as fast as possible, like Go's bench_reader.

python bench/bench_reader.py --nsqd-tcp-address 127.0.0.1:4150 --channel ch --runfor 10s
"""

from __future__ import annotations

import struct
import time

from _common import FEATURES, base_parser, connect, expect_ok, features, run_workers

from nsq_wire.commands import encode_command

_FRAME = struct.Struct(">ii")


def sub_worker(address: str, topic: str, channel: str, rdy: int, *, ready, runfor: float) -> int:  # type: ignore[no-untyped-def]
    s = connect(address, "bench_reader")
    s.sendall(encode_command(b"SUB", topic, channel))
    buf = bytearray()
    expect_ok(s, buf)
    ready.wait()
    s.sendall(b"RDY %d\n" % rdy)
    end = time.perf_counter() + runfor
    s.settimeout(0.5)
    count = 0
    unpack = _FRAME.unpack_from
    pending = bytearray()
    while time.perf_counter() < end:
        try:
            chunk = s.recv(1 << 18)
        except TimeoutError:
            continue
        if not chunk:
            break
        if buf:
            buf += chunk
            data = bytes(buf)
        else:
            data = chunk
        pos = 0
        n = len(data)
        fins = []
        while n - pos >= 8:
            size, ft = unpack(data, pos)
            if n - pos - 4 < size:
                break
            if ft == 2:
                fins.append(data[pos + 18 : pos + 34])
            elif ft == 0 and data[pos + 8 : pos + 4 + size] == b"_heartbeat_":
                pending += b"NOP\n"
            pos += 4 + size
        buf = bytearray(data[pos:])
        if fins:
            count += len(fins)
            pending += b"FIN " + b"\nFIN ".join(fins) + b"\n"
        if pending:
            s.sendall(pending)
            pending = bytearray()
    s.close()
    return count


def main() -> None:
    p = base_parser("bench_reader")
    p.add_argument("--channel", "-channel", default="ch", help="channel to receive messages on")
    p.add_argument("--rdy", "-rdy", type=int, default=2500, help="RDY count to use")
    a = p.parse_args()
    FEATURES.update(features(a))
    run_workers(
        "bench_reader",
        sub_worker,
        (a.nsqd_tcp_address, a.topic, a.channel, a.rdy),
        a.workers,
        a.runfor,
        a.size,
        a.json,
    )


if __name__ == "__main__":
    main()
