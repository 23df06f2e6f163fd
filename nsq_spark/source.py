"""``format("nsq")``: a PySpark Python data source for NSQ topics.

Reading (``spark.readStream.format("nsq")``) is at-least-once: the driver's
:class:`~nsq_spark.consumer.HoldingConsumer` holds each message until Spark
has committed the micro-batch that carried it, then FINs it. Writing
(``df.write.format("nsq")``, ``df.writeStream.format("nsq")``) publishes a
``body`` (or ``value``) column from the executors with MPUB.

Options (all strings, names case-insensitive):

=========================  =======================================================
``topic``                  the topic (required)
``channel``                the channel to consume (reading; required)
``nsqdTcpAddresses``       ``host:4150,host2:4150``: nsqd to use directly
``lookupdHttpAddresses``   ``host:4161,...``: discover the topic's nsqd (reading:
                           polled, new nodes are picked up; writing: one of
                           ``/nodes`` per task)
``maxMessagesPerBatch``    most rows in one micro-batch (default 10000)
``maxInFlight``            messages held unanswered at once, over all nsqd
                           (default 1000; the batch size cannot exceed it)
``msgTimeout``             IDENTIFY msg_timeout, a duration (``"60s"``) or ms
``lookupdPollInterval``    default ``60s``
``idleTimeout``            availableNow: drained after this long without a message
                           (default ``2s``)
``noNodeTimeout``          fail the query when no nsqd could be reached (lookupd
                           or nsqd unreachable) for this long (default ``60s``;
                           ``0``: keep trying forever)
``rowsPerPartition``       split a batch's rows into partitions of this size
                           (default 10000)
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
from nsq_spark.consumer import ConsumerConfig, HoldingConsumer
from nsq_wire import lookupd
from nsq_wire.errors import NSQError
from nsq_wire.gofmt import join_host_port
from nsq_wire.names import is_valid_channel_name, is_valid_topic_name

log = logging.getLogger("nsq_spark")

SCHEMA = "id STRING, body BINARY, timestamp TIMESTAMP, attempts INT, nsqd_address STRING, topic STRING, channel STRING"
_ARROW_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("body", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("attempts", pa.int32()),
        ("nsqd_address", pa.string()),
        ("topic", pa.string()),
        ("channel", pa.string()),
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
    lookupd_addresses: list[str]
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
        lookupd = _list(options, "lookupdhttpaddresses")
        if not nsqd and not lookupd:
            raise OptionError('give "nsqdTcpAddresses" or "lookupdHttpAddresses"')
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
        max_in_flight = _int(options, "maxinflight", 1000)
        return cls(
            topic=topic,
            channel=channel,
            nsqd_addresses=nsqd,
            lookupd_addresses=lookupd,
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
            rows_per_partition=_int(options, "rowsperpartition", 10000),
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
    """The rows of one partition of a micro-batch, shipped to an executor."""

    def __init__(self, address: str, ids: list[str], bodies: list[bytes], timestamps: list[int], attempts: list[int]):
        super().__init__(address)
        self.address = address
        self.ids = ids
        self.bodies = bodies
        self.timestamps = timestamps
        self.attempts = attempts


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets, partitions and commits run on the driver, in one long-lived
    process; :meth:`read` runs on executors from a pickled copy, so the
    consumer is created lazily and never pickled."""

    def __init__(self, options: NSQOptions) -> None:
        self.options = options
        self._consumer: HoldingConsumer | None = None
        self._available_now = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = None
        return state

    @property
    def consumer(self) -> HoldingConsumer:
        if self._consumer is None:
            o = self.options
            self._consumer = HoldingConsumer(
                ConsumerConfig(
                    topic=o.topic,
                    channel=o.channel,
                    nsqd_addresses=o.nsqd_addresses,
                    lookupd_addresses=o.lookupd_addresses,
                    connect=o.connect_options(),
                    max_in_flight=o.max_in_flight,
                    lookupd_poll_interval=o.lookupd_poll_interval,
                    idle_timeout=o.idle_timeout,
                    no_node_timeout=o.no_node_timeout,
                )
            )
            _log_to_stderr()
            self._consumer.start()
        return self._consumer

    def _seq(self, offset: dict) -> int:
        """A position in this consumer's numbering; an old session's is 0."""
        return int(offset.get("seq", 0)) if offset.get("session") == self.consumer.session else 0

    def initialOffset(self) -> dict:
        return {"session": self.consumer.session, "seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        self.consumer.begin_available_now()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        consumer = self.consumer
        seq = self._seq(start)
        # ``start`` is the end of the last committed batch: its messages are done
        done = consumer.finish_below(seq)
        if done:
            log.info("FINed %d messages of committed batches", done)
        if not self._available_now:
            consumer.check_reachable()
        elif not consumer.wait_for_more(seq):
            # drained: this run ends here; make sure nsqd has every FIN
            consumer.close()
            return start
        if self._available_now:
            cap = self.options.max_messages_per_batch
            if isinstance(limit, ReadMaxRows):
                cap = limit.max_rows
            consumer.fill(seq + cap)
        available = consumer.available()
        if isinstance(limit, ReadAllAvailable):
            end = available
        else:
            end = min(available, seq + int(getattr(limit, "max_rows", self.options.max_messages_per_batch)))
        if end == seq and start.get("session") == consumer.session:
            return start
        return {"session": consumer.session, "seq": end}

    def reportLatestOffset(self) -> dict | None:
        if self._consumer is None:
            return None
        return {"session": self._consumer.session, "seq": self._consumer.available()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        consumer = self.consumer
        if end.get("session") != consumer.session:
            # a batch planned by an earlier driver: its messages were never
            # FINed, nsqd delivers them again and they come in a later batch
            return []
        held = consumer.slice(self._seq(start), int(end["seq"]))
        size = self.options.rows_per_partition
        parts: list[InputPartition] = []
        by_address: dict[str, list[Any]] = {}
        for h in held:
            by_address.setdefault(h.conn.address, []).append(h)
        for address, rows in by_address.items():
            for i in range(0, len(rows), size):
                chunk = rows[i : i + size]
                parts.append(
                    NSQPartition(
                        address,
                        [h.id.decode("ascii", "replace") for h in chunk],
                        [h.body for h in chunk],
                        [h.timestamp for h in chunk],
                        [h.attempts for h in chunk],
                    )
                )
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, NSQPartition)
        n = len(partition.ids)
        o = self.options
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(partition.ids, pa.string()),
                pa.array(partition.bodies, pa.binary()),
                pa.array([t // 1000 for t in partition.timestamps], pa.timestamp("us", tz="UTC")),
                pa.array(partition.attempts, pa.int32()),
                pa.array([partition.address] * n, pa.string()),
                pa.array([o.topic] * n, pa.string()),
                pa.array([o.channel] * n, pa.string()),
            ],
            schema=_ARROW_SCHEMA,
        )

    def commit(self, end: dict) -> None:
        if self._consumer is not None and end.get("session") == self._consumer.session:
            self._consumer.finish_below(int(end["seq"]))

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


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
