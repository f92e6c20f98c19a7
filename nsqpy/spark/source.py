"""The ``nsq`` Python data source (pyspark.sql.datasource, Spark >= 4.0): batch and streaming writers, and a
streaming reader (stream_reader.py).

Options (names follow pynsq's arguments; addresses are comma-separated `host:port`):

    topic                    the topic to publish to / read from (required)
    channel                  the channel to read from (readStream; required there)
    nsqd_tcp_addresses       nsqds to publish to / consume from
    lookupd_http_addresses   nsqlookupds to find them
    json_rows                "true": publish each whole row as one JSON object; otherwise the `body` column
                             (binary or string; `body_column` names another)
    batch_size               rows per MPUB (writers; default 500)
    max_in_flight            messages held at once, over all connections (readStream; default 10000)
    max_rdy_count            nsqd's --max-rdy-count (readStream; default 2500): max_in_flight above it opens
                             more connections to each nsqd
    max_rows_per_batch       rows per micro-batch (readStream; default max_in_flight / 2)
    num_partitions           Spark partitions per micro-batch (readStream; default 1)
    msg_timeout              seconds nsqd waits for a FIN before redelivering (readStream; default: nsqd's)

Read schema: id string (NSQ's 16-hex-digit message id), timestamp timestamp (when nsqd accepted it),
attempts int (1 on first delivery), body binary, topic string.

Writers publish each Spark task's rows with `PublishPartition` as they come: NSQ has no transactions, so a
job's `commit` has nothing left to do and `abort` cannot take back what was published (at least once, as
Spark's Kafka sink).
"""

from __future__ import annotations

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from nsqpy.spark.schema import READ_SCHEMA
from nsqpy.spark.publisher import PublishPartition, split_addresses

__all__ = ["NsqDataSource", "NsqWriter", "NsqStreamWriter"]


def _flag(options, name: str) -> bool:
    return str(options.get(name, "false")).strip().lower() in ("true", "1", "yes")


def _required(options, name: str) -> str:
    value = options.get(name)
    if not value:
        raise ValueError(f'format("nsq") needs option {name!r}')
    return value


class NsqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self):
        return READ_SCHEMA

    def writer(self, schema, overwrite: bool):
        return NsqWriter(self._publisher(schema))

    def streamWriter(self, schema, overwrite: bool):
        return NsqStreamWriter(self._publisher(schema))

    def streamReader(self, schema):
        from nsqpy.spark.stream_reader import NsqStreamReader
        return NsqStreamReader(dict(self.options))

    def _publisher(self, schema) -> PublishPartition:
        """Checked here, on the driver, so that a wrong option fails the query, not every task."""
        options = self.options
        json_rows = _flag(options, "json_rows")
        column = options.get("body_column", "body")
        if not json_rows and column not in schema.fieldNames():
            raise ValueError(f'format("nsq"): no {column!r} column to publish (columns: '
                             f'{", ".join(schema.fieldNames())}); set body_column or json_rows=true')
        nsqd = split_addresses(options.get("nsqd_tcp_addresses"))
        lookupd = split_addresses(options.get("lookupd_http_addresses"))
        if not nsqd and not lookupd:
            raise ValueError('format("nsq") needs nsqd_tcp_addresses and/or lookupd_http_addresses')
        return PublishPartition(_required(options, "topic"), nsqd, lookupd,
                                batch=int(options.get("batch_size", 500)),
                                column=None if json_rows else column, json_rows=json_rows,
                                retries=int(options.get("retries", 5)))


class NsqCommitMessage(WriterCommitMessage):
    def __init__(self, published: int):
        self.published = published


class NsqWriter(DataSourceArrowWriter):
    """Takes Arrow batches: the body column goes to MPUBs without a Python Row per row (3-4x the rate)."""

    def __init__(self, publish: PublishPartition):
        self.publish = publish

    def write(self, iterator):
        return NsqCommitMessage(self.publish.publish_bodies(self.publish.encoder.encode_arrow(iterator)))

    def commit(self, messages) -> None:
        pass   # every row is already in nsqd (see the module docstring)

    def abort(self, messages) -> None:
        pass   # published rows stay published: consumers see them at least once


class NsqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, publish: PublishPartition):
        self.publish = publish

    def write(self, iterator):
        return NsqCommitMessage(self.publish.publish_bodies(self.publish.encoder.encode_arrow(iterator)))

    def commit(self, messages, batchId: int) -> None:
        pass

    def abort(self, messages, batchId: int) -> None:
        pass
