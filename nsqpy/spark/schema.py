"""The rows ``spark.read.format("nsq")`` yields: one per message, in this Spark DDL schema (no pyspark import,
so the package can name it without loading Spark)."""

READ_SCHEMA = "id string, timestamp timestamp, attempts int, body binary, topic string"
