"""Shared memory reserved as it is first used (nsqpy.ipc.ring, nsqpy.ipc.inflight, nsqpy.ipc.heap, nsqpy.workers.publishing.links): nothing is touched
before it is reserved, growth keeps every invariant, a full /dev/shm is a clean failure (never SIGBUS), and a
partly reserved in-flight table recovers after its writer is SIGKILLed.

Guarded buffers: an anonymous shared mapping whose pages are PROT_NONE until the layout's ``reserve`` callback
makes them readable and writable (mprotect), so touching a page the layout did not reserve, even reading it, is a
SIGSEGV. Protections are per process, so each guarded workload runs whole in a forked child (``_fork``): exit 0
passes, death by a signal means a touch of an unreserved page (or the child's traceback is printed)."""
import collections
import ctypes
import errno
import json
import mmap
import os
import random
import signal
import textwrap
import time

import numpy as np
import pytest

from tests.private_tmpfs import run_with_tmpfs

from _fork import fork, wait
from nsqpy.ipc import inflight as inf, ring as ring_mod
from nsqpy.ipc.heap import TimerHeap, heap_nbytes
from nsqpy.ipc.inflight import FREE, IN_FLIGHT, OK, InFlightTable, inflight_nbytes
from nsqpy.ipc.layout import align_up
from nsqpy.ipc.ring import CONTROL_BYTES, RESERVE_STEP, Ring
from nsqpy.ipc.shm import Segment, SegmentError
from nsqpy.workers.publishing import links as L

PAGE = mmap.PAGESIZE
CHILD_DEADLINE = 120.0
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class Guarded:
    """A buffer whose pages fault until reserved (module docstring). Only for use inside a forked child."""

    def __init__(self, size):
        self.size = align_up(size, PAGE)
        self.map = mmap.mmap(-1, self.size)
        self.buf = np.frombuffer(self.map, np.uint8)
        self.addr = self.buf.ctypes.data
        self.ranges = []
        self._protect(0, self.size, 0)  # PROT_NONE

    def _protect(self, start, end, prot):
        if _libc.mprotect(self.addr + start, end - start, prot) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")

    def reserve(self, offset, nbytes):
        if nbytes > 0:
            assert 0 <= offset and offset + nbytes <= self.size, (offset, nbytes)
            self._protect(offset // PAGE * PAGE, align_up(offset + nbytes, PAGE), mmap.PROT_READ | mmap.PROT_WRITE)
            self.ranges.append((offset, offset + nbytes))

    def reserved_pages(self):
        return len({p for a, b in self.ranges for p in range(a // PAGE, (b + PAGE - 1) // PAGE)})


def run_guarded(fn, *args):
    status = wait(fork(fn, *args), CHILD_DEADLINE)
    assert os.WIFEXITED(status), f"the child died of signal {os.WTERMSIG(status)}: it touched an unreserved page"
    assert os.WEXITSTATUS(status) == 0, "the child failed (its traceback is above)"


# ---- rings ---------------------------------------------------------------------------------------------------
def _ring_traffic(ring, rng, steps, max_len, lag):
    """Write random records, read and release some (all of them when lag is 0), check every record; -> the
    largest backlog (bytes of records written and not released)."""
    model = collections.deque()
    seq = backlog = 0
    for _ in range(steps):
        for _ in range(rng.randint(1, 8)):
            n = rng.randint(0, max_len)
            payload = (seq.to_bytes(8, "little") * (n // 8 + 1))[:n]
            if not ring.write(payload, seq % 1000):
                break
            model.append((seq % 1000, payload))
            seq += 1
        backlog = max(backlog, sum(ring_mod.record_size(len(p)) for _, p in model))
        want = len(model) if not lag or rng.random() >= lag else rng.randint(0, 1)
        got = ring.read(want)
        for rec in got:
            assert rec == model.popleft()
        ring.release()
    return backlog


def _ring_child(lag):
    cap = 1 << 20
    g = Guarded(PAGE + cap)
    g.reserve(0, CONTROL_BYTES)
    ring = Ring.create(g.buf, 0, cap, data_offset=PAGE, reserve=g.reserve)
    assert ring.reserved == 0
    backlog = _ring_traffic(ring, random.Random(lag), 6000, 3000, lag)
    assert 0 < ring.reserved <= cap and ring.reserved % PAGE == 0
    if lag:  # a lagging reader makes the ring grow until its whole capacity holds records
        assert backlog > cap - 4096 and ring.reserved == cap
    else:  # a reader that keeps up: early laps keep the ring near twice its largest backlog (8 records)
        assert ring.reserved <= align_up(4 * max(RESERVE_STEP, backlog), PAGE), (ring.reserved, backlog)
    assert g.reserved_pages() * PAGE <= PAGE + ring.reserved


@pytest.mark.parametrize("lag", [0, 0.98])
def test_ring_touches_only_reserved_pages(lag):
    run_guarded(_ring_child, lag)


def test_ring_full_when_pages_cannot_be_reserved(monkeypatch):
    """A reservation that fails leaves the write False (a full ring), not an exception; it is retried after
    RESERVE_RETRY and the ring then goes on."""
    cap = 1 << 16
    buf = bytearray(Ring.size_for(cap))
    refuse = [False]
    asked = []

    def reserve(offset, nbytes):
        asked.append((offset, nbytes))
        if refuse[0]:
            raise SegmentError(errno.ENOSPC, "no space (test)")

    ring = Ring.create(buf, 0, cap, reserve=reserve)
    assert ring.write(b"x" * 100) and ring.reserved == RESERVE_STEP and asked == [(CONTROL_BYTES, RESERVE_STEP)]
    refuse[0] = True
    big = b"z" * (cap // 2 - 8)
    assert ring.write(big) is False and ring.out_of_pages  # not room: pages (waiting for the reader won't do)
    assert ring.can_claim(len(big)) is False
    calls = len(asked)
    assert ring.write(big) is False and len(asked) == calls  # not asked again before RESERVE_RETRY
    assert ring.out_of_pages and ring.write(b"small")  # what fits the reserved pages still goes
    assert not ring.out_of_pages
    refuse[0] = False
    monkeypatch.setattr(ring, "_retry_at", 0.0)
    assert ring.write(big) and not ring.out_of_pages
    assert ring.read() == [(0, b"x" * 100), (0, b"small"), (0, big)]


def test_a_full_ring_outgrows_its_pages_once_per_episode():
    """Behind a PAD of an early lap the producer is confined to the reserved part; finding the ring full there
    doubles the reservation once (for the next laps), however often a waiting sender looks again."""
    cap = 1 << 20
    ring = Ring.create(bytearray(Ring.size_for(cap)), 0, cap, reserve=lambda offset, nbytes: None)
    while ring.write(b"a" * 1000):  # a reader that keeps up...
        ring.read()
        ring.release()
        claim = int(ring.ctl[ring_mod.P_CLAIM])
        if claim > 3 * RESERVE_STEP and claim % cap > 3 * RESERVE_STEP // 4:
            break  # (where an early lap will come before the reserved part runs out)
    assert ring.reserved == RESERVE_STEP  # ...kept it at its first reservation, lap after lap
    sent = 0
    while ring.write(b"b" * 1000):  # ...then stops reading
        sent += 1
    assert sent * 1008 < RESERVE_STEP and ring.reserved == 2 * RESERVE_STEP
    for _ in range(10):
        assert not ring.write(b"b" * 1000) and not ring.can_claim(1000)
    assert ring.reserved == 2 * RESERVE_STEP
    assert len(ring.read()) == sent  # the reader passes the PAD: the next laps have the doubled part
    ring.release()
    while ring.write(b"c" * 1000):
        sent += 1
        if ring.reserved > 2 * RESERVE_STEP:
            break
    assert ring.reserved >= 2 * RESERVE_STEP


def test_ring_without_reserve_is_unchanged():
    ring = Ring.create(bytearray(Ring.size_for(4096)), 0, 4096)
    assert ring.reserved == 4096
    assert ring.write(b"a" * 2000) and ring.write(b"b" * 2000) and not ring.write(b"c" * 100)


# ---- links ---------------------------------------------------------------------------------------------------
class _Seg:
    def __init__(self, buf):
        self.buf = buf


def _links_child():
    workers, producers, cap = 3, 5, 1 << 16
    g = Guarded(L.nbytes(workers, producers, cap))
    links = L.LinkSet.create(_Seg(g.buf), workers, producers, cap, g.reserve)
    assert g.reserved_pages() * PAGE == align_up(links.fixed, PAGE)  # nothing but the fixed part
    assert len(links.inputs_of(1)) == producers - 1
    for slot in range(producers):
        for owner in range(workers):
            if slot != owner:
                assert links.pub(slot, owner).send(7, b"%d->%d" % (slot, owner))
    for owner in range(workers):
        got = []
        for link in links.inputs_of(owner):
            link.drain(lambda t, p: got.append((t, bytes(p))))
        assert got == [(7, b"%d->%d" % (slot, owner)) for slot in range(producers) if slot != owner]
    assert links.pub(4, 2).large_forward == cap // L.LARGE_FORWARD_SHARE
    # reply lines: one (STATUS, SEQ) pair per owner, each written by its owner only
    assert links.reply(4, 2, 1) is None and links.last_seq(4) == 0
    links.post_reply(4, 2, 1, 5)
    links.post_reply(4, 0, 3, 0)
    assert links.reply(4, 2, 1) == 5 and links.reply(4, 0, 3) == 0 and links.reply(4, 1, 1) is None
    assert links.last_seq(4) == 3 and links.reply_words(4).tolist()[:6] == [0, 3, 0, 0, 5, 1]


def test_links_reserve_only_their_fixed_part_and_carry_producer_slots():
    run_guarded(_links_child)


def test_wait_reply_across_processes():
    workers, producers = 2, 4
    shared = mmap.mmap(-1, L.nbytes(workers, producers, 1 << 16))
    links = L.LinkSet.create(_Seg(np.frombuffer(shared, np.uint8)), workers, producers, 1 << 16)
    r, w = os.pipe()

    def owner():
        os.read(r, 1)  # the command arrives (here: through the pipe)
        links.post_reply(3, 1, 42, 2)

    pid = fork(owner)
    assert links.wait_reply(3, 1, 42, 0.05) is None  # nothing yet: a bounded wait
    os.write(w, b"c")
    assert links.wait_reply(3, 1, 42, 60) == 2
    assert os.WEXITSTATUS(wait(pid, CHILD_DEADLINE)) == 0
    assert links.proc_of(3) == 4 and links.proc_of(1) == 1 and links.SCANNER == workers
    os.close(r)
    os.close(w)


def test_pub_capacity_comes_from_the_budget():
    assert L.pub_rings(2, 10) == 18 and L.pub_rings(64, 72) == 64 * 71
    assert L.pub_capacity(1 << 30, 2, 10) == L.RING_MAX          # 59 MiB a ring: clamped to 32 MiB
    assert L.pub_capacity(1 << 30, 8, 16) == 8 << 20              # 8.5 MiB -> 8 MiB
    assert L.pub_capacity(1 << 30, 16, 24) == 2 << 20             # 2.8 MiB -> 2 MiB
    assert L.pub_capacity(1 << 30, 32, 40) == 512 << 10
    assert L.pub_capacity(1 << 30, 64, 72) == L.RING_FLOOR        # 231 KiB: the floor
    for budget in (1 << 20, 3 << 28, 10 ** 10):
        for workers in (1, 2, 7, 64):
            cap = L.pub_capacity(budget, workers, workers + 8)
            assert cap & (cap - 1) == 0 and L.RING_FLOOR <= cap <= L.RING_MAX
            assert cap * L.pub_rings(workers, workers + 8) <= max(budget, L.RING_FLOOR * L.pub_rings(workers,
                                                                                                  workers + 8))


# ---- in-flight tables ------------------------------------------------------------------------------------------
def _start(table, ids, channel=1, conn=5):
    ids = np.asarray(ids, np.int64)
    out = np.empty(len(ids), np.int64)
    n = table.start_batch(0, channel, conn, 0, 10, ids, ids * 8, np.ones(len(ids), np.int64), out)
    return n, out


def _inflight_child(capacity):
    inf.GROW_MIN = 8
    g = Guarded(inflight_nbytes(capacity))
    hooks = []
    table = InFlightTable.create(g.buf, 0, capacity, g.reserve, initial=8, grow_hook=hooks.append)
    assert table.reserved == 8 and hooks == [8]
    rng = random.Random(capacity)
    live, next_id = {}, 1
    for _ in range(400):
        if rng.random() < 0.6:
            k = rng.randint(1, 300)
            ids = list(range(next_id, next_id + k))
            if live and rng.random() < 0.2:
                ids[0] = rng.choice(list(live))  # a duplicate
            next_id += k
            n, out = _start(table, ids)
            fresh = [i for i in ids if i not in live]
            room = capacity - len(live)
            assert n == min(len(fresh), room)
            for i, s in zip(ids, out.tolist()):
                if s >= 0:
                    live[i] = s
                else:
                    assert s == (inf.ST_DUPLICATE if i in live else inf.ST_FULL)
        else:
            gone = rng.sample(sorted(live), min(len(live), rng.randint(1, 400)))
            status, freed = np.empty(len(gone), np.int64), np.empty(len(gone), np.int64)
            assert table.finish_batch(1, np.array(gone, np.int64), 5, status, freed) == len(gone)
            for i in gone:
                del live[i]
        table.check()
        assert len(table) == len(live)
        assert table.index.shape[0] >= 2 * table.reserved  # never more than half full
        assert all(s < table.reserved for s in live.values())
    # grew only as far as it was used, doubling, each growth announced to the hook first
    assert hooks == sorted(hooks) and hooks[-1] == table.reserved
    n, out = _start(table, range(10**6, 10**6 + capacity))
    assert n == capacity - len(live) and table.reserved == capacity
    assert (out == inf.ST_FULL).sum() == len(live)  # ST_FULL only once the capacity is reached
    table.check()


def test_inflight_table_grows_touching_only_reserved_pages():
    run_guarded(_inflight_child, 5000)


def test_inflight_growth_refused_is_st_full_then_retried(monkeypatch):
    monkeypatch.setattr(inf, "GROW_MIN", 4)
    refuse = [False]

    def hook(n):
        if refuse[0]:
            raise SegmentError(errno.ENOSPC, "no space (test)")

    table = InFlightTable.create(bytearray(inflight_nbytes(64)), 0, 64, initial=4, grow_hook=hook)
    refuse[0] = True
    n, out = _start(table, range(1, 7))
    assert n == 4 and out.tolist()[4:] == [inf.ST_FULL] * 2 and table.reserved == 4
    refuse[0] = False
    n, out = _start(table, [5, 6])
    assert n == 0  # within GROW_RETRY of the failure: not asked again
    monkeypatch.setattr(table, "_retry_at", 0.0)
    n, out = _start(table, [5, 6])
    assert n == 2 and table.reserved == 8 and sorted(out.tolist()) == [4, 5]  # the new slots, from the low end
    table.check()


def test_stale_views_recover_a_table_grown_by_another_process(monkeypatch):
    """A replacement process inherits table objects made before its predecessor grew the table: recover() must
    re-read how far it is reserved and find every live slot."""
    monkeypatch.setattr(inf, "GROW_MIN", 4)
    buf = mmap.mmap(-1, inflight_nbytes(256))
    table = InFlightTable.create(buf, 0, 256, initial=4)
    stale = InFlightTable(buf, 0)

    def grow():
        n, _ = _start(table, range(1, 101))
        assert n == 100

    assert os.WEXITSTATUS(wait(fork(grow), CHILD_DEADLINE)) == 0
    assert stale.reserved == 4
    live = stale.recover()
    assert stale.reserved == 128 and len(live) == 100 and len(stale) == 100
    stale.check()
    assert sorted(stale.slot(int(s)).msg_id for s in live) == list(range(1, 101))
    assert stale.slot(200) == inf.SlotInfo(200, FREE, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # unreserved: not touched


def test_recover_a_growth_interrupted_between_its_stores(monkeypatch):
    """The two words a growth publishes, each written alone as a SIGKILL may leave them: INDEX_LEN grown but
    not RESERVED, or RESERVED grown before the free list and index were rebuilt."""
    monkeypatch.setattr(inf, "GROW_MIN", 4)
    for case in ("index only", "reserved not rebuilt"):
        buf = bytearray(inflight_nbytes(64))
        table = InFlightTable.create(buf, 0, 64, initial=8)
        _start(table, range(1, 6))
        if case == "index only":
            table.ctl[inf.C_INDEX_LEN] = 64
        else:
            table.ctl[inf.C_INDEX_LEN] = 32
            table.ctl[inf.C_RESERVED] = 16
        fresh = InFlightTable(buf, 0)
        assert len(fresh.recover()) == 5
        fresh.check()
        n, out = _start(fresh, range(10, 30))
        assert n == 20 and len(fresh) == 25
        fresh.check()


def _crash_child(seg_name, wfd, seed):
    """Starts and finishes batches on a lazily reserved shm table until killed; logs each op before and after."""
    seg = Segment.attach(seg_name)
    table = InFlightTable(seg.buf, 0, seg.reserver())
    rng = random.Random(seed)
    next_id = 1
    live = []
    while True:
        if not live or rng.random() < 0.65:
            ids = list(range(next_id, next_id + rng.randint(1, 200)))
            next_id += len(ids)
            os.write(wfd, json.dumps(["S", ids]).encode() + b"\n")
            n, out = _start(table, ids)
            started = [i for i, s in zip(ids, out.tolist()) if s >= 0]
            live += started
            os.write(wfd, json.dumps(["done", started]).encode() + b"\n")
        else:
            gone = rng.sample(live, rng.randint(1, len(live)))
            os.write(wfd, json.dumps(["F", gone]).encode() + b"\n")
            st, fr = np.empty(len(gone), np.int64), np.empty(len(gone), np.int64)
            assert table.finish_batch(1, np.array(gone, np.int64), 5, st, fr) == len(gone)
            live = sorted(set(live) - set(gone))
            os.write(wfd, json.dumps(["done", gone]).encode() + b"\n")


def test_recover_a_lazily_reserved_table_after_sigkill(shm_prefix, monkeypatch):
    """SIGKILL a child that grows and uses a table in a sparse /dev/shm segment at random moments; the parent,
    whose table object still has the views from before the child grew it, recovers and finds exactly the
    messages the child's completed ops left (plus a prefix of an interrupted start, minus a prefix of an
    interrupted finish)."""
    monkeypatch.setattr(inf, "GROW_MIN", 4)
    for rnd in range(12):
        rng = random.Random(rnd)
        seg = Segment.create(f"/{shm_prefix}-inflight{rnd}", inflight_nbytes(4096), reserve=0)
        try:
            table = InFlightTable.create(seg.buf, 0, 4096, seg.reserver(), initial=4)
            r, w = os.pipe()
            pid = fork(_crash_child, seg.name, w, rnd)
            os.close(w)
            data = b""
            while data.count(b"\n") < rng.randint(2, 40):
                chunk = os.read(r, 1 << 16)
                assert chunk, "the child died on its own"
                data += chunk
            time.sleep(rng.uniform(0, 0.002))  # where in an op the kill lands; nothing waits on it
            os.kill(pid, signal.SIGKILL)
            status = wait(pid, CHILD_DEADLINE)
            assert os.WIFSIGNALED(status), status
            while chunk := os.read(r, 1 << 16):
                data += chunk
            os.close(r)
            ops = [json.loads(line) for line in data.split(b"\n")[:-1]]  # a line the kill cut short: not begun
            done, pending = set(), None
            for op in ops:
                if op[0] == "done":
                    done = done | set(op[1]) if pending[0] == "S" else done - set(op[1])
                    pending = None
                else:
                    pending = op
            live_slots = table.recover()
            table.check()
            found = {table.slot(int(s)).msg_id for s in live_slots}
            if pending is None:
                assert found == done
            elif pending[0] == "S":
                assert done <= found and found - done <= set(pending[1])
            else:
                gone = done - found
                assert found <= done and all(i in pending[1] for i in gone)
            assert table.reserved >= 4 and seg.size >= inflight_nbytes(4096)
        finally:
            seg.close()
            seg.unlink()


def test_set_log_pos():
    buf = bytearray(inflight_nbytes(16))
    table = InFlightTable.create(buf, 0, 16, initial=4)
    _, out = _start(table, [11, 12])
    a, b = out.tolist()
    gen = table.generation(a)
    assert table.set_log_pos(a, 12345) == OK
    info = table.slot(a)
    assert info.log_pos == 12345 and info.msg_id == 11 and table.generation(a) == gen  # nothing else changed
    assert table.requeue(b, 0) == OK and table.set_log_pos(b, 777) == OK and table.slot(b).log_pos == 777
    assert table.set_log_pos(3, 1) == inf.ST_BAD_SLOT  # free
    assert table.set_log_pos(9, 1) == inf.ST_BAD_SLOT  # not reserved
    assert table.set_log_pos(-1, 1) == inf.ST_BAD_SLOT
    recovered = InFlightTable(buf, 0)  # a replacement attaching to the same memory
    recovered.recover()
    assert recovered.slot(a).log_pos == 12345 and recovered.slot(b).log_pos == 777
    recovered.check()


def test_set_log_pos_is_one_store_under_sigkill():
    """A child moves every live slot back and forth between two positions until killed: each slot is found at
    one of them, its other fields untouched, and the table consistent."""
    buf = mmap.mmap(-1, inflight_nbytes(2048))
    table = InFlightTable.create(buf, 0, 2048)
    ids = np.arange(1, 2001, dtype=np.int64)
    _start(table, ids)
    r, w = os.pipe()

    def mover():
        os.write(w, b"x")
        for k in range(1 << 40):
            for s in range(2000):
                table.set_log_pos(s, (1 << 40) + k % 2)

    pid = fork(mover)
    os.read(r, 1)
    time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    wait(pid, CHILD_DEADLINE)
    table.recover()
    table.check()
    for s in range(2000):
        info = table.slot(s)
        assert info.log_pos in ((1 << 40), (1 << 40) + 1) and info.state == IN_FLIGHT and info.msg_id == s + 1
    os.close(r)
    os.close(w)


# ---- timer heaps -----------------------------------------------------------------------------------------------
def _heap_child():
    cap = 3000
    g = Guarded(heap_nbytes(cap, cap))
    heap = TimerHeap.create(g.buf, 0, cap, cap, g.reserve, initial=4)
    other = TimerHeap(g.buf, 0, g.reserve)  # the process that hands out handles: backs pages ahead, writes nothing
    assert heap.reserved == 4 and len(heap.pos) == 4
    rng = random.Random(7)
    model = {}
    for step in range(6000):
        roll = rng.random()
        if roll < 0.55:
            h = rng.randrange(min(cap, 4 + step // 2))
            if h >= len(heap.pos):
                other.reserve_pages(h + 1)  # normally the worker's in-flight growth
                with pytest.raises(ValueError):
                    heap.push(1, h)  # past the published reservation: refused until the heap's writer grows it
                heap.grow(1 << h.bit_length())
            if h in model:
                heap.update(h, key := rng.randint(0, 10**6))
            else:
                heap.push(key := rng.randint(0, 10**6), h)
            model[h] = key
        elif roll < 0.8 and model:
            popped = heap.pop()
            assert popped == min((k, h) for h, k in model.items())
            del model[popped[1]]
        elif model:
            h = rng.choice(list(model))
            assert heap.remove(h) == model.pop(h)
        assert len(heap) == len(model)
        if step % 500 == 0:
            heap.check()
    heap.check()
    heap.clear()
    assert len(heap) == 0


def test_heap_grows_touching_only_reserved_pages():
    run_guarded(_heap_child)


def test_heap_views_refresh_after_another_process_grew_it():
    buf = mmap.mmap(-1, heap_nbytes(100, 100))
    heap = TimerHeap.create(buf, 0, 100, 100, initial=2)
    late = TimerHeap(buf, 0)  # e.g. a restarted scanner's inherited object
    heap.grow(64)
    heap.push(5, 40)
    late.clear()  # a restarted scanner: refreshes, then empties
    assert late.reserved == 64 and len(late) == 0 and 40 not in late and late.pos.shape[0] == 64
    late.push(7, 63)
    assert heap.peek() == (7, 63)


# ---- a full /dev/shm, for real -----------------------------------------------------------------------------------
FULL_SCRIPT = textwrap.dedent("""
    import errno, json, os
    import numpy as np
    from nsqpy.ipc.heap import TimerHeap, heap_nbytes
    from nsqpy.ipc.inflight import InFlightTable, inflight_nbytes, ST_FULL
    from nsqpy.ipc.shm import Segment, SegmentError
    from nsqpy.workers.publishing import links as L

    links_seg = Segment.create("/nsqpy-full-links", L.nbytes(2, 3, 1 << 22), reserve=0)
    links = L.LinkSet.create(links_seg, 2, 3, 1 << 22, links_seg.reserver())
    heap_seg = Segment.create("/nsqpy-full-heap", heap_nbytes(1 << 16, 1 << 16), reserve=0)
    heap = TimerHeap.create(heap_seg.buf, 0, 1 << 16, 1 << 16, heap_seg.reserver(), initial=64)
    table_seg = Segment.create("/nsqpy-full-inflight", inflight_nbytes(1 << 16), reserve=0)
    table = InFlightTable.create(table_seg.buf, 0, 1 << 16, table_seg.reserver(), initial=64,
                                 grow_hook=heap.reserve_pages)
    # fill the tmpfs to the last page
    filler = os.open("/dev/shm/filler", os.O_CREAT | os.O_WRONLY)
    size, step = 0, 1 << 20
    while step >= 4096:
        try:
            os.posix_fallocate(filler, size, step)
            size += step
        except OSError as e:
            assert e.errno == errno.ENOSPC
            step //= 2
    link = links.pub(2, 0)
    sent = 0
    while link.send(1, bytes([sent % 251]) * 100_000):
        sent += 1
    got = []
    links.inputs_of(0)[1].drain(lambda t, p: got.append(bytes(p) == bytes([len(got) % 251]) * 100_000))
    ids = np.arange(1, 5001, dtype=np.int64)
    out = np.empty(5000, np.int64)
    started = table.start_batch(0, 1, 1, 0, 1, ids, ids, np.ones(5000, np.int64), out)
    full = int((out == ST_FULL).sum())
    table.check()
    heap_error = None
    try:
        heap.grow(1 << 16)
    except SegmentError as e:
        heap_error = str(e)
    os.close(filler)
    os.unlink("/dev/shm/filler")
    link.ring._retry_at = table._retry_at = 0.0
    after = link.send(1, b"y" * 1_000_000)
    started_after = table.start_batch(0, 1, 1, 0, 1, ids, ids, np.ones(5000, np.int64), out)
    print(json.dumps({"sent": sent, "intact": len(got) == sent and all(got), "started": started,
                      "full": full, "heap_error": heap_error, "after": after,
                      "started_after": started_after, "reserved": table.reserved}))
    for seg in (links_seg, heap_seg, table_seg):
        seg.close()
        seg.unlink()
""")


def test_a_full_dev_shm_is_a_full_ring_and_a_full_table_never_sigbus(tmp_path):
    proc, got = run_with_tmpfs(tmp_path, FULL_SCRIPT, {"/dev/shm": "4m"})
    assert proc.returncode == 0, f"exit {proc.returncode} (-7: SIGBUS): {proc.stderr}"
    assert got["intact"] and got["sent"] < 40, got           # the ring stopped at the tmpfs, not at its 4 MiB
    assert got["started"] < 5000 and got["full"] == 5000 - got["started"], got
    assert got["heap_error"] and "No space left on device" in got["heap_error"], got
    assert got["after"] and got["started_after"] == 5000 - got["started"], got  # space back: all goes on
