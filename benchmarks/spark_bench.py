"""NSQ from PySpark against nsqpy's nsqd, in one run, next to a plain Python producer:

  python_producer_rows_per_s      one blocking Producer, MPUBs of --batch rows, 4 in flight (what each Spark
                                  partition does), no Spark
  foreach_partition_rows_per_s    df.foreachPartition(publish_partition(...)) on --master (local[2]),
                                  --partitions partitions, timed from job submission to its end
  batch_writer_rows_per_s         the same rows through df.write.format("nsq")
  stream_rows_per_s               end to end: --stream-rows messages waiting in a topic, readStream.format("nsq")
                                  -> writeStream.format("nsq") into another topic, timed from query start
                                  until a consumer on the sink topic has them all (query start-up included;
                                  stream_steady_rows_per_s counts from the first row at the sink)

    .venv/bin/python -m benchmarks.spark_bench [--rows=1000000] [--stream-rows=200000] [--size=200]

Starts nsqd on port 0 (unless --nsqd-tcp-address is given), prints one JSON line and, given --out, writes it there
(a new results file: a run never replaces a committed one). Rows are --size bytes; Spark's jobs run once on a few rows
first, so that JVM and Python worker start-up stay outside the timed runs (but not outside the stream's).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

from benchmarks.common import emit, environment, host_port, log
from benchmarks.process import ListeningProcess, python_module
from nsqpy.client import Consumer


class Counter:
    """Counts what arrives on topic/channel (FIN each); `wait(n)` blocks until n arrived or the timeout."""

    def __init__(self, address: str, topic: str, rdy: int = 2500):
        self.count, self.first_at = 0, None
        self.enough = threading.Event()
        self.target = None

        async def handle(message):
            if self.first_at is None:
                self.first_at = time.perf_counter()
            self.count += 1
            if self.target is not None and self.count >= self.target:
                self.enough.set()
        self.consumer = Consumer(topic, "bench", handle, nsqd_tcp_addresses=[address], max_in_flight=rdy).start()

    def wait(self, n: int, timeout: float) -> bool:
        self.target = n
        if self.count >= n:
            self.enough.set()
        ok = self.enough.wait(timeout)
        self.consumer.stop()
        return ok


def python_producer(address: str, topic: str, body: bytes, rows: int, batch: int) -> float:
    from nsqpy.spark import publish_partition
    started = time.perf_counter()
    publish_partition(topic, nsqd=[address], batch=batch)(body for _ in range(rows))   # the same code path
    return time.perf_counter() - started


def timed_job(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nsqd-tcp-address", type=host_port, default=None)
    p.add_argument("--workers", type=int, default=2, help="nsqd --workers when the benchmark starts it")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--stream-rows", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch", type=int, default=500, help="rows per MPUB")
    p.add_argument("--max-rows-per-batch", type=int, default=10000, help="streaming micro-batch rows")
    p.add_argument("--max-in-flight", type=int, default=20000, help="the streaming reader's max_in_flight")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)

    from nsqpy.spark import publish_partition, session
    server = data = None
    if args.nsqd_tcp_address is None:
        data = tempfile.mkdtemp(prefix="spark_bench_")
        server = ListeningProcess(python_module("nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=",
                                                f"--data-path={data}", f"--workers={args.workers}"),
                                  ready_timeout=300).start()
        address = server.address_text
    else:
        address = "%s:%d" % args.nsqd_tcp_address
    run = f"spark_bench_{os.getpid()}"
    spark = session(args.master, app_name="spark_bench")
    ok = True
    try:
        def rows_df(n):
            return spark.range(n, numPartitions=args.partitions).selectExpr(
                f"rpad(cast(id as string), {args.size}, 'x') as body")

        rows_df(1000).foreachPartition(publish_partition(run + "_warm", nsqd=[address]))   # JVM + workers up

        sink = Counter(address, run + "_py")
        t_py = python_producer(address, run + "_py", b"x" * args.size, args.rows, args.batch)
        ok &= sink.wait(args.rows, args.timeout)
        log(f"python producer: {args.rows} rows in {t_py:.2f}s = {args.rows / t_py:,.0f} rows/s")

        sink = Counter(address, run + "_fp")
        t_fp = timed_job(lambda: rows_df(args.rows).foreachPartition(
            publish_partition(run + "_fp", nsqd=[address], batch=args.batch)))
        ok &= sink.wait(args.rows, args.timeout)
        log(f"foreachPartition: {args.rows} rows in {t_fp:.2f}s = {args.rows / t_fp:,.0f} rows/s")

        sink = Counter(address, run + "_w")
        t_w = timed_job(lambda: rows_df(args.rows).write.format("nsq").option("topic", run + "_w")
                        .option("nsqd_tcp_addresses", address).option("batch_size", args.batch)
                        .mode("append").save())
        ok &= sink.wait(args.rows, args.timeout)
        log(f"batch writer: {args.rows} rows in {t_w:.2f}s = {args.rows / t_w:,.0f} rows/s")

        # streaming: the source topic is filled first (its channel made before), then the query drains it
        Consumer(run + "_src", "spark", lambda m: None, nsqd_tcp_addresses=[address], max_in_flight=0).start().stop()
        python_producer(address, run + "_src", b"y" * args.size, args.stream_rows, args.batch)
        sink = Counter(address, run + "_dst")
        checkpoint = tempfile.mkdtemp(prefix="spark_bench_ckpt_")
        started = time.perf_counter()
        query = (spark.readStream.format("nsq").option("topic", run + "_src").option("channel", "spark")
                 .option("nsqd_tcp_addresses", address).option("max_rows_per_batch", args.max_rows_per_batch)
                 .option("max_in_flight", args.max_in_flight)
                 .load().select("body")
                 .writeStream.format("nsq").option("topic", run + "_dst").option("nsqd_tcp_addresses", address)
                 .option("checkpointLocation", checkpoint).start())
        ok &= sink.wait(args.stream_rows, args.timeout)
        t_stream = time.perf_counter() - started
        t_steady = time.perf_counter() - (sink.first_at or started)
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
        log(f"stream: {sink.count} rows in {t_stream:.2f}s = {sink.count / t_stream:,.0f} rows/s "
            f"({sink.count / t_steady:,.0f} from the first row)")
    finally:
        spark.stop()
        if server is not None:
            server.stop()
        if data is not None:
            shutil.rmtree(data, ignore_errors=True)
    result = {
        "tool": "spark_bench", "master": args.master, "partitions": args.partitions, "size": args.size,
        "rows": args.rows, "mpub_batch": args.batch, "nsqd_workers": args.workers if server is not None else None,
        "python_producer_rows_per_s": round(args.rows / t_py),
        "foreach_partition_rows_per_s": round(args.rows / t_fp), "foreach_partition_s": round(t_fp, 3),
        "batch_writer_rows_per_s": round(args.rows / t_w),
        "stream_rows": args.stream_rows, "stream_max_rows_per_batch": args.max_rows_per_batch,
        "stream_max_in_flight": args.max_in_flight,
        "stream_rows_per_s": round(sink.count / t_stream), "stream_steady_rows_per_s": round(sink.count / t_steady),
        "stream_s": round(t_stream, 3), "complete": bool(ok), **environment()}
    emit(result, args.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
