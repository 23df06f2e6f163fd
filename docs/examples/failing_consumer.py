"""A consumer whose every message fails: it REQs each one at once, as a poison message makes a
real consumer do, and prints each delivery (ID, body, attempts). Stops after COUNT deliveries,
or 5 s without one.

    python docs/examples/failing_consumer.py 127.0.0.1:4150 TOPIC CHANNEL COUNT
"""

from __future__ import annotations

import sys

from nsq_client.blocking import Connection, ConnectOptions, TLSConfig
from nsq_wire.frames import FRAME_TYPE_MESSAGE
from nsq_wire.message import decode


def main(address: str, topic: str, channel: str, count: int) -> None:
    conn = Connection(address, ConnectOptions(TLSConfig())).open()
    conn.subscribe(topic, channel)
    conn.rdy(1)
    seen = 0
    while seen < count:
        frames = conn.poll_frames(5.0)
        if not frames:
            break
        for frame_type, data in frames:
            if frame_type != FRAME_TYPE_MESSAGE:
                continue
            msg_id, body, _timestamp, attempts = decode(data)
            print(f"{msg_id.decode()} {body.decode(errors='replace')!r} attempt {attempts}: failed, requeued")
            conn.req(msg_id)
            seen += 1
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
