"""A Spark standalone cluster on loopback, started from the pyspark package as
a user would (``bin/spark-class`` with the Master and Worker classes), for
process-level tests: a master and N workers, each worker in a session of its
own so that a test can kill one whole node (worker JVM, executor JVM, Python
daemon and workers) at once.

Every listener is on 127.0.0.1 and on a port the kernel picks: the master's
RPC port and web UI (``--port 0 --webui-port 0``), the workers', and the
drivers' (``spark-defaults.conf`` in ``conf_dir`` turns off the master's REST
server, which would take 6066, and the driver's UI, 4040). Give a driver
:meth:`StandaloneCluster.client_env` so it uses that configuration."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import IO, Any
from urllib.request import urlopen

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")

# what the test cluster and its drivers read from $SPARK_CONF_DIR/spark-defaults.conf
SPARK_DEFAULTS = """\
spark.master.rest.enabled false
spark.ui.enabled false
spark.ui.showConsoleProgress false
spark.driver.host 127.0.0.1
spark.driver.bindAddress 127.0.0.1
"""


def pyspark_home() -> str:
    """The pyspark package's directory: a Spark distribution (bin/, jars/)."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


class Node:
    """One cluster process (master or worker), its log in a file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: str, cwd: str) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "wb")  # closed in kill()
        # a session of its own: the worker's executors and their Python
        # processes (pyspark's daemon makes a process group of its own) stay in it
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            m = pattern.search(self.log())
            if m:
                return m
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {pattern.pattern!r} after {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def session(self) -> list[int]:
        """Every live process of this node (its session), itself included."""
        return session_members(self.pid)

    def kill(self) -> list[int]:
        """SIGKILL the node: every process of its session, as a machine
        crash would (SIGSTOPped first, so none reacts to another's death)."""
        killed = kill_session(self.pid)
        self.proc.wait()
        self._log.close()
        deadline = time.monotonic() + 30  # a JVM takes a moment to release its memory and go
        while session_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return killed


class StandaloneCluster:
    """``with``-less on purpose: a test starts it and adds :meth:`stop` as a
    cleanup before anything can fail."""

    def __init__(self, workdir: str, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.workdir = workdir
        self.worker_count = workers
        self.cores = cores
        self.memory = memory
        self.conf_dir = os.path.join(workdir, "conf")
        self.master: Node | None = None
        self.workers: list[Node] = []
        self.url = ""
        self.web_url = ""

    def env(self) -> dict[str, str]:
        """The environment of the cluster's processes and of a driver."""
        env = dict(os.environ)
        env.update(
            SPARK_HOME=pyspark_home(),
            SPARK_CONF_DIR=self.conf_dir,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_HOSTNAME="127.0.0.1",
            PYSPARK_PYTHON=sys.executable,
            # shuffle and block files of the drivers and executors here, not
            # in /tmp: a killed executor does not clean up after itself
            SPARK_LOCAL_DIRS=os.path.join(self.workdir, "local"),
        )
        env.pop("PYSPARK_DRIVER_PYTHON", None)
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        return env

    client_env = env

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        os.makedirs(self.conf_dir, exist_ok=True)
        os.makedirs(os.path.join(self.workdir, "local"), exist_ok=True)
        with open(os.path.join(self.conf_dir, "spark-defaults.conf"), "w") as f:
            f.write(SPARK_DEFAULTS)
        spark_class = os.path.join(pyspark_home(), "bin", "spark-class")
        master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
        self.master = Node(
            "master", [spark_class, *master], self.env(), os.path.join(self.workdir, "master.log"), self.workdir
        )
        self.url = self.master.wait_for(_MASTER_URL, timeout).group(1)
        self.web_url = f"http://127.0.0.1:{self.master.wait_for(_MASTER_UI, timeout).group(1)}"
        for i in range(self.worker_count):
            work = os.path.join(self.workdir, f"worker-{i}")
            os.makedirs(work, exist_ok=True)
            argv = [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port", "0"]
            argv += ["--cores", str(self.cores), "--memory", self.memory, "--work-dir", work, self.url]
            self.workers.append(
                Node(f"worker-{i}", argv, self.env(), os.path.join(self.workdir, f"worker-{i}.log"), work)
            )
        self.wait_workers(self.worker_count, timeout)
        return self

    def state(self) -> dict[str, Any]:
        """The master's view: its web UI's /json."""
        with urlopen(f"{self.web_url}/json", timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.state()["workers"] if w["state"] == "ALIVE"]

    def wait_workers(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.alive_workers()) != n:
            for node in self.workers:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"{node.name} exited {node.proc.returncode}:\n{node.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} workers did not register: {self.state()['workers']}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Kill every node, workers first (their executors with them)."""
        for node in [*self.workers, *([self.master] if self.master else [])]:
            if node.proc.returncode is None:
                node.kill()


# -- processes ------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) of ``pid``, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[3])


def command_line(pid: int) -> str:
    """The command line of ``pid`` ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def session_members(sid: int) -> list[int]:
    """The live processes whose session is ``sid``."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[1] == sid:
                members.append(int(name))
    return sorted(members)


def kill_session(sid: int) -> list[int]:
    """SIGSTOP every process of session ``sid`` until no new one appears, then
    SIGKILL them all; returns their pids."""
    stopped: set[int] = set()
    while True:
        fresh = [p for p in session_members(sid) if p not in stopped]
        if not fresh:
            break
        for p in fresh:
            _signal(p, signal.SIGSTOP)
        stopped.update(fresh)
    for p in stopped:
        _signal(p, signal.SIGKILL)
    return sorted(stopped)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def tcp_peers_of(pids: list[int], port: int) -> list[int]:
    """Those of ``pids`` holding a TCP connection to 127.0.0.1:``port``."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            remote, state, inode = cols[2], cols[3], cols[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:  # ESTABLISHED
                inodes.add(f"socket:[{inode}]")
    holders = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    holders.append(pid)
                    break
            except OSError:
                continue
    return holders
