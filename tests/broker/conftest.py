"""Start a real nsqd (python -m workers.nsqd) on port 0 and read the real address from its log line.

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
import subprocess
import sys
import threading
import time

import pytest

from ipc.shm import instance_prefix

LISTEN_RE = re.compile(r"TCP: listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)$")
START_DEADLINE = 120.0


class Nsqd:
    def __init__(self, args, data_path, node_id):
        self.data_path = data_path
        self.node_id = node_id
        self.lines: list[str] = []
        self._cond = threading.Condition()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "workers.nsqd", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        m = self.wait_for_line(LISTEN_RE, START_DEADLINE)
        self.host, self.port = m.group(1), int(m.group(2))

    def _read(self):
        for raw in self.proc.stdout:
            with self._cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def address(self):
        return (self.host, self.port)

    def wait_for_line(self, pattern, timeout=10.0, start=0):
        pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    m = pattern.search(self.lines[i])
                    if m:
                        return m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no line matching {pattern.pattern!r}; output:\n" + "\n".join(self.lines))
                self._cond.wait(left)

    def output(self):
        with self._cond:
            return "\n".join(self.lines)

    def child_pids(self):
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]

    def stop(self, timeout=30.0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError("nsqd did not stop within its deadline:\n" + self.output())
        self._reader.join(5)
        return code

    def segments_left(self):
        prefix = instance_prefix(self.data_path, self.node_id).lstrip("/")
        return [e for e in os.listdir("/dev/shm") if e.startswith(prefix)]


def _factory(base, started):
    def start(*flags, workers=2, node_id=7):
        data = base / f"data{len(started)}"
        data.mkdir()
        args = ["--tcp-address=127.0.0.1:0", f"--data-path={data}", f"--workers={workers}",
                f"--node-id={node_id}", *flags]
        n = Nsqd(args, str(data), node_id)
        started.append(n)
        return n
    return start


def _stop_all(started):
    problems = []
    for n in started:
        code = n.stop()
        if code != 0:
            problems.append(f"nsqd exited with {code}:\n{n.output()}")
        left = n.segments_left()
        if left:
            for e in left:
                os.unlink(os.path.join("/dev/shm", e))
            problems.append(f"nsqd left shared memory behind: {left}")
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
