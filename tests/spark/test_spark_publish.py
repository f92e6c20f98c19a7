"""`publish_partition` under foreachPartition: every row reaches a consumer exactly once without failures, at
least once when a task fails half-way and Spark retries it, and a broker that goes away mid-job loses nothing
that was acknowledged."""

import datetime
import json
import os
import signal
import sys

import pytest
from pyspark import TaskContext, cloudpickle

from nsqpy.spark import PublishError, publish_partition
from tests.spark import helpers
from tests.spark.helpers import WITH_HTTP, Collector, addr, wait_until

# Spark's workers cannot import the test modules (pytest put them on sys.path): ship their functions by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(helpers)

ROWS = 1_000_000   # the figure; each of the two 1 M tests takes ~25 s here, JVM start-up aside


def ids_as_bodies(spark, rows: int, partitions: int = 4):
    return spark.range(rows, numPartitions=partitions).selectExpr("cast(id as string) as body")


def expected_bodies(rows: int) -> set:
    return {str(i).encode() for i in range(rows)}


def test_rows_reach_a_consumer_exactly_once(spark, broker):
    topic = "spark_once"
    collector = Collector(topic, [broker])
    try:
        ids_as_bodies(spark, ROWS).foreachPartition(publish_partition(topic, nsqd=[addr(broker)], batch=500))
        bodies = collector.wait_all(ROWS)
    finally:
        collector.stop()
    assert len(bodies) == ROWS and set(bodies) == expected_bodies(ROWS)
    assert max(bodies.values()) == 1          # no task retry, no re-sent MPUB: each row once


def _fail_first_attempt_of_partition_1(publish, after: int):
    def run(rows):
        context = TaskContext.get()
        if context.partitionId() == 1 and context.attemptNumber() == 0:
            rows = _raise_after(rows, after)
        publish(rows)
    return run


def _raise_after(rows, count: int):
    for i, row in enumerate(rows):
        if i == count:
            raise RuntimeError("injected task failure")
        yield row


def test_a_failed_task_is_retried_and_rows_arrive_at_least_once(spark, broker):
    rows, topic = ROWS, "spark_retry"
    collector = Collector(topic, [broker])
    try:
        publish = publish_partition(topic, nsqd=[addr(broker)], batch=500, window=1)
        ids_as_bodies(spark, rows).foreachPartition(_fail_first_attempt_of_partition_1(publish, rows // 8))
        # the failed attempt published some of partition 1 before it raised; the retry publishes all of it
        wait_until(lambda: collector.total >= rows, 300, "every row")
        bodies = collector.wait_all(collector.total)
    finally:
        collector.stop()
    assert set(bodies) == expected_bodies(rows)
    duplicates = sum(n - 1 for n in bodies.values())
    assert 0 < duplicates <= rows // 4            # only partition 1's head, sent twice


def test_body_forms_bytes_str_and_json_rows(spark, broker):
    topic = "spark_forms"
    collector = Collector(topic, [broker])
    nsqd = [addr(broker)]
    try:
        sc = spark.sparkContext
        sc.parallelize([b"raw-1", b"raw-2"], 2).foreachPartition(publish_partition(topic, nsqd=nsqd))
        sc.parallelize(["text-\u00e9"], 1).foreachPartition(publish_partition(topic, nsqd=nsqd))
        df = spark.createDataFrame(
            [(1, "a", b"\x00\xff", datetime.datetime(2026, 1, 2, 3, 4, 5))],
            "n long, s string, b binary, t timestamp")
        df.foreachPartition(publish_partition(topic, nsqd=",".join(nsqd), json_rows=True))
        df.foreachPartition(publish_partition(topic, nsqd=nsqd, column="s"))
        bodies = collector.wait_all(5)
    finally:
        collector.stop()
    assert set(bodies) - {b for b in bodies if b.startswith(b"{")} == {b"raw-1", b"raw-2", "text-\u00e9".encode(), b"a"}
    (row,) = [json.loads(b) for b in bodies if b.startswith(b"{")]
    assert row == {"n": 1, "s": "a", "b": "AP8=", "t": "2026-01-02T03:04:05"}


def test_no_nsqd_fails_the_task_with_a_clear_error(spark):
    publish = publish_partition("spark_nowhere", nsqd=["127.0.0.1:1"], retries=1, backoff=0.01,
                                connect_timeout=0.2)
    with pytest.raises(Exception) as info:
        spark.sparkContext.parallelize([b"x"], 1).foreachPartition(publish)
    assert "PublishError" in str(info.value) and "not accepted by any nsqd" in str(info.value)
    with pytest.raises(PublishError, match="not accepted by any nsqd"):
        publish([b"x"])                           # the same callable outside Spark


def _stop_broker_after(publish, after: int, pid: int, port: int):
    """Partition 0 stops broker A (SIGTERM: a clean stop that saves its messages) once `after` rows went by,
    and waits until A no longer accepts connections, so the rest of the job must fail over or retry."""
    import socket

    def rows_then_stop(rows):
        for i, row in enumerate(rows):
            if i == after and TaskContext.get().partitionId() == 0 and TaskContext.get().attemptNumber() == 0:
                os.kill(pid, signal.SIGTERM)

                def refused():
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                        return False
                    except OSError:
                        return True
                wait_until(refused, 120, "broker A to stop")
            yield row

    def run(rows):
        publish(rows_then_stop(rows))
    return run


def test_a_broker_stopped_mid_job_loses_nothing_acknowledged(spark, nsqd_factory):  # noqa: F811
    a = nsqd_factory(WITH_HTTP, workers=1)
    b = nsqd_factory(WITH_HTTP, workers=1, node_id=8)
    rows, topic = 40_000, "spark_failover"
    collector_b = Collector(topic, [b])
    collector_a = Collector(topic, [a])          # channel exists on A, so A keeps what it got for it
    try:
        publish = publish_partition(topic, nsqd=[addr(a), addr(b)], batch=200, backoff=0.05)
        job = _stop_broker_after(publish, rows // 8, a.proc.pid, a.port)
        ids_as_bodies(spark, rows, partitions=2).foreachPartition(job)   # both partitions start on A
        collector_a.stop()
        before = collector_a.bodies                # what A delivered before it stopped
        wait_until(lambda: a.proc.poll() is not None, 120, "broker A to finish its clean stop")
        code = a.stop()
        assert code == 0, a.output()[-4000:]
        a2 = nsqd_factory(WITH_HTTP, workers=1, data=a.data_path)     # A again, with what it saved
        collector_a = Collector(topic, [a2])
        wait_until(lambda: sum(before.values()) + collector_a.total + collector_b.total >= rows, 300,
                   "every row from A and B")
        got = before + collector_a.wait_all(collector_a.total) + collector_b.wait_all(collector_b.total)
    finally:
        collector_a.stop()
        collector_b.stop()
    assert set(got) == expected_bodies(rows)
    assert collector_b.total > 0                  # the job went on on B
