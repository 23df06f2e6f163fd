"""pynsq with TLS, snappy, deflate, client certificates and AUTH; print what it saw.

Usage: python pynsq_secure.py CONFIG_JSON
CONFIG_JSON: {"addr": "HOST:PORT", "topic": ..., "channel": ..., "count": N,
              "conn": {pynsq connection options: tls_v1, snappy, deflate, auth_secret,
                       tls_options: {ca_certs, certfile, keyfile}}}
Publishes ``count`` messages (one MPUB and single PUBs) with a Writer and reads
them back with a Reader; prints {"pub": [...], "received": [...], "errors": [...]}.
"""

import json
import ssl
import sys

import nsq
import tornado.ioloop

config = json.loads(sys.argv[1])
addr, topic, channel, count = config["addr"], config["topic"], config["channel"], config["count"]
conn_options = dict(config["conn"])
if "tls_options" in conn_options:
    conn_options["tls_options"] = {"ssl_version": ssl.PROTOCOL_TLS_CLIENT, **conn_options["tls_options"]}
loop = tornado.ioloop.IOLoop.current()
pub_results: list = []
received: list = []
errors: list = []
expected = [f"msg-{i}" for i in range(count)]


def finish_run() -> None:
    print(json.dumps({"pub": pub_results, "received": sorted(received), "errors": errors}))
    loop.stop()


def check() -> None:
    if len(pub_results) == 1 + count // 2 and (sorted(received) == sorted(expected) or errors):
        loop.add_callback(finish_run)


def handle(msg):
    received.append(msg.body.decode())
    check()
    return True


def record(conn, data):
    if isinstance(data, Exception):
        errors.append(str(data))
    pub_results.append(data.decode() if isinstance(data, bytes) else f"error: {data}")
    check()


reader = nsq.Reader(
    topic=topic, channel=channel, message_handler=handle, nsqd_tcp_addresses=[addr], max_in_flight=50, **conn_options
)
writer = nsq.Writer([addr], **conn_options)


def publish():
    if not writer.conns:
        loop.call_later(0.05, publish)
        return
    half = count // 2
    writer.mpub(topic, [m.encode() for m in expected[:half]], callback=record)
    for m in expected[half:]:
        writer.pub(topic, m.encode(), callback=record)


loop.call_later(0.2, publish)
loop.call_later(30, finish_run)
nsq.run()
