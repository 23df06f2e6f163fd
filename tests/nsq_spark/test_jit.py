"""The driver JVM of a short archive run compiles with C1 alone; the job's
end does not wait for PySpark's accumulator server."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from types import SimpleNamespace
from unittest import mock

from twisted.trial import unittest

from nsq_spark import archive
from nsq_spark.jit import SHORT_RUN_MESSAGES, SHORT_RUN_OPTION, short_run, with_short_run_option

JAVA = "spark.driver.extraJavaOptions"


class ShortRunTests(unittest.TestCase):
    def confs(self, argv: list[str], backlog: int | None, environ: dict[str, str] | None = None) -> dict[str, str]:
        args = archive.parse_args(["--nsqd-http-address", "127.0.0.1:1", "--topic", "t", "--output", "/tmp/x", *argv])
        with (
            mock.patch.object(archive, "_backlog_of", return_value=lambda: backlog),
            mock.patch.dict(os.environ, environ or {}),
        ):
            return archive._driver_confs(args)

    def test_the_threshold(self):
        self.assertTrue(short_run(0))
        self.assertTrue(short_run(SHORT_RUN_MESSAGES))
        self.assertFalse(short_run(SHORT_RUN_MESSAGES + 1))
        self.assertFalse(short_run(None))

    def test_the_users_options_come_after(self):
        self.assertEqual(with_short_run_option({}), {JAVA: SHORT_RUN_OPTION})
        mine = with_short_run_option({JAVA: "-XX:TieredStopAtLevel=4 -Xss4m", "spark.x": "1"})
        self.assertEqual(mine, {JAVA: f"{SHORT_RUN_OPTION} -XX:TieredStopAtLevel=4 -Xss4m", "spark.x": "1"})

    def test_an_available_now_run_on_a_local_master_with_a_small_backlog(self):
        for master in (["--master", "local[2]"], ["--master", "local"], []):
            confs = self.confs(["--trigger", "available-now", *master], 400_000, {"SPARK_CONF_DIR": "/nonexistent"})
            self.assertEqual(confs.get(JAVA), SHORT_RUN_OPTION, master)
        confs = self.confs(["--trigger", "available-now", "--conf", f"{JAVA}=-Xss4m"], 10)
        self.assertEqual(confs[JAVA], f"{SHORT_RUN_OPTION} -Xss4m")

    def test_left_to_java(self):
        cases = [
            (["--trigger", "available-now"], SHORT_RUN_MESSAGES + 1, {}),  # a long run
            (["--trigger", "available-now"], None, {}),  # a backlog no node reports
            (["--trigger", "30s"], 10, {}),  # a query that keeps running
            (["--trigger", "available-now", "--master", "spark://127.0.0.1:7077"], 10, {}),
            (["--trigger", "available-now", "--conf", "spark.master=yarn"], 10, {}),
            (["--trigger", "available-now"], 10, {"PYSPARK_GATEWAY_PORT": "1"}),  # spark-submit's JVM
        ]
        for argv, backlog, environ in cases:
            self.assertNotIn(JAVA, self.confs(argv, backlog, environ), (argv, backlog, environ))

    def test_a_node_that_does_not_answer_does_not_hold_up_the_start(self):
        """A paused nsqd or lookupd (HTTP waits seconds for each): after a
        second without the depths, the run is taken for a long one."""
        args = archive.parse_args(["--nsqd-http-address", "127.0.0.1:1", "--topic", "t", "--output", "/tmp/x"])
        release = threading.Event()
        self.addCleanup(release.set)

        def stalled() -> int:
            release.wait(60)
            return 10

        started = time.monotonic()
        with mock.patch.object(archive, "_backlog_of", return_value=stalled):
            confs = archive._driver_confs(args)
        self.assertNotIn(JAVA, confs)
        self.assertLess(time.monotonic() - started, archive.SURVEY_WAIT + 20)

    def test_spark_defaults_naming_a_cluster(self):
        conf = tempfile.mkdtemp(prefix="nsq-spark-conf-")
        with open(os.path.join(conf, "spark-defaults.conf"), "w") as f:
            f.write("spark.master spark://127.0.0.1:7077\n")
        confs = self.confs(["--trigger", "available-now"], 10, {"SPARK_CONF_DIR": conf})
        self.assertNotIn(JAVA, confs)


class StopTests(unittest.TestCase):
    def test_the_accumulator_server_is_not_waited_for(self):
        """PySpark's accumulator server polls for its shutdown twice a second,
        and spark.stop() waits for it: the job shuts it down in a thread."""
        release = threading.Event()
        asked = threading.Event()

        class Server:
            def shutdown(self) -> None:
                asked.set()
                release.wait(30)

        context = SimpleNamespace(_accumulatorServer=Server())
        stopped: list[object] = []

        def stop() -> None:
            stopped.append(context._accumulatorServer)

        spark = SimpleNamespace(sparkContext=context, stop=stop)
        with mock.patch.object(archive, "stop_driver_jvm", return_value=None):
            archive._stop(spark, None)
        # spark.stop() ran without the server (so without waiting for it), and
        # the server was asked to shut down all the same
        self.assertEqual(stopped, [None])
        self.assertTrue(asked.wait(30))
        release.set()
