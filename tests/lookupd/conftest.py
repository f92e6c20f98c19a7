"""Fixtures of the lookupd tests (helpers in ``lookupd_wire.py``): lookupd processes stopped at teardown (exit 0
required), and nsqd nodes registering with them, started by the broker suite's ``nsqd_factory``."""
from __future__ import annotations

import pytest

from lookupd_wire import Lookupd
from tests.broker.conftest import nsqd_factory as _nsqd_factory  # noqa: F401  (fixture)


@pytest.fixture
def lookupd_factory():
    started: list[Lookupd] = []

    def start(*flags):
        lk = Lookupd(*flags)
        started.append(lk)
        return lk
    yield start
    problems = []
    for lk in started:
        code = lk.stop()
        if code != 0:
            problems.append(f"nsqlookupd exited with {code}:\n{lk.output()}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
def lookupd(lookupd_factory):
    return lookupd_factory()


@pytest.fixture
def registered_nsqd(_nsqd_factory):  # noqa: F811
    """start(*lookupds, http_port=..., *flags): an nsqd registering with the given lookupds."""
    def start(*lookupds, http_port=4151, flags=(), **kwargs):
        # http_port=None: with nsqd's HTTP API on port 0, whose real port IDENTIFY must then announce
        http = ["--http-address=127.0.0.1:0"] if http_port is None else ["--http-address=",
                                                                         f"--broadcast-http-port={http_port}"]
        args = [*http, "--broadcast-address=127.0.0.1", *(f"--lookupd-tcp-address={lk.tcp}" for lk in lookupds),
                *flags]
        return _nsqd_factory(*args, **kwargs)
    return start


