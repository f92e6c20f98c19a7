"""``format("nsq")``: the batch writer, the streaming writer, and the streaming reader's at-least-once
contract (FIN only after Spark committed the micro-batch; an idle stream's last batch still commits; a
stopped and restarted query loses nothing and leaves nothing in flight)."""

import pytest

from nsqpy.client import Producer
from tests.spark.helpers import Collector, addr, drained, wait_until


def test_batch_writer_publishes_the_body_column(spark, broker):
    topic = "spark_write"
    collector = Collector(topic, [broker])
    try:
        df = spark.range(5000, numPartitions=3).selectExpr("id", "cast(id as string) as body")
        (df.write.format("nsq").option("topic", topic).option("nsqd_tcp_addresses", addr(broker))
         .option("batch_size", 100).mode("append").save())
        bodies = collector.wait_all(5000)
    finally:
        collector.stop()
    assert set(bodies) == {str(i).encode() for i in range(5000)} and max(bodies.values()) == 1


def test_batch_writer_json_rows(spark, broker):
    topic = "spark_write_json"
    collector = Collector(topic, [broker])
    try:
        df = spark.createDataFrame([(1, "a"), (2, "b")], "n int, s string")
        (df.write.format("nsq").option("topic", topic).option("nsqd_tcp_addresses", addr(broker))
         .option("json_rows", "true").mode("append").save())
        bodies = collector.wait_all(2)
    finally:
        collector.stop()
    assert set(bodies) == {b'{"n":1,"s":"a"}', b'{"n":2,"s":"b"}'}


def test_batch_writer_without_a_body_column_fails_before_running(spark, broker):
    df = spark.createDataFrame([(1,)], "n int")
    with pytest.raises(Exception, match="no 'body' column"):
        df.write.format("nsq").option("topic", "t").option("nsqd_tcp_addresses", addr(broker)).mode("append").save()


def _start(spark, broker, checkpoint, source: str, sink: str):
    stream = (spark.readStream.format("nsq").option("topic", source).option("channel", "spark")
              .option("nsqd_tcp_addresses", addr(broker)).option("max_rows_per_batch", 500).load())
    out = stream.selectExpr("concat('out-', cast(body as string)) as body", "attempts")
    return (out.writeStream.format("nsq").option("topic", sink).option("nsqd_tcp_addresses", addr(broker))
            .option("checkpointLocation", str(checkpoint)).start())


def test_stream_round_trip_with_restart_loses_nothing(spark, broker, tmp_path):
    source, sink, n = "spark_stream_in", "spark_stream_out", 6000
    collector = Collector(sink, [broker])
    query = None
    try:
        with Producer([addr(broker)]) as p:
            p.mpub(source, [b"%d" % i for i in range(n)])     # the topic keeps them until a channel exists
            query = _start(spark, broker, tmp_path / "ckpt", source, sink)
            wait_until(lambda: collector.total >= n // 4, 300, "the first micro-batches")
            query.stop()                        # mid-stream: held messages go back to the channel
            query = _start(spark, broker, tmp_path / "ckpt", source, sink)
            wait_until(lambda: {b"out-%d" % i for i in range(n)} <= set(collector.bodies), 300, "every row")
            p.mpub(source, [b"%d" % i for i in range(n, n + 100)])   # and a few more into a running query
        expected = {b"out-%d" % i for i in range(n + 100)}
        wait_until(lambda: expected <= set(collector.bodies), 300, "the late rows")
        # the stream is idle now: its last batch must still commit, so every message gets FINed
        wait_until(lambda: drained([broker], source, "spark"), 120, "the source channel to drain")
        query.stop()
        query = None
        bodies = collector.wait_all(collector.total)
    finally:
        if query is not None:
            query.stop()
        collector.stop()
    assert set(bodies) == expected
