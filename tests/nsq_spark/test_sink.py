"""df.write.format("nsq") and df.writeStream.format("nsq"): every row
published, MPUBs within nsqd's limits, clear errors."""

from __future__ import annotations

import os
import tempfile

from twisted.trial import unittest

from tests.nsq_spark.harness import consume_all, publish, settled, shared_nsqd, spark, tcp, topic_depth


class SinkTests(unittest.TestCase):
    timeout = 300

    def setUp(self) -> None:
        self.nsqd = shared_nsqd()
        self.address = tcp(self.nsqd)

    def write(self, df, topic: str, **options: str) -> None:
        writer = df.write.format("nsq").mode("append").option("nsqdTcpAddresses", self.address).option("topic", topic)
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.save()

    def test_batch_sink_publishes_every_row(self):
        rows = [(f"row-{i}-".encode() + b"x" * (i % 300),) for i in range(20000)]
        df = spark().createDataFrame(rows, "body binary").repartition(4)
        # a small body limit makes each task split its rows over many MPUBs
        self.write(df, "sink_rows", maxBodySize="20000")
        self.assertEqual(topic_depth(self.nsqd, "sink_rows"), 20000)
        got = consume_all(self.address, "sink_rows", "check", 20000)
        self.assertEqual(sorted(got), sorted(r[0] for r in rows))

    def test_string_value_column(self):
        df = spark().createDataFrame([(i, f"text {i}") for i in range(100)], "key int, value string")
        self.write(df, "sink_text")
        got = consume_all(self.address, "sink_text", "check", 100)
        self.assertEqual(sorted(got), sorted(f"text {i}".encode() for i in range(100)))

    def test_stream_sink_from_an_nsq_source(self):
        expected = [f"relay-{i}".encode() for i in range(3000)]
        publish(self.address, "sink_src", expected)
        checkpoint = os.path.join(tempfile.mkdtemp(prefix="nsq-spark-"), "checkpoint")
        source = (
            spark()
            .readStream.format("nsq")
            .option("nsqdTcpAddresses", self.address)
            .option("topic", "sink_src")
            .option("channel", "relay")
            .option("stagingLocation", checkpoint + "-staging")
            .option("maxMessagesPerBatch", "1000")
            .load()
        )
        query = (
            source.select("body")
            .writeStream.format("nsq")
            .option("nsqdTcpAddresses", self.address)
            .option("topic", "sink_dst")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        self.assertIsNone(query.exception())
        self.assertEqual(topic_depth(self.nsqd, "sink_dst"), 3000)
        self.assertEqual(sorted(consume_all(self.address, "sink_dst", "check", 3000)), sorted(expected))
        self.assertEqual(settled(self.nsqd, "sink_src", "relay")["depth"], 0)

    def test_errors_fail_the_task_with_a_clear_message(self):
        cases = [
            (spark().createDataFrame([(b"ok",), (b"",)], "body binary"), {}, "nsqd rejects empty messages"),
            (
                spark().createDataFrame([(b"x" * 2000,)], "body binary"),
                {"maxMessageSize": "1000"},
                "a message of 2000 bytes is larger than maxMessageSize 1000",
            ),
            (spark().createDataFrame([(1,)], "n int"), {}, 'no "body" or "value" column'),
        ]
        for df, options, text in cases:
            with self.assertRaises(Exception) as e:
                self.write(df, "sink_errors", **options)
            self.assertIn(text, str(e.exception))
        with self.assertRaises(Exception) as e:
            self.write(spark().createDataFrame([(b"x",)], "body binary"), "bad topic!")
        self.assertIn("topic name 'bad topic!' is not valid", str(e.exception))
        with self.assertRaises(Exception) as e:
            spark().createDataFrame([(b"x",)], "body binary").write.format("nsq").mode("append").option(
                "topic", "t"
            ).save()
        self.assertIn('give "nsqdTcpAddresses" or "lookupdHttpAddresses"', str(e.exception))
