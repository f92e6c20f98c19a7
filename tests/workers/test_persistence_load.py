"""Loading a channel's on-disk queue into its log (CleanStop._append_private) with a real message log and
deferred store, and no broker: a batch mixing due and deferred messages goes in run by run, and when the store
cannot grow, the load stops after the runs that went in, so that none is loaded twice at the next start."""
import errno
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tests.workers.fakes import setup  # noqa: F401 (fixture)
from nsqpy.workers.domain.deferred import DeferredStore, LocalChunks
from nsqpy.workers.storage.clean_stop import CleanStop, LoadStopped


class NoMemoryChunks(LocalChunks):
    def create(self, k):
        raise OSError(errno.ENOMEM, "no shared memory left")


def loader(store):
    calls = []
    return SimpleNamespace(deferred=store, deadlines=SimpleNamespace(deferred_changed=lambda: calls.append(1)),
                           calls=calls)


def batch(dues):
    """Bodies b'm0', b'm1', ... one per due time (0: due now), as the load's arrays."""
    bodies = [f"m{i}".encode() for i in range(len(dues))]
    buf = np.frombuffer(b"".join(bodies), np.uint8)
    ln = np.array([len(b) for b in bodies], np.int64)
    off = np.concatenate(([0], np.cumsum(ln)[:-1])).astype(np.int64)
    n = len(dues)
    ts = np.full(n, time.time_ns(), np.int64)
    ids = np.arange(1, n + 1, dtype=np.int64)
    return buf, off, ln, ts, np.ones(n, np.int64), ids, np.array(dues, np.int64)


def load(setup, store, dues):  # noqa: F811 (the fixture)
    worker, log, ch = setup(capacity=16)
    me = loader(store)
    topic = SimpleNamespace(log=log, index=1)
    try:
        CleanStop._append_private(me, topic, ch, *batch(dues))
        stopped = None
    except LoadStopped as e:
        stopped = e
    return log, ch, me, stopped


def test_due_and_deferred_runs_all_go_in(setup):  # noqa: F811
    later = time.time_ns() + 60 * 10**9
    store = DeferredStore(LocalChunks())
    log, ch, me, stopped = load(setup, store, [0, later, later, 0])
    assert stopped is None
    assert log.depth(ch.ch) == 2           # the due ones; the deferred ones are parked, the cursor passes them
    assert len(store) == 2 and store.counts == {ch.key: 2}
    assert me.calls == [1]


def test_a_store_that_cannot_grow_stops_the_load_after_the_runs_that_went_in(setup):  # noqa: F811
    later = time.time_ns() + 60 * 10**9
    store = DeferredStore(NoMemoryChunks())
    log, ch, me, stopped = load(setup, store, [0, 0, later, 0])
    assert stopped is not None and stopped.appended == 2  # m0, m1; m2 (deferred) found no room; m3 not tried
    assert isinstance(stopped.cause, OSError)
    assert log.depth(ch.ch) == 2 and len(store) == 0
    just_two, _, _, _ = load(setup, DeferredStore(LocalChunks()), [0, 0])
    assert log.head == just_two.head  # m2 was not parked in the log either


def test_a_first_run_that_cannot_go_in_appends_nothing(setup):  # noqa: F811
    later = time.time_ns() + 60 * 10**9
    store = DeferredStore(NoMemoryChunks())
    log, ch, me, stopped = load(setup, store, [later, 0])
    assert stopped is not None and stopped.appended == 0
    assert log.head == 0 and log.depth(ch.ch) == 0 and len(store) == 0


def test_reserve_makes_the_next_add_unable_to_fail():
    class OneChunk(LocalChunks):
        def create(self, k):
            if k:
                raise OSError(errno.ENOMEM, "no shared memory left")
            return super().create(k)

    store = DeferredStore(OneChunk())
    store.reserve(10)
    store.add(1, 7, np.arange(10), np.arange(10), np.ones(10, np.int64), np.full(10, 5, np.int64))
    assert store.counts == {7: 10}
    with pytest.raises(OSError):
        store.reserve(store.capacity)  # more than one chunk can hold: it would have to grow
