"""Fixtures of the nsqadmin tests (helpers in ``admin_wire.py``): one real cluster per test module (one nsqpy
nsqlookupd and two nsqpy nsqd registering with it, each with its HTTP API on port 0, whose real port lookupd
hands out), and nsqadmin processes pointed at it, each stopped with SIGTERM at teardown (exit 0 required)."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lookupd"))
from lookupd_wire import Lookupd  # noqa: E402
from tests.admin.admin_wire import Admin, eventually, http_name  # noqa: E402
from tests.broker.conftest import module_nsqd_factory  # noqa: E402,F401  (fixture)


def _stop_all(started, what):
    problems = []
    for p in started:
        code = p.stop()
        if code != 0:
            problems.append(f"{what} exited with {code}:\n{p.output()}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def lookupd_module():
    started = []
    lk = Lookupd()
    started.append(lk)
    yield lk
    _stop_all(started, "nsqlookupd")


@pytest.fixture(scope="module")
def cluster(lookupd_module, module_nsqd_factory):  # noqa: F811
    """A lookupd and two nsqd registered with it: .lookupd, .nodes, .start_node() for one more."""
    lk = lookupd_module

    def start_node(node_id, *flags, data=None):
        n = module_nsqd_factory("--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lk.tcp}", *flags,
                                workers=1, node_id=node_id, data=data)
        n.http_address  # noqa: B018  (waits for the HTTP listening line)
        return n
    nodes = [start_node(11), start_node(12)]
    eventually(lambda: len(lk.get_json("/nodes")["producers"]) == 2, what="both nsqd registered with lookupd")
    return types.SimpleNamespace(lookupd=lk, nodes=nodes, start_node=start_node,
                                 http_names=[http_name(n) for n in nodes])


@pytest.fixture(scope="module")
def admin_factory():
    started: list[Admin] = []

    def start(*flags):
        a = Admin(*flags)
        started.append(a)
        return a
    yield start
    _stop_all(started, "nsqadmin")
