"""The archive's batches as Parquet files, and the copies nsqd delivers again
dropped without a shuffle: a copy is a row with ``attempts >= 2``, or one its
node delivered within the window after it started (a kill -9 brings back
messages with ``attempts`` 1), or any row of a node whose start is unknown;
each is looked up in its hour's files of the window and in its own batch."""

from __future__ import annotations

import datetime
import glob
import json
import os
import tempfile
import time
from typing import Any

import pyarrow.parquet as pq
from twisted.trial import unittest

from nsq_spark import batch_files
from nsq_spark.archive import SOURCE_SCHEMA
from nsq_spark.batch_files import CLOCK_SLACK_MS, BatchFiles
from nsq_spark.options import window_millis
from tests.nsq_spark.harness import spark

NODE = "127.0.0.1:4150"
OTHER = "127.0.0.1:4250"
WINDOW_MS = 600_000


class DropRedeliveredTests(unittest.TestCase):
    timeout = 300

    def setUp(self) -> None:
        self.spark = spark()
        self.dir = tempfile.mkdtemp(prefix="nsq-batch-files-")
        self.output = os.path.join(self.dir, "archive")
        checkpoint = os.path.join(self.output, "_checkpoint")
        os.makedirs(checkpoint)
        with open(os.path.join(checkpoint, "metadata"), "w") as f:
            json.dump({"id": "0123456789abcdef0123456789abcdef"}, f)
        self.started = {NODE: time.time() - 86_400, OTHER: time.time() - 86_400}
        self.files = BatchFiles(
            self.output,
            checkpoint,
            "snappy",
            dedup_window_ms=WINDOW_MS,
            node_starts=lambda: dict(self.started),
        )
        # one time for every row (so one hour), before any restart a test makes
        now = datetime.datetime.now(datetime.UTC)
        self.published = (now - datetime.timedelta(minutes=2)).replace(microsecond=0)

    def batch(self, rows: list[tuple[str, int, str]]) -> Any:
        """A batch as the archive's query hands it over: (id, attempts, node) rows."""
        now = datetime.datetime.now(datetime.UTC)
        data = [
            (mid, f"body-{mid}".encode(), self.published, attempts, node, "t", "c", now) for mid, attempts, node in rows
        ]
        df = self.spark.createDataFrame(data, SOURCE_SCHEMA)
        date, hour = self.published.strftime("%Y-%m-%d"), self.published.strftime("%H")
        from pyspark.sql import functions as F

        return df.withColumn("date", F.lit(date)).withColumn("hour", F.lit(hour))

    def archived(self) -> list[tuple[str, str]]:
        table = pq.read_table(self.output, columns=["nsqd_address", "id"])
        return sorted(zip(table.column("nsqd_address").to_pylist(), table.column("id").to_pylist(), strict=True))

    def test_first_deliveries_are_written_as_they_are(self):
        self.files(self.batch([("a", 1, NODE), ("b", 1, NODE), ("c", 1, OTHER)]), 0)
        self.files(self.batch([("d", 1, NODE)]), 1)
        self.assertEqual(self.archived(), [(NODE, "a"), (NODE, "b"), (NODE, "d"), (OTHER, "c")])
        self.assertEqual(os.listdir(os.path.join(self.output, "_incoming")), [])

    def test_a_redelivered_copy_of_an_archived_message_is_dropped(self):
        self.files(self.batch([("a", 1, NODE), ("b", 1, NODE)]), 0)
        # the FIN for "a" never arrived: nsqd delivers it again, attempts 2;
        # "e" was given back by a losing attempt and is new
        self.files(self.batch([("a", 2, NODE), ("c", 1, NODE), ("e", 2, NODE)]), 1)
        self.assertEqual(self.archived(), [(NODE, "a"), (NODE, "b"), (NODE, "c"), (NODE, "e")])

    def test_copies_in_one_batch_are_kept_once(self):
        self.files(self.batch([("a", 1, NODE), ("a", 2, NODE), ("a", 3, NODE), ("b", 1, NODE)]), 0)
        self.assertEqual(self.archived(), [(NODE, "a"), (NODE, "b")])

    def test_the_same_id_from_another_node_is_another_message(self):
        self.files(self.batch([("a", 1, NODE)]), 0)
        self.files(self.batch([("a", 2, OTHER)]), 1)
        self.assertEqual(self.archived(), [(NODE, "a"), (OTHER, "a")])

    def test_after_a_node_restarted_its_first_attempts_are_checked(self):
        self.files(self.batch([("a", 1, NODE), ("b", 1, OTHER)]), 0)
        # NODE was killed (-9) and started again: its unsynced disk queue
        # delivers "a" once more with attempts 1; OTHER did not restart
        self.started[NODE] = time.time()
        self.files(self.batch([("a", 1, NODE), ("c", 1, NODE), ("b", 1, OTHER)]), 1)
        self.assertEqual(self.archived(), [(NODE, "a"), (NODE, "c"), (OTHER, "b"), (OTHER, "b")])

    def test_after_a_restart_what_was_published_since_is_not_checked(self):
        self.files(self.batch([("a", 1, NODE)]), 0)
        # a node started before these rows were published cannot have
        # delivered them before it started: a first attempt is a first copy
        # (an nsqd never hands out the same ID twice; here it does, to show
        # the row was not looked up)
        self.started[NODE] = self.published.timestamp() - 120
        self.files(self.batch([("a", 1, NODE)]), 1)
        self.assertEqual(self.archived(), [(NODE, "a"), (NODE, "a")])

    def test_many_suspects_are_joined_by_spark(self):
        self.patch(batch_files, "MAX_SUSPECTS_COLLECTED", 2)
        self.files(self.batch([("a", 1, NODE), ("b", 1, NODE)]), 0)
        self.files(self.batch([("a", 2, NODE), ("b", 2, NODE), ("c", 2, NODE), ("c", 3, NODE), ("d", 2, NODE)]), 1)
        self.assertEqual(self.archived(), [(NODE, "a"), (NODE, "b"), (NODE, "c"), (NODE, "d")])

    def test_a_node_whose_start_is_unknown_has_every_row_checked(self):
        self.files(self.batch([("a", 1, NODE)]), 0)
        del self.started[NODE]  # given by its TCP address only, or not answering /info
        self.files(self.batch([("a", 1, NODE), ("b", 1, NODE)]), 1)
        self.assertEqual(self.archived(), [(NODE, "a"), (NODE, "b")])

    def test_a_copy_after_the_window_is_kept(self):
        self.files(self.batch([("a", 1, NODE)]), 0)
        old = time.time() - (WINDOW_MS + CLOCK_SLACK_MS) / 1000 - 60
        for path in glob.glob(os.path.join(self.output, "date=*", "hour=*", "*.parquet")):
            os.utime(path, (old, old))
        self.files(self.batch([("a", 2, NODE)]), 1)
        self.assertEqual(self.archived(), [(NODE, "a"), (NODE, "a")])

    def test_a_batch_run_again_replaces_its_own_files(self):
        self.files(self.batch([("a", 1, NODE), ("a", 2, NODE)]), 0)
        self.files(self.batch([("a", 1, NODE), ("a", 2, NODE)]), 0)
        self.assertEqual(self.archived(), [(NODE, "a")])

    def test_no_window_no_deduplication(self):
        self.files.dedup_window_ms = 0
        self.files(self.batch([("a", 1, NODE)]), 0)
        self.files(self.batch([("a", 2, NODE)]), 1)
        self.assertEqual(self.archived(), [(NODE, "a"), (NODE, "a")])


class WindowTests(unittest.TestCase):
    def test_durations_and_intervals(self):
        self.assertEqual(window_millis("10 minutes"), 600_000)
        self.assertEqual(window_millis("10m"), 600_000)
        self.assertEqual(window_millis("1 hour 30 minutes"), 5_400_000)
        self.assertEqual(window_millis("0"), 0)
        self.assertEqual(window_millis("7 days"), 7 * 86_400_000)

    def test_bad_windows_are_refused(self):
        for text in ("", "10", "8 days", "-1s", "10 parsecs", "nan minutes", "1e400 hours", "10 minutes 5", "abc"):
            with self.assertRaises(ValueError, msg=text):
                window_millis(text)
