"""Fork helpers for the multi-process ipc tests: run a function in a child, wait on it with a deadline.

Waiting uses a pidfd and poll(), so a test blocks on the child's exit itself, never on a sleep. A child reports
failure through its exit status (1 after printing the traceback); ``os._exit`` keeps it from running pytest's
teardown or atexit handlers that belong to the parent.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time
import traceback


def fork(fn, *args) -> int:
    """Run ``fn(*args)`` in a forked child; exit status 0 if it returned, 1 if it raised."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn(*args)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def wait(pid: int, timeout: float) -> int:
    """Wait for ``pid`` to exit and return its wait status; SIGKILL it and raise after ``timeout`` seconds."""
    fd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(0.0, timeout) * 1000):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"child {pid} still running after {timeout:.1f} s (killed)")
        return os.waitpid(pid, 0)[1]
    finally:
        os.close(fd)


def run_all(calls, timeout: float) -> None:
    """Fork one child per (fn, *args) tuple, wait for all within ``timeout``, fail if any child failed."""
    pids = [fork(*call) for call in calls]
    deadline = time.monotonic() + timeout
    failed = []
    for pid in pids:
        try:
            status = wait(pid, deadline - time.monotonic())
        except TimeoutError as exc:
            failed.append(str(exc))
            continue
        if status != 0:
            failed.append(f"child {pid} exited with wait status {status}")
    assert not failed, failed
