"""format("nsq") from a Spark Connect client (``SparkSession.builder.remote("sc://...")``),
against a Spark Connect server started from the pyspark package (its JVM runs the
queries; its Python workers, this virtualenv's Python, run the data source).

A Connect client cannot share a Python process with a classic SparkSession, which the
other Spark tests use: pyspark refuses a remote session beside a classic one
(SESSION_ALREADY_EXIST), and once a remote session exists it sets
SPARK_CONNECT_MODE_ENABLED in the environment, which switches the process's
``pyspark.sql`` (functions, builders) to Connect for good. So each test runs its
Spark side as a client process of its own, ``python -m tests.nsq_spark.test_connect
<scenario> <json>``, which prints what it saw as JSON; the test checks that and nsqd.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from twisted.trial import unittest

from tests.nsq_spark.cluster import kill_session
from tests.nsq_spark.harness import consume_all, publish, settled, shared_nsqd, tcp, topic_depth

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_STARTED = re.compile(rb"Spark Connect server started at: 127\.0\.0\.1:(\d+)")
_RESULT = "nsq-connect-result: "


class ConnectServer:
    """A Spark Connect server from the pyspark package: spark-submit in the
    foreground, local[2], gRPC on 127.0.0.1 and a port the kernel picks (the
    port is read from its log), a token required of clients. It runs in a
    session of its own (the JVM and its Python workers), ended by stop()."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="nsq-spark-connect-")
        self.log_path = os.path.join(self.dir, "server.log")
        self.token = uuid.uuid4().hex
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        # with a token and no TLS, pyspark's client connects only to "localhost"
        # (gRPC local credentials); with any other host a token means TLS
        return f"sc://localhost:{self.port}"

    def start(self, timeout: float = 180.0) -> ConnectServer:
        import pyspark

        home = os.path.dirname(os.path.abspath(pyspark.__file__))
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE")
        }
        env.update(SPARK_HOME=home, PYSPARK_PYTHON=sys.executable, SPARK_CONNECT_AUTHENTICATE_TOKEN=self.token)
        argv = [
            os.path.join(home, "bin", "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--name",
            "nsq-tw connect tests",
            "--master",
            "local[2]",
            "--driver-memory",
            "1g",
        ]
        for conf in (
            "spark.connect.grpc.binding.address=127.0.0.1",
            "spark.connect.grpc.binding.port=0",
            "spark.driver.host=127.0.0.1",
            "spark.driver.bindAddress=127.0.0.1",
            "spark.ui.enabled=false",
            "spark.sql.shuffle.partitions=2",
        ):
            argv += ["--conf", conf]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=self.dir,  # spark-warehouse/ and the like land here
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, "rb") as f:
                found = _STARTED.search(f.read())
            if found:
                self.port = int(found.group(1))
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited ({self.proc.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not start in {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 40) -> str:
        with open(self.log_path, "rb") as f:
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # pyspark's daemons put themselves in process groups of their own, but
        # stay in the session start_new_session made: end what is left of it
        kill_session(proc.pid)
        shutil.rmtree(self.dir, ignore_errors=True)


_SERVER: ConnectServer | None = None


def server() -> ConnectServer:
    """The test run's Connect server (it takes seconds to start)."""
    global _SERVER
    if _SERVER is None:
        _SERVER = ConnectServer()
        atexit.register(_SERVER.stop)
        _SERVER.start()
    return _SERVER


def run_client(scenario: str, **params: Any) -> dict[str, Any]:
    """Run ``scenario`` in a Connect client process; what it returned."""
    s = server()
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.update(NSQ_SPARK_CONNECT_URL=s.url, SPARK_CONNECT_AUTHENTICATE_TOKEN=s.token)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.nsq_spark.test_connect", scenario, json.dumps(params)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=240,
    )
    out = proc.stdout.decode("utf-8", "replace")
    for line in reversed(out.splitlines()):
        if line.startswith(_RESULT) and proc.returncode == 0:
            result: dict[str, Any] = json.loads(line[len(_RESULT) :])
            return result
    err = proc.stderr.decode("utf-8", "replace")
    raise AssertionError(
        f"client {scenario} exited {proc.returncode}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-6000:]}"
        f"\n--- server log\n{s.log_tail()}"
    )


def bodies(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


class ConnectTests(unittest.TestCase):
    timeout = 400

    def setUp(self) -> None:
        self.nsqd = shared_nsqd()
        self.address = tcp(self.nsqd)
        server()
        self.dir = tempfile.mkdtemp(prefix="nsq-spark-connect-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_streaming_read_lands_every_message_once(self):
        """readStream.format("nsq") with trigger(availableNow=True), into Parquet
        and into the memory sink, each read back from the client; nsqd's channels
        are drained; a client-side StreamingQueryListener hears every batch."""
        expected = bodies("connect-read", 3000)
        publish(self.address, "connect_read", expected)
        memory = bodies("connect-mem", 500)
        publish(self.address, "connect_mem", memory)
        got = run_client(
            "read",
            address=self.address,
            topic="connect_read",
            memory_topic="connect_mem",
            channel="spark",
            dir=self.dir,
        )
        self.assertEqual(
            got["columns"], ["id", "body", "timestamp", "attempts", "nsqd_address", "topic", "channel", "received"]
        )
        self.assertIsNone(got["exception"])
        self.assertEqual(sorted(got["bodies"]), sorted(b.decode() for b in expected), "each message once")
        self.assertEqual(set(map(tuple, got["origins"])), {("connect_read", "spark", self.address)})
        # maxMessagesPerBatch 1000: at least three batches, none larger
        batches = [n for n in got["batch_rows"] if n]
        self.assertEqual(sum(batches), 3000)
        self.assertGreaterEqual(len(batches), 3)
        self.assertTrue(all(n <= 1000 for n in batches), batches)
        self.assertEqual(got["listener_rows"], 3000)
        self.assertTrue(got["listener_terminated"])
        stats = settled(self.nsqd, "connect_read", "spark")
        self.assertEqual(
            (stats["depth"], stats["in_flight_count"], stats["requeue_count"], stats["timeout_count"]), (0, 0, 0, 0)
        )
        self.assertEqual(stats["message_count"], 3000)
        self.assertIsNone(got["memory_exception"])
        self.assertEqual(sorted(got["memory_bodies"]), sorted(b.decode() for b in memory))
        stats = settled(self.nsqd, "connect_mem", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"], stats["message_count"]), (0, 0, 500))

    def test_batch_and_streaming_writes_publish_every_row(self):
        """df.write.format("nsq") from a DataFrame the client made, and
        writeStream.format("nsq") relaying one topic to another."""
        relayed = bodies("connect-relay", 1500)
        publish(self.address, "connect_relay_src", relayed)
        got = run_client(
            "write",
            address=self.address,
            topic="connect_write",
            n=2000,
            relay_src="connect_relay_src",
            relay_dst="connect_relay_dst",
            dir=self.dir,
        )
        written = [f"connect-write-{i}-".encode() + b"x" * (i % 200) for i in range(2000)]
        self.assertEqual(topic_depth(self.nsqd, "connect_write"), 2000)
        self.assertEqual(sorted(consume_all(self.address, "connect_write", "check", 2000)), sorted(written))
        self.assertIsNone(got["relay_exception"])
        self.assertEqual(topic_depth(self.nsqd, "connect_relay_dst"), 1500)
        self.assertEqual(sorted(consume_all(self.address, "connect_relay_dst", "check", 1500)), sorted(relayed))
        self.assertEqual(settled(self.nsqd, "connect_relay_src", "relay")["depth"], 0)

    def test_errors_reach_the_client(self):
        """A bad option (raised by the data source on the server's driver) and a
        failed publish (raised in an executor's task) come back to the client with
        their messages."""
        got = run_client("errors", address=self.address, topic="connect_errors", dir=self.dir)
        self.assertIn('the "stagingLocation" option is required to read a topic', got["option_error"])
        self.assertIn("nsqd rejects empty messages", got["publish_error"])

    def test_foreach_batch_runs_on_the_server_without_the_jvm(self):
        """foreachBatch works, but its function runs in a Python process on the
        server, with a Connect session: what it appends to in the client stays
        empty, and ``df.sparkSession._jvm`` (what nsq-spark-archive's file commit
        uses) is not there; neither is ``spark.sparkContext`` in the client."""
        expected = bodies("connect-foreach", 600)
        publish(self.address, "connect_foreach", expected)
        got = run_client("foreach", address=self.address, topic="connect_foreach", dir=self.dir)
        self.assertIsNone(got["exception"])
        self.assertEqual(got["client_side_list"], [])
        files = sorted(os.listdir(os.path.join(self.dir, "foreach")))
        rows = []
        for name in files:
            with open(os.path.join(self.dir, "foreach", name)) as f:
                batch = json.load(f)
            self.assertEqual(batch["session"], "pyspark.sql.connect.session")
            self.assertIn("JVM_ATTRIBUTE_NOT_SUPPORTED", batch["jvm"])
            rows.extend(batch["bodies"])
        self.assertEqual(sorted(rows), sorted(b.decode() for b in expected))
        self.assertIn("JVM_ATTRIBUTE_NOT_SUPPORTED", got["spark_context"])
        self.assertEqual(settled(self.nsqd, "connect_foreach", "spark")["depth"], 0)


# -- the client side: runs in a process of its own ------------------------------------------


def _session() -> Any:
    from pyspark.sql import SparkSession

    from nsq_spark import register

    spark = SparkSession.builder.remote(os.environ["NSQ_SPARK_CONNECT_URL"]).getOrCreate()
    register(spark)  # pickles NSQDataSource (by reference) to the server
    return spark


def _source(spark: Any, address: str, topic: str, channel: str, staging: str, **options: str) -> Any:
    reader = spark.readStream.format("nsq")
    for key, value in {
        "nsqdTcpAddresses": address,
        "topic": topic,
        "channel": channel,
        "stagingLocation": staging,
        **options,
    }.items():
        reader = reader.option(key, value)
    return reader.load()


def _wait(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _exception(query: Any) -> str | None:
    e = query.exception()
    return None if e is None else str(e)


def client_read(spark: Any, p: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql.streaming import StreamingQueryListener

    heard: dict[str, Any] = {"rows": 0, "terminated": set()}

    class Listener(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            heard["rows"] += event.progress.numInputRows or 0

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            heard["terminated"].add(str(event.id))

    listener = Listener()
    spark.streams.addListener(listener)
    d = p["dir"]
    df = _source(
        spark, p["address"], p["topic"], p["channel"], f"{d}/staging", maxMessagesPerBatch="1000", maxInFlight="1000"
    )
    columns = df.columns  # the server analyses the plan: NSQDataSource.schema() there
    query = (
        df.writeStream.format("parquet")
        .option("path", f"{d}/out")
        .option("checkpointLocation", f"{d}/checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    exception = _exception(query)
    # the progress JSON a Connect server sends has numInputRows only per source:
    # progress["numInputRows"] is None, the property sums the sources
    batch_rows = [progress.numInputRows for progress in query.recentProgress]
    terminated = _wait(lambda: str(query.id) in heard["terminated"])
    spark.streams.removeListener(listener)
    rows = spark.read.parquet(f"{d}/out").selectExpr("CAST(body AS STRING) AS b", "topic", "channel", "nsqd_address")
    collected = rows.collect()

    memory = (
        _source(spark, p["address"], p["memory_topic"], p["channel"], f"{d}/staging-mem")
        .selectExpr("CAST(body AS STRING) AS b")
        .writeStream.format("memory")
        .queryName("nsq_connect_memory")
        .option("checkpointLocation", f"{d}/checkpoint-mem")
        .trigger(availableNow=True)
        .start()
    )
    memory.awaitTermination(180)
    memory_bodies = [r.b for r in spark.sql("SELECT b FROM nsq_connect_memory").collect()]
    return {
        "columns": columns,
        "exception": exception,
        "bodies": [r.b for r in collected],
        "origins": sorted({(r.topic, r.channel, r.nsqd_address) for r in collected}),
        "batch_rows": batch_rows,
        "listener_rows": heard["rows"],
        "listener_terminated": terminated,
        "memory_exception": _exception(memory),
        "memory_bodies": memory_bodies,
    }


def client_write(spark: Any, p: dict[str, Any]) -> dict[str, Any]:
    rows = [(f"connect-write-{i}-".encode() + b"x" * (i % 200),) for i in range(p["n"])]
    df = spark.createDataFrame(rows, "body binary").repartition(3)
    # a small body limit: each task splits its rows over several MPUBs
    (
        df.write.format("nsq")
        .mode("append")
        .option("nsqdTcpAddresses", p["address"])
        .option("topic", p["topic"])
        .option("maxBodySize", "20000")
        .save()
    )
    d = p["dir"]
    relay = (
        _source(spark, p["address"], p["relay_src"], "relay", f"{d}/relay-staging", maxMessagesPerBatch="500")
        .select("body")
        .writeStream.format("nsq")
        .option("nsqdTcpAddresses", p["address"])
        .option("topic", p["relay_dst"])
        .option("checkpointLocation", f"{d}/relay-checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    relay.awaitTermination(180)
    return {"relay_exception": _exception(relay)}


def client_errors(spark: Any, p: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    try:  # no stagingLocation
        reader = spark.readStream.format("nsq").option("nsqdTcpAddresses", p["address"]).option("topic", p["topic"])
        columns = reader.option("channel", "spark").load().columns
        result["option_error"] = f"no error: {columns}"
    except Exception as e:
        result["option_error"] = str(e)
    try:
        spark.createDataFrame([(b"ok",), (b"",)], "body binary").write.format("nsq").mode("append").option(
            "nsqdTcpAddresses", p["address"]
        ).option("topic", p["topic"]).save()
        result["publish_error"] = "no error"
    except Exception as e:
        result["publish_error"] = str(e)
    return result


def client_foreach(spark: Any, p: dict[str, Any]) -> dict[str, Any]:
    out = os.path.join(p["dir"], "foreach")
    client_side: list[int] = []

    def each_batch(batch: Any, batch_id: int) -> None:  # pickled by value, run on the server
        import json
        import os

        client_side.append(batch_id)  # the server's copy of the list
        try:
            jvm = f"available: {batch.sparkSession._jvm!r}"
        except Exception as e:
            jvm = str(e)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{batch_id}.json"), "w") as f:
            json.dump(
                {
                    "session": type(batch.sparkSession).__module__,
                    "jvm": jvm,
                    "bodies": [r.b for r in batch.selectExpr("CAST(body AS STRING) AS b").collect()],
                },
                f,
            )

    query = (
        _source(spark, p["address"], p["topic"], "spark", f"{p['dir']}/foreach-staging", maxMessagesPerBatch="200")
        .writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", f"{p['dir']}/foreach-checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    try:
        spark_context = f"available: {spark.sparkContext!r}"
    except Exception as e:
        spark_context = str(e)
    return {"exception": _exception(query), "client_side_list": client_side, "spark_context": spark_context}


CLIENTS = {"read": client_read, "write": client_write, "errors": client_errors, "foreach": client_foreach}


def client_main(scenario: str, params: str) -> int:
    spark = _session()
    try:
        result = CLIENTS[scenario](spark, json.loads(params))
    finally:
        spark.stop()
    print(_RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1], sys.argv[2]))
