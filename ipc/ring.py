"""Single-producer/single-consumer ring of variable-length records in shared memory.

Theory of operation
-------------------
One process writes, one process reads; every shared word has exactly one writer. Positions are byte counts
that only grow (int64: 2**63 bytes is centuries at memory speed); ``position & (capacity - 1)`` indexes the
data area, so the capacity is a power of two.

Layout at ``offset`` (8-aligned; 128-aligned keeps each line on its own cache lines):

    +0     header line   magic 'NSQPYRNG' | version | layout bytes | capacity | max payload          (written once)
    +128   producer line TAIL (committed, store-release) | CLAIM (next free byte, private) | cached HEAD
                         | COUNT slot 0: tail, count | COUNT slot 1: tail, count | CLAIMED count   (producer writes)
    +256   consumer line HEAD (released, store-release) | READ (next unread, private)             (consumer writes)
    +384   data          capacity bytes of records:

           | int64 header: low 32 bits payload length, high 32 bits type | payload | pad to 8 bytes | next ...

A record never straddles the end of the data area: when it would, the producer first writes a padding record
(type PAD) that fills the rest, and the record starts at index 0. A record is at most capacity/2 bytes, so an
empty ring always accepts any record that passes the size check.

Writing: ``ring_claim`` reserves room past CLAIM (checking the cached HEAD, reloading HEAD with an acquire load
only when the cache says full) and writes the header; the payload is copied in place; ``ring_commit``
publishes CLAIM as TAIL with one store-release, making every record claimed since the last commit visible at
once. So the commit word is TAIL, written last: a single writer makes "publish the cursor" and "publish the
length" equivalent, and the cursor needs neither zeroed memory behind the reader nor a recovery scan.

Reading: ``ring_read_batch`` acquire-loads TAIL once and walks headers from READ, returning payload offsets,
lengths and types (skipping padding) without releasing anything; the consumer handles the records, then
``ring_release`` publishes how far it is done as HEAD (store-release). Only then may the producer reuse the
bytes.

Crash semantics (one process killed at any instruction, its replacement attaching to the same memory):
* producer: records claimed but not committed are invisible (TAIL did not move); the new producer resumes at
  TAIL (``ring_producer_recover``) and overwrites them. The number of records committed so far is durable:
  each commit first writes (new tail, count) into the COUNT slot that does not describe the current TAIL, then
  publishes TAIL; recovery takes the slot whose tail equals TAIL, so a producer learns exactly which of its
  records the ring holds (``ring_committed_count``) and resends nothing twice and loses nothing.
* consumer: records read but not released are read again by the new consumer, which starts at HEAD
  (``ring_consumer_recover``); nothing committed is lost, re-reads are the only duplicates.

Kernels return status codes (``OK``, ``FULL``, ``TOO_BIG``, ``CORRUPT``) and never raise; ``Ring`` validates
arguments, owns the views and raises.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ipc.atomics import copy_bytes, get_word, load_acquire, put_word, py_load_acquire, store_release
from ipc.layout import (H_PARAMS, LINE, LINE_WORDS, bytes_view, check_header, is_power_of_two, line_words, magic,
                        stamp_header, words)

__all__ = [
    "Ring", "RingError", "OK", "FULL", "TOO_BIG", "CORRUPT", "PAD", "HEADER_BYTES",
    "ring_claim", "ring_commit", "ring_try_write", "ring_write_batch", "ring_read_batch", "ring_release",
    "ring_release_read", "ring_readable", "ring_free", "ring_committed_count", "ring_producer_recover",
    "ring_consumer_recover", "record_size", "max_payload",
]

RING_MAGIC = magic("NSQPYRNG")
RING_VERSION = 1
HEADER_BYTES = 8  # per record
OK, FULL, TOO_BIG, CORRUPT = 0, -1, -2, -3
PAD = -1  # record type of padding; user types are >= 0

# word indices into the control block (three lines)
_P = line_words(1)
P_TAIL, P_CLAIM, P_CACHED_HEAD, P_S0_TAIL, P_S0_COUNT, P_S1_TAIL, P_S1_COUNT, P_CLAIMED = range(_P, _P + 8)
_C = line_words(2)
C_HEAD, C_READ = _C, _C + 1
CONTROL_WORDS = 3 * LINE_WORDS
CONTROL_BYTES = 3 * LINE


@njit(cache=True, nogil=True, inline="always")
def record_size(length):
    return (HEADER_BYTES + length + 7) & ~7


@njit(cache=True, nogil=True, inline="always")
def max_payload(capacity):
    return capacity // 2 - HEADER_BYTES


@njit(cache=True, nogil=True)
def ring_claim(ctl, data, length, rtype):
    """Reserve one record of ``length`` payload bytes and write its header. Returns the payload's index in
    ``data`` (fill it, then ``ring_commit``), or FULL / TOO_BIG. Producer only."""
    cap = data.size
    if length < 0 or length > max_payload(cap) or rtype < 0:
        return TOO_BIG
    size = record_size(length)
    pos = ctl[P_CLAIM]
    idx = pos & (cap - 1)
    pad = cap - idx if idx + size > cap else 0
    end = pos + pad + size
    if end - ctl[P_CACHED_HEAD] > cap:
        ctl[P_CACHED_HEAD] = load_acquire(ctl, C_HEAD)
        if end - ctl[P_CACHED_HEAD] > cap:
            return FULL
    if pad:
        put_word(data, idx, (PAD << 32) | (pad - HEADER_BYTES))
        idx = 0
    put_word(data, idx, (np.int64(rtype) << 32) | length)
    ctl[P_CLAIM] = end
    ctl[P_CLAIMED] += 1
    return idx + HEADER_BYTES


@njit(cache=True, nogil=True)
def ring_commit(ctl):
    """Publish every record claimed since the last commit (and the durable committed count). Producer only."""
    tail = ctl[P_TAIL]
    new_tail = ctl[P_CLAIM]
    if new_tail == tail:
        return
    slot = P_S1_TAIL if ctl[P_S0_TAIL] == tail else P_S0_TAIL  # the slot that does not describe TAIL
    store_release(ctl, slot, -1)  # invalid while half written
    store_release(ctl, slot + 1, ctl[P_CLAIMED])
    store_release(ctl, slot, new_tail)
    store_release(ctl, P_TAIL, new_tail)


@njit(cache=True, nogil=True)
def ring_try_write(ctl, data, src, src_off, length, rtype):
    """Write and commit one record copied from src[src_off:src_off+length]. Returns OK, FULL or TOO_BIG."""
    at = ring_claim(ctl, data, length, rtype)
    if at < 0:
        return at
    copy_bytes(data, at, src, src_off, length)
    ring_commit(ctl)
    return OK


@njit(cache=True, nogil=True)
def ring_write_batch(ctl, data, src, offsets, lengths, types, start, count):
    """Write records start..start+count-1 (payload i is src[offsets[i]:offsets[i]+lengths[i]]) and commit them
    with one store. Returns how many were written: fewer than ``count`` when the ring filled up, or when
    record start+written is too big (TOO_BIG is then returned if it is the first)."""
    n = 0
    while n < count:
        i = start + n
        at = ring_claim(ctl, data, lengths[i], types[i])
        if at < 0:
            if at == TOO_BIG and n == 0:
                return TOO_BIG
            break
        copy_bytes(data, at, src, offsets[i], lengths[i])
        n += 1
    ring_commit(ctl)
    return n


@njit(cache=True, nogil=True)
def ring_read_batch(ctl, data, out_off, out_len, out_type, max_count, max_bytes):
    """Collect up to ``max_count`` unread records (and, past the first, at most ``max_bytes`` of payload):
    payload index in ``data``, length, type. Advances READ, not HEAD. Returns the count or CORRUPT.
    Consumer only."""
    cap = data.size
    mask = cap - 1
    pos = ctl[C_READ]
    tail = load_acquire(ctl, P_TAIL)
    n = 0
    nbytes = 0
    limit = min(max_count, out_off.size, out_len.size, out_type.size)
    while pos < tail and n < limit:
        idx = pos & mask
        h = get_word(data, idx)
        length = h & 0xFFFFFFFF
        rtype = h >> 32
        size = record_size(length)
        if idx + size > cap or pos + size > tail or rtype < PAD:
            return CORRUPT
        if rtype == PAD:
            pos += size
            continue
        if n > 0 and nbytes + length > max_bytes:
            break
        out_off[n] = idx + HEADER_BYTES
        out_len[n] = length
        out_type[n] = rtype
        nbytes += length
        n += 1
        pos += size
    ctl[C_READ] = pos
    return n


@njit(cache=True, nogil=True)
def ring_release(ctl, upto):
    """Hand the bytes before position ``upto`` (HEAD <= upto <= READ) back to the producer. Consumer only."""
    store_release(ctl, C_HEAD, upto)


@njit(cache=True, nogil=True)
def ring_release_read(ctl):
    """Release everything read so far. Consumer only."""
    store_release(ctl, C_HEAD, ctl[C_READ])


@njit(cache=True, nogil=True)
def ring_readable(ctl):
    """Committed bytes not yet read (0: nothing to read). Consumer only (it reads its private READ)."""
    return load_acquire(ctl, P_TAIL) - ctl[C_READ]


@njit(cache=True, nogil=True)
def ring_free(ctl, capacity):
    """Bytes the producer could claim now (a record may need padding too). Producer only."""
    return capacity - (ctl[P_CLAIM] - load_acquire(ctl, C_HEAD))


@njit(cache=True, nogil=True)
def ring_committed_count(ctl):
    """Records committed since the ring was created, as recorded with the current TAIL (-1: inconsistent)."""
    tail = load_acquire(ctl, P_TAIL)
    if load_acquire(ctl, P_S0_TAIL) == tail:
        return load_acquire(ctl, P_S0_COUNT)
    if load_acquire(ctl, P_S1_TAIL) == tail:
        return load_acquire(ctl, P_S1_COUNT)
    return -1


@njit(cache=True, nogil=True)
def ring_producer_recover(ctl):
    """Resume a producer at TAIL, dropping claimed but uncommitted records. Returns the committed count."""
    count = ring_committed_count(ctl)
    ctl[P_CLAIM] = ctl[P_TAIL]
    ctl[P_CLAIMED] = count
    ctl[P_CACHED_HEAD] = load_acquire(ctl, C_HEAD)
    return count


@njit(cache=True, nogil=True)
def ring_consumer_recover(ctl):
    """Resume a consumer at HEAD: records read but not released will be read again."""
    ctl[C_READ] = ctl[C_HEAD]


class RingError(RuntimeError):
    """A ring operation was given an impossible argument or found corrupt records."""


class Ring:
    """One SPSC ring at ``offset`` of ``buf`` (any writable buffer: shm segment, shared mmap, file mapping).

    ``Ring.create`` initialises the memory; ``Ring.attach`` checks it and, for ``role`` 'producer' or
    'consumer', recovers that side after a crash (it must then be the only process in that role). A batch read
    returns numpy views (offsets, lengths, types) valid until the next read; payload bytes stay valid until
    they are released.
    """

    PRODUCER, CONSUMER = "producer", "consumer"

    def __init__(self, buf, offset: int, role: str | None, max_batch: int):
        self.ctl = words(buf, offset, CONTROL_WORDS, "ring control")
        self.capacity = int(self.ctl[H_PARAMS])
        self.data = bytes_view(buf, offset + CONTROL_BYTES, self.capacity, "ring data")
        self.max_payload = int(max_payload(self.capacity))
        self.role = role
        self._off = np.zeros(max_batch, np.int64)
        self._len = np.zeros(max_batch, np.int64)
        self._type = np.zeros(max_batch, np.int64)

    @staticmethod
    def size_for(capacity: int) -> int:
        return CONTROL_BYTES + capacity

    @classmethod
    def create(cls, buf, offset: int, capacity: int, role: str | None = None, max_batch: int = 1024) -> "Ring":
        if not is_power_of_two(capacity) or capacity < 64:
            raise RingError(f"ring capacity must be a power of two >= 64, got {capacity}")
        ctl = words(buf, offset, CONTROL_WORDS, "ring control")
        bytes_view(buf, offset + CONTROL_BYTES, capacity, "ring data")  # capacity check
        ctl[LINE_WORDS:] = 0
        stamp_header(ctl, RING_MAGIC, RING_VERSION, cls.size_for(capacity), (capacity, max_payload(capacity)))
        return cls(buf, offset, role, max_batch)

    @classmethod
    def attach(cls, buf, offset: int, capacity: int | None = None, role: str | None = None,
               max_batch: int = 1024) -> "Ring":
        ctl = words(buf, offset, CONTROL_WORDS, "ring control")
        check_header(ctl, RING_MAGIC, RING_VERSION, None if capacity is None else cls.size_for(capacity),
                     (capacity,), what=f"ring at offset {offset}", names=("capacity",))
        ring = cls(buf, offset, role, max_batch)
        if role == cls.PRODUCER:
            if ring_producer_recover(ring.ctl) < 0:
                raise RingError("ring producer state is inconsistent (no count slot matches TAIL)")
        elif role == cls.CONSUMER:
            ring_consumer_recover(ring.ctl)
        return ring

    # producer side -----------------------------------------------------------------------------------------
    def _check_record(self, length: int, rtype: int) -> None:
        if length > self.max_payload or rtype < 0 or rtype >= 2**31:
            raise RingError(f"record of {length} bytes, type {rtype}: payload must be <= {self.max_payload} "
                            f"bytes and the type in [0, 2**31)")

    def write(self, payload, rtype: int = 0) -> bool:
        """Write and commit one record; False if the ring is full."""
        src = np.frombuffer(payload, np.uint8) if not isinstance(payload, np.ndarray) else payload
        self._check_record(src.size, rtype)
        return ring_try_write(self.ctl, self.data, src, 0, src.size, rtype) == OK

    def write_batch(self, src, offsets, lengths, types, start: int = 0, count: int | None = None) -> int:
        """Write records from one source buffer, committed together; returns how many were written."""
        count = len(lengths) - start if count is None else count
        n = ring_write_batch(self.ctl, self.data, src, offsets, lengths, types, start, count)
        if n == TOO_BIG:
            self._check_record(int(lengths[start]), int(types[start]))
        return int(n)

    def claim(self, length: int, rtype: int = 0):
        """Reserve one record and return the writable view of its payload (None if full); ``commit`` after."""
        self._check_record(length, rtype)
        at = ring_claim(self.ctl, self.data, length, rtype)
        return None if at < 0 else self.data[at:at + length]

    def commit(self) -> None:
        ring_commit(self.ctl)

    def free(self) -> int:
        return int(ring_free(self.ctl, self.capacity))

    @property
    def committed_count(self) -> int:
        return int(ring_committed_count(self.ctl))

    # consumer side -----------------------------------------------------------------------------------------
    def read_batch(self, max_count: int | None = None, max_bytes: int = 1 << 62):
        """(offsets, lengths, types) of the next unread records, as views valid until the next call."""
        n = ring_read_batch(self.ctl, self.data, self._off, self._len, self._type,
                            len(self._off) if max_count is None else max_count, max_bytes)
        if n == CORRUPT:
            raise RingError(f"corrupt record header at position {int(self.ctl[C_READ])}")
        return self._off[:n], self._len[:n], self._type[:n]

    def read(self, max_count: int | None = None) -> list[tuple[int, bytes]]:
        """Copies of the next unread records as (type, payload) pairs (tests and cold paths)."""
        offs, lens, types = self.read_batch(max_count)
        return [(int(t), self.data[o:o + n].tobytes()) for o, n, t in zip(offs, lens, types)]

    def release(self, upto: int | None = None) -> None:
        """Release everything read (or up to position ``upto``)."""
        if upto is None:
            ring_release_read(self.ctl)
        elif int(self.ctl[C_HEAD]) <= upto <= int(self.ctl[C_READ]):
            ring_release(self.ctl, upto)
        else:
            raise RingError(f"release to {upto} outside [HEAD {int(self.ctl[C_HEAD])}, READ "
                            f"{int(self.ctl[C_READ])}]")

    @property
    def read_position(self) -> int:
        return int(self.ctl[C_READ])

    def readable(self) -> int:
        return int(ring_readable(self.ctl))

    def is_empty(self) -> bool:
        """Nothing committed that the consumer has not released."""
        return int(py_load_acquire(self.ctl, P_TAIL)) == int(py_load_acquire(self.ctl, C_HEAD))

