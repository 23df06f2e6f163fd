"""Every shell command in README.md and docs/*.md, run as written.

Each page is one test (a page added later gets its own at once). Its ```sh
blocks (also ``bash``/``shell``) run in order, one command at a time, in one
bash (so variables and ``. .venv/bin/activate`` carry over from block to
block, as in a terminal), from the root of a copy of the checkout where
``scripts/run`` has made ``.venv``. What the test assumes, which is what the
pages tell a reader:

- A page activates the virtualenv itself (``. .venv/bin/activate`` in its first
  block) or names ``.venv/bin/...``: the shell starts without it.
- A block that starts nsqd, nsqlookupd, twistd or scripts/run itself runs with
  ``scripts/run`` stopped (they use its ports); any other block runs while
  ``scripts/run`` serves nsqd on 127.0.0.1:4150/4151 and nsqlookupd on
  4160/4161, unless servers the page started in the background still run.
- A command that runs until Ctrl-C (a server in the foreground) is stopped with
  SIGINT, as Ctrl-C would, once each nsqd, nsqlookupd or twistd it started
  answers ``GET /ping`` over HTTP (any status); it must then exit cleanly
  (twistd re-raises the signal: status 130). Servers left in the background
  are stopped when the page ends.
- Every other command must exit 0. curl is told ``--fail`` (by a .curlrc), so
  an HTTP error fails it, unless the command shows the status itself
  (``-w '%{http_code}'``, ``--fail-with-body``). What is asynchronous (a server starting in the
  background, a registration reaching nsqlookupd) is waited for by the
  commands themselves (``until curl -sf URL; do sleep 0.1; done``).
- Commands write under a temporary directory (``mktemp -d``), never into the
  checkout: ``git status`` must show nothing new or changed after a page.
- Ports 4100-4299 written after a colon (``127.0.0.1:4150``) are replaced with
  free ports, the same one for the same number across the page, so the test
  never uses the real ones; servers must be given their addresses (a server
  listening on another port fails the test).
- A block opened with ```` ```sh norun ```` is not run (a command that needs a
  cluster, the whole test suite or a long benchmark): each of its commands
  must parse (``bash -n``) and its program must exist and answer ``--help``
  (a shell script: parse).
"""

from __future__ import annotations

import http.client
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from twisted.trial import unittest

from tests.integration.checkout import ROOT, alive, children, free_port, leftovers, make_checkout, ping, wait_for

SHELLS = {"sh", "bash", "shell"}
NOT_SHELL = {"console", "shell-session", "zsh", "fish"}  # would hide commands from this test
NORUN = "norun"
COMMAND_TIMEOUT = 300.0
_PORT = re.compile(r"(?<=:)(4[12]\d\d)\b")
_SERVER = re.compile(
    r"(?:^|[;&|(]|\bdo\b|\bthen\b)\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*"
    r"(?:(?:\S*/)?(?:nsqd|nsqlookupd|twistd)(?!\s+--?(?:help|version)\b)|(?:\./)?scripts/run)(?=\s|$)",
    re.M,
)
_SERVER_NAMES = {"nsqd", "nsqlookupd", "twistd"}
_CURL_SHOWS_STATUS = re.compile(r"\bcurl\s(?:.*\s)?(?:-w|--write-out|--fail-with-body)(?:\s|=|$)", re.S)


@dataclass
class Block:
    page: str
    line: int
    lang: str
    flags: list[str]
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def commands(self) -> list[str]:
        return split_commands(self.text, self.where)

    def starts_servers(self) -> bool:
        return any(_SERVER.search(strip_comments(c)) for c in self.commands())


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,})\s*(.*)$", lines[i])
        if m is None:
            i += 1
            continue
        indent, fence, info = m.groups()
        words = info.split()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        name = str(page.relative_to(ROOT))
        found.append(Block(name, i + 1, words[0].lower() if words else "", words[1:], "\n".join(body) + "\n"))
        i = j + 1
    return found


def syntax_ok(text: str) -> bool:
    done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    return done.returncode == 0 and "here-document" not in done.stderr


def split_commands(text: str, where: str) -> list[str]:
    """The complete shell commands of a block (a loop or continued lines are one)."""
    commands: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        if line.endswith("\\"):
            continue
        joined = "\n".join(current)
        if syntax_ok(joined):
            commands.append(joined)
            current = []
    if current:
        raise AssertionError(f"{where}: not a complete shell command: {chr(10).join(current)}")
    return commands


def strip_comments(command: str) -> str:
    return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in command.splitlines())


# -- processes ---------------------------------------------------------------------------------


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError):
        return []


def server_name(pid: int) -> str | None:
    """nsqd, nsqlookupd or twistd when ``pid`` is one (a console script runs as python SCRIPT)."""
    argv = cmdline(pid)
    for arg in argv[:2]:
        name = os.path.basename(arg)
        if name in _SERVER_NAMES:
            return name
    if len(argv) > 2 and argv[1] == "-m" and argv[2] in ("twisted", "nsqd_tw", "lookupd_tw"):
        return {"twisted": "twistd", "nsqd_tw": "nsqd", "lookupd_tw": "nsqlookupd"}[argv[2]]
    return None


def listening_ports(pid: int) -> set[int]:
    inodes: set[str] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def answers_http(port: int) -> bool:
    """Whether an HTTP server answers ``GET /ping`` on ``port``, whatever its
    status (nsqd with --tls-required answers plain HTTP 403, as Go's does)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        conn.request("GET", "/ping")
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def tree(pids: set[int]) -> set[int]:
    found = set(pids)
    for pid in pids:
        found.update(children(pid))
    return {p for p in found if alive(p)}


def signal_groups(pids: set[int], sig: int) -> None:
    groups: set[int] = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass


def stop_all(pids: set[int], sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Signal the process groups of ``pids`` and wait for every process in them to go."""
    everything = tree(pids)
    signal_groups(everything, sig)
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in everything) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in everything:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- a page's shell ------------------------------------------------------------------------------


@dataclass
class Result:
    command: str
    status: int
    interrupted: bool = False
    servers: list[str] = field(default_factory=list)


class Shell:
    """One bash, fed one command at a time, with job control as in a terminal
    (each job its own process group), its output in a log file."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.status_r, status_w = os.pipe()
        self.fd = status_w
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc"],
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(status_w,),
                start_new_session=True,
            )
        os.close(status_w)
        self.buf = b""
        # job control, and a shell that outlives a job killed by Ctrl-C, as an interactive one
        self.send("set -m\ntrap : INT\n")

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def output(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def _status(self, timeout: float) -> int | None:
        ready, _, _ = select.select([self.status_r], [], [], max(0.0, timeout))
        if ready:
            chunk = os.read(self.status_r, 4096)
            if not chunk:
                raise AssertionError(f"bash exited: {self.output()}")
            self.buf += chunk
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            return int(line)
        return None

    def jobs(self) -> set[int]:
        return set(children(self.proc.pid))

    def run(self, command: str, allowed_ports: set[int]) -> Result:
        """Run ``command``; a foreground server is interrupted once it serves."""
        before = self.jobs()
        # stdin from /dev/null (nothing may wait for input); the status pipe closed for the command
        self.send(f"{{ {command}\n}} </dev/null {self.fd}>&-\nprintf '%s\\n' \"$?\" >&{self.fd}\n")
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while True:
            status = self._status(0.2)
            if status is not None:
                return Result(command, status)
            foreground = self.jobs() - before
            servers = self.serving(foreground, allowed_ports) if foreground else None
            if servers:
                signal_groups(foreground, signal.SIGINT)  # Ctrl-C
                status = self._status(60)
                if status is None:
                    raise AssertionError(f"still running 60s after SIGINT: {command}\n{self.output()}")
                wait_for(lambda group=set(foreground): not tree(group), 30, f"the processes of `{command}` to exit")
                return Result(command, status, interrupted=True, servers=servers)
            if time.monotonic() > deadline:
                raise AssertionError(f"still running after {COMMAND_TIMEOUT:.0f}s: {command}\n{self.output()}")

    def serving(self, pids: set[int], allowed_ports: set[int]) -> list[str] | None:
        """The servers among ``pids`` and their children once each answers /ping, else None."""
        names: list[str] = []
        for pid in tree(pids):
            name = server_name(pid)
            if name is None:
                continue
            ports = listening_ports(pid)
            stray = ports - allowed_ports
            if stray:
                raise AssertionError(
                    f"{name} listens on {sorted(stray)}, a port the command does not name "
                    f"(give it its addresses): {' '.join(cmdline(pid))}"
                )
            if not any(answers_http(port) for port in ports):
                return None
            names.append(name)
        return names or None

    def close(self) -> None:
        stop_all(self.jobs())
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.status_r)


# -- the test --------------------------------------------------------------------------------------


class Node:
    """``scripts/run`` in the checkout, on the page's ports, as in a second terminal."""

    def __init__(self, root: Path, env: dict[str, str], log: Path) -> None:
        self.ports = (int(env["NSQD_HTTP_PORT"]), int(env["NSQLOOKUPD_HTTP_PORT"]))
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                ["scripts/run"],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.log = log

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"scripts/run exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            return all(ping(p) for p in self.ports)

        wait_for(ready, 300, "scripts/run's nsqd and nsqlookupd to answer /ping")

    def stop(self) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            stop_all({self.proc.pid}, signal.SIGKILL)
            return self.proc.wait()


_CHECKOUT: Path | None = None


def checkout() -> Path:
    """The copy of the checkout the pages run in, after the README's first
    command (``scripts/run``, which installs nsq-tw into ``.venv``) ran once."""
    global _CHECKOUT
    if _CHECKOUT is None:
        root = make_checkout(Path(tempfile.mkdtemp(prefix="nsq-docs-")))
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
        for name in ("NSQD_TCP", "NSQD_HTTP", "NSQLOOKUPD_TCP", "NSQLOOKUPD_HTTP"):
            env[f"{name}_PORT"] = str(free_port())
        log = root / ".venv" / "first-run.log"
        node = Node(root, env, log)
        node.wait_ready()
        status = node.stop()
        if status != 0:
            raise AssertionError(f"scripts/run exited {status}: {log.read_text()[-3000:]}")
        _CHECKOUT = root
    return _CHECKOUT


class DocsTests(unittest.TestCase):
    timeout = 1800

    def run_page(self, page: Path) -> None:
        page_blocks = blocks(page)
        hidden = [b.where for b in page_blocks if b.lang in NOT_SHELL]
        self.assertEqual(hidden, [], "write shell commands in ```sh blocks, one command per line, no prompts")
        shell_blocks = [b for b in page_blocks if b.lang in SHELLS]
        for block in shell_blocks:
            if NORUN in block.flags:
                self.check_parses(block)
        runnable = [b for b in shell_blocks if NORUN not in b.flags]
        if not runnable:
            return
        root = checkout()
        work = Path(tempfile.mkdtemp(prefix="nsq-docs-page-"))
        self.addCleanup(shutil.rmtree, work, True)
        ports = {n: free_port() for n in (4150, 4151, 4160, 4161)}
        for block in runnable:
            for m in _PORT.finditer(block.text):
                ports.setdefault(int(m.group(1)), free_port())
        env = self.page_env(work, ports)
        shell = Shell(root, env, work / "shell.log")
        self.addCleanup(shell.close)
        node: Node | None = None
        page_jobs: set[int] = set()

        def stop_node() -> None:
            nonlocal node
            if node is not None:
                status = node.stop()
                self.assertEqual(status, 0, f"scripts/run did not stop cleanly: {node.log.read_text()[-3000:]}")
                node = None

        self.addCleanup(stop_node)
        for block in runnable:
            page_jobs = {p for p in page_jobs if alive(p)}
            wants_node = not block.starts_servers() and not page_jobs
            if wants_node and node is None:
                node = Node(root, env, work / "node.log")
                node.wait_ready()
            elif not wants_node:
                stop_node()
            allowed = set(ports.values())
            for command in block.commands():
                before = shell.jobs()
                curl = "curl-plain" if _CURL_SHOWS_STATUS.search(command) else "curl-fail"
                shell.send(f"export CURL_HOME={shlex.quote(str(work / curl))}\n")
                result = shell.run(_PORT.sub(lambda m: str(ports[int(m.group(1))]), command), allowed)
                page_jobs |= shell.jobs() - before
                self.check_result(block, command, result, shell)
        stop_node()
        self.assertEqual(leftovers(root), [], f"{page.name}: commands left files in the checkout")

    def check_result(self, block: Block, command: str, result: Result, shell: Shell) -> None:
        expected = {0}
        if result.interrupted and "twistd" in result.servers:
            expected.add(128 + signal.SIGINT)  # twistd ends by re-raising the signal
        if result.status not in expected:
            hint = ""
            if result.status == 127:
                hint = "\n(command not found: does the page start with `. .venv/bin/activate`?)"
            self.fail(f"{block.where}: `{command}` exited {result.status}{hint}\n--- output ---\n{shell.output()}")

    def page_env(self, work: Path, ports: dict[int, int]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "NSQ"))}
        # the shell starts as a new terminal would: without this test run's virtualenv
        ours = os.path.realpath(os.path.dirname(sys.executable)) if sys.prefix != sys.base_prefix else None
        env["PATH"] = os.pathsep.join(
            p for p in env.get("PATH", "").split(os.pathsep) if p and os.path.realpath(p) != ours
        )
        tmp = work / "tmp"
        tmp.mkdir()
        env["TMPDIR"] = str(tmp)
        strict = work / "curl-fail"
        strict.mkdir()
        (strict / ".curlrc").write_text("fail\n")
        (work / "curl-plain").mkdir()
        env["NSQD_TCP_PORT"] = str(ports[4150])
        env["NSQD_HTTP_PORT"] = str(ports[4151])
        env["NSQLOOKUPD_TCP_PORT"] = str(ports[4160])
        env["NSQLOOKUPD_HTTP_PORT"] = str(ports[4161])
        return env

    def check_parses(self, block: Block) -> None:
        """A ``norun`` block: it parses, and each program exists and answers --help."""
        root = checkout()
        self.assertTrue(syntax_ok(block.text), f"{block.where}: bash -n fails")
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
        env["PATH"] = os.pathsep.join([str(root / ".venv" / "bin"), env.get("PATH", "")])
        for command in block.commands():
            words = shlex.split(strip_comments(command).replace("\\\n", " "))
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words.pop(0)
            self.assertTrue(words, f"{block.where}: no program in `{command}`")
            program = words[0]
            path = root / program if "/" in program else None
            found = str(path) if path is not None and path.exists() else shutil.which(program, path=env["PATH"])
            self.assertIsNotNone(found, f"{block.where}: `{program}` not found")
            assert found is not None
            with open(found, "rb") as f:
                head = f.read(64)
            if head.startswith(b"#!") and b"bash" in head.split(b"\n", 1)[0]:
                self.assertTrue(syntax_ok(Path(found).read_text()), f"{block.where}: {program} does not parse")
                continue
            argv = [found]
            if len(words) > 2 and words[1] == "-m":
                argv += ["-m", words[2]]
            elif len(words) > 1 and words[1].endswith(".py"):
                argv.append(words[1])
            done = subprocess.run([*argv, "--help"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(done.returncode, 0, f"{block.where}: `{' '.join(argv)} --help` failed: {done.stderr}")


def _page_test(page: Path):  # type: ignore[no-untyped-def]
    def test(self: DocsTests) -> None:
        self.run_page(page)

    test.__doc__ = f"the shell commands of {page.relative_to(ROOT)}"
    return test


for _page in pages():
    setattr(DocsTests, "test_" + re.sub(r"\W", "_", _page.stem), _page_test(_page))
