"""Run pynsq (a client no one here wrote) against an nsqd; print what it saw.

Usage: python pynsq_interop.py HOST:PORT TOPIC
Channels "a" (two Readers) and "b" (one Reader) must already exist.
"""

import json
import sys

import nsq
import tornado.ioloop

addr, topic = sys.argv[1], sys.argv[2]
loop = tornado.ioloop.IOLoop.current()
expected = {f"m{i}" for i in range(20)} | {f"p{i}" for i in range(5)} | {"d0"}
seen: dict = {"a": {}, "b": {}}
per_reader: dict = {}
pub_results: list = []
state = {"m7_finished": False}


def finish_run() -> None:
    print(json.dumps({"seen": seen, "per_reader": per_reader, "pub": pub_results, "m7": state["m7_finished"]}))
    loop.stop()


def done() -> bool:
    a, b = seen["a"], seen["b"]
    return (
        set(a) == expected
        and set(b) == expected
        and a["m3"] == [1, 2]
        and a["m5"] == [1, 2]
        and state["m7_finished"]
        and len(pub_results) == 7
    )


def check() -> None:
    if done():
        loop.add_callback(finish_run)


def handler(channel: str, reader: str):
    def handle(msg):
        body = msg.body.decode()
        seen[channel].setdefault(body, []).append(msg.attempts)
        per_reader[reader] = per_reader.get(reader, 0) + 1
        if channel == "a" and msg.attempts == 1:
            if body == "m3":
                msg.enable_async()
                msg.requeue(delay=0, backoff=False)
                return None
            if body == "m5":
                msg.enable_async()  # never answered: nsqd must time it out
                return None
            if body == "m7":
                msg.enable_async()
                touches = [0]

                def tick():
                    if touches[0] < 4:
                        msg.touch()
                        touches[0] += 1
                        loop.call_later(0.4, tick)
                    else:
                        msg.finish()
                        state["m7_finished"] = True
                        check()

                loop.call_later(0.4, tick)
                return None
        check()
        return True

    return handle


common = dict(nsqd_tcp_addresses=[addr], max_in_flight=10, msg_timeout=1.0)
readers = [
    nsq.Reader(topic=topic, channel="a", message_handler=handler("a", "a1"), **common),
    nsq.Reader(topic=topic, channel="a", message_handler=handler("a", "a2"), **common),
    nsq.Reader(topic=topic, channel="b", message_handler=handler("b", "b1"), **common),
]
writer = nsq.Writer([addr])


def record(conn, data):
    pub_results.append(data.decode() if isinstance(data, bytes) else repr(data))
    check()


def publish():
    if not writer.conns:
        loop.call_later(0.05, publish)
        return
    writer.mpub(topic, [f"m{i}".encode() for i in range(20)], callback=record)
    for i in range(5):
        writer.pub(topic, f"p{i}".encode(), callback=record)
    writer.dpub(topic, 500, b"d0", callback=record)


loop.call_later(0.05, publish)
loop.call_later(40, finish_run)
nsq.run()
