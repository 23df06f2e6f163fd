"""``format("nsq")``: a PySpark Python data source for NSQ topics.

Reading (``spark.readStream.format("nsq")``) runs on the executors: the driver
plans each micro-batch from what the nodes report (:mod:`nsq_spark.planner`),
and each partition's task takes its quota from its nsqd, writes it to a
staging file under ``stagingLocation`` and only then FINs it
(:mod:`nsq_spark.intake`, :mod:`nsq_spark.staging`). A retried task or a
replayed batch reads the staging file, so nothing staged is lost or taken
twice; staging files go once Spark commits the batch. Writing
(``df.write.format("nsq")``, ``df.writeStream.format("nsq")``) publishes a
``body`` (or ``value``) column from the executors with MPUB.

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
``rowsPerPartition``       most rows one task takes (default 10000)
``tls``                    ``true`` to upgrade connections to TLS
``tlsRootCaFile``          CA bundle to verify nsqd with (default: the system's)
``tlsCertFile``/``tlsKeyFile``  a client certificate
``tlsInsecureSkipVerify``  ``true`` to skip verification (testing only)
``authSecret``             sent with AUTH when nsqd asks for it
``snappy``/``deflate``     ``true`` to compress the stream; ``deflateLevel``
``bodyColumn``             writing: the column to publish (default ``body``, else
                           ``value``; binary or string)
``maxMessageSize``         writing: nsqd's ``--max-msg-size`` (default 1048576)
``maxBodySize``            writing: nsqd's ``--max-body-size`` (default 5242880)
=========================  =======================================================
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from nsq_client.blocking import Connection, ConnectOptions, TLSConfig
from nsq_spark.intake import MAX_CONNECTIONS, Plan, Taken, abandon, finish, take
from nsq_spark.planner import Planner, PlannerConfig, allot
from nsq_spark.staging import StagingArea, StagingError, local_root
from nsq_wire import lookupd
from nsq_wire.errors import NSQError
from nsq_wire.gofmt import join_host_port
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name

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


class OptionError(ValueError):
    pass


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


def _bool(options: dict[str, str], key: str, default: bool = False) -> bool:
    value = options.get(key)
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise OptionError(f"option {key}: {value!r} is not a boolean")


def _int(options: dict[str, str], key: str, default: int, minimum: int = 1) -> int:
    value = options.get(key)
    if value is None:
        return default
    try:
        n = int(str(value).strip())
    except ValueError:
        raise OptionError(f"option {key}: {value!r} is not an integer") from None
    if n < minimum:
        raise OptionError(f"option {key}: {n} is below {minimum}")
    return n


def _seconds(options: dict[str, str], key: str, default: float) -> float:
    value = options.get(key)
    if value is None:
        return default
    text = str(value).strip()
    if text.isdigit():
        return int(text) / 1000.0  # plain numbers are milliseconds, as nsqd's flags
    from nsq_wire.gofmt import DurationError, parse_duration

    try:
        return parse_duration(text)
    except DurationError as e:
        raise OptionError(f"option {key}: {e}") from None


def _list(options: dict[str, str], key: str) -> list[str]:
    return [a.strip() for a in str(options.get(key) or "").split(",") if a.strip()]


@dataclass
class NSQOptions:
    """The options, checked once on the driver; plain data, so it pickles."""

    topic: str
    channel: str
    nsqd_addresses: list[str]
    nsqd_http_addresses: list[str]
    lookupd_addresses: list[str]
    staging_location: str
    tls: TLSConfig
    auth_secret: str | None
    snappy: bool
    deflate: bool
    deflate_level: int
    msg_timeout: float
    max_messages_per_batch: int
    max_in_flight: int
    lookupd_poll_interval: float
    idle_timeout: float
    no_node_timeout: float
    rows_per_partition: int
    body_column: str
    max_message_size: int
    max_body_size: int

    @classmethod
    def parse(cls, raw: Any, reading: bool) -> NSQOptions:
        options = {str(k).lower(): v for k, v in dict(raw).items()}
        topic = str(options.get("topic") or "")
        if not topic:
            raise OptionError('the "topic" option is required')
        if not is_valid_topic_name(topic):
            raise OptionError(f"topic name {topic!r} is not valid (1-64 of [.a-zA-Z0-9_-], optional #ephemeral)")
        channel = str(options.get("channel") or "")
        if reading and not channel:
            raise OptionError('the "channel" option is required to read a topic')
        if channel and not is_valid_channel_name(channel):
            raise OptionError(f"channel name {channel!r} is not valid (1-64 of [.a-zA-Z0-9_-], optional #ephemeral)")
        nsqd = _list(options, "nsqdtcpaddresses")
        nsqd_http = _list(options, "nsqdhttpaddresses")
        lookupd = _list(options, "lookupdhttpaddresses")
        if not nsqd and not lookupd and not (reading and nsqd_http):
            raise OptionError('give "nsqdTcpAddresses" or "lookupdHttpAddresses"')
        staging = str(options.get("staginglocation") or "")
        if reading:
            if not staging:
                raise OptionError(
                    'the "stagingLocation" option is required to read a topic: a directory every executor '
                    "reaches at the same path, e.g. beside the query's checkpointLocation"
                )
            try:
                local_root(staging)
            except StagingError as e:
                raise OptionError(str(e)) from None
        snappy, deflate = _bool(options, "snappy"), _bool(options, "deflate")
        if snappy and deflate:
            raise OptionError("snappy and deflate cannot both be enabled")
        tls = TLSConfig(
            enabled=_bool(options, "tls"),
            root_ca_file=str(options.get("tlsrootcafile") or ""),
            cert_file=str(options.get("tlscertfile") or ""),
            key_file=str(options.get("tlskeyfile") or ""),
            insecure_skip_verify=_bool(options, "tlsinsecureskipverify"),
        )
        max_in_flight = _int(options, "maxinflight", 2500)
        return cls(
            topic=topic,
            channel=channel,
            nsqd_addresses=nsqd,
            nsqd_http_addresses=nsqd_http,
            lookupd_addresses=lookupd,
            staging_location=staging,
            tls=tls,
            auth_secret=options.get("authsecret"),
            snappy=snappy,
            deflate=deflate,
            deflate_level=_int(options, "deflatelevel", 6),
            msg_timeout=_seconds(options, "msgtimeout", 0.0),
            max_messages_per_batch=_int(options, "maxmessagesperbatch", 10000),
            max_in_flight=max_in_flight,
            lookupd_poll_interval=_seconds(options, "lookupdpollinterval", 60.0),
            idle_timeout=_seconds(options, "idletimeout", 2.0),
            no_node_timeout=_seconds(options, "nonodetimeout", 60.0),
            rows_per_partition=_int(options, "rowsperpartition", 25000),
            body_column=str(options.get("bodycolumn") or ""),
            max_message_size=_int(options, "maxmessagesize", 1048576),
            max_body_size=_int(options, "maxbodysize", 5242880),
        )

    def connect_options(self) -> ConnectOptions:
        return ConnectOptions(
            tls=self.tls,
            snappy=self.snappy,
            deflate=self.deflate,
            deflate_level=self.deflate_level,
            auth_secret=self.auth_secret,
            msg_timeout_ms=int(self.msg_timeout * 1000),
        )


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


# -- writing ------------------------------------------------------------------------------------


@dataclass
class PublishedCount(WriterCommitMessage):
    count: int
    address: str


def _body_column(schema: StructType, wanted: str) -> str:
    names = schema.fieldNames()
    if wanted:
        if wanted not in names:
            raise OptionError(f"bodyColumn {wanted!r} is not a column (columns: {', '.join(names)})")
        return wanted
    for name in ("body", "value"):
        if name in names:
            return name
    raise OptionError(f'no "body" or "value" column to publish (columns: {", ".join(names)}); set bodyColumn')


def _nsqd_for_task(options: NSQOptions) -> str:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    index = ctx.partitionId() if ctx is not None else random.randrange(1 << 16)
    addresses = options.nsqd_addresses
    if not addresses:
        addresses = _lookupd_nodes(options.lookupd_addresses)
    if not addresses:
        raise NSQError(f"no nsqd found through lookupd {', '.join(options.lookupd_addresses)}")
    return addresses[index % len(addresses)]


def _lookupd_nodes(lookupds: list[str]) -> list[str]:
    from urllib.request import Request, urlopen

    found: set[str] = set()
    for address in lookupds:
        try:
            req = Request(lookupd.nodes_url(address), headers={"Accept": lookupd.ACCEPT})
            with urlopen(req, timeout=5) as resp:
                found.update(join_host_port(host, port) for host, port in lookupd.producers(resp.read()))
        except Exception as e:
            log.warning("lookupd %s: %s", address, e)
    return sorted(found)


class _Publisher:
    """Executor side of both writers: split rows into MPUBs within nsqd's limits."""

    def __init__(self, options: NSQOptions, schema: StructType) -> None:
        self.options = options
        self.column = _body_column(schema, options.body_column)

    def publish(self, batches: Iterator[pa.RecordBatch]) -> PublishedCount:
        o = self.options
        address = _nsqd_for_task(o)
        conn = Connection(address, o.connect_options()).open()
        count = 0
        try:
            mpubs: list[list[bytes]] = []
            current: list[bytes] = []
            size = 4  # MPUB's message count
            row = 0
            for batch in batches:
                for value in batch.column(self.column).to_pylist():
                    row += 1
                    body = value.encode("utf-8") if isinstance(value, str) else value
                    if not body:
                        raise NSQError(
                            f"row {row}: the {self.column} column is null or empty; nsqd rejects empty messages"
                        )
                    if len(body) > o.max_message_size:
                        raise NSQError(
                            f"row {row}: a message of {len(body)} bytes is larger than "
                            f"maxMessageSize {o.max_message_size}"
                        )
                    if current and size + 4 + len(body) > o.max_body_size:
                        mpubs.append(current)
                        current, size = [], 4
                    current.append(body)
                    size += 4 + len(body)
                    if len(mpubs) >= 8:
                        conn.publish(o.topic, mpubs)
                        count += sum(len(m) for m in mpubs)
                        mpubs = []
            if current:
                mpubs.append(current)
            if mpubs:
                conn.publish(o.topic, mpubs)
                count += sum(len(m) for m in mpubs)
        except NSQError as e:
            raise NSQError(f"publishing to topic {o.topic!r} on {address} failed: {e.text}") from None
        finally:
            conn.close()
        return PublishedCount(count, address)


class NSQWriter(DataSourceArrowWriter):
    def __init__(self, options: NSQOptions, schema: StructType) -> None:
        self.publisher = _Publisher(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.publisher.publish(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.count for m in messages if isinstance(m, PublishedCount))
        log.info("published %d messages to %s", total, self.publisher.options.topic)


class NSQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: NSQOptions, schema: StructType) -> None:
        self.publisher = _Publisher(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.publisher.publish(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.count for m in messages if isinstance(m, PublishedCount))
        log.info("batch %d: published %d messages to %s", batchId, total, self.publisher.options.topic)
