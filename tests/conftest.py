"""Suite-wide /dev/shm hygiene: no test may leave a shared-memory segment of ours behind.

Tests name their segments with the ``shm_prefix`` fixture (``nsqpy-t<session pid>-<test number>``), so this
session's segments are told apart from a broker or another test run on the same host. After each test, anything
left under the session prefix is removed and the test errors in teardown, naming the segments; at the end of the
session the same check runs once more (for children that outlived their test) and also catches segments with the
default ``nsqpy`` prefix that this pytest process created and left.
"""
from __future__ import annotations

import itertools
import os

import pytest

SESSION_PID = os.getpid()
SESSION_PREFIX = f"nsqpy-t{SESSION_PID}-"
_counter = itertools.count()
_leaks: list[str] = []


def _ours_left(prefix: str) -> list[str]:
    try:
        return sorted(e for e in os.listdir("/dev/shm") if e.startswith(prefix))
    except FileNotFoundError:
        return []


def _remove(entries) -> None:
    for entry in entries:
        try:
            os.unlink(os.path.join("/dev/shm", entry))
        except FileNotFoundError:
            pass


@pytest.fixture
def shm_prefix() -> str:
    """A segment-name prefix unique to this test (no leading '/'): ``Segment.create('/' + shm_prefix + '-x')``
    or ``segment_name(..., prefix=shm_prefix)``."""
    return f"{SESSION_PREFIX}{next(_counter)}"


@pytest.fixture(autouse=True)
def _no_segment_left(request):
    yield
    if os.getpid() != SESSION_PID:
        return  # a forked child unwinding pytest's stack must not judge the parent's test
    left = _ours_left(SESSION_PREFIX)
    if left:
        _remove(left)
        pytest.fail(f"{request.node.nodeid} left shared-memory segments behind: {left}", pytrace=False)


def _created_here(entry: str) -> bool:
    from nsqpy.ipc.shm import Segment  # imported late: numba loads only for suites that use ipc
    try:
        seg = Segment.attach("/" + entry)
    except Exception:
        return False
    try:
        return seg.creator_pid == os.getpid()
    finally:
        seg.close()


def pytest_sessionstart(session):
    session.config._nsqpy_shm_before = set(_ours_left("nsqpy"))


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_nsqpy_shm_before", set())
    left = _ours_left(SESSION_PREFIX) + [e for e in _ours_left("nsqpy") if e not in before
                                          and not e.startswith(SESSION_PREFIX) and _created_here(e)]
    if left:
        _remove(left)
        _leaks.extend(left)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _leaks:
        terminalreporter.write_line(f"FAILED /dev/shm hygiene: segments left after the session (removed now): "
                                    f"{_leaks}", red=True)
