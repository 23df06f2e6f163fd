"""A streaming query whose first attempt of one task fails on purpose after
it staged and FINed its messages; Spark retries the task (``local[2,2]``
allows one retry). Run by test_source.RetriedTaskTests as a process of its
own, since a test process has one SparkContext.

    python retry_job.py NSQD_HTTP TOPIC OUTPUT WORKDIR
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any


def main(http: str, topic: str, output: str, work: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import TaskContext
    from pyspark.sql import SparkSession

    from nsq_spark.source import NSQDataSource, NSQOptions, NSQPartition, NSQStreamReader, read_partition

    marker = os.path.join(work, "failed-once")

    class FlakyReader(NSQStreamReader):
        def read(self, partition: Any) -> Iterator[Any]:
            assert isinstance(partition, NSQPartition)
            table = read_partition(self.options, partition.plan)  # staged and FINed
            ctx = TaskContext.get()
            if partition.plan.batch == 2 and partition.plan.index == 0 and ctx is not None:
                if ctx.attemptNumber() == 0:
                    with open(marker, "w") as f:
                        f.write(f"{table.num_rows}\n")
                    raise RuntimeError("injected failure after staging")
            yield from table.to_batches()

    class FlakySource(NSQDataSource):
        @classmethod
        def name(cls) -> str:
            return "nsq_flaky"

        def streamReader(self, schema: Any) -> Any:
            return FlakyReader(NSQOptions.parse(self.options, reading=True))

    spark = (
        SparkSession.builder.master("local[2,2]")
        .appName("nsq-tw retried task")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")
    spark.dataSource.register(FlakySource)
    df = (
        spark.readStream.format("nsq_flaky")
        .option("nsqdHttpAddresses", http)
        .option("topic", topic)
        .option("channel", "spark")
        .option("stagingLocation", os.path.join(work, "staging"))
        .option("maxMessagesPerBatch", "1000")
        .option("rowsPerPartition", "500")
        .load()
    )
    query = (
        df.writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", os.path.join(work, "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main(*sys.argv[1:5])
