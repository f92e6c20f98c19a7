"""nsqpy.ipc.ring across processes: a 2 producers x 2 consumers stress run, and a run with 60 SIGKILLs.

Every record is sequence-numbered (its type is its sequence number in its ring) and its length and bytes are a
function of that number, so a consumer re-computes and compares every byte (a stronger check than a checksum).
Lengths are 1 B to 64 KiB, mostly under 200 B. Producers alternate between claiming records in place and
writing staged batches. Each consumer keeps, per ring, in shared memory, EXPECT (the next sequence number it
has not seen) and DUPS; within one consumer incarnation sequence numbers must be consecutive.

All kernels are compiled in the parent before any fork. Processes that find nothing to do call sched_yield:
with 4 busy processes on 2 cores, spinning would starve the peer they wait for.
"""
import os
import random
import signal
import time

import numpy as np
from numba import njit

from _fork import fork, wait
from nsqpy.ipc.ring import Ring, ring_claim, ring_commit, ring_read_batch, ring_release_read, ring_write_batch
from nsqpy.ipc.shm import Segment

CAPACITY = 1 << 20
BATCH = 256
STAGE = 1 << 18
# per-ring state words (one LINE each, written by the consumer only, except TARGET written by the test)
EXPECT, DUPS, ERROR, ERROR_SEQ, TARGET = range(5)
STATE_WORDS = 16
BAD_BYTES, GAP, NOT_CONSECUTIVE, CORRUPT = 1, 2, 3, 4


@njit(nogil=True, inline="always")
def record_length(seq):
    h = (seq * 2654435761) % 4294967296
    if h & 255 == 0:
        return 1 + (h >> 8) % 65536
    return 1 + (h >> 8) % 200


@njit(nogil=True, inline="always")
def fill(buf, at, seq, n):
    for i in range(n):
        buf[at + i] = (seq * 7 + i * 31 + (i >> 8)) & 0xFF


@njit(nogil=True)
def same_bytes(buf, at, seq, n):
    for i in range(n):
        if buf[at + i] != (seq * 7 + i * 31 + (i >> 8)) & 0xFF:
            return False
    return True


@njit(nogil=True)
def produce(ctl, data, stage, offs, lens, types, seq, end, in_place):
    """Write up to BATCH records seq, seq+1, ... (< end); returns how many were committed."""
    n = min(BATCH, end - seq)
    k = 0
    if in_place:
        while k < n:
            length = record_length(seq + k)
            at = ring_claim(ctl, data, length, seq + k)
            if at < 0:
                break
            fill(data, at, seq + k, length)
            k += 1
        ring_commit(ctl)
        return k
    pos = 0
    while k < n:
        length = record_length(seq + k)
        if pos + length > stage.size:
            break
        fill(stage, pos, seq + k, length)
        offs[k], lens[k], types[k] = pos, length, seq + k
        pos += length
        k += 1
    return ring_write_batch(ctl, data, stage, offs, lens, types, 0, k)


@njit(nogil=True)
def consume(ctl, data, offs, lens, types, state, last):
    """Read, verify and release one batch; ``last[0]`` is this incarnation's previous sequence number (-1 at
    start). Returns the count, or -1 with state[ERROR] and state[ERROR_SEQ] set."""
    n = ring_read_batch(ctl, data, offs, lens, types, BATCH, 1 << 40)
    if n < 0:
        state[ERROR] = CORRUPT
        return -1
    for k in range(n):
        seq = types[k]
        if lens[k] != record_length(seq) or not same_bytes(data, offs[k], seq, lens[k]):
            state[ERROR], state[ERROR_SEQ] = BAD_BYTES, seq
            return -1
        if last[0] >= 0 and seq != last[0] + 1:
            state[ERROR], state[ERROR_SEQ] = NOT_CONSECUTIVE, seq
            return -1
        if seq > state[EXPECT]:
            state[ERROR], state[ERROR_SEQ] = GAP, seq
            return -1
        if seq < state[EXPECT]:
            state[DUPS] += 1  # a re-read of a record a killed consumer had read but not released
        else:
            state[EXPECT] = seq + 1
        last[0] = seq
    ring_release_read(ctl)
    return n


def ring_offset(k):
    return k * Ring.size_for(CAPACITY)


def state_of(seg, rings, k):
    return np.frombuffer(seg.buf, np.int64, STATE_WORDS, ring_offset(rings) + k * STATE_WORDS * 8)


def make_segment(name, rings):
    seg = Segment.create(name, ring_offset(rings) + rings * STATE_WORDS * 8)
    for k in range(rings):
        Ring.create(seg.buf, ring_offset(k), CAPACITY)
        state_of(seg, rings, k)[TARGET] = 2**31 - 1
    return seg


def producer(name, rings, mine, seed):
    """Feed rings ``mine`` until each has committed its TARGET (re-read every call: the test may lower it)."""
    rng = random.Random(seed)
    seg = Segment.attach(name)
    ring = {k: Ring.attach(seg.buf, ring_offset(k), CAPACITY, role=Ring.PRODUCER) for k in mine}
    seq = {k: ring[k].committed_count for k in mine}  # resume exactly after the last committed record
    stage = np.zeros(STAGE, np.uint8)
    offs, lens, types = (np.zeros(BATCH, np.int64) for _ in range(3))
    while True:
        moved = done = 0
        for k in mine:
            target = int(state_of(seg, rings, k)[TARGET])
            if seq[k] >= target:
                done += 1
                continue
            got = produce(ring[k].ctl, ring[k].data, stage, offs, lens, types, seq[k], target, rng.random() < 0.5)
            seq[k] += got
            moved += got
        if done == len(mine):
            return
        if not moved:
            os.sched_yield()


def consumer(name, rings, mine):
    seg = Segment.attach(name)
    ring = {k: Ring.attach(seg.buf, ring_offset(k), CAPACITY, role=Ring.CONSUMER) for k in mine}
    last = {k: np.full(1, -1, np.int64) for k in mine}
    offs, lens, types = (np.zeros(BATCH, np.int64) for _ in range(3))
    while True:
        moved = done = 0
        for k in mine:
            state = state_of(seg, rings, k)
            if state[EXPECT] >= state[TARGET]:
                done += 1
                continue
            got = consume(ring[k].ctl, ring[k].data, offs, lens, types, state, last[k])
            assert got >= 0, f"ring {k}: error {int(state[ERROR])} at sequence {int(state[ERROR_SEQ])}"
            moved += got
        if done == len(mine):
            return
        if not moved:
            os.sched_yield()


def compile_kernels():
    buf = bytearray(Ring.size_for(CAPACITY))
    ring = Ring.create(buf, 0, CAPACITY)
    offs, lens, types = (np.zeros(BATCH, np.int64) for _ in range(3))
    for start, in_place in ((0, True), (3, False)):
        produce(ring.ctl, ring.data, np.zeros(STAGE, np.uint8), offs, lens, types, start, start + 3, in_place)
    state, last = np.zeros(STATE_WORDS, np.int64), np.full(1, -1, np.int64)
    assert consume(ring.ctl, ring.data, offs, lens, types, state, last) == 6 and state[ERROR] == 0


def check_states(seg, rings, target):
    for k in range(rings):
        state = state_of(seg, rings, k)
        assert state[ERROR] == 0, f"ring {k}: error {int(state[ERROR])} at sequence {int(state[ERROR_SEQ])}"
        assert state[EXPECT] == target, (k, int(state[EXPECT]), target)


def test_two_producers_two_consumers_four_rings(shm_prefix):
    """4 rings, ring k written by producer k % 2 and read by consumer k // 2, 1M records each.

    Acceptable outcome: exactly one: every record 0..N-1 arrives on its ring once, in order, byte-exact
    (EXPECT == N, DUPS == 0, no error), and all four processes exit 0."""
    compile_kernels()
    n, rings = 1_000_000, 4
    seg = make_segment(f"/{shm_prefix}-stress", rings)
    try:
        for k in range(rings):
            state_of(seg, rings, k)[TARGET] = n
        pids = [fork(producer, seg.name, rings, [0, 2], 1), fork(producer, seg.name, rings, [1, 3], 2),
                fork(consumer, seg.name, rings, [0, 1]), fork(consumer, seg.name, rings, [2, 3])]
        deadline = time.monotonic() + 40
        assert [wait(pid, deadline - time.monotonic()) for pid in pids] == [0, 0, 0, 0]
        check_states(seg, rings, n)
        assert [int(state_of(seg, rings, k)[DUPS]) for k in range(rings)] == [0] * rings
    finally:
        seg.close()
        seg.unlink()


def _wait_for_progress(state, records, deadline):
    start = int(state[EXPECT])
    while state[EXPECT] < start + records:
        assert state[ERROR] == 0, f"error {int(state[ERROR])} at sequence {int(state[ERROR_SEQ])}"
        assert time.monotonic() < deadline, f"no progress past {int(state[EXPECT])}"
        os.sched_yield()


def test_sixty_sigkills_lose_and_corrupt_nothing(shm_prefix):
    """One producer, one consumer, one ring; 60 times, after a random amount of progress, SIGKILL the producer
    or the consumer (at whatever instruction it is at) and start a new one that attaches by segment name.

    Acceptable outcomes, and nothing else:
    * every record 0..TARGET-1 is seen, byte-exact; within one consumer incarnation in strict order;
    * a record appears twice only as a re-read by a consumer started after a consumer kill: at most BATCH
      re-reads per consumer kill (records read but not released), none after producer kills (a restarted
      producer resumes at the committed count, so it never sends a record twice and never skips one);
    * a killed producer's claimed but uncommitted records never reach the consumer (they would show up as a
      gap, a non-consecutive sequence number or wrong bytes)."""
    compile_kernels()
    rng = random.Random(20240601)
    seg = make_segment(f"/{shm_prefix}-crash", 1)
    state = state_of(seg, 1, 0)
    roles = {"producer": (producer, (seg.name, 1, [0], 7)), "consumer": (consumer, (seg.name, 1, [0]))}
    pids = {role: fork(fn, *args) for role, (fn, args) in roles.items()}
    kills = {"producer": 0, "consumer": 0}
    deadline = time.monotonic() + 40
    try:
        for _ in range(60):
            _wait_for_progress(state, rng.randrange(1, 30_000), deadline)
            victim = rng.choice(["producer", "consumer"])
            os.kill(pids[victim], signal.SIGKILL)
            status = wait(pids[victim], 10)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (victim, status)
            kills[victim] += 1
            fn, args = roles[victim]
            pids[victim] = fork(fn, *args)
        state[TARGET] = Ring.attach(seg.buf, 0, CAPACITY).committed_count + 10_000
        for role in roles:
            assert wait(pids.pop(role), deadline - time.monotonic()) == 0, role
        check_states(seg, 1, int(state[TARGET]))
        assert state[DUPS] <= kills["consumer"] * BATCH, (int(state[DUPS]), kills)
        assert min(kills.values()) >= 10, kills
    finally:
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
            wait(pid, 10)
        seg.close()
        seg.unlink()
