"""The broker's control block: a few shared words per process, each with exactly one writer.

Layout (int64 words after the common header line, one LINE per process so writers never share a cache line):

    line 0          header (magic 'NSQCTRL1', version, size, workers)
    line 1          scanner: epoch (bumped by every scanner start), restarts seen by the supervisor
    line 2 + w      worker w: connections it serves (written by worker w, read by the acceptor), restarts

The acceptor picks the worker with the fewest connections; workers compare the scanner epoch once per loop
iteration and re-post their timers when it moved (the scanner restarted and cleared its heaps).
"""
from ipc.atomics import py_fetch_add, py_load_acquire, py_store_release
from ipc.layout import LINE, LINE_WORDS, HEADER_WORDS, check_header, magic, stamp_header, words

MAGIC = magic("NSQCTRL1")
VERSION = 1
SCANNER_EPOCH, SCANNER_RESTARTS = LINE_WORDS, LINE_WORDS + 1
W_CONNS, W_RESTARTS = 0, 1


def nbytes(workers):
    return LINE * (2 + workers)


class Control:
    def __init__(self, seg, workers):
        self.seg = seg
        self.workers = workers
        self.w = words(seg.buf, 0, nbytes(workers) // 8, "control block")
        check_header(self.w[:HEADER_WORDS], MAGIC, VERSION, nbytes(workers), (workers,), what="control block")

    @classmethod
    def create(cls, seg, workers):
        w = words(seg.buf, 0, nbytes(workers) // 8, "control block")
        w[:] = 0
        stamp_header(w[:HEADER_WORDS], MAGIC, VERSION, nbytes(workers), (workers,))
        return cls(seg, workers)

    def _worker(self, w, field):
        return (2 + w) * LINE_WORDS + field

    def add_connections(self, w, delta):
        py_fetch_add(self.w, self._worker(w, W_CONNS), delta)

    def set_connections(self, w, n):
        py_store_release(self.w, self._worker(w, W_CONNS), n)

    def connections(self, w):
        return int(py_load_acquire(self.w, self._worker(w, W_CONNS)))

    def least_loaded(self):
        return min(range(self.workers), key=self.connections)

    def count_restart(self, w):
        """Called by the supervisor; w = -1 for the scanner."""
        idx = SCANNER_RESTARTS if w < 0 else self._worker(w, W_RESTARTS)
        py_fetch_add(self.w, idx, 1)

    def restarts(self):
        return [int(self.w[self._worker(w, W_RESTARTS)]) for w in range(self.workers)] + \
            [int(self.w[SCANNER_RESTARTS])]

    def bump_scanner_epoch(self):
        py_fetch_add(self.w, SCANNER_EPOCH, 1)

    def scanner_epoch(self):
        return int(self.w[SCANNER_EPOCH])  # read every loop iteration: a plain (x86: acquire) load is enough
