"""pynsq Reader that knows only an nsqlookupd; prints the bodies it got as JSON.

Usage: python pynsq_lookupd.py LOOKUPD_HTTP TOPIC COUNT
"""

import json
import sys

import nsq
import tornado.ioloop

lookupd, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
loop = tornado.ioloop.IOLoop.current()
got: list[str] = []


def handler(msg):
    got.append(msg.body.decode())
    if len(got) == count:
        loop.add_callback(loop.stop)
    return True


reader = nsq.Reader(
    topic=topic,
    channel="c",
    message_handler=handler,
    lookupd_http_addresses=[f"http://{lookupd}"],
    lookupd_poll_interval=1,
    max_in_flight=20,
)
loop.call_later(150, loop.stop)  # a bound for a failing run only
nsq.run()
print(json.dumps(got))
