"""End-to-end rows/s of the Spark source and sink (local[*], one nsqd), and of an archive.

    python bench/bench_spark.py                       # 200,000 messages of 200 bytes, 3 runs
    python bench/bench_spark.py --messages 500000 --size 1000 --runs 5
    python bench/bench_spark.py --archive --master 'local[2]' --messages 400000
    python bench/bench_spark.py --archive --master 'local[2]' --messages 400000 --size 100 --backlog disk

archive: publish N messages, then run ``nsq-spark-archive --trigger available-now`` as a
user runs it: its own process, its own SparkSession, JVM start included, given nsqd's HTTP
address so batches are planned from the channel's depth (``--tcp-only``: the TCP address).
It reports the wall time and rows/s, the time until the first batch landed, the rows/s
inside the query after that first batch, the peak RSS of the archive's process tree and of
its parts (the JVM, the driver's Python processes, the task Python workers), and what
``pyarrow.parquet.read_table`` finds in the output (rows, distinct IDs).

source: publish N messages, then time an availableNow query from
``format("nsq")`` to the ``noop`` sink (the time includes FINing them).
sink: time ``df.write.format("nsq")`` of N rows (every MPUB answered OK).
Each run uses a new topic; the SparkSession is started once, outside the timing.

``--backlog disk`` (archive): as an hourly job meets its topic. nsqd keeps its default
``--mem-queue-size`` (10,000), the topic gets two channels (the archive's and another)
before the messages are published by HTTP ``/mpub``, so nearly all of the archive's
backlog is on disk. ``--backlog memory`` (the default) gives nsqd room for all of them.
``--redelivered N`` (archive): N of them are taken and given back (REQ) before the job
runs, so nsqd delivers them with ``attempts`` 2, rows the job looks up as possible copies
(what an ``available-now`` run gives back at its cutoff comes to the next run so).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
import urllib.request
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


def publish_http(http_address: str, topic: str, n: int, size: int, channels: list[str]) -> None:
    """``channels`` of ``topic`` created, then ``n`` messages published by ``POST /mpub``
    (newline-separated bodies, ~1 MB a request), as an HTTP producer does."""
    import http.client

    host, _, port = http_address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def post(path: str, body: bytes = b"") -> None:
        conn.request("POST", path, body)
        answer = conn.getresponse()
        text = answer.read()
        if answer.status != 200:
            raise SystemExit(f"POST {path}: {answer.status} {text!r}")

    try:
        post(f"/topic/create?topic={topic}")
        for channel in channels:
            post(f"/channel/create?topic={topic}&channel={channel}")
        line = b"a" * size
        batch = max(1, min(10_000, (1024 * 1024) // (size + 1)))
        for start in range(0, n, batch):
            post(f"/mpub?topic={topic}", b"\n".join([line] * min(batch, n - start)))
    finally:
        conn.close()


def give_back(address: str, topic: str, channel: str, n: int) -> None:
    """Take ``n`` messages of ``channel`` and give them back (REQ): nsqd delivers
    them again with ``attempts`` 2, as it does what an availableNow run gave
    back at its cutoff, or what a task took and could not stage."""
    from nsq_client.blocking import Connection, ConnectOptions, TLSConfig
    from nsq_wire.frames import FRAME_TYPE_MESSAGE
    from nsq_wire.message import decode

    conn = Connection(address, ConnectOptions(tls=TLSConfig())).open()
    try:
        conn.subscribe(topic, channel)
        taken = 0
        while taken < n:
            conn.rdy(min(2500, n - taken))
            for frame_type, data in conn.poll_frames(1.0):
                if frame_type == FRAME_TYPE_MESSAGE and taken < n:
                    conn.req(decode(data)[0], 0)
                    taken += 1
    finally:
        conn.close()


def rss_by_role(pid: int) -> dict[str, int]:
    """RSS in bytes of a process and its descendants, by role: ``jvm`` (the
    driver JVM, which hosts the executors under local[N]), ``driver_python``
    (the archive's own Python and the Python processes Spark runs for the
    source's driver side: offsets, planning) and ``task_python`` (the Python
    workers running read tasks)."""
    roles = {"jvm": 0, "driver_python": 0, "task_python": 0}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
            with open(f"/proc/{p}/cmdline") as f:
                cmdline = f.read()
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except (OSError, StopIteration):
            continue
        if "java" in cmdline.split("\0", 1)[0]:
            roles["jvm"] += rss
        elif "pyspark.worker" in cmdline and "pyspark.sql" not in cmdline:
            roles["task_python"] += rss
        elif "python" in cmdline:
            roles["driver_python"] += rss
    return roles


def archive_run(address: str, data: str, run: int, a: argparse.Namespace) -> dict[str, float]:
    """One archive of ``a.messages`` messages, as a user runs it."""
    import re
    import subprocess
    import threading

    topic = f"bench_archive_{run}"
    if a.backlog == "disk":
        publish_http(a.http_address, topic, a.messages, a.size, ["nsq_to_parquet", "other"])
    else:
        publish(address, topic, a.messages, a.size)
    if a.redelivered:
        give_back(address, topic, "nsq_to_parquet", a.redelivered)
    output = os.path.join(data, f"archive-{run}")
    exe = Path(sys.executable).parent / "nsq-spark-archive"
    node = ["--nsqd-tcp-address", address] if a.tcp_only else ["--nsqd-http-address", a.http_address]
    argv = [str(exe), *node, "--topic", topic, "--output", output]
    argv += ["--master", a.master]
    if a.max_messages_per_batch:
        argv += ["--max-messages-per-batch", str(a.max_messages_per_batch)]
    argv += a.archive_args
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    peak = {"total": 0, "jvm": 0, "driver_python": 0, "task_python": 0}

    def sample() -> None:
        while proc.poll() is None:
            roles = rss_by_role(proc.pid)
            peak["total"] = max(peak["total"], sum(roles.values()))
            for role, rss in roles.items():
                peak[role] = max(peak[role], rss)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    batches: list[tuple[float, int]] = []
    query_at = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if query_at is None and re.search(r"archiving \S+: query \S+ started", line):
            query_at = time.perf_counter() - started
        if m := re.search(r"batch \d+: (\d+) messages archived", line):
            batches.append((time.perf_counter() - started, int(m.group(1))))
        elif a.verbose or "ERROR" in line:
            print("  " + line.rstrip(), flush=True)
    if proc.wait() != 0:
        raise SystemExit(f"nsq-spark-archive exited {proc.returncode}")
    wall = time.perf_counter() - started
    sampler.join()
    import pyarrow.parquet as pq

    table = pq.read_table(output, columns=["id"])
    rows = sum(n for _, n in batches)
    first_at, first_rows = batches[0] if batches else (wall, 0)
    last_at = batches[-1][0] if batches else wall
    query_at = first_at if query_at is None else query_at
    return {
        # where the wall time goes: JVM and session, the first batch (its warm-up),
        # the other batches, and the tail from the last batch to the process's exit
        "session": query_at,
        "first_batch_took": first_at - query_at,
        "other_batches": last_at - first_at,
        "tail": wall - last_at,
        "query_rows_s": rows / (last_at - query_at) if last_at > query_at else 0.0,
        "wall": wall,
        "rows": rows,
        "first_batch": first_at,
        "wall_rows_s": rows / wall,
        "in_query_rows_s": (rows - first_rows) / (last_at - first_at) if last_at > first_at else 0.0,
        "peak_rss_mb": peak["total"] / 2**20,
        "peak_jvm_mb": peak["jvm"] / 2**20,
        "peak_driver_python_mb": peak["driver_python"] / 2**20,
        "peak_task_python_mb": peak["task_python"] / 2**20,
        "parquet_rows": table.num_rows,
        "parquet_ids": len(set(table.column("id").to_pylist())),
    }


def archive_main(a: argparse.Namespace) -> None:
    data = tempfile.mkdtemp(prefix="nsq-bench-archive-")
    memory = [] if a.backlog == "disk" else ["--mem-queue-size", str(a.messages * 2)]
    proc, address = launch([*memory, "--data-path", data])
    a.http_address = proc.http_address  # type: ignore[attr-defined]
    # as an hourly job meets it, nsqd has been up a while: no message stamped in
    # the second it started, which the archive would look up as a possible copy
    # of one delivered before a restart
    with urllib.request.urlopen(f"http://{a.http_address}/info") as resp:
        started = json.load(resp)["start_time"]
    while time.time() < started + 1.5:
        time.sleep(0.1)
    results = []
    try:
        for run in range(a.runs):
            r = archive_run(address, data, run, a)
            results.append(r)
            print(
                f"run {run + 1}: {r['rows']:,.0f} rows in {r['wall']:.1f} s: wall {r['wall_rows_s']:,.0f} rows/s, "
                f"first batch landed at {r['first_batch']:.1f} s, in-query {r['in_query_rows_s']:,.0f} rows/s, "
                f"query start to last batch {r['query_rows_s']:,.0f} rows/s (split: session {r['session']:.1f} s, "
                f"first batch {r['first_batch_took']:.1f} s, other batches {r['other_batches']:.1f} s, "
                f"tail {r['tail']:.1f} s), "
                f"peak RSS {r['peak_rss_mb']:,.0f} MB (JVM {r['peak_jvm_mb']:,.0f}, driver Python "
                f"{r['peak_driver_python_mb']:,.0f}, task Python {r['peak_task_python_mb']:,.0f}); "
                f"parquet: {r['parquet_rows']:,} rows, "
                f"{r['parquet_ids']:,} distinct ids",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(30)
    print()
    keys = ("wall_rows_s", "query_rows_s", "in_query_rows_s", "session", "first_batch_took", "other_batches", "tail")
    for key in (*keys, "first_batch", "peak_rss_mb", "peak_jvm_mb", "peak_driver_python_mb"):
        values = [r[key] for r in results]
        print(f"{key}: median {statistics.median(values):,.1f} ({', '.join(f'{v:,.1f}' for v in values)})")
    batches = f"batches of {a.max_messages_per_batch:,}" if a.max_messages_per_batch else "the job's batch size"
    print(f"{a.messages:,} messages of {a.size} bytes, --master {a.master}, {batches}, backlog in {a.backlog}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--master", default="local[*]")
    p.add_argument(
        "--max-messages-per-batch",
        type=int,
        help="rows per micro-batch (default: 50,000 for the source; the job's own default for --archive)",
    )
    p.add_argument("--verbose", action="store_true", help="where the source's micro-batches spend their time")
    p.add_argument("--archive", action="store_true", help="time nsq-spark-archive as a user runs it (see above)")
    p.add_argument(
        "--backlog",
        choices=("memory", "disk"),
        default="memory",
        help="archive: nsqd holds the backlog in memory, or on disk as an hourly job meets it (see above)",
    )
    p.add_argument(
        "--redelivered",
        type=int,
        default=0,
        help="archive: this many of the messages taken and given back first (attempts 2: rows the job looks up)",
    )
    p.add_argument(
        "--tcp-only",
        action="store_true",
        help="archive: give nsqd's TCP address only (no /stats: the source cannot plan by depth)",
    )
    p.add_argument(
        "--archive-args",
        default="",
        help="archive: more flags for nsq-spark-archive, one string (e.g. '--class-cache off')",
    )
    a = p.parse_args()
    a.archive_args = shlex.split(a.archive_args)
    if a.archive:
        archive_main(a)
        return

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
                .option("topic", topic)
                .option("channel", "bench")
                .option("maxMessagesPerBatch", str(a.max_messages_per_batch or 50_000))
                .option("nsqdHttpAddresses", proc.http_address)  # type: ignore[attr-defined]
                .option("stagingLocation", os.path.join(data, f"staging-{run}"))
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
