"""``format("nsq")``: a PySpark Python data source for NSQ topics.

Reading (``spark.readStream.format("nsq")``) runs on the executors: the driver
plans each micro-batch from what the nodes report (:mod:`nsq_spark.planner`),
and each partition's task takes its quota from its nsqd, writes it to a
staging file under ``stagingLocation`` and only then FINs it
(:mod:`nsq_spark.intake`, :mod:`nsq_spark.staging`). A retried task or a
replayed batch reads the staging file, so nothing staged is lost or taken
twice; staging files go once Spark commits the batch. Writing
(``df.write.format("nsq")``, ``df.writeStream.format("nsq")``, :mod:`nsq_spark.sink`)
publishes a ``body`` (or ``value``) column from the executors with MPUB.

Options (all strings, names case-insensitive):

=========================  =======================================================
``topic``                  the topic (required)
``channel``                the channel to consume (reading; required)
``stagingLocation``        reading (required): a directory every executor can
                           reach at the same path, e.g. beside the query's
                           checkpoint; local or mounted POSIX filesystems
``nsqdTcpAddresses``       ``host:4150,host2:4150``: nsqd to use directly
``nsqdHttpAddresses``      ``host:4151,...``: nsqd to use directly, found by their
                           HTTP API, which gives the source the channel's depth
``lookupdHttpAddresses``   ``host:4161,...``: discover the topic's nsqd (reading:
                           polled, new nodes are picked up; writing: one of
                           ``/nodes`` per task)
``maxMessagesPerBatch``    most rows in one micro-batch (default 10000)
``maxInFlight``            RDY of each task's connections (default 2500, nsqd's
                           ``--max-rdy-count``); a task opens enough connections
                           for its quota, up to 16
``msgTimeout``             IDENTIFY msg_timeout, a duration (``"60s"``) or ms
``lookupdPollInterval``    default ``60s``
``idleTimeout``            a task stops waiting for its quota after this long
                           without a message (default ``2s``)
``noNodeTimeout``          fail the query when no nsqd could be reached (lookupd
                           or nsqd unreachable) for this long (default ``60s``;
                           ``0``: keep trying forever)
``rowsPerPartition``       most rows one task takes (default 25000)
``tls``                    ``true`` to upgrade connections to TLS
``tlsRootCaFile``          CA bundle to verify nsqd with (default: the system's)
``tlsCertFile``/``tlsKeyFile``  a client certificate
``tlsInsecureSkipVerify``  ``true`` to skip verification (testing only)
``authSecret``             sent with AUTH when nsqd asks for it
``snappy``/``deflate``     ``true`` to compress the stream; ``deflateLevel``
``bodyColumn``             writing: the column to publish (default ``body``, else
                           ``value``; binary or string)
``startingTimestamp``      reading: a new query (no offset in its checkpoint yet)
                           first rewinds its channel on every node to this Unix
                           time in ms (or ``earliest``): the topic's retained
                           messages from then on are delivered again, with what
                           the channel holds (needs nsqd's retention, and
                           ``nsqdHttpAddresses`` or ``lookupdHttpAddresses``)
``maxMessageSize``         writing: nsqd's ``--max-msg-size`` (default 1048576)
``maxBodySize``            writing: nsqd's ``--max-body-size`` (default 5242880)
=========================  =======================================================
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from nsq_spark.intake import MAX_CONNECTIONS, Plan, Taken, abandon, finish, take
from nsq_spark.options import NSQOptions, OptionError
from nsq_spark.planner import Planner, PlannerConfig, allot
from nsq_spark.sink import NSQStreamWriter, NSQWriter
from nsq_spark.staging import StagingArea

__all__ = ["SCHEMA", "NSQDataSource", "NSQOptions", "NSQStreamReader", "OptionError", "read_partition", "settle"]

log = logging.getLogger("nsq_spark")

SCHEMA = (
    "id STRING, body BINARY, timestamp TIMESTAMP, attempts INT, nsqd_address STRING, topic STRING, channel STRING, "
    "received TIMESTAMP"
)
_ARROW_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("body", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("attempts", pa.int32()),
        ("nsqd_address", pa.string()),
        ("topic", pa.string()),
        ("channel", pa.string()),
        ("received", pa.timestamp("us", tz="UTC")),
    ]
)


def _log_to_stderr() -> None:
    """Spark runs the stream reader in a Python process of its own, where no one
    configures logging; its stderr goes to the driver's console. Give our
    warnings a handler there, in the usual shape, unless logging is set up."""
    ours = logging.getLogger("nsq_spark")
    if ours.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    ours.addHandler(handler)


class NSQDataSource(DataSource):
    """Registered as ``nsq``: ``spark.dataSource.register(NSQDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        # only reading asks for the schema: check its options at load(), not
        # when the query starts
        NSQOptions.parse(self.options, reading=True)
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NSQStreamReader(NSQOptions.parse(self.options, reading=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return NSQWriter(NSQOptions.parse(self.options, reading=False), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return NSQStreamWriter(NSQOptions.parse(self.options, reading=False), schema)


class WarmUpSource(DataSource):
    """``nsq_warm_up``: one row per partition (``partitions``, default 1), read
    by the same kind of Python task that reads ``nsq`` after importing this
    module. A batch read of it starts the Python processes Spark keeps for a
    Python data source (the one that builds it, the one that plans its read,
    the read tasks' workers) while nothing waits on them; the archive's query
    then finds them running (:func:`nsq_spark.archive.warm_workers`)."""

    @classmethod
    def name(cls) -> str:
        return "nsq_warm_up"

    def schema(self) -> str:
        return "partition INT"

    def reader(self, schema: StructType) -> DataSourceReader:
        return _WarmUpReader(int(self.options.get("partitions", "1")))


class _WarmUpReader(DataSourceReader):
    def __init__(self, partitions: int) -> None:
        self.count = max(1, min(partitions, 1024))

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(i) for i in range(self.count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pydict({"partition": pa.array([partition.value], pa.int32())})


# -- reading ------------------------------------------------------------------------------


class NSQPartition(InputPartition):
    """One task's share of a micro-batch: where to take how many messages."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan.index)
        self.plan = plan


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets, partitions and commits run on the driver, in one long-lived
    Python process; :meth:`read` runs on executors from a pickled copy.

    An offset names a planned batch: ``{"query": <id>, "batch": n, "parts":
    [[nsqd, quota, depth known], ...], "cutoff": ns or null}``. The plan is in
    the offset, which Spark logs before it runs the batch, so a replay after a
    driver crash plans the same partitions and finds their staging files."""

    def __init__(self, options: NSQOptions) -> None:
        self.options = options
        self._planner: Planner | None = None
        self._cutoff_ns: int | None = None
        self._drained: set[str] = set()  # availableNow: nodes with nothing more for this run
        self._planned: set[int] = set()  # batches this process planned (their staging files say what came)
        self._rewound = False  # startingTimestamp: the channel was rewound

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_planner"] = None
        return state

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            o = self.options
            self._planner = Planner(
                PlannerConfig(
                    topic=o.topic,
                    channel=o.channel,
                    nsqd_addresses=o.nsqd_addresses,
                    nsqd_http_addresses=o.nsqd_http_addresses,
                    lookupd_addresses=o.lookupd_addresses,
                    lookupd_poll_interval=o.lookupd_poll_interval,
                    no_node_timeout=o.no_node_timeout,
                )
            )
            _log_to_stderr()
            self._planner.start()
        return self._planner

    @property
    def staging(self) -> StagingArea:
        return StagingArea(self.options.staging_location)

    def initialOffset(self) -> dict:
        # Spark asks only when the checkpoint has no offset yet: a new query
        if self.options.starting_timestamp is not None and not self._rewound:
            self.planner.rewind(self.options.starting_timestamp)
            self._rewound = True
        return {"query": uuid.uuid4().hex, "batch": 0, "parts": [], "cutoff": None}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._cutoff_ns = time.time_ns()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if "query" not in start:  # an offset of the driver-side source before it
            start = self.initialOffset()
        planner = self.planner
        available_now = self._cutoff_ns is not None
        if available_now and int(start["batch"]) in self._planned:
            self._learn_drained(start)
        while True:
            reachable = planner.survey()
            planner.check_reachable()
            if reachable or not available_now or planner.last_error is None:
                break
            time.sleep(0.2)  # availableNow: nothing reachable is not drained; wait (noNodeTimeout)
        if available_now:
            reachable = [(n, d) for n, d in reachable if n.tcp not in self._drained]
        cap = self.options.max_messages_per_batch
        if isinstance(limit, ReadMaxRows):
            cap = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            cap = max(cap, sum(d for _, d in reachable if d))
        part_size = min(self.options.rows_per_partition, MAX_CONNECTIONS * self.options.max_in_flight)
        parts = allot(reachable, cap, part_size)
        if not parts:
            return start
        self._planned.add(int(start["batch"]) + 1)
        return {
            "query": start["query"],
            "batch": int(start["batch"]) + 1,
            "parts": [[address, quota, int(known)] for address, quota, known in parts],
            "cutoff": self._cutoff_ns,
        }

    def reportLatestOffset(self) -> dict | None:
        return None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if "query" not in end:
            return []  # planned by the driver-side source before it: nothing staged
        return [
            NSQPartition(Plan(end["query"], int(end["batch"]), i, address, int(quota), end.get("cutoff")))
            for i, (address, quota, _known) in enumerate(end["parts"])
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, NSQPartition)
        yield from read_partition(self.options, partition.plan).to_batches()

    def _learn_drained(self, done: dict) -> None:
        """availableNow: a node whose partition of the batch just done came back
        short, or met a message newer than the run, has nothing more for this
        run (Spark calls commit() only after planning the next batch, so this
        reads the staging files' footers before they go)."""
        staged = self.staging.summary(done["query"], int(done["batch"]))
        for i, (address, quota, _known) in enumerate(done["parts"]):
            s = staged.get(i)
            if s is None or s.rows < quota or s.caught_up:
                self._drained.add(address)

    def commit(self, end: dict) -> None:
        if "query" in end:
            self.staging.drop_through(end["query"], int(end["batch"]))

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()


def read_partition(o: NSQOptions, plan: Plan) -> pa.Table:
    """A partition's rows: its staging file if an attempt staged it, else
    messages taken from its nsqd now, staged, then FINed."""
    staging = StagingArea(o.staging_location)
    path = staging.part_path(plan.query, plan.batch, plan.index)
    table = staging.load(path)
    if table is not None:
        return table
    return settle(staging, path, take(plan, o.topic, o.channel, o.connect_options(), o.max_in_flight, o.idle_timeout))


def settle(staging: StagingArea, path: str, taken: Taken) -> pa.Table:
    """Stage what ``taken`` holds and FIN it; if another attempt staged the
    partition first, give the messages back (REQ) and return its rows."""
    try:
        table = taken.table(_ARROW_SCHEMA)
        won = True if not table.num_rows else staging.claim(path, table, taken.caught_up)
    except BaseException:
        abandon(taken)  # nsqd requeues what was taken
        raise
    finish(taken, fin=won)
    if won:
        return table
    winner = staging.load(path)
    assert winner is not None
    return winner
