"""The scanner process: sole owner of the in-flight timer heaps.

Theory of operation: each worker has one heap in shared memory whose handles are that worker's timer batches (one
per delivery round, ``workers/timing/timer_batches.py``; a TOUCH'd message gets a batch of its own). Workers post events through
their ring to the scanner:

    START  n x (batch, generation, key)  push the batch, or move its key
    REMOVE n x (batch)                   its last slot was finished, requeued or touched: no timer needed
    RESET  ()                            the worker restarted and will post START for what it still holds

Each pass drains the rings, then pops every entry whose key has passed (one ``peek_and_shift`` call per heap) and
posts EXPIRED n x (batch, generation) back to the worker, which ignores an entry whose generation moved on. Unlike
NSQ's sampled queueScanLoop, nothing is sampled: the scanner sleeps exactly until the earliest key (at most
``MAX_SLEEP``) or until a worker wakes it, so a timeout never waits for a scan interval.

Deferred messages (DPUB, REQ with a delay) are not here: they are unbounded, so they have their own store and
heap in their owner worker (``workers/domain/deferred.py``).

Crash handling: the heaps are derived state. A restarted scanner clears them and bumps the scanner epoch in the
control block; every worker then posts START for every slot it holds (``Worker.resync_scanner``).
"""
import os
import signal
import time

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, warm_up_step
from nsqpy.ipc.heap import heap_push, heap_remove, heap_update

START, REMOVE, RESET, EXPIRED = 1, 2, 3, 4
MAX_SLEEP = 0.05  # workers do not wake the scanner for timers due later than this (worker.SCANNER_POLL_NS)
SHIFT_BATCH = 4096


@njit(nogil=True, **JIT)
def apply_starts(ctl, keys, vals, pos, gens, recs):
    """recs: (n, 3) int64 rows of (slot, generation, key)."""
    for i in range(recs.shape[0]):
        slot, gen, key = recs[i, 0], recs[i, 1], recs[i, 2]
        if slot < 0 or slot >= pos.shape[0]:
            continue
        if pos[slot] >= 0:
            heap_update(ctl, keys, vals, pos, slot, key)
        else:
            heap_push(ctl, keys, vals, pos, key, slot)
        gens[slot] = gen


@njit(nogil=True, **JIT)
def apply_removes(ctl, keys, vals, pos, slots):
    for i in range(slots.shape[0]):
        slot = slots[i]
        if 0 <= slot < pos.shape[0] and pos[slot] >= 0:
            heap_remove(ctl, keys, vals, pos, slot)


class Scanner:
    def __init__(self, plan, restarted, log):
        self.plan = plan
        self.log = log
        self.links = plan.link_set
        self.heaps = plan.heaps
        self.gens = [np.zeros(h.n_handles, np.int64) for h in self.heaps]
        self.inboxes = [self.links.to_scanner(w) for w in range(plan.workers)]
        self.outboxes = [self.links.from_scanner(w) for w in range(plan.workers)]
        for link in self.inboxes:
            self.links.recover_reader(link)
        for link in self.outboxes:
            self.links.recover_writer(link)
        self._handles = np.empty(SHIFT_BATCH, np.int64)
        self._keys = np.empty(SHIFT_BATCH, np.int64)
        self._stop = False
        self._grow_logged = 0.0
        for h in self.heaps:
            h.clear()
        plan.control.bump_scanner_epoch()

    def on_record(self, w, rtype, payload):
        h = self.heaps[w]
        if rtype == START:
            recs = np.frombuffer(payload, np.int64).reshape(-1, 3)
            if len(recs) and not self._heap_holds(w, int(recs[:, 0].max())):
                return False  # kept in the ring: tried again on the next pass
            apply_starts(h.ctl, h.keys, h.vals, h.pos, self.gens[w], recs)
        elif rtype == REMOVE:
            apply_removes(h.ctl, h.keys, h.vals, h.pos, np.frombuffer(payload, np.int64))
        elif rtype == RESET:
            h.clear()
        return True  # handled: the ring may release it

    def _heap_holds(self, w, handle):
        """Grow worker w's heap to hold this handle (its pages are normally backed already: nsqpy.ipc.heap, lazy
        pages); False, logged once a second, when /dev/shm cannot back them."""
        h = self.heaps[w]
        if handle < h.pos.shape[0] or handle >= h.n_handles:
            return True  # a handle past n_handles is refused by apply_starts as before
        try:
            h.grow(min(h.n_handles, 1 << handle.bit_length()))
        except OSError as e:
            now = time.monotonic()
            if now - self._grow_logged >= 1.0:
                self._grow_logged = now
                self.log.error(f"scanner: the timer heap of worker {w} cannot grow: {e}")
            return False
        return True

    def sweep(self, now_ns):
        """Post EXPIRED for every due entry; returns the earliest remaining key (or None)."""
        earliest = None
        for w, h in enumerate(self.heaps):
            out = self.outboxes[w]
            while len(h) and h.keys[0] <= now_ns:  # (has_room reserves ring pages: only when something is due)
                if not out.has_room(16 * SHIFT_BATCH + 64):
                    break  # the worker is behind: its entries stay due and go out on the next pass
                n = h.peek_and_shift(now_ns, self._handles, self._keys)
                if n == 0:
                    break
                slots = self._handles[:n]
                recs = np.empty((n, 2), np.int64)
                recs[:, 0] = slots
                recs[:, 1] = self.gens[w][slots]
                out.send(EXPIRED, recs.tobytes())
                self.links.wake(w)
                if n < SHIFT_BATCH:
                    break
            if len(h):
                key = int(h.keys[0])
                earliest = key if earliest is None else min(earliest, key)
        return earliest

    def run(self, ready_fd):
        signal.signal(signal.SIGTERM, lambda *a: setattr(self, "_stop", True))
        os.write(ready_fd, b"s")
        while not self._stop:
            busy = False
            for w, inbox in enumerate(self.inboxes):
                busy |= inbox.drain(lambda rtype, payload, w=w: self.on_record(w, rtype, payload)) > 0
            now = time.time_ns()
            earliest = self.sweep(now)
            if busy:
                continue
            wait = MAX_SLEEP if earliest is None else min(MAX_SLEEP, max(0.0, (earliest - now) / 1e9))
            if wait > 0:
                self.links.sleep(self.links.SCANNER, wait, lambda: all(i.empty() for i in self.inboxes))


def scanner_main(plan, restarted, ready_fd, log):
    Scanner(plan, restarted, log).run(ready_fd)


@warm_up_step
def warm_up():
    """The scanner's kernels on a small heap (workers/lane/warmup.py schedules this before fork)."""
    from nsqpy.ipc.heap import TimerHeap, heap_nbytes
    heap = TimerHeap.create(bytearray(heap_nbytes(64, 64)), 0, 64, 64)
    apply_starts(heap.ctl, heap.keys, heap.vals, heap.pos, np.zeros(64, np.int64),
                 np.array([[1, 1, 10], [2, 1, 20]], np.int64))
    apply_removes(heap.ctl, heap.keys, heap.vals, heap.pos, np.array([2], np.int64))
