import io
import os
import sys
import tempfile

from twisted.trial import unittest

from nsq_service.options import DURATION, ConfigError, parse_command_line
from nsq_wire.gofmt import DurationError, parse_duration
from nsqd_tw.options import (
    NSQD_DEPRECATED_FLAGS,
    TLS_NOT_REQUIRED,
    TLS_REQUIRED,
    TLS_REQUIRED_EXCEPT_HTTP,
    NSQDOptions,
    default_node_id,
)
from nsqd_tw.tap import Options as TwistdOptions
from tests.front_ends import FrontEndParity, write_config

GO_NSQD_EXAMPLE_CONFIG = """
log_level = "info"
tcp_address = "0.0.0.0:4150"
http_address = "0.0.0.0:4151"
https_address = "0.0.0.0:4152"
broadcast_address = ""
nsqlookupd_tcp_addresses = ["127.0.0.1:4160"]
http_client_connect_timeout = "2s"
http_client_request_timeout = "5s"
data_path = "/var/lib/nsq"
mem_queue_size = 10000
max_bytes_per_file = 104857600
sync_every = 2500
sync_timeout = "2s"
msg_timeout = "60s"
max_msg_timeout = "15m"
max_msg_size = 1024768
max_req_timeout = "1h"
max_body_size = 5123840
max_heartbeat_interval = "60s"
max_rdy_count = 2500
max_output_buffer_size = 65536
max_output_buffer_timeout = "1s"
statsd_address = "127.0.0.1:8125"
statsd_prefix = "nsq.%s"
statsd_interval = "60s"
statsd_mem_stats = true
statsd_udp_packet_size = 508
e2e_processing_latency_percentiles = [1.0, 0.99, 0.95]
e2e_processing_latency_window_time = "10m"
tls_cert = ""
tls_key = ""
tls_client_auth_policy = "require-verify"
tls_root_ca_file = ""
tls_required = false
tls_min_version = ""
deflate = true
max_deflate_level = 6
snappy = true
id = 5150
"""


def parse(*argv: str, config: str | None = None) -> NSQDOptions:
    args = list(argv)
    if config is not None:
        fd, path = tempfile.mkstemp(suffix=".cfg")
        with os.fdopen(fd, "w") as f:
            f.write(config)
        args = ["--config", path, *args]
    opts, _ = parse_command_line("nsqd", NSQDOptions, args, NSQD_DEPRECATED_FLAGS)
    assert opts is not None
    return opts


class DurationTests(unittest.TestCase):
    def test_go_forms(self) -> None:
        for text, seconds in [
            ("0", 0),
            ("1s", 1),
            ("250ms", 0.25),
            ("1m30s", 90),
            ("1.5h", 5400),
            ("100us", 1e-4),
            ("-2s", -2),
            ("1h2m3s4ms", 3723.004),
        ]:
            self.assertAlmostEqual(parse_duration(text), seconds, msg=text)

    def test_errors(self) -> None:
        for text in ["", "1", "s", "1x", "1s2"]:
            self.assertRaises(DurationError, parse_duration, text)

    def test_go_s_range(self) -> None:
        """Go's time.Duration is an int64 of nanoseconds: ParseDuration refuses past it."""
        self.assertAlmostEqual(parse_duration("2562047h47m16.854775807s"), 9223372036.854775807)
        self.assertAlmostEqual(parse_duration("-2562047h47m16.854775808s"), -9223372036.854775808)
        for text in ["2562047h47m16.854775808s", "3000000h", "9223372037s", "1" + "0" * 320 + "h", "9" * 5000 + "s"]:
            with self.assertRaises(DurationError) as e:
                parse_duration(text)
            self.assertEqual(str(e.exception), f'time: invalid duration "{text}"')

    def test_format(self) -> None:
        self.assertEqual(
            [DURATION.show(x) for x in (60, 900, 0.25, 3600, 2, 0)], ["1m0s", "15m0s", "250ms", "1h0m0s", "2s", "0s"]
        )


class CommandLineTests(unittest.TestCase):
    def test_defaults_are_gos(self) -> None:
        o = parse()
        self.assertEqual(
            (o.tcp_address, o.http_address, o.https_address, o.mem_queue_size, o.max_rdy_count, o.msg_timeout),
            ("0.0.0.0:4150", "0.0.0.0:4151", "0.0.0.0:4152", 10000, 2500, 60.0),
        )
        self.assertEqual((o.max_msg_size, o.max_body_size, o.max_req_timeout), (1048576, 5242880, 3600.0))
        self.assertEqual((o.sync_every, o.sync_timeout, o.max_bytes_per_file), (2500, 2.0, 104857600))
        self.assertEqual((o.deflate, o.snappy, o.statsd_mem_stats, o.node_id), (True, True, True, default_node_id()))

    def test_go_flag_syntax(self) -> None:
        o = parse(
            "-tcp-address",
            "127.0.0.1:1",
            "--http-address=127.0.0.1:2",
            "-mem-queue-size=5",
            "--lookupd-tcp-address",
            "a:1",
            "-lookupd-tcp-address=b:2",
            "--snappy=false",
            "-deflate",
            "--verbose",
            "-msg-timeout",
            "1m30s",
            "-e2e-processing-latency-percentile",
            "0.5,0.99",
            "--e2e-processing-latency-percentile=1.0",
            "-tls-required=tcp-https",
        )
        self.assertEqual((o.tcp_address, o.http_address, o.mem_queue_size), ("127.0.0.1:1", "127.0.0.1:2", 5))
        self.assertEqual(o.lookupd_tcp_addresses, ["a:1", "b:2"])
        self.assertEqual((o.snappy, o.deflate, o.msg_timeout), (False, True, 90.0))
        self.assertEqual(o.e2e_processing_latency_percentiles, [1.0, 0.99, 0.5])
        self.assertEqual(o.tls_required, TLS_REQUIRED_EXCEPT_HTTP)

    def test_bare_tls_required_means_true(self) -> None:
        self.assertEqual(parse("--tls-required").tls_required, TLS_REQUIRED)

    def test_bad_value_exits_2(self) -> None:
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        e = self.assertRaises(SystemExit, parse, "--mem-queue-size", "lots")
        self.assertEqual(e.code, 2)
        self.assertIn('invalid value "lots" for flag -mem-queue-size', err.getvalue())

    def test_unknown_flag_exits_2(self) -> None:
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        e = self.assertRaises(SystemExit, parse, "--no-such-flag")
        self.assertEqual(e.code, 2)
        self.assertIn("--no-such-flag", err.getvalue())

    def test_config_file(self) -> None:
        o = parse(
            config="""
id = 77
tcp_address = "127.0.0.1:4000"
mem_queue_size = 123
msg_timeout = "30s"
max_req_timeout = 5000
nsqlookupd_tcp_addresses = ["l1:4160", "l2:4160"]
e2e_processing_latency_percentiles = [0.5, 1.0]
tls_required = false
log_level = "debug"
unknown_key = "ignored"
""",
        )
        self.assertEqual((o.node_id, o.tcp_address, o.mem_queue_size), (77, "127.0.0.1:4000", 123))
        self.assertEqual((o.msg_timeout, o.max_req_timeout), (30.0, 5.0))
        self.assertEqual(o.lookupd_tcp_addresses, ["l1:4160", "l2:4160"])
        self.assertEqual(o.e2e_processing_latency_percentiles, [0.5, 1.0])
        self.assertEqual((o.tls_required, o.log_level), (TLS_NOT_REQUIRED, "debug"))

    def test_flag_beats_config(self) -> None:
        o = parse("--mem-queue-size", "9", config="mem_queue_size = 123\nmax_rdy_count = 5\n")
        self.assertEqual((o.mem_queue_size, o.max_rdy_count), (9, 5))

    def test_bad_config(self) -> None:
        self.assertRaises(ConfigError, parse, config="log_level = 'loud'\n")
        self.assertRaises(ConfigError, parse, config="this is not toml")
        self.assertRaises(ConfigError, parse, "--config", "/nonexistent.cfg")

    def test_version_returns_none(self) -> None:
        opts, _ = parse_command_line("nsqd", NSQDOptions, ["--version"])
        self.assertIsNone(opts)

    def test_drain_options(self) -> None:
        """Beyond Go: off by default; flags and TOML keys; bad values said clearly."""
        o = parse()
        self.assertEqual((o.sigterm_mode, o.drain_timeout), ("shutdown", 0.0))
        o = parse("--sigterm-mode", "drain", "-drain-timeout=1m30s")
        self.assertEqual((o.sigterm_mode, o.drain_timeout), ("drain", 90.0))
        o = parse(config='sigterm_mode = "drain"\ndrain_timeout = "10s"\n')
        self.assertEqual((o.sigterm_mode, o.drain_timeout), ("drain", 10.0))
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        e = self.assertRaises(SystemExit, parse, "--sigterm-mode", "later")
        self.assertEqual(e.code, 2)
        self.assertIn(
            'invalid value "later" for flag -sigterm-mode: unknown sigterm mode "later" (shutdown or drain)',
            err.getvalue(),
        )
        e = self.assertRaises(ConfigError, parse, config='sigterm_mode = "later"\n')
        self.assertEqual(
            str(e),
            "Resolve failed to coerce value 'later' for field sigterm_mode - "
            'unknown sigterm mode "later" (shutdown or drain)',
        )

    def test_replication_max_lag_bytes(self) -> None:
        """Beyond Go: the async lag bound in bytes, 64 MiB unless told; flag and TOML key."""
        self.assertEqual(parse().replication_max_lag_bytes, 64 << 20)
        self.assertEqual(parse("--replication-max-lag-bytes", "1048576").replication_max_lag_bytes, 1 << 20)
        self.assertEqual(parse(config="replication_max_lag_bytes = 4096\n").replication_max_lag_bytes, 4096)


class ValidateTests(unittest.TestCase):
    def check(self, text: str, **kwargs) -> None:
        e = self.assertRaises(ConfigError, NSQDOptions(**kwargs).validate)
        self.assertEqual(str(e), text)

    def test_go_texts(self) -> None:
        self.check("--node-id must be [0,1024)", node_id=1024)
        self.check("--max-deflate-level must be [1,9]", max_deflate_level=0)
        self.check("cannot require TLS client connections without TLS key and cert", tls_required=TLS_REQUIRED)
        self.check("invalid E2E processing latency percentile: 1.5", e2e_processing_latency_percentiles=[1.5])
        self.check("--auth-http-request-method must be post or get", auth_http_request_method="put")

    def test_drain_options(self) -> None:
        self.check('--sigterm-mode must be shutdown or drain, not "later"', sigterm_mode="later")
        self.check("--drain-timeout must be >= 0", drain_timeout=-1.0)

    def test_replication_options(self) -> None:
        self.check("--replication-max-lag-bytes must be >= 1", replication_max_lag_bytes=0)

    def test_client_auth_policy_implies_tls_required(self) -> None:
        o = NSQDOptions(tls_client_auth_policy="require", tls_cert="c", tls_key="k")
        o.validate()
        self.assertEqual(o.tls_required, TLS_REQUIRED)


class TwistdOptionsTests(unittest.TestCase):
    def test_same_table(self) -> None:
        config = TwistdOptions()
        config.parseOptions(
            [
                "--tcp-address",
                "127.0.0.1:1",
                "--no-snappy",
                "--lookupd-tcp-address",
                "a:1",
                "--lookupd-tcp-address=b:2",
                "--msg-timeout",
                "10s",
            ]
        )
        o = config.resolved
        self.assertEqual((o.tcp_address, o.snappy, o.msg_timeout), ("127.0.0.1:1", False, 10.0))
        self.assertEqual(o.lookupd_tcp_addresses, ["a:1", "b:2"])

    def test_bad_value_exits_2_as_nsqd_does(self) -> None:
        err = io.StringIO()
        self.patch(sys, "stderr", err)
        e = self.assertRaises(SystemExit, TwistdOptions().parseOptions, ["--max-rdy-count", "x"])
        self.assertEqual(e.code, 2)
        self.assertIn('invalid value "x" for flag -max-rdy-count', err.getvalue())


class NSQDFrontEndTests(FrontEndParity, unittest.TestCase):
    """``nsqd ARGS`` and ``twistd nsqd ARGS`` resolve to the same NSQDOptions."""

    cls = NSQDOptions
    prog = "nsqd"
    deprecated = NSQD_DEPRECATED_FLAGS
    twistd_options = TwistdOptions

    def test_tls_required_tri_state(self) -> None:
        for argv, want in [
            (["--tls-required"], TLS_REQUIRED),
            (["-tls-required"], TLS_REQUIRED),
            (["--tls-required", "--tcp-address", "127.0.0.1:0"], TLS_REQUIRED),
            (["--tls-required=true"], TLS_REQUIRED),
            (["--tls-required", "true"], TLS_REQUIRED),
            (["--tls-required=false"], TLS_NOT_REQUIRED),
            (["--tls-required", "false"], TLS_NOT_REQUIRED),
            (["--tls-required=tcp-https"], TLS_REQUIRED_EXCEPT_HTTP),
            (["--tls-required", "tcp-https"], TLS_REQUIRED_EXCEPT_HTTP),
            ([], TLS_NOT_REQUIRED),
        ]:
            self.assertEqual(self.assert_same(argv).tls_required, want, argv)

    def test_gos_example_config_loads_without_a_warning(self) -> None:
        # every key of Go nsqd 1.3's contrib/nsqd.cfg.example, with its values
        self.assert_warnings(GO_NSQD_EXAMPLE_CONFIG, [])
        path = write_config(GO_NSQD_EXAMPLE_CONFIG)
        self.addCleanup(os.remove, path)
        o = self.assert_same(["--config", path])
        self.assertEqual(
            (o.lookupd_tcp_addresses, o.max_body_size, o.tls_min_version), (["127.0.0.1:4160"], 5123840, "tls1.0")
        )

    def test_lists_repeat_and_floats_sort(self) -> None:
        o = self.assert_same(
            [
                "--lookupd-tcp-address",
                "a:1",
                "-lookupd-tcp-address=b:2",
                "--auth-http-address=x:1",
                "-e2e-processing-latency-percentile",
                "0.5,0.99",
                "--e2e-processing-latency-percentile=1.0",
            ]
        )
        self.assertEqual(o.lookupd_tcp_addresses, ["a:1", "b:2"])
        self.assertEqual(o.auth_http_addresses, ["x:1"])
        self.assertEqual(o.e2e_processing_latency_percentiles, [1.0, 0.99, 0.5])

    def test_twistd_keeps_no_prefix_for_booleans(self) -> None:
        config = TwistdOptions()
        config.parseOptions(["--no-snappy", "--no-statsd-mem-stats", "--deflate=false", "--no-tls-required"])
        o = config.resolved
        self.assertEqual((o.snappy, o.statsd_mem_stats, o.deflate, o.tls_required), (False, False, False, 0))
        config = TwistdOptions()
        config.parseOptions(["--no-snappy", "--snappy"])
        self.assertTrue(config.resolved.snappy)

    def test_twistd_options_expose_resolved_values(self) -> None:
        config = TwistdOptions()
        config.parseOptions(["--tcp-address", "127.0.0.1:1", "--tls-required", "--msg-timeout=2s"])
        self.assertEqual(
            (config["tcp-address"], config["tls-required"], config["msg-timeout"]), ("127.0.0.1:1", TLS_REQUIRED, 2.0)
        )


class ConfigValueTests(unittest.TestCase):
    def test_a_list_of_non_numbers_is_a_config_error(self) -> None:
        e = self.assertRaises(ConfigError, parse, config='e2e_processing_latency_percentiles = ["x"]\n')
        self.assertIn("e2e_processing_latency_percentiles", str(e))
        e = self.assertRaises(ConfigError, parse, config="e2e_processing_latency_percentiles = [true]\n")
        self.assertIn("e2e_processing_latency_percentiles", str(e))

    def test_numeric_strings_in_a_float_list(self) -> None:
        o = parse(config='e2e_processing_latency_percentiles = ["0.5", 1]\n')
        self.assertEqual(o.e2e_processing_latency_percentiles, [0.5, 1.0])
