"""Publish as fast as possible with MPUB, like Go's bench_writer.

python bench/bench_writer.py --nsqd-tcp-address 127.0.0.1:4150 --size 200 --batch-size 200 --runfor 10s
"""

from __future__ import annotations

import time

from _common import FEATURES, base_parser, connect, expect_ok, features, run_workers

from nsq_wire.commands import mpub


def pub_worker(address: str, topic: str, size: int, batch_size: int, *, ready, runfor: float) -> int:  # type: ignore[no-untyped-def]
    s = connect(address, "bench_writer")
    command = mpub(topic, [b"a" * size] * batch_size)
    buf = bytearray()
    count = 0
    ready.wait()
    end = time.perf_counter() + runfor
    while True:
        s.sendall(command)
        expect_ok(s, buf)
        count += batch_size
        if time.perf_counter() >= end:
            break
    s.close()
    return count


def main() -> None:
    p = base_parser("bench_writer")
    p.add_argument("--batch-size", "-batch-size", type=int, default=200, help="batch size of messages")
    a = p.parse_args()
    FEATURES.update(features(a))
    run_workers(
        "bench_writer",
        pub_worker,
        (a.nsqd_tcp_address, a.topic, a.size, a.batch_size),
        a.workers,
        a.runfor,
        a.size,
        a.json,
    )


if __name__ == "__main__":
    main()
