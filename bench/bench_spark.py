"""End-to-end rows/s of the Spark source and sink (local[*], one nsqd).

    python bench/bench_spark.py                       # 200,000 messages of 200 bytes, 3 runs
    python bench/bench_spark.py --messages 500000 --size 1000 --runs 5

source: publish N messages, then time an availableNow query from
``format("nsq")`` to the ``noop`` sink (the time includes FINing them).
sink: time ``df.write.format("nsq")`` of N rows (every MPUB answered OK).
Each run uses a new topic; the SparkSession is started once, outside the timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from run import launch  # noqa: E402

from nsq_client.blocking import Connection, ConnectOptions, TLSConfig  # noqa: E402


def publish(address: str, topic: str, n: int, size: int) -> None:
    conn = Connection(address, ConnectOptions(tls=TLSConfig())).open()
    body = b"a" * size
    batch = max(1, min(1000, (5 * 1024 * 1024 - 4) // (size + 4)))
    try:
        for start in range(0, n, batch * 8):
            chunk = [[body] * min(batch, n - i) for i in range(start, min(n, start + batch * 8), batch)]
            conn.publish(topic, chunk)
    finally:
        conn.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--max-messages-per-batch", type=int, default=50_000)
    p.add_argument("--verbose", action="store_true", help="where the source's micro-batches spend their time")
    a = p.parse_args()

    data = tempfile.mkdtemp(prefix="nsq-bench-spark-")
    proc, address = launch(["--mem-queue-size", str(a.messages * 2), "--data-path", data])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from nsq_spark import register

    spark = (
        SparkSession.builder.master(a.master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    source: list[float] = []
    sink: list[float] = []
    try:
        for run in range(a.runs):
            topic = f"bench_spark_{run}"
            publish(address, topic, a.messages, a.size)
            started = time.perf_counter()
            query = (
                spark.readStream.format("nsq")
                .option("nsqdTcpAddresses", address)
                .option("topic", topic)
                .option("channel", "bench")
                .option("maxMessagesPerBatch", str(a.max_messages_per_batch))
                .option("maxInFlight", str(a.max_messages_per_batch))
                .option("idleTimeout", "500ms")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", os.path.join(data, f"checkpoint-{run}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            elapsed = time.perf_counter() - started
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            if rows != a.messages:
                raise SystemExit(f"source read {rows} of {a.messages} messages")
            source.append(rows / elapsed)
            if a.verbose:
                phases: dict[str, int] = {}
                batches = [p for p in query.recentProgress if p["numInputRows"]]
                for p in batches:
                    for k, v in p["durationMs"].items():
                        phases[k] = phases.get(k, 0) + v
                print(f"  {len(batches)} batches; total ms per phase: {phases}")

            df = spark.range(a.messages).selectExpr(f"repeat('a', {a.size}) AS value").repartition(2).cache()
            df.count()
            started = time.perf_counter()
            df.write.format("nsq").mode("append").option("nsqdTcpAddresses", address).option(
                "topic", f"{topic}_out"
            ).save()
            sink.append(a.messages / (time.perf_counter() - started))
            df.unpersist()
            print(f"run {run + 1}: source {source[-1]:,.0f} rows/s, sink {sink[-1]:,.0f} rows/s", flush=True)
    finally:
        spark.stop()
        proc.terminate()
        proc.wait(30)
    print()
    for name, values in (("source", source), ("sink", sink)):
        print(
            f"{name}: median {statistics.median(values):,.0f} rows/s over {len(values)} runs "
            f"({', '.join(f'{v:,.0f}' for v in values)}), {a.messages:,} messages of {a.size} bytes"
        )


if __name__ == "__main__":
    main()
