"""NSQ for PySpark: publish partitions over TCP, and a Python data source ``format("nsq")``.

    from nsqpy.spark import publish_partition, register, session

    spark = session("local[2]")                       # sets PYSPARK_PYTHON to this interpreter first
    df.foreachPartition(publish_partition("events", nsqd=["127.0.0.1:4150"], column="body"))
    register(spark)                                   # then spark.read/readStream/write/writeStream .format("nsq")

`publish_partition` needs no Spark import (executors only unpickle and call it); the data source classes import
pyspark, so they load only when `register` is called.
"""

from nsqpy.spark.env import python_env, register, session
from nsqpy.spark.publisher import PublishError, PublishPartition, publish_partition
from nsqpy.spark.schema import READ_SCHEMA

__all__ = ["publish_partition", "PublishPartition", "PublishError", "register", "python_env", "session",
           "READ_SCHEMA"]
