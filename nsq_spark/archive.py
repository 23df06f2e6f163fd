"""nsq-spark-archive: land an NSQ topic in Parquet, partitioned by date and hour,
every message exactly once.

    nsq-spark-archive --nsqd-tcp-address 127.0.0.1:4150 --topic events --output ./archive

consumes ``events`` on channel ``nsq_to_parquet`` until it is drained (the
default trigger, ``available-now``) and adds ``./archive/date=YYYY-MM-DD/
hour=HH/part-<query>-b<batch>-<n>.parquet`` files (the hour of each message's nsqd
timestamp, UTC). ``--trigger 30s`` keeps running, a micro-batch every 30
seconds. The checkpoint (``<output>/_checkpoint`` unless ``--checkpoint`` says
otherwise) makes a restart carry on where the last run stopped.

Exactly once, for any Parquet reader: the source stages each batch before it
FINs it (staging files under ``<checkpoint>/nsq-staging``); a copy nsqd
delivers again within ``--dedup-window`` of the first (a FIN that never
arrived, nsqd restarted after kill -9) is dropped when the batch that holds it
is written, by ``(nsqd_address, id)`` (:mod:`nsq_spark.batch_files`); and each
batch's files are written aside
(``_incoming/``) and renamed into place only when complete, after removing
whatever an unfinished attempt of the same batch left.

Runs on ``local[*]`` unless ``--master`` names a cluster; under spark-submit
the master spark-submit was given is used:

    spark-submit --master spark://host:7077 "$(python -m nsq_spark.archive --path)" --topic events ...
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import threading
from typing import Any

from nsq_spark.batch_files import BatchFiles
from nsq_spark.classcache import ClassCache, default_directory, stop_driver_jvm
from nsq_spark.jit import short_run, with_short_run_option
from nsq_spark.options import since_millis, window_millis
from nsq_spark.progress import ClearingHandler, Progress
from nsq_spark.sparkhome import runs_locally, spark_home

log = logging.getLogger("nsq_spark.archive")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nsq-spark-archive", description=__doc__.split("\n\n")[0])
    p.add_argument("--topic", required=True, help="NSQ topic to archive")
    p.add_argument("--channel", default="nsq_to_parquet", help="channel to consume (default %(default)s)")
    p.add_argument("--nsqd-tcp-address", action="append", default=[], help="nsqd TCP address (repeatable)")
    p.add_argument(
        "--nsqd-http-address",
        action="append",
        default=[],
        help="nsqd HTTP address (repeatable): lets the source plan batches from the channel's depth",
    )
    p.add_argument("--lookupd-http-address", action="append", default=[], help="nsqlookupd HTTP address (repeatable)")
    p.add_argument("--output", required=True, help="directory (or any Hadoop URL) for the Parquet files")
    p.add_argument("--checkpoint", help="streaming checkpoint location (default <output>/_checkpoint)")
    p.add_argument(
        "--staging-location",
        help="where tasks stage messages before FINing them: a directory every executor reaches at the same path "
        "(default <checkpoint>/nsq-staging)",
    )
    p.add_argument(
        "--dedup-window",
        default="10 minutes",
        help="drop a copy nsqd delivers again within this long of the first (a duration such as 10m, or an "
        "interval, default %(default)s, at most 7 days; 0 turns deduplication off)",
    )
    p.add_argument(
        "--trigger",
        default="available-now",
        help="'available-now' (drain the channel, then exit) or an interval such as 30s or '1 minute'",
    )
    p.add_argument(
        "--max-messages-per-batch",
        type=int,
        help=f"most messages in one micro-batch (default {BATCH_AVAILABLE_NOW:,} with available-now, "
        f"{BATCH_INTERVAL:,} with an interval; each batch has a fixed cost of a few hundred ms)",
    )
    p.add_argument("--max-in-flight", type=int, default=0, help="RDY of each task connection (default 2500)")
    p.add_argument("--idle-timeout", default="2s", help="available-now: drained after this long without a message")
    p.add_argument(
        "--no-node-timeout",
        default="60s",
        help="fail when no nsqd could be reached (through lookupd or directly) for this long; 0: keep trying",
    )
    p.add_argument(
        "--since",
        help="first rewind the channel on every node to this time (RFC 3339, Unix ms, 'earliest', or a duration "
        "ago such as 2h): the topic's retained messages from then on are archived too, each once (nsqd's retention)",
    )
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, as spark-submit's --conf (repeatable); wins over the job's own choices",
    )
    p.add_argument(
        "--class-cache",
        default=default_directory(),
        metavar="DIR",
        help="where the driver JVM's class-data archive is kept, so later runs start faster; 'off' for none "
        "(default $NSQ_SPARK_CLASS_CACHE, else $XDG_CACHE_HOME/nsq-spark or ~/.cache/nsq-spark)",
    )
    p.add_argument("--tls", action="store_true", help="connect to nsqd with TLS")
    p.add_argument("--tls-root-ca-file")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--auth-secret", help="secret for nsqd's AUTH (or NSQ_AUTH_SECRET in the environment)")
    p.add_argument("--snappy", action="store_true")
    p.add_argument("--deflate", action="store_true")
    p.add_argument("--compression", default="snappy", help="Parquet compression codec (default %(default)s)")
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress, only warnings, errors and the final summary (for cron)",
    )
    p.add_argument("--path", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.nsqd_tcp_address and not args.lookupd_http_address and not args.nsqd_http_address:
        p.error("give --nsqd-tcp-address, --nsqd-http-address or --lookupd-http-address")
    args.since_ms = None
    if args.since is not None:
        if not args.nsqd_http_address and not args.lookupd_http_address:
            p.error("--since rewinds the channel over HTTP: give --nsqd-http-address or --lookupd-http-address")
        try:
            args.since_ms = since_millis(args.since)
        except ValueError as e:
            p.error(f"--since {args.since!r}: {e}")
    try:
        args.dedup_window_ms = window_millis(args.dedup_window)
    except ValueError as e:
        p.error(f"--dedup-window {args.dedup_window!r}: {e}")
    if args.max_messages_per_batch is None:
        args.max_messages_per_batch = BATCH_AVAILABLE_NOW if args.trigger == "available-now" else BATCH_INTERVAL
    if args.class_cache is not None and args.class_cache.strip().lower() in ("", "off"):
        args.class_cache = None
    args.confs = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            p.error(f"--conf {item!r}: expected KEY=VALUE")
        args.confs[key.strip()] = value
    return args


# rows per micro-batch: a run that drains the channel and exits pays a batch's
# fixed cost (planning, the state commit, the files' renames) fewer times; a
# query that keeps running lands what came in each interval in smaller steps
BATCH_AVAILABLE_NOW = 500_000
BATCH_INTERVAL = 100_000


def checkpoint_location(args: argparse.Namespace) -> str:
    return args.checkpoint or f"{args.output.rstrip('/')}/_checkpoint"


def source_options(args: argparse.Namespace) -> dict[str, str]:
    options = {
        "topic": args.topic,
        "channel": args.channel,
        "maxMessagesPerBatch": str(args.max_messages_per_batch),
        "maxInFlight": str(args.max_in_flight or 2500),
        "idleTimeout": args.idle_timeout,
        "noNodeTimeout": args.no_node_timeout,
        "stagingLocation": args.staging_location or f"{checkpoint_location(args)}/nsq-staging",
    }
    if args.nsqd_tcp_address:
        options["nsqdTcpAddresses"] = ",".join(args.nsqd_tcp_address)
    if args.nsqd_http_address:
        options["nsqdHttpAddresses"] = ",".join(args.nsqd_http_address)
    if args.lookupd_http_address:
        options["lookupdHttpAddresses"] = ",".join(args.lookupd_http_address)
    if args.tls:
        options["tls"] = "true"
    for key, value in (
        ("tlsRootCaFile", args.tls_root_ca_file),
        ("tlsCertFile", args.tls_cert),
        ("tlsKeyFile", args.tls_key),
    ):
        if value:
            options[key] = value
    secret = args.auth_secret or os.environ.get("NSQ_AUTH_SECRET")
    if secret:
        options["authSecret"] = secret
    if args.snappy:
        options["snappy"] = "true"
    if args.deflate:
        options["deflate"] = "true"
    return options


# what the job sets unless the user's Spark configuration does (spark-defaults.conf,
# --conf): SQL settings, applied once the session is up
_SQL_DEFAULTS = {
    # no empty batch when nothing arrived (the query keeps no state that
    # would need one)
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    # a batch's rows usually fall in one hour: write them as they come instead
    # of sorting them by date and hour first (a second hour in a task sorts the
    # rest, as before: no more memory than the sort)
    "spark.sql.maxConcurrentOutputFileWriters": "1",
}

# a checkpoint made before the archive dropped copies itself holds the state of
# Spark's dropDuplicatesWithinWatermark, which its query must keep (Spark refuses
# a query without the stateful operator its checkpoint has): the settings that
# state was made with
_LEGACY_STATE_DEFAULTS = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
}


def spark_session(
    master: str | None,
    app_name: str,
    *,
    confs: dict[str, str] | None = None,
    class_cache: ClassCache | None = None,
    ui: bool = True,
) -> Any:
    """The job's SparkSession. ``confs``: the user's ``--conf`` settings, which
    win; ``class_cache``: the driver JVM's class-data archive; ``ui``: False for
    a run that ends by itself (Spark's web UI costs its start and is gone when
    the run is)."""
    # executors' Python is this one, so they find pyarrow and nsq_spark
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf()
    confs = confs or {}
    builder = SparkSession.builder.appName(app_name)
    # Spark's own `[Stage 3:===>  (1 + 0) / 2]` bar: carriage returns in a log
    # file, and a second live line beside ours in a terminal
    defaults = {"spark.ui.showConsoleProgress": "false"}
    if not ui:
        defaults["spark.ui.enabled"] = "false"
    for key, value in defaults.items():
        if not conf.contains(key):
            builder = builder.config(key, value)
    if master:
        builder = builder.master(master)
    elif not conf.contains("spark.master") and "spark.master" not in confs:
        builder = builder.master("local[*]")
    for key, value in confs.items():
        builder = builder.config(key, value)
    if class_cache is not None:
        builder = class_cache.configure(builder, confs)
    try:
        spark = builder.getOrCreate()
    except Exception:
        if class_cache is None or not class_cache.reading:
            raise
        class_cache.discard()
        builder = builder.config("spark.driver.extraJavaOptions", confs.get("spark.driver.extraJavaOptions", ""))
        spark = builder.getOrCreate()
    conf = SparkConf()
    if not conf.contains("spark.sql.shuffle.partitions"):
        # a batch with copies to drop joins and shuffles: one partition per
        # core, not Spark's 200 (a new checkpoint keeps the number it started with)
        spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
    for key, value in _SQL_DEFAULTS.items():
        if not conf.contains(key):
            spark.conf.set(key, value)
    return spark


def warm_workers(spark: Any) -> Any:
    """Start Spark's Python processes for a Python data source while the query
    starts: a batch read of :class:`nsq_spark.source.WarmUpSource`, one
    partition per task slot, in a thread. Spark starts each kind of those
    processes on first use (the one that builds a source, the one that plans
    its read, the read tasks' workers), each importing PySpark, seconds the
    first batch would otherwise wait for; it keeps them, and the workers
    (``spark.python.worker.reuse``), so the query's own find them running. (An
    RDD job's workers are not those: Spark keeps SQL's Python workers apart.)
    Returns the thread (done when the read is)."""
    from nsq_spark.source import WarmUpSource

    slots = max(1, int(spark.sparkContext.defaultParallelism))

    def job() -> None:
        try:
            spark.dataSource.register(WarmUpSource)
            spark.read.format(WarmUpSource.name()).option("partitions", str(slots)).load().collect()
        except Exception as e:  # only a head start: the query starts its processes anyway
            log.debug("warming Spark's Python processes failed: %s", e)

    thread = threading.Thread(target=job, name="nsq-archive-warm", daemon=True)
    thread.start()
    return thread


def _dated(spark: Any, messages: Any) -> Any:
    """The archive's rows: the source's columns, and the date and hour (UTC) of
    each message's nsqd timestamp."""
    from pyspark.sql import functions as F

    utc = F.to_utc_timestamp(F.col("timestamp"), spark.conf.get("spark.sql.session.timeZone"))
    return messages.withColumn("date", F.date_format(utc, "yyyy-MM-dd")).withColumn("hour", F.date_format(utc, "HH"))


def archive_query(spark: Any, args: argparse.Namespace) -> Any:
    """Start the streaming query; the caller waits for it."""

    from nsq_spark import register

    register(spark)
    reader = spark.readStream.format("nsq").schema(SOURCE_SCHEMA)
    for key, value in source_options(args).items():
        reader = reader.option(key, value)
    messages = reader.load()
    window_ms = args.dedup_window_ms
    if window_ms and _has_state(spark, checkpoint_location(args)):
        log.info("the checkpoint holds Spark's deduplication state: copies are dropped by it, as before")
        from pyspark import SparkConf

        conf = SparkConf()
        for key, value in _LEGACY_STATE_DEFAULTS.items():
            if not conf.contains(key):
                spark.conf.set(key, value)
        interval = f"{window_ms} milliseconds"
        messages = messages.withWatermark("received", interval).dropDuplicatesWithinWatermark(["nsqd_address", "id"])
        window_ms = 0
    rows = _dated(spark, messages)
    writer = (
        rows.writeStream.foreachBatch(
            BatchFiles(
                args.output.rstrip("/"),
                checkpoint_location(args),
                args.compression,
                args.since_ms,
                dedup_window_ms=window_ms,
                node_starts=_node_starts(args),
            )
        )
        .option("checkpointLocation", checkpoint_location(args))
        .queryName(f"nsq-archive-{args.topic}")
    )
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=_spark_interval(args.trigger))
    return writer.start()


SOURCE_SCHEMA = (
    "id STRING, body BINARY, timestamp TIMESTAMP, attempts INT, nsqd_address STRING, topic STRING, channel STRING, "
    "received TIMESTAMP"
)


def _has_state(spark: Any, checkpoint: str) -> bool:
    """Whether ``checkpoint`` holds a stateful operator's state (any Hadoop path)."""
    Path = spark._jvm.org.apache.hadoop.fs.Path
    path = Path(f"{checkpoint}/state")
    return bool(path.getFileSystem(spark._jsc.hadoopConfiguration()).exists(path))


def _spark_interval(text: str) -> str:
    """A Spark interval from a Go duration (``30s``), plain ``0``, or a Spark
    interval already (``10 minutes``)."""
    if " " in text.strip():
        return text.strip()
    from nsq_wire.gofmt import parse_duration

    return f"{int(parse_duration(text) * 1000)} milliseconds"


def _observer(args: argparse.Namespace) -> Any:
    """One planner for what this process asks the nodes while the query runs
    (their backlog, their start times), made on first use; None when no node
    has an HTTP address to ask."""
    if not args.nsqd_http_address and not args.lookupd_http_address:
        return None
    if getattr(args, "observer", None) is None:
        args.observer = _planner(args)
    return args.observer


def _node_starts(args: argparse.Namespace) -> Any:
    """() -> when each node the job reads started, where its HTTP API says
    (none given: every row is checked for copies)."""
    planner = _observer(args)
    return dict if planner is None else planner.start_times


def _planner(args: argparse.Namespace) -> Any:
    """The source's planner, for the nodes the job was given."""
    from nsq_spark.planner import Planner, PlannerConfig

    planner = Planner(
        PlannerConfig(
            topic=args.topic,
            channel=args.channel,
            nsqd_addresses=list(args.nsqd_tcp_address),
            nsqd_http_addresses=list(args.nsqd_http_address),
            lookupd_addresses=list(args.lookupd_http_address),
        )
    )
    planner.start()
    return planner


def rewind_channel(args: argparse.Namespace) -> None:
    """``--since``: the channel, on every node, gets again what its topic retained
    from then on (raises RewindError)."""
    planner = _planner(args)
    try:
        planner.rewind("earliest" if args.since.strip() == "earliest" else str(args.since_ms))
    finally:
        planner.close()


def _backlog_of(args: argparse.Namespace) -> Any:
    """() -> the messages left for the job on the nodes whose depth can be read
    (None: none can), through the source's own planner."""
    planner = _observer(args)
    if planner is None:
        return None

    def backlog() -> int | None:
        depths = [d for _, d in planner.survey() if d is not None]
        return sum(depths) if depths else None

    return backlog


def main(argv: list[str] | None = None) -> int:
    if argv is None and "--path" in sys.argv[1:]:
        print(os.path.abspath(__file__))  # for spark-submit
        return 0
    args = parse_args(argv)
    mode = "quiet" if args.quiet else "live" if sys.stderr.isatty() else "lines"
    handler = ClearingHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    ours = logging.getLogger("nsq_spark")
    ours.addHandler(handler)
    ours.setLevel(logging.WARNING if args.quiet else logging.INFO)
    if args.since is not None:
        from nsq_spark.planner import RewindError

        try:
            rewind_channel(args)
        except RewindError as e:
            log.error("archiving %s failed: %s", args.topic, e)
            return 1
    confs = _driver_confs(args)
    cache = args.class_cache or default_directory()
    if cache and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # a JVM this process starts: its Python processes import the installed
        # PySpark (nsq_spark.sparkhome); set before the class cache is keyed
        home = spark_home(cache, args.master or args.confs.get("spark.master"))
        if home is not None:
            os.environ["SPARK_HOME"] = home
    class_cache = None
    if args.class_cache:
        class_cache = ClassCache.for_new_driver(args.class_cache, confs)
    spark = spark_session(
        args.master,
        f"nsq-spark-archive {args.topic}",
        confs=confs,
        class_cache=class_cache,
        ui=args.trigger != "available-now",
    )
    progress = Progress(args.topic, mode, _backlog_of(args) if mode == "live" else None)
    handler.progress = progress
    spark.streams.addListener(progress.listener)
    warm_workers(spark)
    query = archive_query(spark, args)
    failed: str | None = None
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    except Exception as e:
        failed = failure_reason(str(e))
    finally:
        progress.catch_up(query)
        progress.close()
        spark.streams.removeListener(progress.listener)
    if failed is not None:
        log.error("archiving %s failed: %s", args.topic, failed)
        _stop(spark, class_cache)
        return 1
    elapsed = max(progress.elapsed(), 1e-9)
    ours.setLevel(logging.INFO)  # the summary shows with --quiet too
    log.info(
        "done: %d messages of %s archived in %s (%.1f s, %.0f rows/s)",
        progress.total,
        args.topic,
        args.output,
        elapsed,
        progress.total / elapsed,
    )
    if args.quiet:
        ours.setLevel(logging.WARNING)
    _stop(spark, class_cache)
    return 0


def _driver_confs(args: argparse.Namespace) -> dict[str, str]:
    """The user's ``--conf`` settings, with the driver JVM's compilers chosen
    for a short run (:mod:`nsq_spark.jit`): an ``available-now`` run whose
    local JVM this process starts, over a backlog the nodes report."""
    confs = dict(args.confs)
    if args.trigger != "available-now" or "PYSPARK_GATEWAY_PORT" in os.environ:
        return confs
    if not runs_locally(args.master or confs.get("spark.master")):
        return confs
    messages = _backlog_soon(args)
    if short_run(messages):
        log.debug("a short run (%s messages): the driver JVM compiles with C1 alone", messages)
        return with_short_run_option(confs)
    return confs


SURVEY_WAIT = 1.0  # the most the JVM's start waits for the nodes' depths


def _backlog_soon(args: argparse.Namespace, wait: float = SURVEY_WAIT) -> int | None:
    """The backlog the nodes report within ``wait`` seconds, else None: a
    paused or unreachable node (HTTP waits 5 s for each) must not hold up the
    start."""
    backlog = _backlog_of(args)
    if backlog is None:
        return None
    answer: list[int | None] = []

    def ask() -> None:
        try:
            answer.append(backlog())
        except Exception as e:
            log.debug("the nodes' depths: %s", e)

    asking = threading.Thread(target=ask, name="nsq-archive-backlog", daemon=True)
    asking.start()
    asking.join(wait)
    return answer[0] if answer else None


def _stop(spark: Any, class_cache: ClassCache | None) -> None:
    """Stop Spark, then its JVM, and wait for it: the job's process exits after
    the JVM (which may be writing its class-data archive)."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        # PySpark's accumulator server notices a shutdown at its next poll, up
        # to half a second later, and spark.stop() waits for it: no job is left
        # to report to it, so it is shut down in a thread beside the JVM's stop
        spark.sparkContext._accumulatorServer = None
        threading.Thread(target=server.shutdown, name="nsq-archive-accumulators", daemon=True).start()
    spark.stop()
    code = stop_driver_jvm()
    if class_cache is not None:
        class_cache.finish(code)


def failure_reason(text: str) -> str:
    """The error a failed query carries, without Spark's wrapping: the Python
    exception's message when the source raised one (e.g. no nsqd reachable)."""
    start = text.rfind("Traceback (most recent call last):")
    if start >= 0:
        for line in text[start:].splitlines()[1:]:
            if line and not line[0].isspace():
                name, _, message = line.partition(": ")
                return re.sub(r"(\s+SQLSTATE: \w+)+\s*$", "", message or name)
    return text.strip().splitlines()[0] if text.strip() else "unknown error"


if __name__ == "__main__":
    if __package__ in (None, ""):
        # run as a file by spark-submit: import nsq_spark from where this file lives
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
