"""nsqpy.ipc.wake: no lost wake-up across processes, no syscall on a busy path, one syscall per sleep."""
import mmap
import random

import pytest

from _fork import run_all
from nsqpy.ipc.ring import Ring
from nsqpy.ipc.wake import Wakeups, make_eventfd

ROUNDS = 100_000
LOST = 5.0  # seconds without a wake-up that can only mean a lost one


@pytest.fixture
def eventfds():
    fds = [make_eventfd(), make_eventfd()]
    yield fds
    for fd in fds:
        __import__("os").close(fd)


def _ping_pong(buf, fds, me, rounds, seed):
    """Send round r to the peer, wait (sleeping) for its round r; the first side starts. Any sleep that ends in
    a timeout is a lost wake-up: the peer's commit happened and its notify did not reach us."""
    rng = random.Random(seed)
    peer = 1 - me
    wake = Wakeups.attach(buf, 0, fds)
    base = Wakeups.size_for(2)
    rings = [Ring.attach(buf, base + k * Ring.size_for(4096), 4096) for k in (0, 1)]
    out, inbox = rings[peer], rings[me]  # ring k is read by process k
    for r in range(rounds):
        if me == 0:
            _send(out, wake, peer, r, rng)
        _receive(inbox, wake, me, r)
        if me == 1:
            _send(out, wake, peer, r, rng)


def _send(ring, wake, peer, r, rng):
    for _ in range(rng.randrange(64)):  # vary where the commit lands in the peer's arm/re-check/poll window
        pass
    assert ring.write(r.to_bytes(8, "little"))
    wake.notify(peer)


def _receive(ring, wake, me, r):
    while True:
        got = ring.read(1)
        if got:
            ring.release()
            assert got == [(0, r.to_bytes(8, "little"))], (got, r)
            return
        assert wake.sleep(me, lambda: ring.readable() > 0, LOST), f"lost wake-up in round {r} (reader {me})"


def _shared(fds):
    buf = mmap.mmap(-1, Wakeups.size_for(2) + 2 * Ring.size_for(4096))
    wake = Wakeups.create(buf, 0, fds)
    rings = [Ring.create(buf, Wakeups.size_for(2) + k * Ring.size_for(4096), 4096) for k in (0, 1)]
    return buf, wake, rings


def test_no_wake_up_is_lost_between_processes(eventfds):
    _, wake, rings = _shared(eventfds)  # compile every kernel in the parent, before forking
    _send(rings[0], wake, 0, 0, random.Random(0))
    assert not wake.prepare_sleep(0, lambda: rings[0].readable() > 0)
    _receive(rings[0], wake, 0, 0)
    buf, _, _ = _shared(eventfds)
    run_all([(_ping_pong, buf, eventfds, 0, ROUNDS, 1), (_ping_pong, buf, eventfds, 1, ROUNDS, 2)], timeout=50)
    wake = Wakeups.attach(buf, 0, eventfds)
    assert 0 < wake.signals(0) <= ROUNDS + 1 and 0 < wake.signals(1) <= ROUNDS + 1


def test_a_busy_reader_costs_writers_no_syscall(eventfds):
    wake = Wakeups.create(mmap.mmap(-1, Wakeups.size_for(2)), 0, eventfds)
    assert not any(wake.notify(0) for _ in range(100_000))
    assert wake.signals(0) == 0


def test_one_syscall_per_sleep_however_many_writers_commit(eventfds):
    wake = Wakeups.create(mmap.mmap(-1, Wakeups.size_for(2)), 0, eventfds)
    assert wake.prepare_sleep(1, lambda: False)
    assert [wake.notify(1) for _ in range(10)] == [True] + [False] * 9
    assert wake.signals(1) == 1 and wake.signals(0) == 0
    assert wake.sleep(1, lambda: False, LOST)  # returns at once: the eventfd holds the signal


def test_work_found_on_the_re_check_cancels_the_sleep(eventfds):
    wake = Wakeups.create(mmap.mmap(-1, Wakeups.size_for(2)), 0, eventfds)
    assert not wake.prepare_sleep(0, lambda: True)
    assert not wake.notify(0)  # the flag was cleared: no signal
    assert not wake.sleep(0, lambda: False, 0.01)  # nothing pending: a plain timeout
