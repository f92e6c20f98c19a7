"""Single-producer/single-consumer ring of variable-length records in shared memory.

Theory of operation
-------------------
One process writes, one process reads; every shared word has exactly one writer. Positions are byte counts
that only grow (int64: 2**63 bytes is centuries at memory speed); ``position & (capacity - 1)`` indexes the
data area, so the capacity is a power of two.

Layout at ``offset`` (8-aligned; 128-aligned keeps each line on its own cache lines):

    +0     header line   magic 'NSQPYRNG' | version | layout bytes | capacity | max payload
                         | data offset (from +0; CONTROL_BYTES unless the caller put the data elsewhere) (written once)
    +128   producer line TAIL (committed, store-release) | CLAIM (next free byte, private) | cached HEAD
                         | COUNT slot 0: tail, count | COUNT slot 1: tail, count | CLAIMED count   (producer writes)
                         | WANT_ROOM (the producer waits for room: its reader wakes it, workers/publishing/records.py)
                         | RESERVED (data bytes backed, from index 0) | WANT (how far a claim needed them)
                         | OUTGROWN (full while pages were left)
    +256   consumer line HEAD (released, store-release) | READ (next unread, private)             (consumer writes)
                         | STALLED (its users' flag: the reader cannot take the next record, workers/publishing/records.py)
    +384   data          capacity bytes of records (or at the data offset):

           | int64 header: low 32 bits payload length, high 32 bits type | payload | pad to 8 bytes | next ...

A record never straddles the end of the data area: when it would, the producer first writes a padding record
(type PAD) that fills the rest, and the record starts at index 0. A record is at most capacity/2 bytes, so an
empty ring always accepts any record that passes the size check (given the pages for it, below).

Lazy pages (``Ring.create(..., reserve=)``, for rings in a sparse /dev/shm segment): touching an unreserved page
of a full tmpfs is SIGBUS, so the producer only writes below RESERVED, the data bytes from index 0 that are
backed. A claim that would reach past it fails as FULL and records in WANT how far it needed; ``Ring`` then
reserves more (``reserve(offset, nbytes)``: posix_fallocate, at least doubling, whole pages) and retries, and
a reservation that fails leaves the claim FULL (the caller's ordinary "ring full"; it is retried after
``RESERVE_RETRY``). Before reserving, a claim that reaches RESERVED starts the next lap early when the reader has
released at least half the reserved part of the current lap (a PAD to the end, as at the real end), so the
records stay in the reserved part. Until the reader passes that PAD the producer can only use indexes below the
reader's, so the ring then behaves as one of its reserved size: a claim that finds it full while pages are left
marks it OUTGROWN, and ``Ring`` doubles the reservation (the claim still fails: the ring is full now; the next
laps have the room). So a ring whose reader keeps up stays near its first reservation, and a ring's pages grow
to about twice the most it had to hold at once, not to its capacity. The reader only reads bytes the producer
wrote, so it never touches an unreserved page. RESERVED, WANT and OUTGROWN are the producer's own words (a
restarted producer finds what its predecessor reserved); a crash between a reservation and the RESERVED store
only means those pages are reserved again.

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

import mmap
import time

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE, warm_up_step
from nsqpy.ipc.atomics import copy_bytes, get_word, load_acquire, put_word, py_load_acquire, store_release
from nsqpy.ipc.layout import (H_PARAMS, LINE, LINE_WORDS, align_up, bytes_view, check_header, is_power_of_two,
                        line_words, magic, read_only, stamp_header, words)

__all__ = [
    "Ring", "RingError", "OK", "FULL", "TOO_BIG", "CORRUPT", "PAD", "HEADER_BYTES",
    "ring_claim", "ring_commit", "ring_try_write", "ring_write_batch", "ring_read_batch", "ring_release",
    "ring_release_read", "ring_readable", "ring_free", "ring_can_claim", "ring_committed_count",
    "ring_producer_recover", "ring_consumer_recover", "record_size", "max_payload", "P_RESERVED", "P_WANT",
    "P_OUTGROWN",
]

RING_MAGIC = magic("NSQPYRNG")
RING_VERSION = 2
HEADER_BYTES = 8  # per record
OK, FULL, TOO_BIG, CORRUPT = 0, -1, -2, -3
RESERVE_STEP = 16 << 10  # bytes: the first reservation of a lazy ring's data (then it at least doubles)
RESERVE_RETRY = 0.05     # seconds after a failed reservation before a claim tries to reserve again
PAD = -1  # record type of padding; user types are >= 0

# word indices into the control block (three lines)
_P = line_words(1)
P_TAIL, P_CLAIM, P_CACHED_HEAD, P_S0_TAIL, P_S0_COUNT, P_S1_TAIL, P_S1_COUNT, P_CLAIMED = range(_P, _P + 8)
P_WANT_ROOM = _P + 8  # not used by the ring itself: a flag of its users (workers/publishing/records.py)
# lazy pages: data bytes reserved from index 0, how far a claim needed them, and "full with pages left: grow"
P_RESERVED, P_WANT, P_OUTGROWN = _P + 9, _P + 10, _P + 11
_C = line_words(2)
C_HEAD, C_READ = _C, _C + 1
C_STALLED = _C + 2  # not used by the ring itself: a flag of its users (workers/publishing/records.py)
CONTROL_WORDS = 3 * LINE_WORDS
CONTROL_BYTES = 3 * LINE


@njit(nogil=True, inline="always", **JIT)
def record_size(length):
    return (HEADER_BYTES + length + 7) & ~7


@njit(nogil=True, inline="always", **JIT)
def max_payload(capacity):
    return capacity // 2 - HEADER_BYTES


@njit(nogil=True, inline="always", **JIT)
def _room(ctl, end, cap):
    """Whether the consumer released enough for the producer to write up to position ``end`` (reloading HEAD
    with an acquire load only when the cached copy says no)."""
    if end - ctl[P_CACHED_HEAD] <= cap:
        return True
    ctl[P_CACHED_HEAD] = load_acquire(ctl, C_HEAD)
    return end - ctl[P_CACHED_HEAD] <= cap


@njit(nogil=True, inline="always", **JIT_CALLEE)
def _place(ctl, cap, size):
    """Where the next record of ``size`` bytes goes: -> the padding before it (> 0: it starts at index 0), or
    FULL (no room, or its pages are not reserved: WANT then says how many bytes must be).

    Records end at most at LIMIT: the capacity once every page is reserved, else RESERVED - HEADER_BYTES, so
    that the padding header of an early lap always fits at CLAIM's index."""
    pos = ctl[P_CLAIM]
    idx = pos & (cap - 1)
    reserved = ctl[P_RESERVED]
    limit = cap if reserved >= cap else reserved - HEADER_BYTES
    pad = 0
    if idx + size > cap:  # padding to the end, the record at index 0
        pad = cap - idx
        want = size
    elif idx + size <= limit:
        want = 0
    elif size <= limit and _room(ctl, pos + cap - idx + max(size, limit >> 1), cap):
        return cap - idx  # start the next lap early rather than reserve more (see the module docstring)
    else:
        want = idx + size
    if not _room(ctl, pos + pad + size, cap):
        if reserved < cap:
            ctl[P_OUTGROWN] = 1  # full while pages are left: the backlog outgrew the reserved part
        return FULL
    if want > limit:
        ctl[P_WANT] = min(cap, want + HEADER_BYTES)
        return FULL
    return pad


@njit(nogil=True, **JIT)
def ring_claim(ctl, data, length, rtype):
    """Reserve one record of ``length`` payload bytes and write its header. Returns the payload's index in
    ``data`` (fill it, then ``ring_commit``), or FULL / TOO_BIG. Producer only."""
    cap = data.size
    if length < 0 or length > max_payload(cap) or rtype < 0:
        return TOO_BIG
    size = record_size(length)
    pad = _place(ctl, cap, size)
    if pad < 0:
        return FULL
    pos = ctl[P_CLAIM]
    idx = pos & (cap - 1)
    end = pos + pad + size
    if pad:
        put_word(data, idx, (PAD << 32) | (pad - HEADER_BYTES))
        idx = 0
    put_word(data, idx, (np.int64(rtype) << 32) | length)
    ctl[P_CLAIM] = end
    ctl[P_CLAIMED] += 1
    return idx + HEADER_BYTES


@njit(nogil=True, **JIT)
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


@njit(nogil=True, **JIT)
def ring_try_write(ctl, data, src, src_off, length, rtype):
    """Write and commit one record copied from src[src_off:src_off+length]. Returns OK, FULL or TOO_BIG."""
    at = ring_claim(ctl, data, length, rtype)
    if at < 0:
        return at
    copy_bytes(data, at, src, src_off, length)
    ring_commit(ctl)
    return OK


@njit(nogil=True, **JIT)
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


@njit(nogil=True, **JIT)
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


@njit(nogil=True, **JIT)
def ring_release(ctl, upto):
    """Hand the bytes before position ``upto`` (HEAD <= upto <= READ) back to the producer. Consumer only."""
    store_release(ctl, C_HEAD, upto)


@njit(nogil=True, **JIT)
def ring_release_read(ctl):
    """Release everything read so far. Consumer only."""
    store_release(ctl, C_HEAD, ctl[C_READ])


@njit(nogil=True, **JIT)
def ring_readable(ctl):
    """Committed bytes not yet read (0: nothing to read). Consumer only (it reads its private READ)."""
    return load_acquire(ctl, P_TAIL) - ctl[C_READ]


@njit(nogil=True, **JIT)
def ring_can_claim(ctl, capacity, length):
    """Whether a record of ``length`` payload bytes can be claimed now: room and reserved pages (WANT is set
    when only the pages are missing). Producer only."""
    if length < 0 or length > max_payload(capacity):
        return False
    return _place(ctl, capacity, record_size(length)) >= 0


@njit(nogil=True, **JIT)
def ring_free(ctl, capacity):
    """Bytes the producer could claim now (a record may need padding too). Producer only."""
    return capacity - (ctl[P_CLAIM] - load_acquire(ctl, C_HEAD))


@njit(nogil=True, **JIT)
def ring_committed_count(ctl):
    """Records committed since the ring was created, as recorded with the current TAIL (-1: inconsistent)."""
    tail = load_acquire(ctl, P_TAIL)
    if load_acquire(ctl, P_S0_TAIL) == tail:
        return load_acquire(ctl, P_S0_COUNT)
    if load_acquire(ctl, P_S1_TAIL) == tail:
        return load_acquire(ctl, P_S1_COUNT)
    return -1


@njit(nogil=True, **JIT)
def ring_producer_recover(ctl):
    """Resume a producer at TAIL, dropping claimed but uncommitted records. Returns the committed count."""
    count = ring_committed_count(ctl)
    ctl[P_CLAIM] = ctl[P_TAIL]
    ctl[P_CLAIMED] = count
    ctl[P_CACHED_HEAD] = load_acquire(ctl, C_HEAD)
    return count


@njit(nogil=True, **JIT)
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

    ``data_offset`` puts the data area elsewhere in ``buf`` than right after the control block (many rings can
    then keep their control blocks together, and their data page-aligned). ``reserve(offset, nbytes)`` backs
    bytes of ``buf`` (e.g. ``nsqpy.ipc.shm.Segment.reserver()``): a ring created with it starts with no data page
    reserved and reserves them as its producer first reaches them; a producer must be given it too (it raises
    OSError when it cannot, and the write then fails as a full ring would, with ``out_of_pages`` set: waiting
    for the reader will not help, only free /dev/shm will).
    """

    PRODUCER, CONSUMER = "producer", "consumer"

    def __init__(self, buf, offset: int, role: str | None, max_batch: int, reserve=None):
        self.ctl = words(buf, offset, CONTROL_WORDS, "ring control")
        self.capacity = int(self.ctl[H_PARAMS])
        self._data_at = offset + int(self.ctl[H_PARAMS + 2])
        self.data = bytes_view(buf, self._data_at, self.capacity, "ring data")
        self.max_payload = int(max_payload(self.capacity))
        self.role = role
        self._reserve = reserve
        self._retry_at = 0.0
        self._outgrown_at = -1
        self.out_of_pages = False  # the last write failed because its pages could not be reserved (/dev/shm full)
        self._off = np.zeros(max_batch, np.int64)
        self._len = np.zeros(max_batch, np.int64)
        self._type = np.zeros(max_batch, np.int64)

    @staticmethod
    def size_for(capacity: int) -> int:
        """Bytes of a ring whose data follows its control block."""
        return CONTROL_BYTES + capacity

    @classmethod
    def create(cls, buf, offset: int, capacity: int, role: str | None = None, max_batch: int = 1024,
               data_offset: int | None = None, reserve=None) -> "Ring":
        """A new empty ring; its data at ``data_offset`` of buf (default: after the control block). With
        ``reserve`` the data pages are reserved lazily (class docstring); the control block must be backed."""
        if not is_power_of_two(capacity) or capacity < 64:
            raise RingError(f"ring capacity must be a power of two >= 64, got {capacity}")
        data_at = offset + CONTROL_BYTES if data_offset is None else data_offset
        if data_at % 8 or (data_at < offset + CONTROL_BYTES and data_at + capacity > offset):
            raise RingError(f"ring data at {data_at} overlaps the control block at {offset} or is not 8-aligned")
        ctl = words(buf, offset, CONTROL_WORDS, "ring control")
        bytes_view(buf, data_at, capacity, "ring data")  # capacity check
        ctl[LINE_WORDS:] = 0
        ctl[P_RESERVED] = 0 if reserve is not None else capacity
        stamp_header(ctl, RING_MAGIC, RING_VERSION, cls.size_for(capacity),
                     (capacity, max_payload(capacity), data_at - offset))
        return cls(buf, offset, role, max_batch, reserve)

    @classmethod
    def attach(cls, buf, offset: int, capacity: int | None = None, role: str | None = None,
               max_batch: int = 1024, reserve=None) -> "Ring":
        ctl = words(buf, offset, CONTROL_WORDS, "ring control")
        check_header(ctl, RING_MAGIC, RING_VERSION, None if capacity is None else cls.size_for(capacity),
                     (capacity,), what=f"ring at offset {offset}", names=("capacity",))
        ring = cls(buf, offset, role, max_batch, reserve)
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

    def _reserve_more(self) -> bool:
        """A claim failed: for want of reserved pages (WANT > RESERVED: reserve up to WANT, at least doubling, in
        whole pages), or the ring was OUTGROWN (double the reservation for the next laps, once per position of
        CLAIM: a sender polling a full ring must not double it at every look). -> whether the claim may be
        retried now: False when nothing was missing but room, or the reservation failed (then not tried again
        for RESERVE_RETRY: a full /dev/shm is not asked at every write)."""
        want, have = int(self.ctl[P_WANT]), int(self.ctl[P_RESERVED])
        missing = want > have  # the claim needed pages: it may succeed once they are reserved
        outgrown = False
        if self.ctl[P_OUTGROWN]:
            self.ctl[P_OUTGROWN] = 0
            claim = int(self.ctl[P_CLAIM])
            outgrown = not missing and claim != self._outgrown_at
            if outgrown:
                self._outgrown_at = claim
        if not (missing or outgrown) or self._reserve is None:
            return False
        if time.monotonic() < self._retry_at:
            self.out_of_pages = missing
            return False
        new = min(self.capacity, align_up(max(want, 2 * have, RESERVE_STEP), mmap.PAGESIZE))
        try:
            self._reserve(self._data_at + have, new - have)
        except OSError:
            self._retry_at = time.monotonic() + RESERVE_RETRY
            self.out_of_pages = missing
            return False
        self._retry_at = 0.0
        self.ctl[P_RESERVED] = new  # the producer's own words: nobody else reads them
        return missing  # an outgrown ring is full now all the same

    def write(self, payload, rtype: int = 0) -> bool:
        """Write and commit one record; False if the ring is full (or its pages cannot be reserved)."""
        src = read_only(payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, np.uint8))
        self._check_record(src.size, rtype)
        self.out_of_pages = False
        while True:
            st = ring_try_write(self.ctl, self.data, src, 0, src.size, rtype)
            if st == OK or not self._reserve_more():
                return st == OK

    def write_batch(self, src, offsets, lengths, types, start: int = 0, count: int | None = None) -> int:
        """Write records from one source buffer, committed together (in two or more commits when pages had to
        be reserved on the way); returns how many were written."""
        count = len(lengths) - start if count is None else count
        self.out_of_pages = False
        n = ring_write_batch(self.ctl, self.data, src, offsets, lengths, types, start, count)
        if n == TOO_BIG:
            self._check_record(int(lengths[start]), int(types[start]))
        while 0 <= n < count and self._reserve_more():
            more = ring_write_batch(self.ctl, self.data, src, offsets, lengths, types, start + n, count - n)
            if more <= 0:
                break
            n += more
        return int(n)

    def claim(self, length: int, rtype: int = 0):
        """Reserve one record and return the writable view of its payload (None if full); ``commit`` after."""
        self._check_record(length, rtype)
        self.out_of_pages = False
        while True:
            at = ring_claim(self.ctl, self.data, length, rtype)
            if at >= 0 or not self._reserve_more():
                return None if at < 0 else self.data[at:at + length]

    def can_claim(self, length: int) -> bool:
        """Whether a record of ``length`` payload bytes can be claimed now: the consumer left room for it and its
        pages are reserved (reserving them now if need be)."""
        self.out_of_pages = False
        while True:
            if ring_can_claim(self.ctl, self.capacity, length):
                return True
            if not self._reserve_more():
                return False

    @property
    def reserved(self) -> int:
        """Data bytes backed so far (from index 0; the capacity for a ring created without ``reserve``)."""
        return int(self.ctl[P_RESERVED])

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



def _ring_with_a_record():
    """-> (buffer, ring) of a small ring holding one record (the warm-up's)."""
    buf = np.zeros(Ring.size_for(1 << 12), np.uint8)
    ring = Ring.create(buf, 0, 1 << 12)
    ring.write(np.frombuffer(b"abc", np.uint8).copy(), 1)  # Ring.write passes any payload read-only
    return buf, ring


@warm_up_step
def warm_up():
    """The ring's kernels as its producers and reader call them (workers/lane/warmup.py schedules this)."""
    buf, ring = _ring_with_a_record()
    Ring.attach(buf, 0, 1 << 12, Ring.PRODUCER)  # each child recovers the ends of its rings at its start
    Ring.attach(buf, 0, 1 << 12, Ring.CONSUMER)
    ring.can_claim(3)
    record_size(3)  # a forwarding link's test for room (workers/publishing/links.py)
    ring.read_batch(16)
    ring.release()
    ring.readable()
    ring.free()


@warm_up_step(deferred="rare")
def warm_up_rare():
    """A release up to a position: a link that refused a record offers it again (rare)."""
    _, ring = _ring_with_a_record()
    ring.read_batch(16)
    ring.release(int(ring.ctl[C_READ]))
