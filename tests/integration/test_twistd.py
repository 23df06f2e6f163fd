"""``twistd nsqd`` and ``twistd nsqlookupd`` are the same programs as ``nsqd`` and ``nsqlookupd``.

Each test runs the console command and twistd with the same arguments and
compares what an operator sees: what plain HTTP is allowed to do, the FATAL
line and exit status of a refused start, the warnings, the listening lines.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import treq
from treq.client import HTTPClient
from twisted.internet import defer, reactor, ssl, task
from twisted.trial import unittest
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool

from tests.certs import make_certs
from tests.integration.procs import ServerProcess, command

Completed = subprocess.CompletedProcess[str]
_STAMP = re.compile(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6}")


def twistd_argv(app: str, *args: str) -> list[str]:
    return [*command("twistd"), "-n", "--pidfile=", "--logfile=-", app, *args]


class FrontEndsTestCase(unittest.TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.dir = os.path.abspath(self.mktemp())
        os.makedirs(self.dir)

    def start(self, app: str, *args: str, twistd: bool, wait_for: tuple[str, ...] = ("TCP", "HTTP")) -> ServerProcess:
        if twistd:
            proc = ServerProcess("twistd", argv=twistd_argv(app, *args), cwd=self.dir, stdout=True)
        else:
            proc = ServerProcess(app, *args, cwd=self.dir)
        proc.start(wait_for)
        self.addCleanup(proc.kill)
        return proc

    def run_both(
        self, app: str, *args: str
    ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        run = {"cwd": self.dir, "capture_output": True, "text": True, "timeout": 60}
        ours = subprocess.run([*command(app), *args], **run)  # type: ignore[call-overload]
        theirs = subprocess.run(twistd_argv(app, *args), **run)  # type: ignore[call-overload]
        return ours, theirs


class TLSRequiredTests(FrontEndsTestCase):
    """Under twistd, ``--tls-required`` (bare or with a value) protects plain HTTP as nsqd's does."""

    @defer.inlineCallbacks
    def observe(self, *tls_required: str, twistd: bool) -> defer.Deferred:
        certs = self.certs = getattr(self, "certs", None) or make_certs(os.path.join(self.dir, "certs"))
        proc = self.start(
            "nsqd",
            "--tcp-address",
            "127.0.0.1:0",
            "--http-address",
            "127.0.0.1:0",
            "--https-address",
            "127.0.0.1:0",
            "--data-path",
            self.mktemp_dir(),
            "--tls-cert",
            certs.cert,
            "--tls-key",
            certs.key,
            *tls_required,
            twistd=twistd,
            wait_for=("TCP", "HTTP", "HTTPS"),
        )
        http = proc.addresses["HTTP"]
        resp = yield treq.post(f"http://{http}/pub?topic=t", b"plain", persistent=False)
        body = (yield resp.content()).replace(b"%d" % proc.port("HTTPS"), b"HTTPS_PORT")
        with open(certs.ca, "rb") as f:
            trust = ssl.Certificate.loadPEM(f.read())
        pool = HTTPConnectionPool(reactor, persistent=False)
        https = HTTPClient(Agent(reactor, BrowserLikePolicyForHTTPS(trustRoot=trust), pool=pool))
        config = yield https.get(f"https://{proc.addresses['HTTPS']}/config/tls_required")
        return resp.code, body, json.loads((yield config.content()))

    def mktemp_dir(self) -> str:
        path = os.path.abspath(self.mktemp())
        os.makedirs(path)
        return path

    @defer.inlineCallbacks
    def test_every_form_under_twistd_as_under_nsqd(self):
        refused = (403, b'{"message": "TLS_REQUIRED", "https_port": HTTPS_PORT}', 2)
        for args, want in [
            (("--tls-required",), refused),
            (("--tls-required=true",), refused),
            (("--tls-required", "true"), refused),
            (("--tls-required=tcp-https",), (200, b"OK", 1)),
            (("--tls-required=false",), (200, b"OK", 0)),
        ]:
            nsqd = yield self.observe(*args, twistd=False)
            twistd = yield self.observe(*args, twistd=True)
            self.assertEqual(nsqd, want, args)
            self.assertEqual(twistd, want, args)


def fatal_lines(text: str) -> list[str]:
    return [_STAMP.sub("TIME", line) for line in text.splitlines() if "FATAL" in line]


class RefusedStartTests(FrontEndsTestCase):
    """A bad config file or value: the same one FATAL line (or flag error) and exit status."""

    def assert_same_refusal(self, app: str, *args: str, code: int = 1) -> str:
        ours, theirs = self.run_both(app, *args)
        self.assertEqual(ours.returncode, code, ours.stderr)
        self.assertEqual(theirs.returncode, code, theirs.stdout + theirs.stderr)
        for noise in ("Traceback", "Usage:", "Options:"):
            self.assertNotIn(noise, theirs.stdout + theirs.stderr)
        if code == 1:
            self.assertEqual(len(fatal_lines(ours.stderr)), 1, ours.stderr)
            self.assertEqual(fatal_lines(theirs.stderr), fatal_lines(ours.stderr))
            self.assertEqual(theirs.stdout, "")
        else:
            self.assertEqual(theirs.stderr.replace(f"twistd {app} -help", f"{app} -help"), ours.stderr)
        return fatal_lines(theirs.stderr)[0] if code == 1 else theirs.stderr

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return name

    def test_toml_syntax_error(self) -> None:
        bad = self.write("bad.toml", "this is not toml\n")
        for app in ("nsqd", "nsqlookupd"):
            line = self.assert_same_refusal(app, "--config", bad)
            self.assertIn(f"[{app}] TIME FATAL: failed to load config file bad.toml - ", line)

    def test_missing_config_file(self) -> None:
        for app in ("nsqd", "nsqlookupd"):
            line = self.assert_same_refusal(app, "--config", "nonexistent.toml")
            self.assertIn("FATAL: failed to load config file nonexistent.toml - ", line)

    def test_bad_value_in_config_file(self) -> None:
        nsqd = self.write("nsqd.toml", 'mem_queue_size = "lots"\n')
        line = self.assert_same_refusal("nsqd", "--config", nsqd)
        self.assertIn("FATAL: Resolve failed to coerce value 'lots' for field mem_queue_size", line)
        lookupd = self.write("lookupd.toml", 'tombstone_lifetime = "forever"\n')
        line = self.assert_same_refusal("nsqlookupd", "--config", lookupd)
        self.assertIn("FATAL: Resolve failed to coerce value 'forever' for field tombstone_lifetime", line)

    def test_bad_value_found_by_validation(self) -> None:
        loopback = ("--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0")
        line = self.assert_same_refusal("nsqd", *loopback, "--max-deflate-level", "0")
        self.assertIn("[nsqd] TIME FATAL: failed to instantiate nsqd - --max-deflate-level must be [1,9]", line)
        line = self.assert_same_refusal("nsqd", *loopback, "--tls-cert", "missing.pem", "--tls-key", "missing.key")
        self.assertIn("FATAL: failed to instantiate nsqd - failed to build TLS config - open missing.pem: ", line)
        line = self.assert_same_refusal("nsqd", *loopback, "--log-prefix", "[x] ", "--node-id", "1024")
        self.assertIn("[x] TIME FATAL: failed to instantiate nsqd - --node-id must be [0,1024)", line)

    def test_tcp_only_listener_given_a_path(self) -> None:
        """HTTPS and nsqlookupd's listeners are TCP only in Go: a path is refused, never a unix socket."""
        certs = make_certs(os.path.join(self.dir, "certs"))
        loopback = ("--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--data-path", ".")
        tls = ("--tls-cert", certs.cert, "--tls-key", certs.key)
        for app, args, address in [
            ("nsqd", (*loopback, *tls, "--https-address", "https.sock"), "https.sock"),
            ("nsqlookupd", ("--tcp-address", "lookupd.sock", "--http-address", "127.0.0.1:0"), "lookupd.sock"),
            ("nsqlookupd", ("--tcp-address", "127.0.0.1:0", "--http-address", "lookupd.sock"), "lookupd.sock"),
        ]:
            line = self.assert_same_refusal(app, *args)
            self.assertIn(
                f"FATAL: failed to instantiate {app} - listen ({address}) failed - "
                f"listen tcp: address {address}: missing port in address",
                line,
            )
            self.assertFalse(os.path.exists(os.path.join(self.dir, address)))

    def test_bad_flag_value(self) -> None:
        text = self.assert_same_refusal("nsqd", "--mem-queue-size", "lots", code=2)
        self.assertIn('invalid value "lots" for flag -mem-queue-size', text)
        text = self.assert_same_refusal("nsqd", "--tls-required=maybe", code=2)
        self.assertIn('invalid value "maybe" for flag -tls-required', text)
        text = self.assert_same_refusal("nsqlookupd", "-tombstone-lifetime", "10", code=2)
        self.assertIn("missing unit in duration", text)


class UnknownConfigKeyTests(FrontEndsTestCase):
    """A typo'd --config key is named in a WARNING, under every front end."""

    def test_typo_is_named(self) -> None:
        with open(os.path.join(self.dir, "typo.toml"), "w") as f:
            f.write('tcp-address = "127.0.0.1:4150"\ntcp_address = "127.0.0.1:0"\nhttp_address = "127.0.0.1:0"\n')
        want = 'config file typo.toml: unknown key "tcp-address" ignored (did you mean "tcp_address"?)'
        for app, twistd in (("nsqd", False), ("nsqlookupd", False), ("nsqd", True)):
            args = ("--config", "typo.toml") + (("--data-path", self.dir) if app == "nsqd" else ())
            proc = self.start(app, *args, twistd=twistd)
            warnings = [line for line in proc.lines if want in line]
            self.assertEqual(len(warnings), 1, proc.lines)
            if not twistd:
                self.assertRegex(warnings[0], rf"^\[{app}\] {_STAMP.pattern} WARNING: ")
            proc.stop()


class ListeningLineTests(FrontEndsTestCase):
    """Listening lines print addresses as text; a unix socket is announced as Go announces it."""

    @defer.inlineCallbacks
    def test_unix_socket_path_is_text(self):
        for twistd in (False, True):
            proc = self.start(
                "nsqd", "--tcp-address", "nsqd.sock", "--http-address", "127.0.0.1:0", "--data-path", ".", twistd=twistd
            )
            self.assertEqual(proc.addresses["TCP"], "nsqd.sock")
            self.assertFalse(any("b'" in line for line in proc.lines), proc.lines)
            resp = yield treq.get(f"http://{proc.addresses['HTTP']}/info", persistent=False)
            info = json.loads((yield resp.content()))
            self.assertEqual(info["tcp_port"], -1)  # as Go's /info says for a unix socket
            proc.stop()
            self.assertTrue(any("TCP: closing nsqd.sock" in line for line in proc.lines), proc.lines)

    @defer.inlineCallbacks
    def test_lookupd_is_told_the_broadcast_port(self):
        lookupd = self.start(
            "nsqlookupd", "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", twistd=False
        )
        nsqd = self.start(
            "nsqd",
            "--tcp-address",
            "nsqd.sock",
            "--http-address",
            "127.0.0.1:0",
            "--data-path",
            ".",
            "--broadcast-address",
            "127.0.0.1",
            "--broadcast-tcp-port",
            "4999",
            "--lookupd-tcp-address",
            lookupd.addresses["TCP"],
            twistd=False,
        )
        url = f"http://{lookupd.addresses['HTTP']}/nodes"
        deadline = time.monotonic() + 60
        while True:
            resp = yield treq.get(url, persistent=False)
            producers = json.loads((yield resp.content()))["producers"]
            if producers or time.monotonic() > deadline:
                break
            yield deferLater(0.05)
        (producer,) = producers
        self.assertEqual((producer["tcp_port"], producer["http_port"]), (4999, nsqd.port("HTTP")))


def deferLater(seconds: float) -> defer.Deferred:
    return task.deferLater(reactor, seconds, lambda: None)
