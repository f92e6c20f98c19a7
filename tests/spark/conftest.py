"""Spark tests: real PySpark in local mode against real nsqpy brokers (tests/no_http_brokers.py), started with
their HTTP API on port 0 so that the tests can read channel depth and in-flight counts from /stats.

One SparkSession for the whole directory: a JVM start costs seconds. Its master is ``local[2,2]`` (two
threads, a task may fail once and is retried), which the forced-failure test needs and the others ignore.
`nsqpy.spark.session` points PYSPARK_PYTHON at this interpreter, so the Python workers import this checkout.
"""

import pytest

from nsqpy.spark import session
from tests.no_http_brokers import (_factory, _module_factory, module_nsqd_factory, nsqd_factory,  # noqa: F401
                                   shared_nsqd)
from tests.spark.helpers import WITH_HTTP


@pytest.fixture(scope="session")
def spark():
    s = session("local[2,2]", app_name="nsqpy-tests")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def broker(module_nsqd_factory):  # noqa: F811
    return module_nsqd_factory(WITH_HTTP)
