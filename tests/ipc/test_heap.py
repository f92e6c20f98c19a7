"""TimerHeap against a dict model (handle -> key; the minimum is the smallest (key, handle)), plus a cross-process
handoff through an anonymous shared mmap."""
import mmap
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nsqpy.ipc.heap import HeapFull, TimerHeap, heap_nbytes
from nsqpy.ipc.layout import LayoutError

CAPACITY, HANDLES = 12, 16
KEYS = st.integers(-5, 40)  # a narrow range so that equal deadlines are common
HANDLE = st.integers(-1, HANDLES)  # includes the out-of-range -1 and HANDLES

OPS = st.one_of(
    st.tuples(st.just("push"), KEYS, HANDLE),
    st.tuples(st.just("pop")),
    st.tuples(st.just("peek")),
    st.tuples(st.just("remove"), HANDLE),
    st.tuples(st.just("update"), HANDLE, KEYS),
    st.tuples(st.just("shift"), KEYS, st.integers(0, 5)),
    st.tuples(st.just("clear")),
)


def new_heap(capacity=CAPACITY, handles=HANDLES, offset=64):
    buf = bytearray(offset + heap_nbytes(capacity, handles))
    return TimerHeap.create(buf, offset, capacity, handles), buf


def model_min(model):
    return min((k, h) for h, k in model.items()) if model else None


def apply(heap, model, op):
    """Run one op on both; assert they agree."""
    name = op[0]
    if name == "push":
        _, key, h = op
        if not 0 <= h < HANDLES or h in model:
            with pytest.raises(ValueError):
                heap.push(key, h)
        elif len(model) == CAPACITY:
            with pytest.raises(HeapFull):
                heap.push(key, h)
        else:
            heap.push(key, h)
            model[h] = key
    elif name in ("pop", "peek"):
        want = model_min(model)
        assert (heap.pop() if name == "pop" else heap.peek()) == want
        if name == "pop" and want:
            del model[want[1]]
    elif name == "remove":
        h = op[1]
        if h in model:
            assert heap.remove(h) == model.pop(h)
        else:
            with pytest.raises((KeyError, ValueError)):
                heap.remove(h)
    elif name == "update":
        _, h, key = op
        if h in model:
            heap.update(h, key)
            model[h] = key
        else:
            with pytest.raises((KeyError, ValueError)):
                heap.update(h, key)
    elif name == "shift":
        _, deadline, room = op
        out_h, out_k = np.full(room, -9, np.int64), np.full(room, -9, np.int64)
        n = heap.peek_and_shift(deadline, out_h, out_k)
        due = sorted((k, h) for h, k in model.items() if k <= deadline)[:room]
        assert list(zip(out_k[:n].tolist(), out_h[:n].tolist())) == due
        for _, h in due:
            del model[h]
    else:
        heap.clear()
        model.clear()


@settings(max_examples=400, deadline=None)
@given(st.lists(OPS, max_size=80))
def test_heap_matches_model(ops):
    heap, _ = new_heap()
    model = {}
    for op in ops:
        apply(heap, model, op)
        heap.check()
        assert len(heap) == len(model)
        for h in range(HANDLES):
            assert (h in heap) == (h in model)
            if h in model:
                assert heap.key_of(h) == model[h]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(KEYS, st.integers(0, HANDLES - 1)), max_size=CAPACITY, unique_by=lambda p: p[1]))
def test_rebuild_heapifies(pairs):
    heap, _ = new_heap()
    heap.push(99, 0)  # stale content: rebuild replaces it
    heap.rebuild(np.array([k for k, _ in pairs], np.int64), np.array([h for _, h in pairs], np.int64))
    heap.check()
    out_h, out_k = np.zeros(CAPACITY, np.int64), np.zeros(CAPACITY, np.int64)
    n = heap.peek_and_shift(1 << 62, out_h, out_k)
    assert list(zip(out_k[:n].tolist(), out_h[:n].tolist())) == sorted(pairs)


def test_rebuild_rejects_repeated_handle():
    heap, _ = new_heap()
    with pytest.raises(ValueError):
        heap.rebuild(np.array([1, 2], np.int64), np.array([3, 3], np.int64))
    assert len(heap) == 0 and 3 not in heap
    heap.check()


def test_attach_checks_layout():
    heap, buf = new_heap()
    heap.push(7, 3)
    again = TimerHeap(buf, 64)
    assert again.peek() == (7, 3)
    with pytest.raises(LayoutError, match="magic"):
        TimerHeap(buf, 0)
    with pytest.raises(LayoutError, match="buffer holds"):
        TimerHeap(bytes(buf[:-8]), 64)
    with pytest.raises(LayoutError):
        TimerHeap.create(bytearray(100), 0, CAPACITY, HANDLES)
    other = bytearray(buf)
    TimerHeap.create(other, 64, CAPACITY, HANDLES - 1)
    np.frombuffer(other, np.int64, 8, 64)[3] = CAPACITY + 1  # a header whose size does not fit its parameters
    with pytest.raises(LayoutError, match="size"):
        TimerHeap(other, 64)


def test_handoff_between_processes():
    """A child fills a heap in an anonymous shared mmap and hands it over through a pipe (the syscall orders
    memory); the parent then pops every entry in (key, handle) order and finds the index consistent."""
    capacity, handles = 5000, 6000
    buf = mmap.mmap(-1, heap_nbytes(capacity, handles))
    heap = TimerHeap.create(buf, 0, capacity, handles)
    heap.push(1, 1), heap.pop()  # compile in the parent, before fork
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 1 << 40, capacity)
    handles_used = rng.permutation(handles)[:capacity]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: write, update a third, remove a tenth, hand over
        status = 1
        try:
            for k, h in zip(keys.tolist(), handles_used.tolist()):
                heap.push(k, h)
            for h in handles_used[::3].tolist():
                heap.update(h, heap.key_of(h) // 2)
            for h in handles_used[::10].tolist():
                heap.remove(h)
            status = 0
        finally:
            os.write(w, bytes([status]))
            os._exit(status)
    os.close(w)
    try:
        assert os.read(r, 1) == b"\0"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    expect = {h: k for k, h in zip(keys.tolist(), handles_used.tolist())}
    for h in handles_used[::3].tolist():
        expect[h] //= 2
    for h in handles_used[::10].tolist():
        del expect[h]
    attached = TimerHeap(buf, 0)
    attached.check()
    out_h, out_k = np.zeros(capacity, np.int64), np.zeros(capacity, np.int64)
    n = attached.peek_and_shift(1 << 62, out_h, out_k)
    assert list(zip(out_k[:n].tolist(), out_h[:n].tolist())) == sorted((k, h) for h, k in expect.items())
    assert len(attached) == 0
    del heap, attached
    buf.close()
