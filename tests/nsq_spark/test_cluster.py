"""nsq-spark-archive on a Spark standalone cluster (a master and two workers
started from the pyspark package, on loopback): one worker, with its
executor and Python processes, SIGKILLed while the job runs; the job finishes
on the other worker and the Parquet output holds every message exactly once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from twisted.python import log as twisted_log
from twisted.trial import unittest

from tests.nsq_spark.cluster import Node, StandaloneCluster, command_line, kill_session, tcp_peers_of
from tests.nsq_spark.harness import publish, settled, start_nsqd, tcp

MESSAGES = 100_000
BATCH = 10_000


def archive_command() -> list[str]:
    """The nsq-spark-archive script next to this Python (what pip installed)."""
    script = Path(sys.executable).parent / "nsq-spark-archive"
    return [str(script)] if script.exists() else [sys.executable, "-m", "nsq_spark.archive"]


def archived_rows(output: str) -> int:
    """Rows in the Parquet files in place now (each appears whole, by rename)."""
    rows = 0
    for path in Path(output).glob("date=*/hour=*/*.parquet"):
        try:
            rows += pq.read_metadata(path).num_rows
        except (OSError, ValueError):
            pass  # replaced by a batch run again
    return rows


class StandaloneClusterTests(unittest.TestCase):
    timeout = 400

    def setUp(self) -> None:
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise RuntimeError("Spark needs Java 17+: install a JDK (Debian: openjdk-17-jre-headless)")
        self.dir = tempfile.mkdtemp(prefix="nsq-spark-cluster-")
        self.passed = False
        self.addCleanup(self.remove_dir)  # runs last: after every process is gone
        os.mkdir(os.path.join(self.dir, "nsqd"))
        self.nsqd = start_nsqd(cwd=os.path.join(self.dir, "nsqd"))
        self.addCleanup(self.nsqd.kill)
        self.cluster = StandaloneCluster(os.path.join(self.dir, "cluster"), workers=2, cores=1, memory="1g")
        self.addCleanup(self.cluster.stop)
        self.cluster.start()

    def remove_dir(self) -> None:
        """The logs, the archive and nsqd's data go once the test passed; a
        failure leaves them for a look."""
        if self.passed:
            shutil.rmtree(self.dir, ignore_errors=True)

    def test_worker_killed_mid_run_exactly_once(self):
        topic = "cluster_archive"
        expected = [b"%d" % i for i in range(MESSAGES)]
        publish(tcp(self.nsqd), topic, expected, batch=5000)
        output = os.path.join(self.dir, "archive")
        staging = os.path.join(self.dir, "staging")  # both workers' executors reach it: same machine
        argv = [
            *archive_command(),
            "--master",
            self.cluster.url,
            "--nsqd-http-address",
            f"127.0.0.1:{self.nsqd.port('HTTP')}",
            "--topic",
            topic,
            "--output",
            output,
            "--staging-location",
            staging,
            "--max-messages-per-batch",
            str(BATCH),
            "--trigger",
            "available-now",
        ]
        log_path = os.path.join(self.dir, "archive.log")
        with open(log_path, "wb") as log:
            job = subprocess.Popen(
                argv,
                env=self.cluster.client_env(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.addCleanup(kill_session, job.pid)  # the driver's JVM and Python processes, if it is still there

        def job_log() -> str:
            return Path(log_path).read_text(errors="replace")[-5000:]

        # the first batch landed: both executors have run tasks
        deadline = time.monotonic() + 150
        while archived_rows(output) == 0:
            if job.poll() is not None:
                self.fail(f"nsq-spark-archive exited {job.returncode} before archiving:\n{job_log()}")
            if time.monotonic() > deadline:
                self.fail(f"no batch archived:\n{job_log()}")
            time.sleep(0.1)
        apps = self.cluster.state()["activeapps"]
        self.assertEqual(len(apps), 1, apps)
        self.assertEqual([w["coresused"] for w in self.cluster.alive_workers()], [1, 1])  # an executor on each

        # the node to lose: the one whose task is reading from nsqd right now
        # if one is caught doing so within a few seconds, else the first
        victim: Node = self.cluster.workers[0]
        reading = False
        port = self.nsqd.port("TCP")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not reading and job.poll() is None:
            for node in self.cluster.workers:
                if tcp_peers_of(node.session(), port):
                    victim, reading = node, True
                    break
            else:
                time.sleep(0.01)
        self.assertIsNone(job.poll(), f"the job ended before the kill:\n{job_log()}")
        processes = [command_line(pid) for pid in victim.session()]
        victim.kill()
        at_kill = archived_rows(output)
        self.assertLess(at_kill, MESSAGES, "the kill did not land mid-run")
        # a node lost: the worker JVM and its executor JVM (and the executor's
        # Python processes, when it had run a Python task)
        self.assertTrue(any("deploy.worker.Worker" in c for c in processes), processes)
        self.assertTrue(any("CoarseGrainedExecutorBackend" in c for c in processes), processes)
        if reading:
            self.assertTrue(any(c.startswith(sys.executable) for c in processes), processes)
        self.assertEqual(victim.session(), [])

        # the master sees the node gone; the job carries on with the other worker
        deadline = time.monotonic() + 60
        while len(self.cluster.alive_workers()) != 1:
            if time.monotonic() > deadline:
                self.fail(f"the master still lists two live workers: {self.cluster.state()['workers']}")
            time.sleep(0.2)
        try:
            code = job.wait(timeout=240)
        except subprocess.TimeoutExpired:
            self.fail(f"nsq-spark-archive did not finish after the worker was killed:\n{job_log()}")
        detail = f"killed {victim.name} (reading from nsqd: {reading}) at {at_kill} rows archived"
        twisted_log.msg(f"{detail}; the job exited {code}; {len(processes)} processes killed")
        self.assertEqual(code, 0, f"{detail}\n{job_log()}")
        self.assertIn("Lost executor", Path(log_path).read_text(errors="replace"))  # the driver saw it go

        got = pq.read_table(output, columns=["body"]).column("body").to_pylist()
        detail += f"; archived {len(got)} rows, {len(set(got))} distinct"
        self.assertEqual(len(got), MESSAGES, detail)
        self.assertEqual(set(got), set(expected), detail)
        stats = settled(self.nsqd, topic, "nsq_to_parquet")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0), detail)
        self.assertEqual(list(Path(output, "_incoming").iterdir()), [])
        self.passed = True
