"""nsq-spark-archive's output: each micro-batch's rows as whole Parquet files, once.

The archive job (:mod:`nsq_spark.archive`) hands a :class:`BatchFiles` to
``foreachBatch``. Copies nsqd delivers again are dropped here, without a
shuffle (:meth:`BatchFiles._drop_redelivered`), and with ``--since`` the copies
the archive holds already are left out.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

# clocks differ: an executor stamps ``received``, nsqd its start time and the
# filesystem its files' times
CLOCK_SLACK_MS = 60_000
# suspect rows looked up from the driver; more are joined by Spark
MAX_SUSPECTS_COLLECTED = 100_000
_KEY_SCHEMA = "nsqd_address STRING, id STRING"


class BatchFiles:
    """``foreachBatch``: a micro-batch's rows as Parquet files that appear
    whole, once. Spark writes the batch under ``<output>/_incoming/<query>-b<id>``
    (readers skip names starting with ``_``); each finished file is then
    renamed to ``date=.../hour=.../part-<query>-b<id>-<n>.parquet``, where
    ``<query>`` is the streaming query's id (kept in the checkpoint), so jobs
    sharing an output never touch each other's files. A batch run again (the
    job was killed before Spark recorded it) first removes every
    ``part-<query>-b<id>-*`` an earlier attempt renamed into place, so what a reader
    counts is each batch's rows exactly once. Works on any Hadoop filesystem
    Spark can write to; on object stores a rename is a copy, still whole."""

    def __init__(
        self,
        output: str,
        checkpoint: str,
        compression: str,
        since_ms: int | None = None,
        *,
        dedup_window_ms: int = 0,
        node_starts: Callable[[], dict[str, float]] = dict,
    ) -> None:
        self.output = output
        self.checkpoint = checkpoint
        self.compression = compression
        self.since_ms = since_ms  # --since: rows published since then may be archived already
        self.dedup_window_ms = dedup_window_ms  # 0: no deduplication
        self.node_starts = node_starts  # TCP address -> when that nsqd started (Unix s), where known
        self.query: str | None = None

    def _query_id(self, spark: Any, fs_of: Any) -> str:
        """The streaming query's id, from the checkpoint's metadata file."""
        if self.query is None:
            jvm = spark._jvm
            path = jvm.org.apache.hadoop.fs.Path(f"{self.checkpoint}/metadata")
            stream = fs_of(path).open(path)
            try:
                text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
            finally:
                stream.close()
            self.query = str(json.loads(text.splitlines()[0])["id"]).replace("-", "")[:12]
        return self.query

    def __call__(self, df: Any, batch_id: int) -> None:
        spark = df.sparkSession
        jvm = spark._jvm
        Path = jvm.org.apache.hadoop.fs.Path
        conf = spark._jsc.hadoopConfiguration()
        out = Path(self.output)
        fs = out.getFileSystem(conf)
        tag = f"{self._query_id(spark, lambda p: p.getFileSystem(conf))}-b{batch_id:010d}"
        incoming = Path(out, f"_incoming/{tag}")
        for status in fs.globStatus(Path(out, f"date=*/hour=*/part-{tag}-*")) or []:
            fs.delete(status.getPath(), False)
        fs.delete(incoming, True)
        fs.delete(Path(f"{incoming.toString()}-again"), True)
        if self.since_ms is not None:
            df = self._not_archived(df, fs, out)
        observed = None
        if self.dedup_window_ms > 0:
            df, observed = self._observed(df)
        schema = df.schema
        self._write(df, incoming)
        written = fs.globStatus(Path(incoming, "date=*/hour=*/*.parquet")) or []
        if written and observed is not None:
            starts = self.node_starts()
            if self._may_hold_copies(observed.get, starts) and self._drop_redelivered(
                spark, schema, fs, out, incoming, starts
            ):
                written = fs.globStatus(Path(incoming, "date=*/hour=*/*.parquet")) or []
        for n, src in enumerate(sorted((s.getPath() for s in written), key=lambda p: p.toString())):
            hour = src.getParent()
            target = Path(out, f"{hour.getParent().getName()}/{hour.getName()}")
            fs.mkdirs(target)
            if not fs.rename(src, Path(target, f"part-{tag}-{n:05d}.parquet")):
                raise OSError(f"could not move {src.toString()} into {target.toString()}")
        fs.delete(incoming, True)

    def _write(self, df: Any, path: Any) -> None:
        df.write.partitionBy("date", "hour").option("compression", self.compression).parquet(path.toString())

    @staticmethod
    def _observed(df: Any) -> tuple[Any, Any]:
        """``df`` with what says whether it can hold a copy measured as it is
        written (Spark's observed metrics: no job of their own)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        observation = Observation("nsq-archive-batch")
        df = df.observe(
            observation,
            F.max("attempts").alias("attempts"),
            F.unix_micros(F.min("timestamp")).alias("published"),
            F.unix_micros(F.min("received")).alias("received"),
            F.collect_set("nsqd_address").alias("nodes"),
        )
        return df, observation

    def _may_hold_copies(self, seen: dict[str, Any], starts: dict[str, float]) -> bool:
        """Whether a batch, by its observed metrics, has rows :meth:`_suspect`
        takes (a row redelivered, or one a node that started within the window
        may have delivered before it did; any row of a node whose start is
        unknown)."""
        if seen.get("attempts") is None:
            return False  # no rows
        if seen["attempts"] >= 2:
            return True
        window_us = (self.dedup_window_ms + CLOCK_SLACK_MS) * 1000
        for node in seen["nodes"]:
            started = starts.get(node)
            if started is None:
                return True
            started_us = int(started * 1_000_000)
            if seen["published"] < started_us + 1_000_000 and seen["received"] < started_us + window_us:
                return True
        return False

    def _drop_redelivered(
        self, spark: Any, schema: Any, fs: Any, out: Any, incoming: Any, starts: dict[str, float]
    ) -> bool:
        """Drop, from the batch just written under ``incoming``, the copies of a
        message nsqd delivered again within the deduplication window of the
        first; True when it rewrote the batch.

        nsqd delivers a message again when the FIN for it never arrived (the
        task died after staging it, the connection broke), with ``attempts``
        of 2 or more; or after nsqd itself restarted from a kill -9 (a disk
        queue whose read position was not yet synced, durable mode's
        unfinished messages), with ``attempts`` of 1 again. So the rows that
        can be a copy (:meth:`_suspect`) are those with ``attempts >= 2`` and
        those published before their node last started and received within the
        window after (``/info``'s ``start_time``, read after the batch was; a
        node whose start is unknown, given by its TCP address only or not
        answering, makes all its rows suspect). Mostly there are none, which
        the metrics Spark observed as it wrote the batch tell (:meth:`_observed`,
        no job of their own), and this is not called. Otherwise each suspect
        is looked up in the files of its hour written within the window (every
        copy of a message has the same nsqd timestamp, so the same hour) and in
        the batch itself, by broadcast joins, and the batch is written again
        without the copies if there are any."""
        from pyspark.sql import functions as F

        Path = spark._jvm.org.apache.hadoop.fs.Path
        key = ["nsqd_address", "id"]
        batch = spark.read.schema(schema).option("basePath", incoming.toString()).parquet(incoming.toString())
        suspects = batch.where(self._suspect(starts))
        rows = suspects.select(*key, "date", "hour", "received").limit(MAX_SUSPECTS_COLLECTED + 1).collect()
        if not rows:
            return False
        # the files a copy's first could be in: its hour's, written within the window
        first: dict[tuple[str, str], Any] = {}
        for r in rows:
            when = (r["date"], r["hour"])
            first[when] = min(first.get(when, r["received"]), r["received"])
        files = []
        for (date, hour), received in first.items():
            since_ms = int(received.timestamp() * 1000) - self.dedup_window_ms - CLOCK_SLACK_MS
            for status in fs.globStatus(Path(out, f"date={date}/hour={hour}/part-*.parquet")) or []:
                if status.getModificationTime() >= since_ms:
                    files.append(status.getPath().toString())
        archived = spark.read.parquet(*files).select(*key) if files else None
        if len(rows) > MAX_SUSPECTS_COLLECTED:
            # too many to look up from here: Spark joins the batch with them
            twice = suspects.select(*key).distinct()
            seen = archived.join(twice, key, "left_semi") if archived is not None else None
        else:
            # the usual case: a few redelivered rows, looked up by broadcast
            # joins (no shuffle), and the batch written again only if one is
            # a copy
            lookup = F.broadcast(spark.createDataFrame(sorted({(r[0], r[1]) for r in rows}), _KEY_SCHEMA))
            counts = Counter(tuple(r) for r in batch.select(*key).join(lookup, key, "left_semi").collect())
            found = set()
            if archived is not None:
                found = {tuple(r) for r in archived.join(lookup, key, "left_semi").distinct().collect()}
            repeated = {k for k, n in counts.items() if n > 1}
            if not found and not repeated:
                return False
            twice = spark.createDataFrame(sorted(found | repeated), _KEY_SCHEMA)
            seen = spark.createDataFrame(sorted(found), _KEY_SCHEMA) if found else None
        # every copy of an archived message goes; of a message the batch holds
        # more than once, one stays
        kept = batch.join(F.broadcast(seen), key, "left_anti") if seen is not None else batch
        once = kept.join(twice, key, "left_semi").dropDuplicates(key)
        clean = kept.join(twice, key, "left_anti").unionByName(once).select(*batch.columns)
        again = Path(f"{incoming.toString()}-again")
        fs.delete(again, True)
        self._write(clean, again)
        fs.delete(incoming, True)
        if not fs.rename(again, incoming):
            raise OSError(f"could not move {again.toString()} to {incoming.toString()}")
        return True

    def _suspect(self, starts: dict[str, float]) -> Any:
        """The rows that can be a copy: redelivered (``attempts >= 2``), or, on
        a node that started within the window, published before it started
        (its own clock stamps both) and delivered within the window after; every
        row of a node whose start is unknown."""
        from pyspark.sql import functions as F

        if not starts:
            return F.lit(True)
        suspect = (F.col("attempts") >= 2) | ~F.col("nsqd_address").isin(sorted(starts))
        window_s = (self.dedup_window_ms + CLOCK_SLACK_MS) / 1000
        for node, started in sorted(starts.items()):
            # start_time is in whole seconds; the executor's clock stamps received
            before = F.col("timestamp") < F.timestamp_seconds(F.lit(started + 1))
            within = F.col("received") < F.timestamp_seconds(F.lit(started + window_s))
            suspect = suspect | ((F.col("nsqd_address") == node) & before & within)
        return suspect

    def _not_archived(self, df: Any, fs: Any, out: Any) -> Any:
        """``df`` without the rows the archive already holds, looked up in the
        hours of the rows published since ``--since``: a rewind delivers again
        what the channel had, and what it archived before may be older than
        the deduplication window. A message's hour is that of its nsqd
        timestamp, so any earlier copy is in the same hour's files."""
        from pyspark.sql import functions as F

        recent = df.where(F.col("timestamp") >= F.timestamp_millis(F.lit(self.since_ms)))
        Path = df.sparkSession._jvm.org.apache.hadoop.fs.Path
        hours = [
            f"{self.output}/date={r['date']}/hour={r['hour']}"
            for r in recent.select("date", "hour").distinct().collect()
            if fs.exists(Path(out, f"date={r['date']}/hour={r['hour']}"))
        ]
        if not hours:
            return df
        archived = df.sparkSession.read.option("basePath", self.output).parquet(*hours)
        kept = df.join(archived.select("nsqd_address", "id"), ["nsqd_address", "id"], "left_anti")
        return kept.select(*df.columns)
