"""Discovery through nsqlookupd: publish_partition finds the nsqd from lookupd's /nodes (a topic nobody has yet),
and readStream.format("nsq") with lookupd_http_addresses finds it from /lookup."""

from nsqpy.spark import publish_partition
from tests.lookupd.lookupd_wire import Lookupd
from tests.spark.helpers import WITH_HTTP, Collector, addr, drained, wait_until


def test_publish_and_stream_through_lookupd(spark, nsqd_factory, tmp_path):  # noqa: F811
    lookupd = Lookupd()
    query = None
    try:
        nsqd = nsqd_factory(WITH_HTTP, "--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lookupd.tcp}",
                            workers=1)
        wait_until(lambda: lookupd.get_json("/nodes").get("producers"), 60, "nsqd to register with lookupd")
        source, sink, n = "spark_lk_in", "spark_lk_out", 2000
        collector = Collector(sink, [nsqd])
        try:
            spark.range(n, numPartitions=2).selectExpr("cast(id as string) as body").foreachPartition(
                publish_partition(source, lookupd=[lookupd.http]))
            wait_until(lambda: lookupd.producer_ports(source), 60, "lookupd to list the topic")
            query = (spark.readStream.format("nsq").option("topic", source).option("channel", "spark")
                     .option("lookupd_http_addresses", lookupd.http).load().select("body")
                     .writeStream.format("nsq").option("topic", sink).option("nsqd_tcp_addresses", addr(nsqd))
                     .option("checkpointLocation", str(tmp_path / "ckpt")).start())
            expected = {b"%d" % i for i in range(n)}
            wait_until(lambda: expected <= set(collector.bodies), 300, "every row at the sink")
            wait_until(lambda: drained([nsqd], source, "spark"), 120, "the source channel to drain")
        finally:
            if query is not None:
                query.stop()
            collector.stop()
    finally:
        assert lookupd.stop() == 0, lookupd.output()[-3000:]
