"""`readStream.format("nsq")`: a channel as a micro-batch stream, each message FINed only after Spark has
committed the micro-batch that carried it (at least once).

Theory of operation
-------------------
Spark keeps one instance of this reader in a long-lived Python process next to the driver for the whole
query and calls `latestOffset`, `partitions` and `commit` on it there; `read` runs in the executors on the
partitions it is handed. So the driver side holds the NSQ consumer: messages arrive (RDY = max_in_flight)
into `arrived` without being answered; `latestOffset` moves up to max_rows_per_batch of them into a planned
batch and numbers them (offset `seq`, a count of messages handed to Spark by this query); `partitions`
ships their bodies to the executors inside the InputPartitions; `commit(end)` comes once Spark has written
the micro-batch's output and its commit log, and FINs every message planned up to `end`.

Why an extra empty batch: Spark tells a source that batch N is committed only while it constructs batch
N+1, and constructs one only when the source reports a new offset. A stream that goes idle after batch N
would keep N's messages in flight until nsqd's msg_timeout and then get them again. So when nothing new has
arrived but planned messages wait for their commit, `latestOffset` reports the same `seq` with `tick`
advanced: Spark runs an empty batch, and commits N on the way.

Offsets are `{"seq": int, "tick": int}`. After a restart Spark re-runs the last planned-but-uncommitted batch
from its offset log with `partitions(start, end)`; the messages that batch held were on the old query's
connection, which is gone, so nsqd redelivers them (attempts + 1). The re-run batch takes up to the same
number of messages from whatever has arrived, and the rest follow in later batches: nothing FINed was
uncommitted, nothing uncommitted is lost. `stop` REQs (without delay or backoff) what it still holds.

A message held longer than nsqd's msg timeout is redelivered and its late FIN fails (E_FIN_FAILED, logged by
the consumer): a duplicate, never a loss. Raise `msg_timeout` for slow micro-batches. The rows of one
micro-batch are bounded by max_in_flight: nsqd sends no more than RDY unanswered messages per connection, so
the reader opens max_in_flight / max_rdy_count connections to each nsqd.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadMaxRows

from nsqpy.spark.publisher import split_addresses

__all__ = ["NsqStreamReader", "NsqPartition"]


class NsqPartition(InputPartition):
    """One task's share of a micro-batch: (id, timestamp ns, attempts, body) per message."""

    def __init__(self, topic: str, messages: list):
        self.topic = topic
        self.messages = messages


class NsqStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict):
        self.topic = options.get("topic")
        self.channel = options.get("channel")
        if not self.topic or not self.channel:
            raise ValueError('readStream.format("nsq") needs options topic and channel')
        self.nsqd = split_addresses(options.get("nsqd_tcp_addresses"))
        self.lookupd = split_addresses(options.get("lookupd_http_addresses"))
        if not self.nsqd and not self.lookupd:
            raise ValueError('readStream.format("nsq") needs nsqd_tcp_addresses and/or lookupd_http_addresses')
        self.max_in_flight = int(options.get("max_in_flight", 10000))
        self.max_rdy_count = int(options.get("max_rdy_count", 2500))
        # half: while Spark runs one batch, the messages of the next are already arriving (a batch that held
        # every message RDY allows would leave nothing to plan until it committed: one idle batch in two)
        self.max_rows = int(options.get("max_rows_per_batch", max(1, self.max_in_flight // 2)))
        self.num_partitions = max(1, int(options.get("num_partitions", 1)))
        self.client_options = {"max_attempts": int(options.get("max_attempts", 0))}   # 0: never give up
        if options.get("msg_timeout"):
            self.client_options["msg_timeout"] = float(options["msg_timeout"])
        self._consumers = None   # driver side only, made on first use (this object is also pickled to executors)
        self._arrived = None
        self._planned: dict[int, list] = {}   # end seq -> messages awaiting Spark's commit

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_consumers=None, _arrived=None, _planned={})
        return state

    # -- driver side -------------------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._consumers is not None:
            return
        import collections
        from nsqpy.client import Consumer
        arrived = self._arrived = collections.deque()

        async def hold(message):           # answered later by commit() or stop(), never by the consumer
            message.disable_auto_response()
            arrived.append(message)

        # nsqd caps each connection's RDY (--max-rdy-count), and a micro-batch holds its messages unanswered
        # until Spark commits it: more rows per batch need more connections, one Consumer each
        count = -(-self.max_in_flight // self.max_rdy_count)
        self._consumers = [
            Consumer(self.topic, self.channel, hold, nsqd_tcp_addresses=self.nsqd,
                     lookupd_http_addresses=self.lookupd, max_in_flight=-(-self.max_in_flight // count),
                     **self.client_options).start()
            for _ in range(count)]

    def initialOffset(self) -> dict:
        self._start()
        return {"seq": 0, "tick": 0}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict, limit) -> dict:
        self._start()
        room = limit.max_rows if isinstance(limit, ReadMaxRows) else len(self._arrived)
        take = min(room, len(self._arrived))
        if take:
            messages = [self._arrived.popleft() for _ in range(take)]
            end = {"seq": start["seq"] + take, "tick": start.get("tick", 0)}
            self._planned[end["seq"]] = messages
            return end
        if self._planned:    # idle, but a batch waits for its commit: force an empty batch (module docstring)
            return {"seq": start["seq"], "tick": start.get("tick", 0) + 1}
        return start

    def partitions(self, start: dict, end: dict):
        self._start()
        count = end["seq"] - start["seq"]
        if count <= 0:
            return []
        messages = self._planned.get(end["seq"])
        if messages is None:   # a batch planned before a restart: re-run it with what has arrived since
            messages = [self._arrived.popleft() for _ in range(min(count, len(self._arrived)))]
            self._planned[end["seq"]] = messages
        rows = [(m.id.decode("ascii"), m.timestamp, m.attempts, m.body) for m in messages]
        if not rows:
            return []
        share = -(-len(rows) // self.num_partitions)
        return [NsqPartition(self.topic, rows[i:i + share]) for i in range(0, len(rows), share)]

    def commit(self, end: dict) -> None:
        for seq in sorted(self._planned):
            if seq > end["seq"]:
                break
            for message in self._planned.pop(seq):
                message.fin()

    def stop(self) -> None:
        if self._consumers is None:
            return
        held = [m for batch in self._planned.values() for m in batch] + list(self._arrived)
        for message in held:
            message.req(0, backoff=False)    # back to the channel now, for the next query
        self._planned.clear()
        self._arrived.clear()
        consumers, self._consumers = self._consumers, None
        for consumer in consumers:
            consumer.stop()

    # -- executor side -----------------------------------------------------------------------------------------

    def read(self, partition: NsqPartition):
        """One Arrow RecordBatch per partition: Spark takes it as is, without converting row by row."""
        import pyarrow as pa
        messages = partition.messages
        schema = pa.schema([("id", pa.string()), ("timestamp", pa.timestamp("us", tz="UTC")),
                            ("attempts", pa.int32()), ("body", pa.binary()), ("topic", pa.string())])
        columns = [
            pa.array([m[0] for m in messages], pa.string()),
            pa.array([m[1] // 1000 for m in messages], pa.int64()).cast(schema.field("timestamp").type),
            pa.array([m[2] for m in messages], pa.int32()),
            pa.array([m[3] for m in messages], pa.binary()),
            pa.array([partition.topic] * len(messages), pa.string()),
        ]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)   # READ_SCHEMA, as Spark's Arrow types
