"""A Spark pipeline on NSQ: a batch job publishes a DataFrame to a topic (foreachPartition), and a streaming
query reads that topic through channel `spark`, turns each message into a JSON event and writes it to another
topic (readStream/writeStream .format("nsq")). Prints what reached the sink and exits 0 when every row did.

    python -m nsqpy.examples.spark_pipeline --nsqd-tcp-address=127.0.0.1:4150 [--rows=10000] [--master=local[2]]

The streaming query is at least once: a message is FINed only after Spark committed its micro-batch, so a
crash re-delivers it (the sink may see it twice); the checkpoint directory lets a restarted run continue.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

from nsqpy.client import Consumer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="spark_pipeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    p.add_argument("--source-topic", default=f"spark_in_{os.getpid()}")
    p.add_argument("--sink-topic", default=f"spark_out_{os.getpid()}")
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--checkpoint", default="", help="checkpoint directory (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for every row at the sink")
    args = p.parse_args(argv)

    from pyspark.sql import functions as F   # after argparse: --help should not need a JVM
    from nsqpy.spark import publish_partition, session

    spark = session(args.master, app_name="nsqpy-spark-pipeline")   # sets PYSPARK_PYTHON, registers "nsq"
    nsqd = args.nsqd_tcp_address
    seen: set[bytes] = set()
    lock = threading.Lock()

    def collect(message):
        with lock:
            seen.add(message.body)

    sink = Consumer(args.sink_topic, "check", collect, nsqd_tcp_addresses=[nsqd], max_in_flight=500).start()
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="nsqpy-spark-")
    query = None
    try:
        # 1. Streaming: source topic -> JSON events -> sink topic.
        events = (spark.readStream.format("nsq").option("topic", args.source_topic).option("channel", "spark")
                  .option("nsqd_tcp_addresses", nsqd).load()
                  .select(F.col("id"), F.col("attempts"), F.col("body").cast("string").alias("user"),
                          F.upper(F.col("body").cast("string")).alias("shout")))
        query = (events.writeStream.format("nsq").option("topic", args.sink_topic)
                 .option("nsqd_tcp_addresses", nsqd).option("json_rows", "true")
                 .option("checkpointLocation", checkpoint).start())

        # 2. Batch: a DataFrame published by its partitions.
        users = spark.range(args.rows, numPartitions=4).selectExpr("concat('user-', id) as body")
        users.foreachPartition(publish_partition(args.source_topic, nsqd=[nsqd], column="body"))

        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            with lock:
                users_seen = {json.loads(b)["user"] for b in seen}
            if len(users_seen) >= args.rows or query.exception() is not None:
                break
            time.sleep(0.2)   # progress polling for a demo; the condition above decides
        print(f"{len(users_seen)} of {args.rows} rows reached {args.sink_topic} "
              f"({len(seen)} messages, e.g. {sorted(seen)[:1]})")
        return 0 if len(users_seen) == args.rows else 1
    finally:
        if query is not None:
            query.stop()
        sink.stop()
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
