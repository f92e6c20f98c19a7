"""Small fakes for unit tests of the domain objects (Channel, Topic) without a broker: a real message log and a
real in-flight table and deferred store (all in this process's memory), and a fake worker that provides exactly
the narrow services a channel uses (workers/domain/channel.py lists them) and records the frames it is asked to write."""
import itertools
import mmap
import time
from types import SimpleNamespace

import numpy as np
import pytest

from nsqpy.ipc.inflight import InFlightTable, inflight_nbytes
from nsqpy.ipc.msglog import MessageLog, ShmSegmentProvider, log_ctrl_nbytes
from nsqpy.ipc.msglog_layout import FRAME_OVERHEAD
from nsqpy.workers.domain.channel import Channel
from nsqpy.workers.domain.deferred import DeferredStore, LocalChunks

S = 8 << 20


class FakeSuspect:
    def __init__(self):
        self.w = np.zeros(16, np.int64)  # a compiled round writes its suspect words here
        self.base = 0

    def careful_rounds(self, key):
        return 0

    def careful_done(self):
        pass

    def begin(self, *args):
        pass

    def end(self):
        pass


class FakeDirectory:
    def __init__(self):
        self.changes = []

    def __getattr__(self, name):
        return lambda *args: self.changes.append((name, *args))


class FakeWorker:
    """The parts of nsqpy.workers.processes.worker.Worker a channel uses; frames are recorded as (session, positions)."""

    def __init__(self, capacity, compiled=True):
        self.round_buffer = np.empty(8 << 20, np.uint8) if compiled else None  # as the worker's FRAME_SCRATCH
        self.inflight = InFlightTable.create(np.zeros(inflight_nbytes(capacity), np.uint8), 0, capacity)
        self.deferred = DeferredStore(LocalChunks())
        self.directory = FakeDirectory()
        self.pending = set()
        self.table_blocked = set()
        self.touched = set()
        self.retries = []
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
        s.attempts.extend(int(a) for a in attempts)

    @staticmethod
    def direct_fd(s):
        return -1  # no socket: every round's frames come to send_frames

    def send_frames(self, s, out, end, sent=0):
        """A compiled round's frames, read back as the client would."""
        self.rounds.append(end)
        data, at = bytes(out[:end]), 0
        while at < end:
            size = int.from_bytes(data[at:at + 4], "big")
            s.attempts.append(int.from_bytes(data[at + 16:at + 18], "big"))
            s.received.append(data[at + FRAME_OVERHEAD:at + 4 + size])
            at += 4 + size

    def timer_start(self, slots, key):
        pass

    def timer_start_each(self, slots, keys):
        pass

    def timer_leave(self, slots):
        pass

    def timer_leave_one(self, slot):
        pass

    def channel_changed(self, ch):
        self.touched.add(ch.topic)

    def slots_of_channel(self, key):
        table = self.inflight
        return [s for s in range(table.capacity) if table.slot(s).state and table.slot(s).channel == key]

    def deferred_changed(self):
        pass

    def retry_later(self, ch):
        self.retries.append(ch)

    def storage_failed(self, what, exc):
        pass

    def _record(self, change, *args):
        change(*args)

    def come_due(self, now=None):
        """What Worker._on_deferred_due does: due entries join their channel's due queue."""
        idx = self.deferred.due(time.time_ns() if now is None else now)
        _, channels, _, _, _, _ = self.deferred.fields(idx)
        for i, key in zip(idx.tolist(), channels.tolist()):
            self.channels[key].came_due(i)
        return len(idx)


class FakeTopic:
    def __init__(self, worker, log):
        self.worker, self.log, self.index, self.paused, self.name = worker, log, 1, False, "t"


class FakeSession:
    def __init__(self, conn_id, rdy):
        self.conn_id = conn_id
        self.rdy = rdy
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.received = []
        self.attempts = []
        self.closed = False
        self.channel = None
        self.settings = SimpleNamespace(msg_timeout_ms=60_000, sample_rate=0)

    def ready_for_more(self):
        return self.in_flight < self.rdy

    def close(self):
        self.closed = True


@pytest.fixture(params=[True, False], ids=["compiled-rounds", "general-rounds"])
def setup(shm_prefix, request):
    """make(capacity) -> (worker, log, channel); each test runs with the worker's compiled delivery rounds
    (kernels.deliver_round) and without (the general path alone)."""
    made = []

    def make(capacity, mem_segments=4):
        worker = FakeWorker(capacity, compiled=request.param)
        ctrl = mmap.mmap(-1, log_ctrl_nbytes(S, mem_segments * S))
        log = MessageLog.create(ctrl, 0, segment_size=S, mem_bytes=mem_segments * S,
                                memory=ShmSegmentProvider(f"{shm_prefix}-{len(made)}"))
        made.append(log)
        topic = FakeTopic(worker, log)
        ch = Channel(topic, "c", log.open_channel(), worker.next_channel_key())
        worker.channels = {ch.key: ch}
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
