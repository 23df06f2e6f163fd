"""scripts/run, the README's first command, as a user runs it: Ctrl-C or a
kill of its pid stops both servers and exits 0, and pip runs only when the
sources changed. Run in a copy of the checkout with ports of the test's own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from twisted.trial import unittest

from tests.integration.checkout import alive, children, free_port, make_checkout, ping, wait_for

INSTALLING = "scripts/run: installing nsq-tw into .venv"
_CHECKOUT: Path | None = None


def checkout() -> Path:
    global _CHECKOUT
    if _CHECKOUT is None:
        _CHECKOUT = make_checkout(Path(tempfile.mkdtemp(prefix="nsq-scripts-run-")))
    return _CHECKOUT


class Run:
    """One ``scripts/run`` process, in its own session as a terminal would start it."""

    def __init__(self, root: Path, *args: str, **ports: int) -> None:
        self.ports = {name: free_port() for name in ("NSQD_TCP", "NSQD_HTTP", "NSQLOOKUPD_TCP", "NSQLOOKUPD_HTTP")}
        self.ports.update(ports)
        env = {**os.environ, **{f"{k}_PORT": str(v) for k, v in self.ports.items()}}
        env.pop("VIRTUAL_ENV", None)
        self.log = root / "run.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["scripts/run", *args],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.servers: list[int] = []

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"scripts/run exited {self.proc.returncode}: {self.output()[-3000:]}")
            return ping(self.ports["NSQD_HTTP"]) and ping(self.ports["NSQLOOKUPD_HTTP"])

        wait_for(ready, 180, "nsqd and nsqlookupd to answer /ping")
        self.servers = children(self.proc.pid)

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"scripts/run still running {timeout:.0f}s later: {self.output()[-3000:]}") from None

    def kill(self) -> None:
        for pid in [self.proc.pid, *children(self.proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def cmdline(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")


class ScriptsRunTests(unittest.TestCase):
    timeout = 600

    def start(self, *args: str, **ports: int) -> Run:
        run = Run(checkout(), *args, **ports)
        self.addCleanup(run.kill)
        return run

    def assertStoppedCleanly(self, run: Run) -> None:
        self.assertEqual(run.wait(), 0, run.output()[-3000:])
        self.assertEqual(len(run.servers), 2, "nsqlookupd and nsqd ran as the script's children")
        wait_for(lambda: not any(alive(pid) for pid in run.servers), 10, "both servers to be gone")
        self.assertFalse(ping(run.ports["NSQD_HTTP"], 0.5) or ping(run.ports["NSQLOOKUPD_HTTP"], 0.5))
        self.assertIn("NSQ: bye", run.output())  # nsqd's clean stop

    def test_ctrl_c_stops_both_servers_and_exits_0(self):
        run = self.start()
        run.wait_ready()
        os.killpg(run.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        self.assertStoppedCleanly(run)

    def test_kill_of_its_pid_stops_both_servers_and_exits_0(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            run = self.start()
            run.wait_ready()
            os.kill(run.proc.pid, sig)  # the script alone, as `kill PID` does
            self.assertStoppedCleanly(run)

    def test_extra_arguments_go_to_nsqd(self):
        run = self.start("--mem-queue-size", "0")
        run.wait_ready()
        nsqd = [argv for argv in map(cmdline, run.servers) if argv[1].endswith(b"/nsqd")]
        self.assertEqual(len(nsqd), 1)
        self.assertEqual(nsqd[0][-3:-1], [b"--mem-queue-size", b"0"])
        os.kill(run.proc.pid, signal.SIGTERM)
        self.assertStoppedCleanly(run)

    def test_a_server_that_cannot_start_stops_the_other(self):
        """nsqd's port is taken: scripts/run exits with nsqd's status (1) and
        takes nsqlookupd down with it instead of leaving it running."""
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        self.addCleanup(blocker.close)
        run = self.start(NSQD_TCP=blocker.getsockname()[1])
        seen: set[int] = set()

        def exited() -> bool:
            seen.update(children(run.proc.pid))
            return run.proc.poll() is not None

        wait_for(exited, 180, "scripts/run to exit")
        self.assertEqual(run.proc.returncode, 1, run.output()[-3000:])
        self.assertIn("FATAL", run.output())
        wait_for(lambda: not any(alive(pid) for pid in seen), 10, "nsqlookupd to be gone")
        self.assertFalse(ping(run.ports["NSQLOOKUPD_HTTP"], 0.5))

    def test_pip_runs_only_when_the_sources_changed(self):
        root = checkout()
        (root / ".venv" / ".nsq-tw-installed").unlink(missing_ok=True)
        run = self.start()
        run.wait_ready()
        self.assertIn(INSTALLING, run.output())
        os.killpg(run.proc.pid, signal.SIGINT)
        self.assertStoppedCleanly(run)

        run = self.start()
        run.wait_ready()
        self.assertNotIn(INSTALLING, run.output(), "nothing changed: no pip")
        os.killpg(run.proc.pid, signal.SIGINT)
        self.assertStoppedCleanly(run)

        source = root / "nsqd_tw" / "__init__.py"
        original = source.read_bytes()
        self.addCleanup(source.write_bytes, original)
        source.write_bytes(original + b"# changed\n")
        run = self.start()
        run.wait_ready()
        self.assertIn(INSTALLING, run.output(), "a source changed: installed again")
        os.killpg(run.proc.pid, signal.SIGINT)
        self.assertStoppedCleanly(run)
