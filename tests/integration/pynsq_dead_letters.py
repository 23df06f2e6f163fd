"""pynsq against an nsqd whose channel has ``max_attempts``: REQ everything; print what was seen.

Usage: python pynsq_dead_letters.py HOST:PORT TOPIC COUNT
The channel "work" of TOPIC must exist with max_attempts set; its dead letters
are read from TOPIC.dead, channel "inspect" (created by the reader).
"""

import json
import sys

import nsq
import tornado.ioloop

addr, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
loop = tornado.ioloop.IOLoop.current()
work: dict = {}
dead: dict = {}
pub_results: list = []


def finish_run() -> None:
    print(json.dumps({"work": work, "dead": dead, "pub": pub_results}))
    loop.stop()


def requeue_all(msg):
    work.setdefault(msg.body.decode(), []).append(msg.attempts)
    msg.enable_async()
    msg.requeue(delay=0, backoff=False)


def collect(msg):
    dead[msg.body.decode()] = {"id": msg.id.decode(), "attempts": msg.attempts, "timestamp": msg.timestamp}
    if len(dead) == count:
        loop.add_callback(finish_run)
    return True


common = dict(nsqd_tcp_addresses=[addr], max_in_flight=20, max_tries=0)
nsq.Reader(topic=topic, channel="work", message_handler=requeue_all, **common)
nsq.Reader(topic=topic + ".dead", channel="inspect", message_handler=collect, **common)
writer = nsq.Writer([addr])


def publish():
    if not writer.conns:
        loop.call_later(0.05, publish)
        return
    writer.mpub(topic, [f"m{i}".encode() for i in range(count)], callback=lambda c, d: pub_results.append(str(d)))


loop.call_later(0.2, publish)
loop.call_later(60, finish_run)
nsq.run()
