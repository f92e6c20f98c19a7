"""Polling with a deadline (never a sleep as synchronisation) and unique names for tests sharing a broker."""

import itertools
import os
import time

_seq = itertools.count()
DEADLINE = 90.0   # generous: a cold numba cache makes a broker's first messages take tens of seconds


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_seq)}"


def wait_until(cond, timeout: float = DEADLINE, what: str = "condition", interval: float = 0.01):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout}s")
        time.sleep(interval)   # polling interval of a condition with a deadline


def addr(nsqd) -> str:
    return "%s:%d" % nsqd.address
