"""What the Spark tests share: one SparkSession (it takes seconds to start),
nsqd processes, and blocking publish/inspect helpers."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any
from urllib.request import urlopen

from nsq_client.blocking import Connection, ConnectOptions, TLSConfig
from tests.integration.procs import ServerProcess

_SPARK: Any = None

if "NSQ_SPARK_CLASS_CACHE" not in os.environ:
    # the nsq-spark-archive runs of this test run share a class-data cache of
    # their own (the first writes it), not the user's
    _CLASS_CACHE = tempfile.mkdtemp(prefix="nsq-spark-class-cache-")
    os.environ["NSQ_SPARK_CLASS_CACHE"] = _CLASS_CACHE
    atexit.register(shutil.rmtree, _CLASS_CACHE, True)


def spark() -> Any:
    """The test run's SparkSession (local[2]), with format("nsq") registered."""
    global _SPARK
    if _SPARK is None:
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise RuntimeError("Spark needs Java 17+: install a JDK (Debian: openjdk-17-jre-headless)")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        from nsq_spark import register

        _SPARK = (
            SparkSession.builder.master("local[2]")
            .appName("nsq-tw tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "1g")
            .getOrCreate()
        )
        _SPARK.sparkContext.setLogLevel("FATAL")  # queries stopped on purpose log stack traces
        register(_SPARK)
        atexit.register(_SPARK.stop)
    return _SPARK


_NSQD: ServerProcess | None = None


def shared_nsqd() -> ServerProcess:
    """One nsqd for the tests that do not need their own (each uses its own topics)."""
    global _NSQD
    if _NSQD is None:
        _NSQD = start_nsqd()
        atexit.register(_NSQD.kill)
    return _NSQD


def start_nsqd(*args: str, cwd: str | None = None) -> ServerProcess:
    cwd = cwd or tempfile.mkdtemp(prefix="nsq-spark-test-")
    proc = ServerProcess("nsqd", "-tcp-address", "127.0.0.1:0", "-http-address", "127.0.0.1:0", *args, cwd=cwd)
    return proc.start()


def tcp(proc: ServerProcess) -> str:
    return f"127.0.0.1:{proc.port('TCP')}"


def publish(address: str, topic: str, bodies: list[bytes], batch: int = 500, **connect: Any) -> None:
    conn = Connection(address, ConnectOptions(tls=connect.pop("tls", TLSConfig()), **connect)).open()
    try:
        conn.publish(topic, [bodies[i : i + batch] for i in range(0, len(bodies), batch)])
    finally:
        conn.close()


def channel_stats(proc: ServerProcess, topic: str, channel: str) -> dict[str, Any]:
    with urlopen(f"http://127.0.0.1:{proc.port('HTTP')}/stats?format=json&topic={topic}", timeout=5) as resp:
        stats = json.loads(resp.read())
    for t in stats["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    raise KeyError(f"no channel {topic}/{channel}")


def topic_depth(proc: ServerProcess, topic: str) -> int:
    with urlopen(f"http://127.0.0.1:{proc.port('HTTP')}/stats?format=json&topic={topic}", timeout=5) as resp:
        stats = json.loads(resp.read())
    return sum(t["depth"] for t in stats["topics"] if t["topic_name"] == topic)


def settled(proc: ServerProcess, topic: str, channel: str, timeout: float = 10.0) -> dict[str, Any]:
    """The channel's stats once nothing is in flight (FINs can trail the query)."""
    deadline = time.monotonic() + timeout
    while True:
        c = channel_stats(proc, topic, channel)
        if c["in_flight_count"] == 0 or time.monotonic() > deadline:
            return c
        time.sleep(0.1)


def consume_all(address: str, topic: str, channel: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """Read ``count`` messages with a plain connection, FINing each."""
    from nsq_wire import commands
    from nsq_wire.frames import FRAME_TYPE_MESSAGE, HEARTBEAT
    from nsq_wire.message import decode

    conn = Connection(address, ConnectOptions(tls=TLSConfig())).open()
    conn.sock.settimeout(timeout)
    bodies: list[bytes] = []
    try:
        conn.subscribe(topic, channel)
        conn.rdy(2500)
        while len(bodies) < count:
            frame_type, data = conn.read_frame()
            if frame_type == FRAME_TYPE_MESSAGE:
                msg_id, body, _, _ = decode(data)
                bodies.append(body)
                conn.fin([msg_id])
            elif data == HEARTBEAT:
                conn.send(commands.NOP)
    finally:
        conn.close()
    return bodies


def wait_rows(table: str, n: int, timeout: float = 60) -> None:
    """Wait until the memory sink ``table`` holds ``n`` rows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if spark().sql(f"SELECT count(*) AS n FROM {table}").first().n >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"{table} did not reach {n} rows")
