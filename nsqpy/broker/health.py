"""Whether the broker is healthy, as nsqd's /ping and /stats report it.

nsqd turns unhealthy after a failed disk write (``NOK - <the error>``) and healthy again after the next good one;
so does nsqpy, per worker. Readers (the HTTP API's processes) call this per request, so it stays cheap: one shared
word per worker.
"""
from __future__ import annotations

import time

__all__ = ["unhealthy_reason", "health_text"]


def unhealthy_reason(plan) -> str | None:
    """None when healthy, else the error that made the broker unhealthy (nsqd's text after ``NOK - ``): a worker
    whose last attempt to store messages failed (no space in /dev/shm or on the data path's disk, an I/O error),
    until one of its stores works again. One word per worker in the control block (``workers/control/block.py``)."""
    failing = [w for w in range(plan.workers) if plan.control.storage_failed(w)]
    if not failing:
        return None
    since = min(plan.control.storage_failed(w) for w in failing) / 1e9
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(since))
    return (f"failed to store messages on worker {', '.join(map(str, failing))} since {stamp} UTC "
            f"(disk or shared memory full, or an I/O error; see nsqd's log)")


def health_text(reason: str | None) -> str:
    """nsqd's GetHealth(): ``OK`` or ``NOK - <reason>``."""
    return "OK" if reason is None else f"NOK - {reason}"
