"""nsqd that notes every kernel numba loads (or compiles: a compile looks in the cache first), and which process
did: one line ``<pid> <kernel>`` appended to the file named by $NSQPY_KERNEL_LOADS.

    python -m tests.broker.kernel_loads <nsqd flags>

The note is taken in numba's ``Cache._load_overload``, below ``Cache.load_overload`` (which nsqd's warm-up may
replace: workers/lane/warmup.py), and the processes the supervisor forks take it along (tests/broker/test_first_start.py).
"""
import os
import sys

import nsqpy.ipc  # noqa: F401  (numba's cache directory, before numba: ipc/numba_cache.py)
from numba.core.caching import Cache


def _noting(load, path):
    def _load_overload(self, sig, target_context):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {self._name}\n".encode())  # one write each: lines never interleave
        finally:
            os.close(fd)
        return load(self, sig, target_context)
    return _load_overload


if __name__ == "__main__":
    Cache._load_overload = _noting(Cache._load_overload, os.environ["NSQPY_KERNEL_LOADS"])
    from nsqpy.workers.processes import nsqd
    sys.exit(nsqd.main(sys.argv[1:]))
