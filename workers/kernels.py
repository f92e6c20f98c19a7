"""Numba kernels of the worker that read its in-flight table in bulk (the table's own kernels are per slot).

They read the slot words directly, with the layout constants of ``ipc.inflight``; the worker is the table's only
writer and these run in the worker, so plain loads are enough.
"""
import numpy as np
from numba import njit

from ipc.inflight import (DEFERRED, F_ATTEMPTS, FREE, HALF_WORDS, REQUEUED, S_CHANNEL, S_HALF0, S_LOG_POS, S_TAG,
                          SLOT_WORDS)


@njit(cache=True, nogil=True)
def low_water(slots, out):
    """out[channel key] = the lowest log position a live slot of that channel holds (out preset to 'none').
    Channel keys are unique within a worker, so one pass serves every topic."""
    for s in range(slots.shape[0] // SLOT_WORDS):
        b = s * SLOT_WORDS
        if slots[b + S_TAG] & 3 != FREE:
            key = slots[b + S_CHANNEL]
            if 0 <= key < out.shape[0] and slots[b + S_LOG_POS] < out[key]:
                out[key] = slots[b + S_LOG_POS]


@njit(cache=True, nogil=True)
def slots_of_channel(slots, key, out):
    """Live slots of channel `key` into out; -> how many (may exceed out's length)."""
    n = 0
    for s in range(slots.shape[0] // SLOT_WORDS):
        b = s * SLOT_WORDS
        if slots[b + S_TAG] & 3 != FREE and slots[b + S_CHANNEL] == key:
            if n < out.shape[0]:
                out[n] = s
            n += 1
    return n


@njit(cache=True, nogil=True)
def slot_fields(slots, which, out_gen, out_pos, out_attempts):
    """Generation, log position and attempts of the given slots."""
    for i in range(which.shape[0]):
        b = which[i] * SLOT_WORDS
        tag = slots[b + S_TAG]
        out_gen[i] = tag >> 3
        out_pos[i] = slots[b + S_LOG_POS]
        out_attempts[i] = slots[b + S_HALF0 + ((tag >> 2) & 1) * HALF_WORDS + F_ATTEMPTS]


@njit(cache=True, nogil=True)
def waiting_positions(slots, which, out_pos):
    """Log position of each given slot that is REQUEUED or DEFERRED (waiting to be delivered again), else -1
    (a slot that changed state since it was queued: redelivering it will fail, and its position may be gone)."""
    for i in range(which.shape[0]):
        b = which[i] * SLOT_WORDS
        state = slots[b + S_TAG] & 3
        out_pos[i] = slots[b + S_LOG_POS] if state == REQUEUED or state == DEFERRED else -1


def generations(table, which):
    n = len(which)
    gen, pos, att = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    slot_fields(table.slots, which, gen, pos, att)
    return gen, pos, att
