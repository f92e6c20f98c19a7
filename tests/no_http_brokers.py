"""Fixtures for suites that run against real nsqpy brokers without their HTTP API (the client and the tools
suites import them into their conftest). The client tests run against real nsqpy brokers, started by the broker suite's helpers (port 0, tmp data
path, SIGTERM at teardown with a leak check). The brokers here run without the HTTP API (`--http-address=`)
unless a test asks for it by passing its own --http-address, which comes later on the command line and wins."""

import pytest

from tests.broker.conftest import module_nsqd_factory as _module_factory  # noqa: F401  (fixture)
from tests.broker.conftest import nsqd_factory as _factory  # noqa: F401  (fixture)

NO_HTTP = ("--http-address=",)


def _without_http(start):
    def wrapped(*flags, **kwargs):
        return start(*NO_HTTP, *flags, **kwargs)
    return wrapped


@pytest.fixture
def nsqd_factory(_factory):  # noqa: F811
    return _without_http(_factory)


@pytest.fixture(scope="module")
def module_nsqd_factory(_module_factory):  # noqa: F811
    return _without_http(_module_factory)


@pytest.fixture(scope="module")
def shared_nsqd(module_nsqd_factory):
    return module_nsqd_factory()
