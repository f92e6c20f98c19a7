"""The scanner (workers/processes/scanner.py), without a broker: its in-flight timer heaps and the rings to and from
the workers are the real ones (``TimerHeap``, a real ``LinkSet`` in an anonymous mapping), the process around it
is not run; a test plays the workers' side of the rings and calls the scanner's two steps (drain the inboxes,
``sweep``) as its loop does.

What must hold: due entries come back as EXPIRED in due order (ties by handle) with their latest generation, and
only due ones; a START of a handle already in the heap moves it, REMOVE takes it out; a full ring back to a worker
is back-pressure (the entries stay due and go out once the worker drained it, none lost or doubled); a START the
heap cannot grow for stays in the ring and is applied once it can; a worker's RESET empties its heap only; a
restarted scanner starts with empty heaps, bumps the epoch (the workers post their timers again) and reads what
was left in its rings.

(The deferred messages' due-time heap is the worker's own, ``workers/domain/deferred.py``:
tests/workers/test_deferred.py.)"""
import mmap
import os
from types import SimpleNamespace

import numpy as np
import pytest

from nsqpy.ipc.heap import TimerHeap, heap_nbytes
from nsqpy.workers.processes.scanner import EXPIRED, REMOVE, RESET, SHIFT_BATCH, START, Scanner
from nsqpy.workers.publishing.links import LinkSet, nbytes

WORKERS = 2
T0 = 10**18  # a time far from now: the tests pass "now" to sweep themselves


class Epoch:
    def __init__(self):
        self.value = 0

    def bump_scanner_epoch(self):
        self.value += 1


class Rig:
    """A plan with WORKERS workers' rings and heaps, a scanner over it, and the workers' ends of the rings."""

    def __init__(self, capacity=1024, n_handles=1024, reserve=None, initial=None):
        self.mem = mmap.mmap(-1, nbytes(WORKERS, WORKERS, 1 << 16))
        self.links = LinkSet.create(SimpleNamespace(buf=self.mem), WORKERS, WORKERS, capacity=1 << 16)
        self.heap_mem = [np.zeros(heap_nbytes(capacity, n_handles), np.uint8) for _ in range(WORKERS)]
        self.heaps = [TimerHeap.create(m, 0, capacity, n_handles, reserve=reserve, initial=initial)
                      for m in self.heap_mem]
        self.plan = SimpleNamespace(link_set=self.links, heaps=self.heaps, workers=WORKERS, control=Epoch())
        self.log = SimpleNamespace(lines=[])
        self.log.error = self.log.lines.append
        self.scanner = Scanner(self.plan, False, self.log)
        self.to_scanner = [self.links.to_scanner(w) for w in range(WORKERS)]
        self.from_scanner = [self.links.from_scanner(w) for w in range(WORKERS)]

    def start(self, w, rows):
        """Worker w posts START for (handle, generation, key) rows."""
        assert self.to_scanner[w].send(START, np.array(rows, np.int64).reshape(-1, 3).tobytes())

    def remove(self, w, handles):
        assert self.to_scanner[w].send(REMOVE, np.array(handles, np.int64).tobytes())

    def reset(self, w):
        assert self.to_scanner[w].send(RESET, b"")

    def drain(self, scanner=None):
        """The scanner's loop, its first step: every inbox drained. -> records handled."""
        sc = scanner or self.scanner
        return sum(inbox.drain(lambda rtype, payload, w=w: sc.on_record(w, rtype, payload))
                   for w, inbox in enumerate(sc.inboxes))

    def expired(self, w):
        """What worker w reads back: [(handle, generation)] in order, over every EXPIRED record waiting."""
        got = []

        def take(rtype, payload):
            assert rtype == EXPIRED
            got.extend(tuple(r) for r in np.frombuffer(payload, np.int64).reshape(-1, 2).tolist())
        while self.from_scanner[w].drain(take):
            pass
        return got

    def close(self):
        for fd in self.links.eventfds:
            os.close(fd)


@pytest.fixture
def rig():
    made = []

    def make(**kw):
        r = Rig(**kw)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


def test_due_entries_come_back_in_due_order_with_their_generation_and_only_those(rig):
    r = rig()
    r.start(0, [(5, 50, T0 + 30), (3, 30, T0 + 10), (7, 70, T0 + 10), (1, 10, T0 + 99)])
    r.start(1, [(2, 20, T0 + 5)])
    assert r.drain() == 2
    earliest = r.scanner.sweep(T0 + 30)
    assert r.expired(0) == [(3, 30), (7, 70), (5, 50)]  # by key, equal keys by handle
    assert r.expired(1) == [(2, 20)]
    assert earliest == T0 + 99 and len(r.heaps[0]) == 1 and len(r.heaps[1]) == 0
    assert r.scanner.sweep(T0 + 98) == T0 + 99 and r.expired(0) == []  # nothing due: nothing posted
    assert r.scanner.sweep(T0 + 99) is None and r.expired(0) == [(1, 10)]


def test_a_start_of_a_handle_in_the_heap_moves_it_and_remove_takes_it_out(rig):
    r = rig()
    r.start(0, [(4, 1, T0 + 10), (6, 1, T0 + 10)])
    r.start(0, [(4, 2, T0 + 50)])  # the batch was touched (or reused): its new deadline and generation
    r.remove(0, [6])
    r.remove(0, [9])  # not in the heap: nothing happens
    r.drain()
    assert r.scanner.sweep(T0 + 10) == T0 + 50 and r.expired(0) == []
    r.scanner.sweep(T0 + 50)
    assert r.expired(0) == [(4, 2)]


def test_a_handle_past_the_heap_is_refused_not_applied(rig):
    r = rig(n_handles=16)
    r.start(0, [(16, 1, T0), (-1, 1, T0), (15, 1, T0)])
    r.drain()
    assert len(r.heaps[0]) == 1
    r.scanner.sweep(T0)
    assert r.expired(0) == [(15, 1)]


def test_more_due_than_one_shift_go_out_in_several_records_each_once(rig):
    n = 3 * SHIFT_BATCH + 5
    r = rig(capacity=n, n_handles=n)
    keys = np.random.default_rng(1).integers(0, 1000, n)
    rows = [(h, h + 1, T0 + int(k)) for h, k in enumerate(keys)]
    for part in range(0, n, 1000):
        r.start(1, rows[part:part + 1000])
    r.drain()
    assert r.scanner.sweep(T0 + 1000) is None
    got = r.expired(1)
    assert sorted(got) == [(h, h + 1) for h in range(n)]
    order = [(int(keys[h]), h) for h, _ in got]
    assert order == sorted(order)


def test_a_full_ring_to_a_worker_is_back_pressure_and_loses_nothing(rig):
    r = rig()
    out = r.scanner.outboxes[0]
    filler = 0
    while out.has_room(16 * SHIFT_BATCH + 64):  # the worker stopped reading: its ring fills up
        assert out.send(99, b"\0" * 65536)
        filler += 1
    r.start(0, [(1, 1, T0), (2, 1, T0 + 1)])
    r.drain()
    assert r.scanner.sweep(T0 + 5) == T0  # nothing sent, both still due
    assert len(r.heaps[0]) == 2
    seen = []

    def worker_reads(rtype, payload):  # the worker catches up
        if rtype == EXPIRED:
            seen.extend(tuple(x) for x in np.frombuffer(payload, np.int64).reshape(-1, 2).tolist())
    while r.from_scanner[0].drain(worker_reads):
        pass
    assert seen == []
    assert r.scanner.sweep(T0 + 5) is None
    assert r.expired(0) == [(1, 1), (2, 1)] and filler > 0


def test_a_start_the_heap_cannot_grow_for_waits_in_the_ring(rig):
    """The heap's pages are reserved as handles grow; when /dev/shm cannot back them the START stays in the
    ring (logged once a second), and later records of that worker wait behind it, in order."""
    failing = [False]

    def reserve(offset, n):
        if failing[0]:
            raise OSError(28, "No space left on device")
    r = rig(capacity=4096, n_handles=4096, reserve=reserve, initial=8)
    failing[0] = True  # /dev/shm is full from here on
    r.start(0, [(1000, 1, T0)])
    r.remove(0, [1000])
    assert r.drain() == 0 and len(r.heaps[0]) == 0
    assert len(r.log.lines) == 1 and "cannot grow" in r.log.lines[0]
    assert r.drain() == 0 and len(r.log.lines) == 1  # once a second, not once a pass
    failing[0] = False
    assert r.drain() == 2 and len(r.heaps[0]) == 0  # applied in order: the START, then its REMOVE
    r.start(0, [(2000, 3, T0)])
    r.drain()
    r.scanner.sweep(T0)
    assert r.expired(0) == [(2000, 3)]


def test_a_workers_reset_empties_its_heap_only(rig):
    """A restarted worker says RESET and posts START again for what it still holds."""
    r = rig()
    r.start(0, [(1, 1, T0), (2, 1, T0)])
    r.start(1, [(1, 1, T0)])
    r.drain()
    r.reset(0)
    r.start(0, [(2, 5, T0 + 1)])  # the replacement's timers, after its RESET
    r.drain()
    r.scanner.sweep(T0 + 1)
    assert r.expired(0) == [(2, 5)] and r.expired(1) == [(1, 1)]


def test_a_restarted_scanner_starts_empty_bumps_the_epoch_and_reads_what_was_left(rig):
    r = rig()
    r.start(0, [(1, 1, T0)])
    r.drain()
    r.start(0, [(2, 1, T0)])  # posted, never read by the scanner that died
    assert r.plan.control.value == 1
    again = Scanner(r.plan, True, r.log)  # the supervisor forks a replacement
    assert r.plan.control.value == 2 and len(r.heaps[0]) == 0  # the workers see the epoch and post again
    r.start(0, [(1, 2, T0)])
    assert r.drain(again) == 2
    again.sweep(T0)
    assert r.expired(0) == [(1, 2), (2, 1)]
