"""Writing to NSQ: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Each task publishes its rows from the executor with MPUB, to one nsqd (from
``nsqdTcpAddresses`` by partition, or from nsqlookupd's ``/nodes``), keeping
MPUBs within nsqd's ``--max-body-size`` and waiting for every OK.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from nsq_client.blocking import Connection
from nsq_spark.options import NSQOptions, OptionError
from nsq_wire import lookupd
from nsq_wire.errors import NSQError
from nsq_wire.gofmt import join_host_port

log = logging.getLogger("nsq_spark")


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
