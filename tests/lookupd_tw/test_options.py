"""nsqlookupd's options: ``nsqlookupd ARGS`` and ``twistd nsqlookupd ARGS`` agree."""

from twisted.trial import unittest

from lookupd_tw.options import DEPRECATED_FLAGS, NSQLookupdOptions
from lookupd_tw.tap import Options as TwistdOptions
from tests.front_ends import FrontEndParity


class LookupdFrontEndTests(FrontEndParity, unittest.TestCase):
    cls = NSQLookupdOptions
    prog = "nsqlookupd"
    deprecated = DEPRECATED_FLAGS
    twistd_options = TwistdOptions

    def test_gos_example_config_loads_without_a_warning(self) -> None:
        # every key of Go nsqlookupd 1.3's contrib/nsqlookupd.cfg.example
        config = (
            'log_level = "info"\ntcp_address = "0.0.0.0:4160"\nhttp_address = "0.0.0.0:4161"\n'
            'broadcast_address = ""\ninactive_producer_timeout = "300s"\ntombstone_lifetime = "45s"\n'
        )
        self.assert_warnings(config, [])

    def test_durations(self) -> None:
        o = self.assert_same(["--inactive-producer-timeout", "1m", "-tombstone-lifetime=90s"])
        self.assertEqual((o.inactive_producer_timeout, o.tombstone_lifetime), (60.0, 90.0))
