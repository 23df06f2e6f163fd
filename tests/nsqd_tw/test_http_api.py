from treq.testing import StubTreq
from twisted.internet import defer
from twisted.trial import unittest

from nsqd_tw.http_api import NSQDHTTPAPI
from tests.helpers import make_nsqd


class PingTests(unittest.TestCase):
    def setUp(self) -> None:
        self.nsqd = make_nsqd()
        self.treq = StubTreq(NSQDHTTPAPI(self.nsqd).resource())

    @defer.inlineCallbacks
    def test_ok(self):
        resp = yield self.treq.get("http://nsqd/ping")
        self.assertEqual(resp.code, 200)
        self.assertEqual((yield resp.content()), b"OK")
        self.assertEqual(resp.headers.getRawHeaders("content-type"), ["text/plain; charset=utf-8"])

    @defer.inlineCallbacks
    def test_unhealthy(self):
        self.nsqd.set_health(OSError("disk full"))
        resp = yield self.treq.get("http://nsqd/ping")
        self.assertEqual(resp.code, 500)
        self.assertEqual((yield resp.content()), b"NOK - disk full")
