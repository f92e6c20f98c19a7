"""Waiting for a condition of another process: poll it with a deadline (never a sleep as synchronisation)."""
import time


def wait_until(cond, timeout=90.0, what="condition", interval=0.02):
    """Poll ``cond`` until it returns something truthy (returned) or ``timeout`` seconds pass (AssertionError).
    The deadlines are generous: the machine is small and shared, and they cost nothing when things are right."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s (last: {value!r})")
        time.sleep(interval)  # the polling interval: the condition is what is waited on
