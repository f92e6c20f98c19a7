"""Timer batches: how a worker keeps the scanner's heap small and its ring quiet.

Theory of operation: the messages of one delivery round all get the same deadline, so the worker registers one
timer per round, not per message: a *batch* (a handle in the scanner's heap) holding the slots delivered in that
round. ``slot_batch[slot]`` says which batch a slot's timer belongs to (-1: none). A slot leaves its batch when it is
finished, requeued, touched (it then gets a batch of its own with the new deadline) or redelivered; a batch whose
last slot left is removed from the scanner's heap with one REMOVE. When the scanner reports a batch EXPIRED, only
the slots that still belong to it have timed out (or come due, for deferred ones).

So the scanner sees one START and at most one REMOVE per delivery round (up to ``channel.ROUND`` messages) instead
of two events per message: measured, per-message events made the scanner the broker's bottleneck.

A batch may also be *held*: started in this worker but not yet posted to the scanner (``hold``). Most messages
are finished within milliseconds of their delivery, far inside their timeout (>= 1 s), so the worker posts a
round's START only once it has been held for a short while (``take_held``); a held batch that empties first
never reaches the scanner at all, neither its START nor its REMOVE. That takes two ring records and their
Python per delivery round off a busy worker, and the traffic of every worker off the one scanner.

Batch handles come from a free list of the heap's size; a batch always holds at least one slot, so there are never
more batches than slots. All of this is worker-private memory: after a worker restart every slot is recovered from
the in-flight table and timers are re-registered from scratch (the scanner's heap is reset first).

``live[b]`` is the number of slots whose ``slot_batch`` is b, so a batch empties at the one moment its count
reaches 0: ``batches_leave`` (compiled) takes the slots of a FIN batch out of their batches in one pass and lists
each batch that emptied once. A FIN batch read from a busy consumer's socket spans many delivery rounds; in numpy
that pass was a dozen array operations and an ``np.unique`` per call, the largest Python part of a FIN batch under
Go's bench_reader (py-spy on the owner).
"""
import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, warm_up_step


@njit(nogil=True, **JIT)
def batches_leave(slot_batch, live, slots, emptied):
    """Take each slot of ``slots`` (a negative one is skipped: a FIN that failed) out of its batch; each batch
    whose last slot left is written once to ``emptied`` (as long as ``slots``). -> how many emptied."""
    k = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        if s < 0:
            continue
        b = slot_batch[s]
        if b < 0:
            continue
        slot_batch[s] = -1
        live[b] -= 1
        if live[b] == 0:
            emptied[k] = b
            k += 1
    return k


class TimerBatches:
    def __init__(self, capacity):
        self.slot_batch = np.full(capacity, -1, np.int64)
        self.live = np.zeros(capacity, np.int64)
        self.gen = np.zeros(capacity, np.int64)   # bumped per use of a handle: stale EXPIRED reports are ignored
        self.members = [None] * capacity
        self._free = list(range(capacity - 1, -1, -1))
        self.unposted = np.zeros(capacity, np.bool_)  # held: the scanner has not heard of this use of the handle
        self._held = []                                # (handle, gen, key) in the order they were held
        self._emptied = np.empty(256, np.int64)         # batches_leave's output, grown to the longest call's

    def add(self, slots):
        """A new batch for these slots (which belong to no batch); -> its handle."""
        b = self._free.pop()
        self.gen[b] += 1
        n = len(slots)
        if n == 1:
            self.slot_batch[int(slots[0])] = b  # (an unbuffered consumer's every round: no array indexing)
        else:
            self.slot_batch[slots] = b
        self.live[b] = n
        self.members[b] = np.array(slots, np.int64)
        return b

    def hold(self, b, key):
        """Batch b's timer (deadline `key`) is not posted yet: ``take_held`` gives it, unless b empties first."""
        self.unposted[b] = True
        self._held.append((b, int(self.gen[b]), key))

    def held(self):
        return len(self._held)

    def take_held(self):
        """The held timers still live, as rows (handle, gen, key) to post with START; none is held after."""
        rows = [row for row in self._held if self.unposted[row[0]] and self.gen[row[0]] == row[1]]
        self._held = []
        if rows:
            self.unposted[[row[0] for row in rows]] = False
        return rows

    def leave(self, slots):
        """These slots no longer need their timer (negative entries are skipped); -> handles of posted batches
        that became empty (to REMOVE). A held batch that empties is dropped here: the scanner never heard of it."""
        n = len(slots)
        if n == 0:
            return ()
        if len(self._emptied) < n:
            self._emptied = np.empty(max(n, 2 * len(self._emptied)), np.int64)
        k = batches_leave(self.slot_batch, self.live, np.asarray(slots, np.int64), self._emptied)
        return self._maybe_free(self._emptied[:k].tolist())

    def leave_one(self, slot):
        """``leave`` for one slot (a FIN's) in plain ints: no array indexing on every FIN."""
        b = int(self.slot_batch[slot])
        if b < 0:
            return ()
        self.slot_batch[slot] = -1
        self.live[b] -= 1
        return self._maybe_free((b,))

    def _maybe_free(self, batches):
        empty = []
        for b in batches:
            if self.live[b] <= 0 and self.members[b] is not None:
                self.members[b] = None
                self.live[b] = 0
                self._free.append(b)
                if self.unposted[b]:
                    self.unposted[b] = False
                else:
                    empty.append(b)
        return empty

    def expire(self, b, gen):
        """The scanner says batch b (use number gen) is due: -> the slots still in it (their timers fired)."""
        slots = self.members[b]
        if slots is None or self.gen[b] != gen:
            return np.empty(0, np.int64)  # emptied, or freed and reused since: a stale report
        due = slots[self.slot_batch[slots] == b]
        self.slot_batch[due] = -1
        self.members[b] = None
        self.live[b] = 0
        self.unposted[b] = False
        self._free.append(b)
        return due

    def clear(self):
        gen = self.gen
        self.__init__(len(self.slot_batch))
        self.gen = gen + 1


@warm_up_step
def warm_up():
    """``batches_leave`` with a worker's argument types (workers/lane/warmup.py schedules this before fork)."""
    timers = TimerBatches(8)
    timers.add(np.arange(3, dtype=np.int64))
    timers.leave(np.array([0, -1, 2, 1], np.int64))
