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
    """Make ``format("nsq")`` available in this SparkSession."""
    from nsq_spark.source import NSQDataSource

    spark.dataSource.register(NSQDataSource)
