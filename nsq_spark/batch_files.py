"""nsq-spark-archive's output: each micro-batch's rows as whole Parquet files, once.

The archive job (:mod:`nsq_spark.archive`) hands a :class:`BatchFiles` to
``foreachBatch``; the rows come deduplicated within the watermark, and with
``--since`` the copies the archive holds already are left out here.
"""

from __future__ import annotations

import json
from typing import Any


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

    def __init__(self, output: str, checkpoint: str, compression: str, since_ms: int | None = None) -> None:
        self.output = output
        self.checkpoint = checkpoint
        self.compression = compression
        self.since_ms = since_ms  # --since: rows published since then may be archived already
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
        if self.since_ms is not None:
            df = self._not_archived(df, fs, out)
        df.write.partitionBy("date", "hour").option("compression", self.compression).parquet(incoming.toString())
        written = fs.globStatus(Path(incoming, "date=*/hour=*/*.parquet")) or []
        for n, src in enumerate(sorted((s.getPath() for s in written), key=lambda p: p.toString())):
            hour = src.getParent()
            target = Path(out, f"{hour.getParent().getName()}/{hour.getName()}")
            fs.mkdirs(target)
            if not fs.rename(src, Path(target, f"part-{tag}-{n:05d}.parquet")):
                raise OSError(f"could not move {src.toString()} into {target.toString()}")
        fs.delete(incoming, True)

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
