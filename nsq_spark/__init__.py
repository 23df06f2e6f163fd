"""NSQ for Apache Spark (PySpark's Python data source API).

    from nsq_spark import register
    register(spark)
    df = (spark.readStream.format("nsq")
          .option("nsqdTcpAddresses", "127.0.0.1:4150")
          .option("topic", "events").option("channel", "spark")
          .load())

See docs/spark.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Make ``format("nsq")`` available in this SparkSession.

    A Spark Connect session (``SparkSession.builder.remote("sc://...")``) works
    too: the client pickles the data source class by reference and sends it to
    the server, whose Python workers import it, so the server's Python (its
    ``PYSPARK_PYTHON``, on the driver and every executor) needs nsq-tw[spark]
    installed, at the client's Python minor version."""
    from nsq_spark.source import NSQDataSource

    spark.dataSource.register(NSQDataSource)
