"""nsqpy.ipc.ring in one process: against a pure-Python model (hypothesis state machine), plus edge cases.

The model keeps the byte positions the way the module docstring describes them (records rounded to 8 bytes,
padding when a record would straddle the end, at most capacity/2 per record), so "full" is predicted to the
byte, including exactly-full rings and wrap-around, and the records are compared with a deque.
"""
import collections
import mmap

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nsqpy.ipc.layout import LayoutError
from nsqpy.ipc.ring import Ring, RingError

CAPACITY = 256


def rounded(length):
    return (8 + length + 7) // 8 * 8


class RingModel:
    def __init__(self, capacity):
        self.cap = capacity
        self.claim = self.tail = self.head = self.read = 0
        self.unread = collections.deque()  # committed, not read: (type, payload, end position)
        self.unreleased = []  # read, not released
        self.pending = []  # claimed, not committed
        self.count = 0

    def fits(self, length):
        idx = self.claim % self.cap
        size = rounded(length)
        pad = self.cap - idx if idx + size > self.cap else 0
        return self.claim + pad + size - self.head <= self.cap, pad + size

    def claim_record(self, rtype, payload):
        ok, used = self.fits(len(payload))
        if ok:
            self.claim += used
            self.pending.append((rtype, payload, self.claim))
        return ok

    def commit(self):
        self.unread.extend(self.pending)
        self.count += len(self.pending)
        self.pending = []
        self.tail = self.claim

    def take(self, max_count):
        got = []
        while self.unread and len(got) < max_count:
            got.append(self.unread.popleft())
        self.unreleased.extend(got)
        if got:
            self.read = got[-1][2]
        return [(t, p) for t, p, _ in got]


payloads = st.binary(min_size=0, max_size=CAPACITY // 2 - 8)
types = st.integers(0, 2**31 - 1)


class RingMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.buf = mmap.mmap(-1, Ring.size_for(CAPACITY))
        self.ring = Ring.create(self.buf, 0, CAPACITY, max_batch=16)
        self.model = RingModel(CAPACITY)

    @precondition(lambda self: not self.model.pending)
    @rule(payload=payloads, rtype=types)
    def write(self, payload, rtype):
        expected = self.model.claim_record(rtype, payload)
        self.model.commit()
        assert self.ring.write(payload, rtype) == expected

    @precondition(lambda self: not self.model.pending)
    @rule(records=st.lists(st.tuples(payloads, types), max_size=6))
    def write_batch(self, records):
        src = np.frombuffer(b"".join(p for p, _ in records) + b"\0", np.uint8)
        lengths = np.array([len(p) for p, _ in records], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if records else lengths
        rtypes = np.array([t for _, t in records], np.int64)
        expected = 0
        for payload, rtype in records:
            if not self.model.claim_record(rtype, payload):
                break
            expected += 1
        self.model.commit()
        assert self.ring.write_batch(src, offsets, lengths, rtypes) == expected

    @rule(payload=payloads, rtype=types)
    def claim(self, payload, rtype):
        view = self.ring.claim(len(payload), rtype)
        assert (view is not None) == self.model.claim_record(rtype, payload)
        if view is not None:
            view[:] = np.frombuffer(payload, np.uint8)

    @rule()
    def commit(self):
        self.ring.commit()
        self.model.commit()

    @rule(max_count=st.integers(1, 16))  # max_batch
    def read(self, max_count):
        assert self.ring.read(max_count) == self.model.take(max_count)

    @rule()
    def release(self):
        self.ring.release()
        self.model.head = self.model.read
        self.model.unreleased = []

    @rule()
    def producer_restarts(self):
        """A killed producer's replacement: uncommitted claims vanish, the count is what was committed."""
        self.ring = Ring.attach(self.buf, 0, CAPACITY, role=Ring.PRODUCER, max_batch=16)
        self.model.pending = []
        self.model.claim = self.model.tail
        assert self.ring.committed_count == self.model.count

    @rule()
    def consumer_restarts(self):
        """A killed consumer's replacement reads the unreleased records again."""
        self.ring = Ring.attach(self.buf, 0, CAPACITY, role=Ring.CONSUMER, max_batch=16)
        self.model.unread.extendleft(reversed(self.model.unreleased))
        self.model.unreleased = []
        self.model.read = self.model.head

    @invariant()
    def cursors_agree(self):
        model = self.model
        assert self.ring.readable() == model.tail - model.read
        assert self.ring.free() == CAPACITY - (model.claim - model.head)
        assert self.ring.is_empty() == (model.tail == model.head)


TestRingAgainstModel = RingMachine.TestCase
TestRingAgainstModel.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


@pytest.fixture
def ring():
    return Ring.create(mmap.mmap(-1, Ring.size_for(CAPACITY)), 0, CAPACITY)


def test_exactly_full_then_wrap_with_padding(ring):
    assert ring.write(b"a" * 120) and ring.write(b"b" * 112)  # 128 + 120 bytes
    assert ring.free() == 8 and ring.write(b"") and ring.free() == 0  # an empty record fills the last 8
    assert not ring.write(b"")
    assert [len(p) for _, p in ring.read(1)] == [120]
    ring.release()
    assert ring.write(b"c" * 100)  # 8 bytes of padding are free but too few: wraps to index 0
    assert [p[:1] for _, p in ring.read()] == [b"b", b"", b"c"]
    ring.release()
    assert ring.is_empty() and ring.readable() == 0


def test_max_bytes_limits_a_batch_but_never_to_nothing(ring):
    for k in range(4):
        assert ring.write(bytes([k]) * 40)
    offs, lens, _ = ring.read_batch(max_bytes=10)
    assert lens.tolist() == [40]
    offs, lens, _ = ring.read_batch(max_bytes=80)
    assert lens.tolist() == [40, 40]


def test_argument_and_layout_errors():
    buf = mmap.mmap(-1, Ring.size_for(CAPACITY))
    with pytest.raises(RingError, match="power of two"):
        Ring.create(buf, 0, 200)
    with pytest.raises(LayoutError, match="not initialised"):
        Ring.attach(buf, 0)
    with pytest.raises(LayoutError, match="needs bytes"):
        Ring.create(buf, 0, 2 * CAPACITY)
    ring = Ring.create(buf, 0, CAPACITY)
    with pytest.raises(LayoutError, match="expected 896"):
        Ring.attach(buf, 0, CAPACITY * 2)
    with pytest.raises(RingError, match="payload must be"):
        ring.write(b"x" * (CAPACITY // 2))
    with pytest.raises(RingError, match="type"):
        ring.write(b"x", rtype=-1)
    with pytest.raises(RingError, match="outside"):
        ring.release(10**6)
    lengths = np.array([CAPACITY], np.int64)
    with pytest.raises(RingError, match="payload must be"):
        ring.write_batch(np.zeros(CAPACITY, np.uint8), np.zeros(1, np.int64), lengths, np.zeros(1, np.int64))


def test_corrupt_header_is_reported_not_followed(ring):
    ring.write(b"abc")
    ring.data.view(np.int64)[0] = 10_000  # length beyond what was committed
    with pytest.raises(RingError, match="corrupt"):
        ring.read_batch()
