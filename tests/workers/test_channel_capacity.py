"""Channel delivery at its capacity edges, without a broker: a real message log and a real in-flight table (both
in this process's memory), a fake worker that records the frames it is asked to write, and fake consumers.

What must hold: a full in-flight table is back-pressure (the cursor passes only what got a slot; the rest comes
once slots free up), deferred messages that find no slot wait in the log, and a round's frames stay within
MAX_ROUND_BYTES unless a single message is bigger (then it goes alone)."""
import itertools
import mmap
import time
from types import SimpleNamespace

import numpy as np
import pytest

from ipc.inflight import InFlightTable, inflight_nbytes
from ipc.msglog import MessageLog, ShmSegmentProvider, log_ctrl_nbytes
from ipc.msglog_layout import FRAME_OVERHEAD
from workers.channel import MAX_ROUND_BYTES, Channel

S = 8 << 20


class FakeSuspect:
    def careful_rounds(self, key):
        return 0

    def begin(self, *args):
        pass

    def end(self):
        pass


class FakeWorker:
    """The parts of workers.worker.Worker a channel uses; frames are recorded as (session, positions)."""

    def __init__(self, capacity):
        self.inflight = InFlightTable.create(np.zeros(inflight_nbytes(capacity), np.uint8), 0, capacity)
        self.pending = set()
        self.table_blocked = set()
        self.suspect = FakeSuspect()
        self.rounds = []
        self.opts = SimpleNamespace(max_msg_timeout=900 * 10**9)
        self._keys = 0

    def next_channel_key(self):
        self._keys += 1
        return self._keys

    def write_frames(self, s, log, positions, attempts):
        lengths = log.records_at(positions).lengths[:len(positions)]
        self.rounds.append(int(lengths.sum()) + FRAME_OVERHEAD * len(positions))
        s.received.extend(log.body(int(p)) for p in positions)

    def timer_start(self, slots, key):
        pass

    def timer_start_each(self, slots, keys):
        pass

    def timer_leave(self, slots):
        pass

    def slots_of_channel(self, key):
        return []


class FakeSession:
    def __init__(self, conn_id, rdy):
        self.conn_id = conn_id
        self.rdy = rdy
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.received = []
        self.settings = SimpleNamespace(msg_timeout_ms=60_000, sample_rate=0)

    def ready_for_more(self):
        return self.in_flight < self.rdy


@pytest.fixture
def setup(shm_prefix):
    made = []

    def make(capacity, mem_segments=4):
        worker = FakeWorker(capacity)
        ctrl = mmap.mmap(-1, log_ctrl_nbytes(S, mem_segments * S))
        log = MessageLog.create(ctrl, 0, segment_size=S, mem_bytes=mem_segments * S,
                                memory=ShmSegmentProvider(f"{shm_prefix}-{len(made)}"))
        made.append(log)
        topic = SimpleNamespace(worker=worker, log=log, index=1, paused=False, name="t")
        ch = Channel(topic, "c", log.open_channel(), worker.next_channel_key())
        return worker, log, ch

    yield make
    for log in made:
        log.destroy()


_ids = itertools.count(1000)


def publish(log, bodies, not_before=0):
    ts = time.time_ns()
    for b in bodies:
        log.append(b, ts, next(_ids), not_before)


def drain(ch, passes=1000):
    """Delivery passes until the channel says nothing more can go out now (bounded: a stuck channel fails)."""
    for _ in range(passes):
        if not ch.deliver():
            return
    raise AssertionError("delivery never settles")


def finish_all(ch, s):
    table = ch.worker.inflight
    for slot in table.iter_conn(s.conn_id).tolist():
        table.release(slot)
    s.in_flight = 0


def test_a_full_in_flight_table_holds_messages_back_and_loses_none(setup):
    worker, log, ch = setup(capacity=4)
    bodies = [b"m%d" % i for i in range(10)]
    publish(log, bodies)
    s = FakeSession(1, rdy=100)
    ch.add_consumer(s)
    ch.deliver()
    assert len(s.received) == 4 and ch in worker.table_blocked
    assert log.depth(ch.ch) == 6  # the six that found no slot are still the channel's
    while log.depth(ch.ch):
        finish_all(ch, s)
        ch.deliver()
    assert s.received == bodies  # each once, in order


def test_deferred_messages_that_find_no_slot_wait_in_the_log(setup):
    worker, log, ch = setup(capacity=4)
    publish(log, [b"d%d" % i for i in range(10)], not_before=time.time_ns() + 3600 * 10**9)
    s = FakeSession(1, rdy=100)
    ch.add_consumer(s)
    ch.deliver()
    assert s.received == [] and len(worker.inflight) == 4
    assert log.depth(ch.ch) == 6 and ch in worker.table_blocked


def test_requeued_rounds_stay_within_the_round_budget(setup):
    worker, log, ch = setup(capacity=256)
    bodies = [bytes([i]) * (100 << 10) for i in range(100)]
    publish(log, bodies)
    s = FakeSession(1, rdy=100)
    ch.add_consumer(s)
    drain(ch)
    assert len(s.received) == 100
    ch.remove_consumer(s)  # a consumer holding 100 x 100 KiB goes away: all of it is requeued at once
    worker.rounds.clear()
    s2 = FakeSession(2, rdy=100)
    ch.add_consumer(s2)
    drain(ch)
    assert sorted(s2.received) == sorted(bodies)
    assert max(worker.rounds) <= MAX_ROUND_BYTES and len(worker.rounds) >= 3


def test_a_message_bigger_than_a_round_goes_alone(setup):
    worker, log, ch = setup(capacity=16)
    big = b"x" * (MAX_ROUND_BYTES + (1 << 20))
    publish(log, [b"small", big, b"after"])
    s = FakeSession(1, rdy=10)
    ch.add_consumer(s)
    drain(ch)
    assert s.received == [b"small", big, b"after"]
    assert worker.rounds[1] == len(big) + FRAME_OVERHEAD  # alone in its round
