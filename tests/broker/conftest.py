"""Start a real nsqd (python -m nsqpy.workers.processes.nsqd) on port 0 and read the real address from its log line.

``nsqd_factory(*flags)`` starts one and returns an ``Nsqd`` handle; every broker started in a test is stopped
with SIGTERM at teardown, must exit 0 within its deadline, and must leave no shared-memory segment behind.
Output is collected by a reader thread, so tests can wait on log lines (``wait_for_line``) with a deadline.
``shared_nsqd`` / ``module_nsqd_factory`` do the same once per test module, for tests that keep to their own
topic names (start-up costs seconds; one broker per test would make the suite minutes long).
"""
from __future__ import annotations

import os
import re
import signal

import pytest

from nsqpy.ipc.shm import instance_prefix
from tests.logged_process import LoggedProcess

LISTEN_RE = re.compile(r"TCP: listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)$")
HTTP_LISTEN_RE = re.compile(r"HTTP: listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)$")
START_DEADLINE = 120.0


class Nsqd(LoggedProcess):
    name = "nsqd"

    def __init__(self, args, data_path, node_id, module="nsqpy.workers.processes.nsqd"):
        self.data_path = data_path
        self.node_id = node_id
        self.expected_code = 0
        super().__init__(module, args)
        with self.starting():
            m = self.wait_for_line(LISTEN_RE, START_DEADLINE)
        self.host, self.port = m.group(1), int(m.group(2))

    @property
    def address(self):
        return (self.host, self.port)

    @property
    def http_address(self):
        """(host, port) of the HTTP API, from nsqd's ``HTTP: listening on`` line (logged once the HTTP processes are
        ready, which can be after TCP's)."""
        m = self.wait_for_line(HTTP_LISTEN_RE, START_DEADLINE)
        return (m.group(1), int(m.group(2)))

    def kill_all(self):
        """SIGKILL every process of the broker at once (a whole-broker crash); its teardown then expects -9."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(5)
        self.expected_code = -signal.SIGKILL

    def segments_left(self):
        prefix = instance_prefix(self.data_path, self.node_id).lstrip("/")
        return [e for e in os.listdir("/dev/shm") if e.startswith(prefix)]


def _factory(base, started):
    def start(*flags, workers=2, node_id=7, data=None, module="nsqpy.workers.processes.nsqd"):
        """``data``: a data path to (re)use, e.g. a stopped broker's (default: a new one); ``module``: what runs
        (``python -m``), nsqd's main or a test's harness around it."""
        if data is None:
            data = base / f"data{len(started)}"
            data.mkdir()
        args = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={data}",
                f"--workers={workers}",
                f"--node-id={node_id}", *flags]
        n = Nsqd(args, str(data), node_id, module)
        started.append(n)
        return n
    return start


def _stop_all(started):
    problems = []
    codes = [n.stop() for n in started]  # all first: a restarted broker shares its data path (and segment names)
    for n, code in zip(started, codes):
        if code != getattr(n, "expected_code", 0):
            problems.append(f"nsqd exited with {code}:\n{n.output()}")
        left = n.segments_left()
        if left:
            for e in left:
                os.unlink(os.path.join("/dev/shm", e))
            problems.append(f"nsqd left shared memory behind: {left}\n{n.output()[-6000:]}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
def nsqd_factory(tmp_path):
    started: list[Nsqd] = []
    yield _factory(tmp_path, started)
    _stop_all(started)


@pytest.fixture
def nsqd(nsqd_factory):
    return nsqd_factory()


@pytest.fixture(scope="module")
def module_nsqd_factory(tmp_path_factory):
    """Like ``nsqd_factory``, but the brokers live for the whole test module (start-up takes seconds). Only for
    tests that keep to their own topic names, so that they cannot see each other's messages."""
    started: list[Nsqd] = []
    yield _factory(tmp_path_factory.mktemp("nsqd"), started)
    _stop_all(started)


@pytest.fixture(scope="module")
def shared_nsqd(module_nsqd_factory):
    """One default broker (two workers) per test module."""
    return module_nsqd_factory()
