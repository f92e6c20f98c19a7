"""The HTTP child's boot counter (workers/processes/http_gunicorn.py ``_Booted``): gunicorn's workers, forked
from one arbiter, count their boots in a shared memfd, and the one that completes the first ``n`` sends nsqd's
HTTP ready byte. Forked workers share the fd's open file description, so the lock must belong to the process,
not the description (a flock there let two workers count at once: both counted 1, and HTTP never became ready)."""
import os

from nsqpy.workers.processes.http_gunicorn import _Booted

PROCS, EACH = 4, 400


def test_concurrent_boots_from_forked_workers_count_each_once_and_one_completes_the_count():
    booted = _Booted(PROCS * EACH)
    reads = []
    pids = []
    for _ in range(PROCS):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a forked worker: the same fd, the same open file description
            os.close(r)
            completed = sum(booted.count() for _ in range(EACH))
            os.write(w, bytes([completed]))
            os._exit(0)
        os.close(w)
        reads.append(r)
        pids.append(pid)
    completed = []
    for r, pid in zip(reads, pids):
        completed.append(os.read(r, 1)[0])
        os.close(r)
        assert os.waitpid(pid, 0)[1] == 0
    assert int.from_bytes(os.pread(booted.fd, 8, 0), "little") == PROCS * EACH  # no count lost
    assert sum(completed) == 1  # exactly one worker saw the count complete
    assert booted.count() is False  # a later boot (a replacement worker) counts on without effect
