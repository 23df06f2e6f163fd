"""pynsq Reader through nsqlookupd, for the replication failover tests: writes one
line per message, ``NODE BODY TIMESTAMP`` (NODE: the nsqd it came from;
TIMESTAMP: the message's, in nanoseconds, set by the nsqd that took the publish),
FINs it, and stops when its stdin closes.

Usage: python pynsq_failover.py LOOKUPD_HTTP TOPIC
"""

import sys

import nsq
import tornado.ioloop

lookupd, topic = sys.argv[1], sys.argv[2]
loop = tornado.ioloop.IOLoop.current()
current = {"node": ""}


class Reader(nsq.Reader):  # type: ignore[misc]
    def _on_message(self, conn, message, **kwargs):  # type: ignore[no-untyped-def]
        current["node"] = conn.id  # the handler below is called from here, synchronously
        super()._on_message(conn, message, **kwargs)


def handler(msg):  # type: ignore[no-untyped-def]
    sys.stdout.write(f"{current['node']} {msg.body.decode()} {msg.timestamp}\n")
    sys.stdout.flush()
    return True


def stdin_closed(fd, events):  # type: ignore[no-untyped-def]
    loop.stop()


reader = Reader(
    topic=topic,
    channel="c",
    message_handler=handler,
    lookupd_http_addresses=[f"http://{lookupd}"],
    lookupd_poll_interval=1,
    max_in_flight=200,
)
loop.add_handler(sys.stdin.fileno(), stdin_closed, loop.READ)
loop.call_later(300, loop.stop)  # a bound for a failing run only
nsq.run()
