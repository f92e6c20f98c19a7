"""The Python that Spark runs: executors and the data source's planner processes must be this interpreter (the
venv that has nsqpy and pyarrow), not whatever `python3` is first on PATH, which Spark would start otherwise.

Spark reads PYSPARK_PYTHON (executors, Python workers) and PYSPARK_DRIVER_PYTHON when it launches the JVM, so
they must be set before the first SparkSession of the process; `python_env()` sets them only where unset, so an
operator's own choice (a cluster's Python path) wins.
"""

from __future__ import annotations

import os
import sys

__all__ = ["python_env", "register", "session"]


def register(spark) -> None:
    """Register the ``nsq`` data source with this SparkSession (`spark.dataSource.register`, Spark >= 4.0)."""
    from nsqpy.spark.source import NsqDataSource
    spark.dataSource.register(NsqDataSource)


_register = register  # session()'s parameter of the same name hides the function there


def python_env() -> dict:
    """Point PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON at sys.executable unless already set; returns both."""
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        os.environ.setdefault(name, sys.executable)
    return {name: os.environ[name] for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}


def session(master: str = "local[2]", app_name: str = "nsqpy", register: bool = True, **conf):
    """A SparkSession with the right Python and, by default, ``format("nsq")`` registered. `conf` keys use
    underscores for dots (``sql_shuffle_partitions=4`` -> ``spark.sql.shuffle.partitions``)."""
    python_env()
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master(master).appName(app_name)
    # a small local job should not plan 200 shuffle partitions; the UI port would clash between test runs; the
    # console progress bar would interleave with the program's own output
    builder = (builder.config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in conf.items():
        builder = builder.config("spark." + key.replace("_", "."), str(value))
    spark = builder.getOrCreate()
    if register:
        _register(spark)
    return spark
