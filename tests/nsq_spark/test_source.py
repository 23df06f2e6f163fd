"""spark.readStream.format("nsq") against real nsqd processes: executor-side
intake through staging files, restarts from a checkpoint, a failed batch
replayed, a retried task, lookupd discovery, TLS."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from twisted.internet import threads
from twisted.trial import unittest

from tests.certs import make_certs
from tests.integration.procs import ServerProcess
from tests.nsq_spark.harness import publish, settled, shared_nsqd, spark, start_nsqd, tcp, wait_rows


def bodies(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


class SourceTests(unittest.TestCase):
    timeout = 300

    def setUp(self) -> None:
        self.nsqd = shared_nsqd()
        self.address = tcp(self.nsqd)
        spark()
        self.dir = tempfile.mkdtemp(prefix="nsq-spark-")

    def stream(self, topic: str, channel: str = "spark", **options: str) -> Any:
        reader = spark().readStream.format("nsq").option("nsqdTcpAddresses", self.address)
        staging = os.path.join(self.dir, "staging")
        for key, value in {"topic": topic, "channel": channel, "stagingLocation": staging, **options}.items():
            reader = reader.option(key, value)
        return reader.load()

    def to_parquet(self, df: Any, name: str = "out", **trigger: Any) -> Any:
        return (
            df.writeStream.format("parquet")
            .option("path", os.path.join(self.dir, name))
            .option("checkpointLocation", os.path.join(self.dir, name + "-checkpoint"))
            .trigger(**(trigger or {"availableNow": True}))
            .start()
        )

    def for_each_batch(self, df: Any, fn: Any) -> Any:
        """An availableNow query handing each micro-batch to ``fn`` (one checkpoint per test)."""
        return (
            df.writeStream.foreachBatch(fn)
            .option("checkpointLocation", os.path.join(self.dir, "foreach-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    def parquet_bodies(self, name: str = "out") -> list[bytes]:
        rows = spark().read.parquet(os.path.join(self.dir, name)).select("body").collect()
        return [bytes(r.body) for r in rows]

    def test_available_now_reads_everything_then_fins_it(self):
        expected = bodies("all", 5000)
        publish(self.address, "spark_all", expected)
        query = self.to_parquet(self.stream("spark_all", maxMessagesPerBatch="1000", maxInFlight="1000"))
        query.awaitTermination(120)
        self.assertIsNone(query.exception())
        got = self.parquet_bodies()
        self.assertEqual(sorted(got), sorted(expected))
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        self.assertTrue(all(n <= 1000 for n in batches), batches)
        self.assertGreaterEqual(len(batches), 5)
        df = spark().read.parquet(os.path.join(self.dir, "out"))
        self.assertEqual(
            df.columns, ["id", "body", "timestamp", "attempts", "nsqd_address", "topic", "channel", "received"]
        )
        row = df.first()
        self.assertEqual(
            (row.topic, row.channel, row.nsqd_address, row.attempts), ("spark_all", "spark", self.address, 1)
        )
        self.assertEqual(len(row.id), 16)
        self.assertLess(abs(row.timestamp.timestamp() - time.time()), 600)
        stats = settled(self.nsqd, "spark_all", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"], stats["timeout_count"]), (0, 0, 0))
        self.assertEqual(stats["message_count"], 5000)

    def test_stopped_query_restarts_from_its_checkpoint_without_loss(self):
        expected = bodies("restart", 6000)
        publish(self.address, "spark_restart", expected)
        df = self.stream("spark_restart", maxMessagesPerBatch="500", maxInFlight="500")
        query = self.to_parquet(df, processingTime="200 milliseconds")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = sum(p["numInputRows"] for p in query.recentProgress)
            if done >= 1500:
                break
            time.sleep(0.1)
        query.stop()
        first_run = len(self.parquet_bodies())
        self.assertGreater(first_run, 0)
        self.assertLess(first_run, 6000)
        # the same query, restarted from its checkpoint, drains the rest
        query = self.to_parquet(self.stream("spark_restart", maxMessagesPerBatch="500", maxInFlight="500"))
        query.awaitTermination(120)
        self.assertIsNone(query.exception())
        got = self.parquet_bodies()
        self.assertEqual(set(got), set(expected), "nothing lost")
        stats = settled(self.nsqd, "spark_restart", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"]), (0, 0))

    def test_held_messages_are_touched_while_a_batch_runs(self):
        """msg_timeout 1 s, a batch that takes 3 s: TOUCH keeps every message
        in flight, so none times out or comes back."""
        expected = bodies("slow", 200)
        publish(self.address, "spark_slow", expected)
        seen: list[bytes] = []

        def slow_batch(batch: Any, batch_id: int) -> None:
            seen.extend(bytes(r.body) for r in batch.select("body").collect())
            time.sleep(3)

        query = self.for_each_batch(self.stream("spark_slow", msgTimeout="1s", maxMessagesPerBatch="100"), slow_batch)
        query.awaitTermination(120)
        self.assertIsNone(query.exception())
        self.assertEqual(sorted(seen), sorted(expected))
        stats = settled(self.nsqd, "spark_slow", "spark")
        self.assertEqual((stats["timeout_count"], stats["requeue_count"], stats["depth"]), (0, 0, 0))

    def test_a_failed_batch_is_replayed_from_its_staging_files(self):
        """The sink fails on the second batch: its messages were staged and
        FINed, and the query run again from its checkpoint reads them from the
        staging files (nsqd delivers nothing twice)."""
        expected = bodies("fail", 1500)
        publish(self.address, "spark_fail", expected)
        seen: list[bytes] = []
        failing = {"on": True}

        def sink(batch: Any, batch_id: int) -> None:
            rows = [bytes(r.body) for r in batch.select("body").collect()]
            if failing["on"] and batch_id == 1:
                raise RuntimeError("the warehouse is down")
            seen.extend(rows)

        def run() -> Any:
            q = self.for_each_batch(self.stream("spark_fail", maxMessagesPerBatch="500", maxInFlight="500"), sink)
            try:
                q.awaitTermination(120)
            except Exception:
                pass
            return q

        query = run()
        self.assertIn("the warehouse is down", str(query.exception()))
        self.assertEqual(len(seen), 500)
        failing["on"] = False
        query = run()
        self.assertIsNone(query.exception())
        self.assertEqual(set(seen), set(expected))
        self.assertEqual(len(seen), len(expected))
        stats = settled(self.nsqd, "spark_fail", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"], stats["requeue_count"]), (0, 0, 0))

    def test_messages_published_while_it_runs(self):
        df = self.stream("spark_live")
        query = df.writeStream.format("memory").queryName("live").trigger(processingTime="200 milliseconds").start()
        try:
            publish(self.address, "spark_live", bodies("early", 100))
            wait_rows("live", 100)
            publish(self.address, "spark_live", bodies("late", 100))
            wait_rows("live", 200)
        finally:
            query.stop()
        got = {bytes(r.body) for r in spark().sql("SELECT body FROM live").collect()}
        self.assertEqual(got, set(bodies("early", 100) + bodies("late", 100)))

    def test_option_errors_are_clear(self):
        with self.assertRaises(Exception) as e:
            spark().readStream.format("nsq").option("topic", "t").option(
                "nsqdTcpAddresses", "x:1"
            ).load().writeStream.format("memory").queryName("bad").start().awaitTermination(30)
        self.assertIn('the "channel" option is required', str(e.exception))


class DiscoveryTests(unittest.TestCase):
    """The source finds the topic's nsqd through nsqlookupd, new ones included."""

    timeout = 300

    def test_lookupd_discovery_and_a_node_joining(self):
        base = tempfile.mkdtemp(prefix="nsq-spark-cluster-")
        lookupd = ServerProcess("nsqlookupd", "-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0", cwd=base)
        lookupd.start()
        self.addCleanup(lookupd.kill)
        lookupd_tcp = f"127.0.0.1:{lookupd.port('TCP')}"
        lookupd_http = f"127.0.0.1:{lookupd.port('HTTP')}"
        nodes = []
        for i in range(2):
            os.makedirs(os.path.join(base, f"n{i}"))
        first = start_nsqd(
            "-lookupd-tcp-address", lookupd_tcp, "-broadcast-address", "127.0.0.1", cwd=os.path.join(base, "n0")
        )
        self.addCleanup(first.kill)
        nodes.append(first)
        publish(tcp(first), "spark_cluster", bodies("n0", 50))
        time.sleep(0.5)  # the REGISTER reaches lookupd
        df = (
            spark()
            .readStream.format("nsq")
            .option("lookupdHttpAddresses", lookupd_http)
            .option("topic", "spark_cluster")
            .option("channel", "spark")
            .option("lookupdPollInterval", "500ms")
            .option("stagingLocation", os.path.join(base, "staging"))
            .load()
        )
        query = df.writeStream.format("memory").queryName("cluster").trigger(processingTime="200 milliseconds").start()
        try:
            wait_rows("cluster", 50)
            second = start_nsqd(
                "-lookupd-tcp-address", lookupd_tcp, "-broadcast-address", "127.0.0.1", cwd=os.path.join(base, "n1")
            )
            self.addCleanup(second.kill)
            publish(tcp(second), "spark_cluster", bodies("n1", 50))
            wait_rows("cluster", 100)
        finally:
            query.stop()
        rows = spark().sql("SELECT body, nsqd_address FROM cluster").collect()
        self.assertEqual({bytes(r.body) for r in rows}, set(bodies("n0", 50) + bodies("n1", 50)))
        self.assertEqual({r.nsqd_address for r in rows}, {tcp(first), tcp(second)})


class SecureSourceTests(unittest.TestCase):
    timeout = 300

    def test_tls_snappy_and_auth(self):
        from tests.nsqd_tw.test_security import AuthServer

        base = tempfile.mkdtemp(prefix="nsq-spark-tls-")
        certs = make_certs(os.path.join(base, "certs"))
        auth = AuthServer()
        auth.response = {
            "ttl": 3600,
            "identity": "spark",
            "authorizations": [{"topic": "^spark_", "channels": [".*"], "permissions": ["publish", "subscribe"]}],
        }
        # the auth server runs in trial's reactor; the blocking Spark part runs
        # in a thread meanwhile
        address = auth.listen()
        self.addCleanup(auth.port.stopListening)
        return threads.deferToThread(self._secure_run, base, certs, address, auth)

    def _secure_run(self, base: str, certs: Any, address: str, auth: Any) -> None:
        nsqd = start_nsqd(
            "-https-address",
            "127.0.0.1:0",
            "-tls-cert",
            certs.cert,
            "-tls-key",
            certs.key,
            "-tls-required",
            "true",
            "-auth-http-address",
            address,
            cwd=base,
        )
        self.addCleanup(nsqd.kill)
        from nsq_client.blocking import TLSConfig

        tls = TLSConfig(enabled=True, root_ca_file=certs.ca)
        publish(tcp(nsqd), "spark_secure", bodies("secure", 300), tls=tls, snappy=True, auth_secret="s3cret")
        out = os.path.join(base, "out")
        df = (
            spark()
            .readStream.format("nsq")
            .option("nsqdTcpAddresses", tcp(nsqd))
            .option("topic", "spark_secure")
            .option("channel", "spark")
            .option("tls", "true")
            .option("tlsRootCaFile", certs.ca)
            .option("snappy", "true")
            .option("authSecret", "s3cret")
            .option("stagingLocation", os.path.join(base, "staging"))
            .load()
        )
        query = (
            df.writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", out + "-checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        self.assertIsNone(query.exception())
        got = [bytes(r.body) for r in spark().read.parquet(out).collect()]
        self.assertEqual(sorted(got), sorted(bodies("secure", 300)))
        self.assertTrue(all(q["tls"] == "true" and q["secret"] == "s3cret" for q in auth.queries))


class RetriedTaskTests(unittest.TestCase):
    """One task fails on purpose after staging and FINing its messages; Spark
    retries it, the retry reads the staging file: nothing lost, nothing twice."""

    timeout = 300

    def test_a_retried_task_loses_and_duplicates_nothing(self):
        import subprocess
        import sys

        import pyarrow.parquet as pq

        nsqd = start_nsqd()
        self.addCleanup(nsqd.kill)
        expected = bodies("retry", 3000)
        publish(tcp(nsqd), "spark_retry", expected)
        work = tempfile.mkdtemp(prefix="nsq-spark-retry-")
        output = os.path.join(work, "out")
        job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "retry_job.py")
        done = subprocess.run(
            [sys.executable, job, nsqd.addresses["HTTP"], "spark_retry", output, work],
            capture_output=True,
            text=True,
            timeout=240,
        )
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        with open(os.path.join(work, "failed-once")) as f:
            self.assertEqual(int(f.read()), 500)  # the failed attempt had staged a full partition
        got = pq.read_table(output, columns=["body"]).column("body").to_pylist()
        self.assertEqual(len(got), len(expected))
        self.assertEqual(set(got), set(expected))
        stats = settled(nsqd, "spark_retry", "spark")
        self.assertEqual((stats["depth"], stats["in_flight_count"], stats["requeue_count"]), (0, 0, 0))
        self.assertEqual(stats["message_count"], 3000)
