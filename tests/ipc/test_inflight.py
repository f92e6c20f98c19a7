"""InFlightTable against a pure-Python model, op by op (hypothesis) and across SIGKILLs of its writer."""
import mmap
import os
import random
import signal
import struct
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nsqpy.ipc import inflight as inf
from nsqpy.ipc.inflight import FREE, IN_FLIGHT, OK, InFlightTable, inflight_nbytes
from nsqpy.ipc.layout import LayoutError

U64 = (1 << 64) - 1


class Model:
    """What the table should hold, slot by slot, including the free list order (LIFO, ascending after recover)
    and every slot's generation. live[slot] = [state, topic, channel, msg_id, log_pos, conn, attempts,
    delivered, deadline]."""

    FIELDS = {"state": 0, "conn": 5, "attempts": 6, "delivered": 7, "deadline": 8}

    def __init__(self, capacity):
        self.capacity = capacity
        self.live = {}
        self.gen = [0] * capacity
        self.free = list(range(capacity - 1, -1, -1))  # pop() -> the head

    def key_slot(self, channel, msg_id):
        return next((s for s, r in self.live.items() if r[2] == channel and r[3] == msg_id), -1)

    def _set(self, s, rec):
        self.live[s] = rec
        self.gen[s] += 1

    def start(self, topic, channel, conn, now, deadline, ids, log_pos, attempts):
        out = []
        for msg_id, lp, att in zip(ids, log_pos, attempts):
            if self.key_slot(channel, msg_id) >= 0:
                out.append(inf.ST_DUPLICATE)
            elif not self.free:
                out.append(inf.ST_FULL)
            else:
                s = self.free.pop()
                self._set(s, [IN_FLIGHT, topic, channel, msg_id, lp, conn, att, now, deadline])
                out.append(s)
        return out

    def lookup(self, channel, msg_id, conn):
        s = self.key_slot(channel, msg_id)
        if s < 0:
            return inf.ST_NOT_FOUND
        if self.live[s][0] != IN_FLIGHT:
            return inf.ST_BAD_STATE
        return s if self.live[s][5] == conn else inf.ST_NOT_OWNER

    def release(self, s):
        if s not in self.live:
            return inf.ST_BAD_SLOT
        del self.live[s]
        self.gen[s] += 1
        self.free.append(s)
        return OK

    def fin(self, channel, ids, conn):
        out = []
        for msg_id in ids:
            s = self.lookup(channel, msg_id, conn)
            out.append((s, -1) if s < 0 else (OK, s))
            if s >= 0:
                self.release(s)
        return out

    def _change(self, s, want_states, **fields):
        if s not in self.live:
            return inf.ST_BAD_SLOT
        if self.live[s][0] not in want_states:
            return inf.ST_BAD_STATE
        rec = list(self.live[s])
        for name, value in fields.items():
            rec[self.FIELDS[name]] = value
        self._set(s, rec)
        return OK

    def touch(self, s, deadline):
        return self._change(s, (IN_FLIGHT,), deadline=deadline)

    def requeue(self, s, due):
        return self._change(s, (IN_FLIGHT,), state=inf.DEFERRED if due > 0 else inf.REQUEUED, conn=-1,
                            deadline=max(due, 0))

    def redeliver(self, s, conn, now, deadline):
        if s in self.live and self.live[s][0] in (inf.REQUEUED, inf.DEFERRED):
            return self._change(s, (inf.REQUEUED, inf.DEFERRED), state=IN_FLIGHT, conn=conn,
                                attempts=self.live[s][6] + 1, delivered=now, deadline=deadline)
        return self._change(s, (inf.REQUEUED, inf.DEFERRED))

    def iter_conn(self, conn):
        return sorted(s for s, r in self.live.items() if r[0] == IN_FLIGHT and r[5] == conn)

    def recover(self):
        self.free = sorted((s for s in range(self.capacity) if s not in self.live), reverse=True)
        return sorted(self.live)

    def snapshot(self):
        return [(self.live[s][0], self.gen[s], *self.live[s][1:]) if s in self.live else
                (FREE, self.gen[s]) for s in range(self.capacity)]


def table_snapshot(table):
    out = []
    for info in map(table.slot, range(table.capacity)):
        out.append((FREE, info.generation) if info.state == FREE else (info.state, info.generation, *info[3:]))
    return out


def new_table(capacity, offset=128):
    buf = bytearray(offset + inflight_nbytes(capacity))
    return InFlightTable.create(buf, offset, capacity), buf


def ids_array(ids):
    return np.array(ids, dtype=np.uint64)


def run_op(table, model, op):
    """Apply op to both; return (table result, model result) for the caller to compare."""
    name, args = op[0], op[1:]
    if name == "start":
        topic, channel, conn, now, deadline, entries = args
        ids, log_pos, attempts = ([e[i] for e in entries] for i in range(3))
        out = np.full(len(ids), 99, np.int64)
        n = table.start_batch(topic, channel, conn, now, deadline, ids_array(ids), np.array(log_pos, np.int64),
                              np.array(attempts, np.int64), out)
        want = model.start(topic, channel, conn, now, deadline, ids, log_pos, attempts)
        return (n, out.tolist()), (sum(s >= 0 for s in want), want)
    if name == "fin":
        channel, ids, conn = args
        status, slots = np.full(len(ids), 99, np.int64), np.full(len(ids), 99, np.int64)
        n = table.finish_batch(channel, ids_array(ids), conn, status, slots)
        want = model.fin(channel, ids, conn)
        return (n, list(zip(status.tolist(), slots.tolist()))), (sum(st == OK for st, _ in want), want)
    if name == "lookup":
        return table.lookup(*args), model.lookup(*args)
    if name == "iter_conn":
        return table.iter_conn(*args).tolist(), model.iter_conn(*args)
    if name == "recover":
        return table.recover().tolist(), model.recover()
    return getattr(table, name)(*args), getattr(model, name)(*args)


# ------------------------------------------------------------------------------------------ model test
CAP = 8


def _colliding_keys():
    """(msg_id, channel) pairs whose home bucket in a 16-entry index is 3 or 15 (15 wraps around), so probe runs
    are long, overlap and cross the end of the index; plus ids above 2**63."""
    keys, want = [], {3: 6, 15: 6}
    msg_id = 1
    while any(want.values()):
        channel = msg_id % 2
        home = inf._hash(np.int64(msg_id), channel) & 15
        if want.get(home, 0):
            want[home] -= 1
            keys.append((msg_id, channel))
        msg_id += 1
    return keys + [(U64 - 1, 0), (1 << 63, 1), (U64, 1)]


KEYS = _colliding_keys()
SLOT = st.integers(-1, CAP)
CONN = st.integers(1, 3)
TIME = st.integers(0, 10**12)


@st.composite
def key_batch(draw, max_size):
    channel = draw(st.integers(0, 1))
    ids = draw(st.lists(st.sampled_from([m for m, c in KEYS if c == channel]), max_size=max_size))
    return channel, ids


@st.composite
def start_op(draw):
    channel, ids = draw(key_batch(6))
    entries = [(m, draw(TIME), draw(st.integers(1, 5))) for m in ids]
    return ("start", channel // 2, channel, draw(CONN), draw(TIME), draw(TIME), entries)


@st.composite
def fin_op(draw):
    channel, ids = draw(key_batch(4))
    return ("fin", channel, ids, draw(CONN))


OPS = st.one_of(
    start_op(), fin_op(),
    st.builds(lambda k, c: ("lookup", k[1], k[0], c), st.sampled_from(KEYS), CONN),
    st.tuples(st.just("touch"), SLOT, TIME),
    st.tuples(st.just("requeue"), SLOT, st.integers(-5, 10**12)),
    st.tuples(st.just("redeliver"), SLOT, CONN, TIME, TIME),
    st.tuples(st.just("release"), SLOT),
    st.tuples(st.just("iter_conn"), CONN),
    st.tuples(st.just("recover")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=60))
def test_table_matches_model(ops):
    table, _ = new_table(CAP)
    model = Model(CAP)
    for op in ops:
        got, want = run_op(table, model, op)
        assert got == want, op
        table.check()
        assert len(table) == len(model.live)
        assert table_snapshot(table) == model.snapshot()


def test_generation_marks_stale_events():
    """A TIMEOUT for (slot, generation) arriving after the slot was FINed and reused is recognisably stale."""
    table, _ = new_table(4)
    out = np.zeros(1, np.int64)
    table.start_batch(0, 0, 7, 100, 200, ids_array([42]), np.zeros(1, np.int64), np.ones(1, np.int64), out)
    slot, gen_at_start = int(out[0]), table.generation(int(out[0]))
    status, freed = np.zeros(1, np.int64), np.zeros(1, np.int64)
    assert table.finish_batch(0, ids_array([42]), 7, status, freed) == 1
    table.start_batch(0, 0, 8, 300, 400, ids_array([43]), np.zeros(1, np.int64), np.ones(1, np.int64), out)
    assert out[0] == slot and table.generation(slot) == gen_at_start + 2


def test_attach_checks_layout():
    table, buf = new_table(CAP)
    assert InFlightTable(buf, 128).capacity == CAP
    with pytest.raises(LayoutError, match="magic"):
        InFlightTable(buf, 0)
    with pytest.raises(LayoutError, match="buffer holds"):
        InFlightTable(bytes(buf[:-8]), 128)
    with pytest.raises(LayoutError):
        InFlightTable.create(bytearray(1000), 0, CAP)


# ------------------------------------------------------------------------------------------ crash test
# The child is killed while it runs ops on a table; the parent replays the same ops on a reference table that
# nobody kills (the model test above vouches for the reference), so the child spends its time in kernels, not in
# a Python model, and the kills land inside batches often.
CRASH_CAP = 16384
MAX_BATCH = 4096
KILLS = 100
REC = struct.Struct("<I")


def rows(table):
    """Per slot (state, generation, topic, channel, msg_id, log_pos, conn, attempts, delivered, deadline); a
    free slot keeps only state and generation."""
    slots = table.slots.reshape(table.capacity, inf.SLOT_WORDS)
    tag = slots[:, inf.S_TAG]
    half = inf.S_HALF0 + ((tag >> 2) & 1) * inf.HALF_WORDS
    cur = np.take_along_axis(slots, half[:, None] + np.arange(inf.HALF_WORDS), axis=1)
    out = np.concatenate([(tag & 3)[:, None], (tag >> 3)[:, None], slots[:, inf.S_TOPIC:inf.S_LOG_POS + 1], cur],
                         axis=1)
    out[(tag & 3) == FREE, 2:] = 0
    return out


def gen_op(rng, table, next_id):
    """The next random op for `table` (a pure function of rng, the table's slots and next_id, so the parent
    replays on its reference table what the killed child did). Cheap, so that the child spends its time in
    kernels and the kills land inside them."""
    tag = table.slots[inf.S_TAG::inf.SLOT_WORDS]
    state = tag & 3
    flying, waiting = np.flatnonzero(state == IN_FLIGHT), np.flatnonzero(state > IN_FLIGHT)
    n_free = table.capacity - len(flying) - len(waiting)
    roll = rng.random()
    if (roll < 0.3 and n_free > table.capacity // 4) or len(flying) + len(waiting) == 0:
        ids = np.arange(next_id, next_id + rng.randint(1, min(MAX_BATCH, n_free + 8)), dtype=np.uint64)
        if len(flying) and rng.random() < 0.2:
            ids[0] = table.slot(int(rng.choice(flying))).msg_id  # a duplicate
        channel = rng.randint(0, 3)
        return ("start", channel // 2, channel, rng.randint(1, 5), rng.randint(0, 10**9), rng.randint(0, 10**9),
                ids, np.arange(len(ids), dtype=np.int64), np.full(len(ids), rng.randint(1, 3), np.int64))
    if roll < 0.6 and len(flying):
        # FIN a random part of one connection's messages on one channel, plus an unknown id and one owned by
        # another connection or channel when there is one
        words = np.arange(table.capacity) * inf.SLOT_WORDS
        conn = table.slots[words + inf.S_HALF0 + ((tag >> 2) & 1) * inf.HALF_WORDS + inf.F_CONN]
        channel = table.slots[words + inf.S_CHANNEL]
        first = int(rng.choice(flying))
        mine = flying[(conn[flying] == conn[first]) & (channel[flying] == channel[first])]
        pick = mine[rng.random() < np.linspace(0, 1, len(mine))] if rng.random() < 0.5 else mine
        ids = np.append(table.slots[pick * inf.SLOT_WORDS + inf.S_MSG_ID], [-1, table.slots[
            int(rng.choice(flying)) * inf.SLOT_WORDS + inf.S_MSG_ID]]).view(np.uint64)
        return ("finish_batch", int(channel[first]), ids, int(conn[first]))
    if roll < 0.7 and len(flying):
        return ("requeue", int(rng.choice(flying)), rng.choice((0, rng.randint(1, 10**9))))
    if roll < 0.75 and len(flying):
        return ("touch", int(rng.choice(flying)), rng.randint(0, 10**9))
    if roll < 0.82 and len(waiting):
        return ("redeliver", int(rng.choice(waiting)), rng.randint(1, 5), rng.randint(0, 10**9),
                rng.randint(0, 10**9))
    if roll < 0.9 and len(waiting):
        return ("release_some", waiting[:rng.randint(1, 64)].tolist())
    if roll < 0.98:
        return ("disconnect", rng.randint(1, 5))
    return ("recover",)


def apply_op(table, op):
    """Run op; -> the slots it changes, in the order it changes them."""
    name, args = op[0], op[1:]
    if name == "start":
        out = np.empty(len(args[5]), np.int64)
        table.start_batch(*args, out)
        return [s for s in out.tolist() if s >= 0]
    if name == "finish_batch":
        status, out = np.empty(len(args[1]), np.int64), np.empty(len(args[1]), np.int64)
        table.finish_batch(*args, status, out)
        return [s for s in out.tolist() if s >= 0]
    if name == "disconnect":
        order = table.iter_conn(args[0]).tolist()
        for s in order:
            assert table.requeue(s, 0) == OK
        return order
    if name == "release_some":
        for s in args[0]:
            assert table.release(s) == OK
        return args[0]
    if name == "recover":
        table.recover()
        return []
    assert getattr(table, name)(*args) == OK
    return [args[0]]


def child_main(table, seed, next_id, wfd):
    """Runs ops until killed; writes each op's sequence number to the pipe just before running it."""
    rng = random.Random(seed)
    for seq in range(1 << 30):
        op = gen_op(rng, table, next_id)
        os.write(wfd, REC.pack(seq))
        apply_op(table, op)
        next_id += MAX_BATCH


def run_child_until_killed(table, seed, next_id, n_records, pause):
    """Fork a child running child_main, SIGKILL it `pause` seconds after it logged n_records ops; -> the last
    op's number. (The pause only places the kill at a random point of an op rather than just after a log write:
    nothing waits on it, the pipe and waitpid order everything.)"""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            child_main(table, seed, next_id, w)
        finally:
            os._exit(3)
    os.close(w)
    data = b""
    while len(data) < n_records * REC.size:
        chunk = os.read(r, 65536)
        assert chunk, "child died on its own"
        data += chunk
    time.sleep(pause)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    last = REC.unpack_from(data, len(data) - REC.size)[0]
    assert len(data) == (last + 1) * REC.size
    return last


def test_recover_after_sigkill():
    """SIGKILL a child that runs random ops on a shared table at random moments (KILLS times); after each kill
    the parent recovers the table and compares it, slot by slot, with a reference table on which it replays
    the child's ops.

    The child logs op k's number before running op k, so ops 0..k-1 completed and op k was in progress.
    Acceptable outcomes for op k, each slot judged by its tag (one store publishes a slot's change):
      - start / finish_batch / disconnect (batches): a prefix of the slots the op changes, in the order it
        changes them, is changed as the op says; the rest are untouched (0 and all are prefixes too);
      - touch / requeue / redeliver / release (one slot): the slot is wholly before or wholly after;
      - recover: no slot changes (the free list and index it was rebuilding are rebuilt again).
    No other slot may differ, and after recover() the free list, live count and index agree with the slots
    (table.check()).
    """
    size = inflight_nbytes(CRASH_CAP)
    buf, ref_buf = mmap.mmap(-1, size), bytearray(size)
    table = InFlightTable.create(buf, 0, CRASH_CAP)
    rng, next_id = random.Random(0), 1
    for _ in range(100):  # compile every kernel before forking, and start from a busy table
        apply_op(table, gen_op(rng, table, next_id))
        next_id += MAX_BATCH
    table.check()
    partial = 0
    for rnd in range(KILLS):
        rng = random.Random(rnd)
        ref_buf[:] = buf[:]
        ref = InFlightTable(ref_buf, 0)
        seed = 1000 + rnd
        last = run_child_until_killed(table, seed, next_id, rng.randint(1, 50), rng.uniform(0, 0.003))
        rng = random.Random(seed)
        for _ in range(last):  # replay the completed ops
            apply_op(ref, gen_op(rng, ref, next_id))
            next_id += MAX_BATCH
        before = rows(ref)
        op = gen_op(rng, ref, next_id)
        order = apply_op(ref, op)
        after = rows(ref)
        next_id += MAX_BATCH

        table.recover()
        table.check()
        got = rows(table)
        changed = np.flatnonzero((got != before).any(axis=1)).tolist()
        assert (got[changed] == after[changed]).all(), (rnd, op[0])
        assert set(changed) == set(order[:len(changed)]), (rnd, op[0], order, changed)
        partial += 0 < len(changed) < len(order)
        del ref
    print(f"\n{partial} of {KILLS} kills landed inside a batch, leaving it half done")
    del table
    buf.close()
