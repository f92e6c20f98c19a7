"""The wrappers whose kernels read a source buffer pass it read-only, whatever the caller holds: numba types
read-only and writable arrays apart and compiles a kernel once for each, so a writable source from Python (a
ring's bytes, the pump's buffer) would compile a second copy of the kernel in a worker, after the warm-up (which
compiles the read-only one only: ``workers/lane/warmup.py``). Each test checks that the copy stays unchanged and that
a writable source adds no signature to the kernel."""
import mmap

import numpy as np

from nsqpy.ipc import msglog_kernels as K
from nsqpy.ipc.layout import read_only
from nsqpy.ipc.msglog import MessageLog, ShmSegmentProvider, log_ctrl_nbytes
from nsqpy.ipc.ring import Ring, ring_try_write
from nsqpy.workers.publishing.records import forward_size, pack_bodies, pack_forward, unpack_forward


def _writable(data: bytes) -> np.ndarray:
    a = np.frombuffer(data, np.uint8).copy()
    assert a.flags.writeable
    return a


def test_read_only_views_a_writable_array_and_keeps_a_read_only_one():
    a = _writable(b"abc")
    v = read_only(a)
    assert not v.flags.writeable and a.flags.writeable and np.shares_memory(a, v)
    assert read_only(v) is v


def test_message_log_appends_a_writable_source_with_the_read_only_kernel(shm_prefix):
    s = 1 << 16
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(s, s))
    log = MessageLog.create(ctrl, 0, segment_size=s, mem_bytes=s, memory=ShmSegmentProvider(shm_prefix))
    try:
        ch = log.open_channel()
        log.append(b"first", 1, 1)  # a client's bytes: read-only
        known = len(K.append_batch.signatures)
        src = _writable(b"hello world")
        log.append_batch(src, np.array([0, 6], np.int64), np.array([5, 5], np.int64), np.zeros(2, np.int64),
                         np.array([2, 3], np.int64))
        assert len(K.append_batch.signatures) == known
        assert src.flags.writeable
        b = log.read(ch, 8, 1 << 20)
        assert b.n == 3
        positions = b.positions[:b.n].tolist()  # body() reads into arrays of its own
        assert [log.body(p) for p in positions] == [b"first", b"hello", b"world"]
    finally:
        log.destroy()


def test_ring_write_sends_a_writable_payload_through_the_read_only_kernel():
    ring = Ring.create(np.zeros(Ring.size_for(1 << 12), np.uint8), 0, 1 << 12)
    assert ring.write(b"abc", 1)
    known = len(ring_try_write.signatures)
    payload = _writable(b"defg")
    assert ring.write(payload, 2) and ring.write(bytearray(b"hi"), 3)
    assert len(ring_try_write.signatures) == known
    offs, lens, types = ring.read_batch(8)
    assert [bytes(ring.data[o:o + n]) for o, n in zip(offs, lens)] == [b"abc", b"defg", b"hi"]
    assert list(types) == [1, 2, 3]


def test_pack_forward_packs_a_writable_source_with_the_read_only_kernel():
    offsets, lengths = np.array([0, 2], np.int64), np.array([2, 3], np.int64)
    out = np.empty(forward_size(b"t", lengths), np.uint8)
    pack_forward(out, b"t", np.frombuffer(b"xyzzy", np.uint8), offsets, lengths, 7, 0)
    known = len(pack_bodies.signatures)
    payload = pack_forward(out, b"t", _writable(b"abcde"), offsets, lengths, 7, 0)
    assert len(pack_bodies.signatures) == known
    topic, offs, lens, ts, defer_ms = unpack_forward(payload, np.empty(4, np.int64), np.empty(4, np.int64))
    assert (topic, ts, defer_ms) == ("t", 7, 0)
    assert [bytes(payload[o:o + n]) for o, n in zip(offs, lens)] == [b"ab", b"cde"]
