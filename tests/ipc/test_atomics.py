"""nsqpy.ipc.atomics: each operation's result in one process, then the orderings across processes on shared memory.

Kernels are compiled in the parent before any fork, so children only run machine code. Shared memory is an
anonymous shared mmap (inherited by fork); the cross-process tests check exact totals, which a lost update
(non-atomic increment, broken CAS) or a missing fence would make wrong.
"""
import ctypes
import mmap

import numpy as np
import pytest
from numba import njit

from _fork import run_all
from nsqpy.ipc.atomics import (cas, copy_bytes, cpu_pause, fence, fetch_add, load_acquire, py_cas, py_fetch_add,
                         py_load_acquire, py_store_release, store_release)

SPIN_LIMIT = 1 << 26  # iterations before a spin gives up: only reached if a load was hoisted out of the loop
# With 2 cores and other work on the machine, the process a spin waits for may not be running: give the CPU
# back every 256 spins so lock-step rounds cost a context switch at worst, not a time slice.
_sched_yield = ctypes.CDLL(None).sched_yield
_sched_yield.restype = ctypes.c_int
_sched_yield.argtypes = ()


def shared_words(n):
    return np.frombuffer(mmap.mmap(-1, n * 8), dtype=np.int64)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32])
def test_single_process_results(dtype):
    a = np.zeros(4, dtype)
    py_store_release(a, 1, 5)
    assert py_load_acquire(a, 1) == 5
    assert py_cas(a, 1, 4, 9) == 5 and a[1] == 5  # failed: old value returned, nothing written
    assert py_cas(a, 1, 5, 9) == 5 and a[1] == 9  # succeeded
    assert py_fetch_add(a, 2, 3) == 0 and py_fetch_add(a, 2, 3) == 3 and a[2] == 6
    assert a[0] == 0 and a[3] == 0  # neighbours untouched


def test_uint64_wraps_and_int64_extremes():
    u = np.array([2**64 - 1], np.uint64)
    assert py_fetch_add(u, 0, 1) == 2**64 - 1 and u[0] == 0
    s = np.array([-(2**63)], np.int64)
    assert py_cas(s, 0, -(2**63), 2**63 - 1) == -(2**63) and s[0] == 2**63 - 1


@njit(nogil=True)
def _copy_and_fence(dst, src, n):
    copy_bytes(dst, 3, src, 1, n)
    fence()
    cpu_pause()


def test_copy_bytes_copies_exactly_the_range():
    src = np.arange(100, dtype=np.uint8)
    dst = np.zeros(100, np.uint8)
    _copy_and_fence(dst, src, 50)
    assert dst[:3].tolist() == [0, 0, 0] and dst[3:53].tolist() == list(range(1, 51)) and not dst[53:].any()


@njit(nogil=True)
def _add_many(words, n):
    for _ in range(n):
        fetch_add(words, 0, 1)


@njit(nogil=True)
def _lock_and_increment(words, n):
    """words[0]: lock (0 free, 1 held) taken by CAS; words[1]: a counter updated with PLAIN load and store."""
    for _ in range(n):
        while cas(words, 0, 0, 1) != 0:
            cpu_pause()
        words[1] = words[1] + 1
        store_release(words, 0, 0)


def test_fetch_add_from_two_processes_gives_the_exact_total():
    words, n = shared_words(16), 2_000_000
    _add_many(words, 1)
    words[0] = 0
    run_all([(_add_many, words, n), (_add_many, words, n)], timeout=30)
    assert words[0] == 2 * n


def test_cas_lock_from_two_processes_protects_a_plain_counter():
    words, n = shared_words(16), 300_000
    _lock_and_increment(words, 1)
    words[1] = 0
    run_all([(_lock_and_increment, words, n), (_lock_and_increment, words, n)], timeout=30)
    assert words[0] == 0 and words[1] == 2 * n


@njit(nogil=True)
def _spin_until(words, i, value):
    """Spin until words[i] >= value; False if SPIN_LIMIT iterations pass first."""
    spins = 0
    while load_acquire(words, i) < value:
        cpu_pause()
        spins += 1
        if spins & 255 == 0:
            _sched_yield()
        if spins == SPIN_LIMIT:
            return False
    return True


@njit(nogil=True)
def _store_buffer_rounds(words, mine, theirs, seen, rounds, me):
    """Dekker's pattern: x = 1; fence; read y. With the fence at least one side must see the other's store.

    words[0] is a barrier counter (both sides wait for it to reach at least 2*(round+1)); ``mine``/``theirs`` hold one
    flag per round so nothing is reset between rounds; seen[round] records what this side read."""
    for r in range(rounds):
        mine[r] = 1
        fence()
        seen[r] = load_acquire(theirs, r)
        fetch_add(words, 0, 1)
        if not _spin_until(words, 0, 2 * (r + 1)):
            return


def test_fence_orders_store_before_load_across_processes():
    rounds = 5_000
    words = shared_words(16)
    x, y, seen_a, seen_b = (shared_words(rounds) for _ in range(4))
    _store_buffer_rounds(shared_words(16), shared_words(1), shared_words(1), shared_words(1), 1, 0)
    run_all([(_store_buffer_rounds, words, x, y, seen_a, rounds, 0),
             (_store_buffer_rounds, words, y, x, seen_b, rounds, 1)], timeout=30)
    assert words[0] == 2 * rounds
    both_missed = np.flatnonzero((seen_a == 0) & (seen_b == 0))
    assert both_missed.size == 0, f"rounds where neither side saw the other's store: {both_missed[:10]}"


def test_acquire_load_in_a_spin_sees_another_process_store():
    words = shared_words(16)
    _spin_until(words, 1, 0)

    def waiter():
        words[2] = 1  # plain store: the parent only polls it under its own deadline
        assert _spin_until(words, 0, 7), "spin never saw the store: the load was hoisted out of the loop"

    def setter():
        assert _spin_until(words, 2, 1)
        py_store_release(words, 0, 7)

    run_all([(waiter,), (setter,)], timeout=30)
