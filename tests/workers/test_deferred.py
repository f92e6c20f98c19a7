"""The deferred store (workers/domain/deferred.py) and a channel's deferred messages, without a broker.

What must hold: deferred messages are not bounded by the in-flight table (the store grows by chunks); entries
come due in due-time order; a due message takes a slot only when a consumer gets it, and a full table keeps the
rest due (nothing lost); a REQ with a delay frees the slot; recovery rebuilds everything from the entries' tags;
pause, empty and delete do what NSQ's do."""
import time

import numpy as np

from tests.workers.fakes import FakeSession, drain, finish_all, publish, setup  # noqa: F401 (fixture)
from nsqpy.workers.domain.deferred import CHUNK, DeferredStore, LocalChunks

HOUR = 3600 * 10**9


def add(store, n, due0, channel=7, topic=3):
    ids = np.arange(n, dtype=np.int64) + 100
    return store.add(topic, channel, ids, ids * 8, np.zeros(n, np.int64), due0 + np.arange(n, dtype=np.int64))


def test_store_grows_by_chunks_and_pops_in_due_order():
    store = DeferredStore(LocalChunks())
    assert store.capacity == 0  # an idle worker has no chunk
    n = CHUNK * 2 + 5
    rng = np.random.default_rng(1)
    dues = rng.permutation(n).astype(np.int64) + 1000
    ids = np.arange(n, dtype=np.int64)
    store.add(1, 2, ids, ids, np.zeros(n, np.int64), dues)
    assert store.capacity == CHUNK * 3 and len(store) == n and store.counts == {2: n}
    assert store.earliest() == 1000
    idx = store.due(1000 + n // 2 - 1)
    _, _, got_ids, _, _, got_dues = store.fields(idx)
    assert len(idx) == n // 2 and (np.diff(got_dues) >= 0).all()
    store.free(idx)
    assert len(store) == n - n // 2 and store.counts == {2: n - n // 2}


def test_recover_rebuilds_free_list_counts_and_heap_from_tags():
    chunks = LocalChunks()
    store = DeferredStore(chunks)
    idx = add(store, 10, 5000)
    store.free(idx[:3])
    popped = store.due(5004)  # due but not yet delivered: still waiting, must come back after a crash
    assert len(popped) == 2
    again = DeferredStore(chunks, recovering=True)
    waiting = again.recover()
    assert sorted(waiting.tolist()) == sorted(idx[3:].tolist())
    assert again.counts == {7: 7} and again.earliest() == 5003
    assert len(again.due(10**12)) == 7


def test_drop_channel_frees_only_that_channel():
    store = DeferredStore(LocalChunks())
    add(store, 100, 10, channel=1)
    add(store, 50, 10, channel=2)
    assert store.drop_channel(1) == 100
    assert store.counts == {2: 50} and len(store.due(10**12)) == 50


def test_low_water_holds_oldest_position_per_channel():
    store = DeferredStore(LocalChunks())
    add(store, 4, 10, channel=1)  # positions 800, 808, 816, 824
    lows = np.full(4, 1 << 62, np.int64)
    store.low_water(lows)
    assert lows[1] == 800 and lows[2] == 1 << 62


def test_deferred_beyond_table_capacity_all_delivered(setup):
    worker, log, ch = setup(capacity=4)
    bodies = [b"d%d" % i for i in range(50)]
    publish(log, bodies, not_before=time.time_ns() + HOUR)
    s = FakeSession(1, rdy=100)
    ch.add_consumer(s)
    drain(ch)
    assert ch.deferred_count == 50 and len(worker.inflight) == 0 and log.depth(ch.ch) == 0
    assert worker.come_due(time.time_ns() + 2 * HOUR) == 50
    assert ch.deferred_count == 0 and ch.depth() == 50
    while len(s.received) < 50:
        ch.deliver()
        assert len(worker.inflight) <= 4
        finish_all(ch, s)
    assert sorted(s.received) == sorted(bodies) and s.attempts == [1] * 50
    assert len(worker.deferred) == 0 and ch.depth() == 0


def test_req_with_delay_frees_the_slot_and_comes_back_with_attempts(setup):
    worker, log, ch = setup(capacity=4)
    publish(log, [b"a"])
    s = FakeSession(1, rdy=1)
    ch.add_consumer(s)
    drain(ch)
    slot = int(worker.inflight.iter_conn(1)[0])
    hex_id = b"%016x" % (worker.inflight.slot(slot).msg_id)
    ch.requeue(s, hex_id, 60_000)
    assert len(worker.inflight) == 0 and ch.deferred_count == 1 and s.in_flight == 0
    worker.come_due(time.time_ns() + 61 * 10**9)
    drain(ch)
    assert s.received == [b"a", b"a"] and s.attempts == [1, 2]


def test_pause_stops_delivery_and_unpause_resumes(setup):
    worker, log, ch = setup(capacity=16)
    s = FakeSession(1, rdy=10)
    ch.add_consumer(s)
    ch.pause(True)
    publish(log, [b"x", b"y"])
    drain(ch)
    assert s.received == [] and ("channel_paused", ch.key, True) in worker.directory.changes
    ch.pause(False)
    assert ch in worker.pending
    drain(ch)
    assert s.received == [b"x", b"y"]


def test_empty_clears_queue_in_flight_and_deferred_but_keeps_consumers(setup):
    worker, log, ch = setup(capacity=16)
    publish(log, [b"now%d" % i for i in range(5)])
    publish(log, [b"later"], not_before=time.time_ns() + HOUR)
    publish(log, [b"queued%d" % i for i in range(5)])
    s = FakeSession(1, rdy=3)
    ch.add_consumer(s)
    drain(ch)
    assert len(s.received) == 3 and s.in_flight == 3
    ch.empty()
    assert ch.depth() == 0 and ch.deferred_count == 0 and len(worker.inflight) == 0 and s.in_flight == 0
    assert ch.consumers == [s] and not s.closed
    publish(log, [b"fresh"])
    drain(ch)
    assert s.received[3:] == [b"fresh"]


def test_set_log_pos_moves_entries_and_their_low_water():
    store = DeferredStore(LocalChunks())
    idx = add(store, 3, 10, channel=1)  # positions 800, 808, 816
    store.set_log_pos(idx[:2], np.array([5000, 5008], np.int64))
    lows = np.full(2, 1 << 62, np.int64)
    store.low_water(lows)
    assert lows[1] == 816
    assert store.fields(idx)[3].tolist() == [5000, 5008, 816]
