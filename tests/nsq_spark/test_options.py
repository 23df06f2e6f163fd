"""The nsq data source's options, checked before anything connects."""

from __future__ import annotations

from twisted.trial import unittest

from nsq_spark.options import NSQOptions, OptionError


class OptionTests(unittest.TestCase):
    def parse(self, reading: bool = True, **options: str) -> NSQOptions:
        base = {
            "topic": "events",
            "channel": "spark",
            "nsqdTcpAddresses": "127.0.0.1:4150",
            "stagingLocation": "/tmp/nsq-staging",
        }
        return NSQOptions.parse({**base, **options}, reading=reading)

    def test_defaults(self):
        o = self.parse()
        self.assertEqual(o.nsqd_addresses, ["127.0.0.1:4150"])
        self.assertEqual((o.max_messages_per_batch, o.max_in_flight, o.rows_per_partition), (10000, 2500, 25000))
        self.assertEqual((o.staging_location, o.nsqd_http_addresses), ("/tmp/nsq-staging", []))
        self.assertEqual((o.msg_timeout, o.idle_timeout, o.lookupd_poll_interval), (0.0, 2.0, 60.0))
        self.assertEqual(o.no_node_timeout, 60.0)
        self.assertEqual(self.parse(noNodeTimeout="0").no_node_timeout, 0.0)  # keep trying forever
        self.assertEqual(self.parse(NONODETIMEOUT="90s").no_node_timeout, 90.0)
        self.assertFalse(o.tls.enabled)
        self.assertIsNone(o.auth_secret)

    def test_names_are_case_insensitive_and_lists_split(self):
        o = NSQOptions.parse(
            {
                "TOPIC": "t",
                "Channel": "c",
                "lookupdhttpaddresses": "a:4161, b:4161",
                "MSGTIMEOUT": "90s",
                "idleTimeout": "500",
                "TLS": "true",
                "tlsRootCaFile": "/ca.pem",
                "STAGINGLOCATION": "file:///tmp/s",
            },
            reading=True,
        )
        self.assertEqual(o.lookupd_addresses, ["a:4161", "b:4161"])
        self.assertEqual((o.msg_timeout, o.idle_timeout), (90.0, 0.5))
        self.assertTrue(o.tls.enabled)
        self.assertEqual(o.tls.root_ca_file, "/ca.pem")
        self.assertEqual(o.connect_options().msg_timeout_ms, 90000)

    def test_errors(self):
        cases = [
            ({"topic": ""}, 'the "topic" option is required'),
            ({"topic": "a b"}, "topic name 'a b' is not valid"),
            ({"channel": ""}, 'the "channel" option is required to read a topic'),
            ({"channel": "x" * 65}, "is not valid"),
            ({"nsqdTcpAddresses": ""}, 'give "nsqdTcpAddresses" or "lookupdHttpAddresses"'),
            ({"snappy": "true", "deflate": "true"}, "snappy and deflate cannot both be enabled"),
            ({"maxMessagesPerBatch": "0"}, "option maxmessagesperbatch: 0 is below 1"),
            ({"maxInFlight": "lots"}, "option maxinflight: 'lots' is not an integer"),
            ({"msgTimeout": "soon"}, 'option msgtimeout: time: invalid duration "soon"'),
            ({"tls": "maybe"}, "option tls: 'maybe' is not a boolean"),
            ({"noNodeTimeout": "never"}, 'option nonodetimeout: time: invalid duration "never"'),
            ({"stagingLocation": ""}, 'the "stagingLocation" option is required to read a topic'),
            ({"stagingLocation": "s3://bucket/x"}, "only local or mounted POSIX filesystems"),
        ]
        for options, text in cases:
            with self.assertRaises(OptionError) as e:
                self.parse(**options)
            self.assertIn(text, str(e.exception))

    def test_writing_needs_no_channel(self):
        o = self.parse(reading=False, channel="", stagingLocation="")
        self.assertEqual(o.channel, "")

    def test_options_pickle(self):
        import pickle

        o = self.parse(tls="true", authSecret="s")
        self.assertEqual(pickle.loads(pickle.dumps(o)), o)
