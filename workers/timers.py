"""Timer batches: how a worker keeps the scanner's heap small and its ring quiet.

Theory of operation: the messages of one delivery round all get the same deadline, so the worker registers one
timer per round, not per message: a *batch* (a handle in the scanner's heap) holding the slots delivered in that
round. ``slot_batch[slot]`` says which batch a slot's timer belongs to (-1: none). A slot leaves its batch when it is
finished, requeued, touched (it then gets a batch of its own with the new deadline) or redelivered; a batch whose
last slot left is removed from the scanner's heap with one REMOVE. When the scanner reports a batch EXPIRED, only
the slots that still belong to it have timed out (or come due, for deferred ones).

So the scanner sees one START and at most one REMOVE per delivery round (up to ``channel.ROUND`` messages) instead
of two events per message: measured, per-message events made the scanner the broker's bottleneck.

Batch handles come from a free list of the heap's size; a batch always holds at least one slot, so there are never
more batches than slots. All of this is worker-private memory: after a worker restart every slot is recovered from
the in-flight table and timers are re-registered from scratch (the scanner's heap is reset first).
"""
import numpy as np


class TimerBatches:
    def __init__(self, capacity):
        self.slot_batch = np.full(capacity, -1, np.int64)
        self.live = np.zeros(capacity, np.int64)
        self.gen = np.zeros(capacity, np.int64)   # bumped per use of a handle: stale EXPIRED reports are ignored
        self.members = [None] * capacity
        self._free = list(range(capacity - 1, -1, -1))

    def add(self, slots):
        """A new batch for these slots (which belong to no batch); -> its handle."""
        b = self._free.pop()
        self.gen[b] += 1
        self.slot_batch[slots] = b
        self.live[b] = len(slots)
        self.members[b] = np.array(slots, np.int64)
        return b

    def leave(self, slots):
        """These slots no longer need their timer; -> handles of batches that became empty (to REMOVE)."""
        if len(slots) == 0:
            return ()
        owners = self.slot_batch[slots]
        owners = owners[owners >= 0]
        self.slot_batch[slots] = -1
        if len(owners) == 0:
            return ()
        if len(owners) == 1:
            b = int(owners[0])
            self.live[b] -= 1
            return self._maybe_free((b,))
        batches, counts = np.unique(owners, return_counts=True)
        self.live[batches] -= counts
        return self._maybe_free(batches[self.live[batches] <= 0].tolist())

    def _maybe_free(self, batches):
        empty = []
        for b in batches:
            if self.live[b] <= 0:
                self.members[b] = None
                self.live[b] = 0
                self._free.append(b)
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
        self._free.append(b)
        return due

    def clear(self):
        gen = self.gen
        self.__init__(len(self.slot_batch))
        self.gen = gen + 1
