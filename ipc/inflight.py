"""The in-flight table of one worker: which messages are out at which connection, until FIN, REQ or timeout.

Theory of operation
-------------------
One writing process, the worker that owns the channels (consumers are moved to it at SUB). The table lives in
shared memory only so that the worker's replacement finds it after a SIGKILL: nobody reads it concurrently.

Slots. A fixed array of slots, each holding one message that a channel handed out: its key (message id, channel),
the topic, its position in the topic's log, and the per-delivery fields (connection, attempts, delivery time,
deadline). A slot's state is FREE, IN_FLIGHT, REQUEUED (REQ 0 or a dead connection: deliver again at once) or
DEFERRED (kept for tables written before deferred messages moved to the worker's deferred store,
``workers/domain/deferred.py``; the broker no longer makes such slots); its ``deadline`` is the timeout for
IN_FLIGHT and the due time for DEFERRED.

The tag word. Every change of a slot is published by ONE store (``store_release``) of its tag word
``generation << 3 | half << 2 | state``. The per-delivery fields exist twice (half 0 and half 1): a change writes
the half the tag does not point at, then flips ``half`` with the tag store. So at every instant a SIGKILL can hit,
each slot is wholly before or wholly after its change, never a mix. The generation grows with every change
(start, touch, requeue, redeliver, release), so an event that names (slot, generation) -- a TIMEOUT from the
scanner, say -- is stale exactly when the generations differ, even if the slot was freed and reused meanwhile.

The index. An open-addressing hash table (linear probing, power-of-two size >= 2 x slots, so it is never more
than half full) maps (message id, channel) to a slot number, so FIN/REQ/TOUCH find their slot in O(1) and can
check that the requesting connection owns it. Deletion shifts later entries of the probe run back
(backward-shift deletion), so there are no tombstones and probes stay short forever. A slot is written and its
tag published before the index points at it.

Recovery. The slots are the truth; the free list, the live count and the index are derived from them. They can be
stale or half-updated after a SIGKILL, so a process that attaches to a table whose writer may have died calls
``recover()`` first: it rebuilds all three from the tags and lists every slot that is not FREE, for the new
process to requeue (at worst a duplicate delivery, never a loss).

Lazy pages (``create(..., reserve=, initial=)``, for a table in a sparse /dev/shm segment). An idle table should
cost little, and touching an unreserved page of a full tmpfs is SIGBUS, so only the first RESERVED slots and the
first INDEX_LEN index entries are backed and ever touched: the kernels get views of exactly those (``slots``,
``index``). The free list holds reserved slots only, so ``start_batch`` finding it empty means "full" to the
kernel; the wrapper then grows the table (``_grow``: at least doubling, up to the capacity): it reserves the
new slots' pages and a larger index (INDEX_LEN stays the power of two >= 2 x RESERVED), calls ``grow_hook``
(the worker's timer heap gets pages for as many handles, ``nsqpy.ipc.heap``), publishes INDEX_LEN, then RESERVED (each with a
store-release, in that order, so INDEX_LEN is always enough for RESERVED), rebuilds free list (ascending, so
slots are handed out from the low end), count and index over the new views, and retries the refused entries.
ST_FULL thus reaches the caller only at the configured capacity, or when /dev/shm cannot back more (not asked
again for ``GROW_RETRY``). New slots are zero pages: FREE, generation 0. A SIGKILL anywhere in a growth leaves
RESERVED either old (the new pages are reserved again next time) or new (their slots are FREE); ``recover()``
re-reads both words, so a replacement whose inherited views predate its predecessor's growth sees every slot.
``set_log_pos`` moves a held message (its body copied forward in the log) with one store of LOG_POS.

Layout (int64 words at a caller-given 8-aligned offset; message ids are uint64 stored bit for bit; the header
line is ipc/layout.py's)::

    +0     +--------------------------------------------------------------------+
           | magic "NSQINFLT" | version | size in bytes | capacity | index_capacity |  header line
    +128   +--------------------------------------------------------------------+
           | free_head | n_live | reserved slots | index length in use             |  control line (`ctl`)
    +256   +--------------------------------------------------------------------+
           | slot 0, 16 words: TAG TOPIC CHANNEL MSG_ID LOG_POS NEXT_FREE           |
           |                   CONN ATTEMPTS DELIVERED DEADLINE   (half 0)          |
           |                   CONN ATTEMPTS DELIVERED DEADLINE   (half 1)          |
           |                   HASH, 1 spare                                      |
           | slot 1 ...                                                         |
    +256 + 128*capacity
           | index[index_capacity]: slot number or -1                           |
           +--------------------------------------------------------------------+
"""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE, warm_up_step
from nsqpy.ipc.atomics import py_load_acquire, py_store_release, store_release
from nsqpy.ipc.layout import LINE, LINE_WORDS, HEADER_WORDS, LayoutError, check_header, magic, stamp_header, words

__all__ = [
    "InFlightTable", "SlotInfo", "inflight_nbytes", "inflight_reserved_ranges", "INFLIGHT_MAGIC", "INFLIGHT_VERSION",
    "C_FREE_HEAD", "C_N_LIVE", "C_RESERVED", "C_INDEX_LEN", "GROW_MIN", "GROW_RETRY",
    "FREE", "IN_FLIGHT", "REQUEUED", "DEFERRED", "STATE_NAMES",
    "SLOT_WORDS", "HALF_WORDS", "S_TAG", "S_TOPIC", "S_CHANNEL", "S_MSG_ID", "S_LOG_POS", "S_NEXT_FREE", "S_HALF0",
    "S_HASH", "F_CONN", "F_ATTEMPTS", "F_DELIVERED", "F_DEADLINE",
    "OK", "ST_FULL", "ST_DUPLICATE", "ST_NOT_FOUND", "ST_NOT_OWNER", "ST_BAD_STATE", "ST_BAD_SLOT", "ST_CORRUPT",
    "inflight_start_batch", "inflight_finish_batch", "inflight_lookup", "inflight_touch", "inflight_requeue",
    "inflight_redeliver", "inflight_release", "inflight_iter_conn", "inflight_recover", "inflight_check",
]

INFLIGHT_MAGIC = magic("NSQINFLT")
INFLIGHT_VERSION = 2

C_FREE_HEAD, C_N_LIVE, C_RESERVED, C_INDEX_LEN = 0, 1, 2, 3  # control-line words
GROW_MIN = 1024      # slots: the least a lazily reserved table grows to
GROW_RETRY = 0.1     # seconds after a failed reservation before start_batch tries to grow again
# slot words (public: bulk readers in the owning worker, e.g. workers/lane/kernels.py, index slots with these)
SLOT_WORDS = 16
S_TAG, S_TOPIC, S_CHANNEL, S_MSG_ID, S_LOG_POS, S_NEXT_FREE, S_HALF0, S_HASH = 0, 1, 2, 3, 4, 5, 6, 14
HALF_WORDS = 4
F_CONN, F_ATTEMPTS, F_DELIVERED, F_DEADLINE = 0, 1, 2, 3   # offsets inside a half

FREE, IN_FLIGHT, REQUEUED, DEFERRED = 0, 1, 2, 3
STATE_NAMES = {FREE: "free", IN_FLIGHT: "in-flight", REQUEUED: "requeued", DEFERRED: "deferred"}

OK = 0
ST_FULL = -1         # no free slot
ST_DUPLICATE = -2    # (message id, channel) already has a slot
ST_NOT_FOUND = -3    # no slot for (message id, channel)
ST_NOT_OWNER = -4    # the slot is in flight at another connection (NSQ: "client does not own message")
ST_BAD_STATE = -5    # the slot is not in a state the operation applies to (e.g. FIN of a requeued message)
ST_BAD_SLOT = -6     # slot number out of range, or a free slot
ST_CORRUPT = -7      # inflight_check found a broken invariant

_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S33 = np.uint64(33)


def inflight_nbytes(capacity: int) -> int:
    return 2 * LINE + 8 * (SLOT_WORDS * capacity + _index_capacity(capacity))


def inflight_reserved_ranges(capacity: int, reserved: int) -> list[tuple[int, int]]:
    """Byte ranges [start, end) of a table of ``capacity`` slots that are backed when ``reserved`` slots are
    (header, control line and those slots; the index in use), relative to the table."""
    index_at = 2 * LINE + 8 * SLOT_WORDS * capacity
    return [(0, 2 * LINE + 8 * SLOT_WORDS * reserved), (index_at, index_at + 8 * _index_capacity(reserved))]


def _index_capacity(capacity: int) -> int:
    return 1 << max(1, (2 * capacity - 1).bit_length())


# ---------------------------------------------------------------------------------------------------- kernels
# Arguments: ctl (the control line), slots (flat int64, SLOT_WORDS per slot), index (int64): views of the layout.

@njit(nogil=True, inline="always", **JIT)
def _state(tag):
    return tag & 3


@njit(nogil=True, inline="always", **JIT_CALLEE)
def _half_base(slots, s):
    """Index of the current half of slot s."""
    return s * SLOT_WORDS + S_HALF0 + ((slots[s * SLOT_WORDS + S_TAG] >> 2) & 1) * HALF_WORDS


@njit(nogil=True, **JIT)
def _hash(msg_id, channel):
    x = np.uint64(msg_id) ^ (np.uint64(channel) * _GOLDEN)
    x ^= x >> _S33
    x *= _MIX1
    x ^= x >> _S33
    x *= _MIX2
    x ^= x >> _S33
    return np.int64(x >> np.uint64(1))


@njit(nogil=True, **JIT_CALLEE)
def _find(slots, index, msg_id, channel, h):
    """-> (slot, index position) of the key, or (-1, the empty position that ends its probe run)."""
    mask = index.shape[0] - 1
    p = h & mask
    while True:
        s = index[p]
        if s < 0:
            return -1, p
        b = s * SLOT_WORDS
        if slots[b + S_MSG_ID] == msg_id and slots[b + S_CHANNEL] == channel:
            return s, p
        p = (p + 1) & mask


@njit(nogil=True, **JIT_CALLEE)
def _index_delete(slots, index, p):
    """Empty index position p and shift back later entries of its probe run that may move (no tombstones)."""
    mask = index.shape[0] - 1
    hole = p
    j = p
    while True:
        j = (j + 1) & mask
        s = index[j]
        if s < 0:
            break
        home = slots[s * SLOT_WORDS + S_HASH] & mask
        if ((j - home) & mask) >= ((j - hole) & mask):  # the hole lies on s's probe path: fill it
            index[hole] = s
            hole = j
    index[hole] = -1


@njit(nogil=True, inline="always", **JIT)
def _commit(slots, s, state, half):
    """Publish slot s's new state with one release store; the generation grows by one."""
    b = s * SLOT_WORDS
    store_release(slots, b + S_TAG, (((slots[b + S_TAG] >> 3) + 1) << 3) | (half << 2) | state)


@njit(nogil=True, inline="always", **JIT_CALLEE)
def _write_half(slots, s, conn, attempts, delivered, deadline):
    """Fill the half the tag does not point at; -> that half's number, for _commit."""
    half = 1 - ((slots[s * SLOT_WORDS + S_TAG] >> 2) & 1)
    hb = s * SLOT_WORDS + S_HALF0 + half * HALF_WORDS
    slots[hb + F_CONN] = conn
    slots[hb + F_ATTEMPTS] = attempts
    slots[hb + F_DELIVERED] = delivered
    slots[hb + F_DEADLINE] = deadline
    return half


@njit(nogil=True, **JIT)
def inflight_start_batch(ctl, slots, index, topic, channel, conn, now, deadline, msg_ids, log_pos, attempts,
                         out_slots):
    """Record delivery i of msg_ids[i] (log_pos[i], attempts[i]) to `conn`: out_slots[i] = its slot, or
    ST_DUPLICATE / ST_FULL. -> the number started."""
    n_ok = 0
    for i in range(msg_ids.shape[0]):
        h = _hash(msg_ids[i], channel)
        found, p = _find(slots, index, msg_ids[i], channel, h)
        if found >= 0:
            out_slots[i] = ST_DUPLICATE
            continue
        s = ctl[C_FREE_HEAD]
        if s < 0:
            out_slots[i] = ST_FULL
            continue
        b = s * SLOT_WORDS
        nxt = slots[b + S_NEXT_FREE]
        slots[b + S_TOPIC] = topic
        slots[b + S_CHANNEL] = channel
        slots[b + S_MSG_ID] = msg_ids[i]
        slots[b + S_LOG_POS] = log_pos[i]
        slots[b + S_HASH] = h
        _commit(slots, s, IN_FLIGHT, _write_half(slots, s, conn, attempts[i], now, deadline))
        ctl[C_FREE_HEAD] = nxt
        ctl[C_N_LIVE] += 1
        index[p] = s
        out_slots[i] = s
        n_ok += 1
    return n_ok


@njit(nogil=True, **JIT)
def inflight_lookup(slots, index, channel, msg_id, conn):
    """The slot of an in-flight message owned by `conn` (FIN/REQ/TOUCH), or ST_NOT_FOUND / ST_BAD_STATE /
    ST_NOT_OWNER."""
    s, _ = _find(slots, index, msg_id, channel, _hash(msg_id, channel))
    if s < 0:
        return ST_NOT_FOUND
    if _state(slots[s * SLOT_WORDS + S_TAG]) != IN_FLIGHT:
        return ST_BAD_STATE
    if slots[_half_base(slots, s) + F_CONN] != conn:
        return ST_NOT_OWNER
    return s


@njit(nogil=True, **JIT_CALLEE)
def _live_slot(ctl, slots, s):
    """-> the state of slot s, or ST_BAD_SLOT when out of range or free."""
    if s < 0 or s >= slots.shape[0] // SLOT_WORDS or _state(slots[s * SLOT_WORDS + S_TAG]) == FREE:
        return ST_BAD_SLOT
    return _state(slots[s * SLOT_WORDS + S_TAG])


@njit(nogil=True, **JIT)
def inflight_release(ctl, slots, index, s):
    """Free a live slot (FIN, or a requeued message handed back to the channel). -> OK or ST_BAD_SLOT."""
    if _live_slot(ctl, slots, s) < 0:
        return ST_BAD_SLOT
    b = s * SLOT_WORDS
    tag = slots[b + S_TAG]
    found, p = _find(slots, index, slots[b + S_MSG_ID], slots[b + S_CHANNEL], slots[b + S_HASH])
    if found == s:
        _index_delete(slots, index, p)
    slots[b + S_NEXT_FREE] = ctl[C_FREE_HEAD]
    _commit(slots, s, FREE, (tag >> 2) & 1)
    ctl[C_FREE_HEAD] = s
    ctl[C_N_LIVE] -= 1
    return OK


@njit(nogil=True, **JIT)
def inflight_finish_batch(ctl, slots, index, channel, msg_ids, conn, out_status, out_slots):
    """FIN each of msg_ids from `conn`: out_status[i] is OK or the lookup's failure, out_slots[i] the freed slot
    (for the scanner's heap) or -1. -> the number finished."""
    n_ok = 0
    for i in range(msg_ids.shape[0]):
        s = inflight_lookup(slots, index, channel, msg_ids[i], conn)
        if s < 0:
            out_status[i] = s
            out_slots[i] = -1
            continue
        inflight_release(ctl, slots, index, s)
        out_status[i] = OK
        out_slots[i] = s
        n_ok += 1
    return n_ok


@njit(nogil=True, **JIT)
def inflight_touch(ctl, slots, s, deadline):
    """TOUCH: a new timeout for an in-flight slot. -> OK / ST_BAD_STATE / ST_BAD_SLOT."""
    state = _live_slot(ctl, slots, s)
    if state != IN_FLIGHT:
        return ST_BAD_SLOT if state < 0 else ST_BAD_STATE
    hb = _half_base(slots, s)
    half = _write_half(slots, s, slots[hb + F_CONN], slots[hb + F_ATTEMPTS], slots[hb + F_DELIVERED], deadline)
    _commit(slots, s, IN_FLIGHT, half)
    return OK


@njit(nogil=True, **JIT)
def inflight_requeue(ctl, slots, s, due):
    """REQ, timeout or disconnect of an in-flight slot: DEFERRED until `due` when due > 0, else REQUEUED. The
    connection becomes -1. -> OK / ST_BAD_STATE / ST_BAD_SLOT."""
    state = _live_slot(ctl, slots, s)
    if state != IN_FLIGHT:
        return ST_BAD_SLOT if state < 0 else ST_BAD_STATE
    hb = _half_base(slots, s)
    half = _write_half(slots, s, -1, slots[hb + F_ATTEMPTS], slots[hb + F_DELIVERED], max(due, 0))
    _commit(slots, s, DEFERRED if due > 0 else REQUEUED, half)
    return OK


@njit(nogil=True, **JIT)
def inflight_redeliver(ctl, slots, s, conn, now, deadline):
    """Deliver a REQUEUED or DEFERRED slot again, to `conn`; attempts grows by one. -> OK / ST_BAD_STATE /
    ST_BAD_SLOT."""
    state = _live_slot(ctl, slots, s)
    if state != REQUEUED and state != DEFERRED:
        return ST_BAD_SLOT if state < 0 else ST_BAD_STATE
    half = _write_half(slots, s, conn, slots[_half_base(slots, s) + F_ATTEMPTS] + 1, now, deadline)
    _commit(slots, s, IN_FLIGHT, half)
    return OK


@njit(nogil=True, **JIT)
def inflight_iter_conn(ctl, slots, conn, out_slots):
    """The in-flight slots of `conn`, ascending, into out_slots (up to its length). -> how many there are (may
    exceed the room)."""
    n = 0
    for s in range(slots.shape[0] // SLOT_WORDS):
        if _state(slots[s * SLOT_WORDS + S_TAG]) == IN_FLIGHT and slots[_half_base(slots, s) + F_CONN] == conn:
            if n < out_slots.shape[0]:
                out_slots[n] = s
            n += 1
    return n


@njit(nogil=True, **JIT)
def inflight_recover(ctl, slots, index, out_slots):
    """Rebuild the free list (ascending), the live count and the index from the slot tags, and list every
    non-free slot in out_slots (up to its length). -> the number of live slots, or ST_DUPLICATE if two live
    slots hold one key (the index then lacks the second; cannot happen through these kernels)."""
    cap = slots.shape[0] // SLOT_WORDS
    index[:] = -1
    free_head = -1
    n = 0
    dup = False
    for s in range(cap - 1, -1, -1):
        b = s * SLOT_WORDS
        if _state(slots[b + S_TAG]) == FREE:
            slots[b + S_NEXT_FREE] = free_head
            free_head = s
            continue
        h = _hash(slots[b + S_MSG_ID], slots[b + S_CHANNEL])
        slots[b + S_HASH] = h
        found, p = _find(slots, index, slots[b + S_MSG_ID], slots[b + S_CHANNEL], h)
        if found >= 0:
            dup = True
        else:
            index[p] = s
        n += 1
    ctl[C_FREE_HEAD] = free_head
    ctl[C_N_LIVE] = n
    k = 0
    for s in range(cap):
        if _state(slots[s * SLOT_WORDS + S_TAG]) != FREE and k < out_slots.shape[0]:
            out_slots[k] = s
            k += 1
    return ST_DUPLICATE if dup else n


@njit(nogil=True, **JIT)
def inflight_check(ctl, slots, index):
    """Verify: every live slot is found through the index at its own position, the index holds nothing else,
    the free list is exactly the free slots, the live count is right. -> OK or ST_CORRUPT."""
    cap = slots.shape[0] // SLOT_WORDS
    n_live = 0
    for s in range(cap):
        b = s * SLOT_WORDS
        if _state(slots[b + S_TAG]) != FREE:
            n_live += 1
            if slots[b + S_HASH] != _hash(slots[b + S_MSG_ID], slots[b + S_CHANNEL]):
                return ST_CORRUPT
            found, _ = _find(slots, index, slots[b + S_MSG_ID], slots[b + S_CHANNEL], slots[b + S_HASH])
            if found != s:
                return ST_CORRUPT
    in_index = 0
    for p in range(index.shape[0]):
        if index[p] >= 0:
            in_index += 1
    n_free = 0
    s = ctl[C_FREE_HEAD]
    while s >= 0 and n_free <= cap:
        if s >= cap or _state(slots[s * SLOT_WORDS + S_TAG]) != FREE:
            return ST_CORRUPT
        n_free += 1
        s = slots[s * SLOT_WORDS + S_NEXT_FREE]
    if n_live != ctl[C_N_LIVE] or in_index != n_live or n_free != cap - n_live:
        return ST_CORRUPT
    return OK


# ---------------------------------------------------------------------------------------------- Python class

class SlotInfo(NamedTuple):
    slot: int
    state: int
    generation: int
    topic: int
    channel: int
    msg_id: int        # uint64
    log_pos: int
    conn: int
    attempts: int
    delivered_ns: int
    deadline_ns: int


class InFlightTable:
    """The in-flight table in `buf` at `offset` (shared memory, an mmap, a bytearray).

    Hot-path calls take numpy arrays and return counts plus per-entry status codes (OK or a negative ST_*); the
    worker maps them to NSQ errors (ST_NOT_FOUND / ST_BAD_STATE / ST_NOT_OWNER -> E_FIN_FAILED and friends).
    Single-slot calls return the status code. Only misuse raises (ValueError).

    ``slots`` and ``index`` are views of the reserved part only (module docstring: lazy pages); they are
    replaced when the table grows, so read them from the table each time rather than keeping them.
    ``reserve(offset, nbytes)`` backs bytes of `buf` (``nsqpy.ipc.shm.Segment.reserver()``; None: all of `buf` is
    backed) and ``grow_hook(slots)`` is called before a growth to `slots` is published (it raises OSError to
    refuse it).

    Resource handling: holds numpy views of `buf` and never frees it; the buffer's owner closes it after dropping
    the table. After attaching to a table whose writer may have died, call ``recover()`` before anything else.
    """

    __slots__ = ("ctl", "slots", "index", "capacity", "_all_slots", "_all_index", "_offset", "_reserve",
                 "_grow_hook", "_retry_at", "_none")

    def __init__(self, buf, offset: int = 0, reserve=None, grow_hook=None):
        """Attach to an initialised table; LayoutError unless magic, version and size match and `buf` holds it."""
        hdr = words(buf, offset, HEADER_WORDS, "in-flight table")
        size, capacity, index_cap = check_header(hdr, INFLIGHT_MAGIC, INFLIGHT_VERSION, what="in-flight table")[:3]
        if size != inflight_nbytes(capacity) or index_cap != _index_capacity(capacity):
            raise LayoutError(f"in-flight table: size {size} or index {index_cap} does not match {capacity} slots")
        whole = words(buf, offset, size // 8, "in-flight table")
        self.ctl = whole[LINE_WORDS:2 * LINE_WORDS]
        self._all_slots = whole[2 * LINE_WORDS:2 * LINE_WORDS + SLOT_WORDS * capacity]
        self._all_index = whole[2 * LINE_WORDS + SLOT_WORDS * capacity:]
        self.capacity = capacity
        self._offset = offset
        self._reserve = reserve
        self._grow_hook = grow_hook
        self._retry_at = 0.0
        self._none = np.empty(0, np.int64)
        self._view()

    def _view(self) -> None:
        """Views of the reserved slots and the index in use, as the control line says now."""
        reserved = int(py_load_acquire(self.ctl, C_RESERVED))
        index_len = int(py_load_acquire(self.ctl, C_INDEX_LEN))
        if not (0 < reserved <= self.capacity and index_len >= _index_capacity(reserved)
                and index_len <= self._all_index.shape[0] and index_len & (index_len - 1) == 0):
            raise LayoutError(f"in-flight table: {reserved} reserved slots and an index of {index_len} do not fit "
                              f"{self.capacity} slots")
        self.slots = self._all_slots[:SLOT_WORDS * reserved]
        self.index = self._all_index[:index_len]

    @classmethod
    def create(cls, buf, offset: int, capacity: int, reserve=None, initial: int | None = None,
               grow_hook=None) -> InFlightTable:
        """Initialise an empty table of `capacity` slots in `buf` (overwriting it) and attach to it. With
        ``initial`` only that many slots are reserved at first (``reserve`` backs their pages); None: all."""
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        size = inflight_nbytes(capacity)
        whole = words(buf, offset, size // 8, "in-flight table")
        reserved = capacity if initial is None else max(1, min(initial, capacity))
        index_len = _index_capacity(reserved)
        index_at = 2 * LINE + 8 * SLOT_WORDS * capacity
        if reserve is not None:
            for start, end in inflight_reserved_ranges(capacity, reserved):
                reserve(offset + start, end - start)
        if grow_hook is not None:
            grow_hook(reserved)
        whole[HEADER_WORDS:2 * LINE_WORDS + SLOT_WORDS * reserved] = 0
        slots = whole[2 * LINE_WORDS:2 * LINE_WORDS + SLOT_WORDS * reserved]
        slots[S_NEXT_FREE::SLOT_WORDS] = np.arange(1, reserved + 1)
        slots[S_NEXT_FREE + SLOT_WORDS * (reserved - 1)] = -1
        whole[index_at // 8:index_at // 8 + index_len] = -1  # empty index
        ctl = whole[LINE_WORDS:2 * LINE_WORDS]
        ctl[C_RESERVED], ctl[C_INDEX_LEN] = reserved, index_len
        stamp_header(whole[:HEADER_WORDS], INFLIGHT_MAGIC, INFLIGHT_VERSION, size,
                     (capacity, _index_capacity(capacity)))
        return cls(buf, offset, reserve, grow_hook)

    def __len__(self) -> int:
        return int(self.ctl[C_N_LIVE])

    @property
    def reserved(self) -> int:
        """Slots usable without growing (all of them in a table created without ``initial``)."""
        return self.slots.shape[0] // SLOT_WORDS

    def _grow(self) -> bool:
        """Reserve more slots (module docstring); False at the capacity or when the reservation failed."""
        old, index_len = self.reserved, self.index.shape[0]
        if old >= self.capacity or time.monotonic() < self._retry_at:
            return False
        new = min(self.capacity, max(2 * old, GROW_MIN))
        new_index = max(index_len, _index_capacity(new))
        try:
            if self._reserve is not None:
                self._reserve(self._offset + 2 * LINE + 8 * SLOT_WORDS * old, 8 * SLOT_WORDS * (new - old))
                index_at = self._offset + 2 * LINE + 8 * SLOT_WORDS * self.capacity
                self._reserve(index_at + 8 * index_len, 8 * (new_index - index_len))
            if self._grow_hook is not None:
                self._grow_hook(new)
        except OSError:
            self._retry_at = time.monotonic() + GROW_RETRY
            return False
        self._all_slots[SLOT_WORDS * old:SLOT_WORDS * new] = 0  # zero pages already, unless the buffer was reused
        py_store_release(self.ctl, C_INDEX_LEN, new_index)
        py_store_release(self.ctl, C_RESERVED, new)
        self._view()
        inflight_recover(self.ctl, self.slots, self.index, self._none)  # free list, count, index for the new size
        return True

    def start_batch(self, topic: int, channel: int, conn: int, now_ns: int, deadline_ns: int,
                    msg_ids: np.ndarray, log_pos: np.ndarray, attempts: np.ndarray, out_slots: np.ndarray) -> int:
        """Record deliveries to `conn`; out_slots[i] = slot or ST_DUPLICATE / ST_FULL. -> number started."""
        ids = _as_i64(msg_ids)
        n = inflight_start_batch(self.ctl, self.slots, self.index, topic, channel, conn, now_ns, deadline_ns,
                                 ids, _as_i64(log_pos), attempts, out_slots)
        count = ids.shape[0]
        while n < count and self.reserved < self.capacity:
            # the free list ran dry at entry k; what follows it either was a duplicate (and still is) or found no
            # slot: grow and start again from k
            full = np.flatnonzero(out_slots[:count] == ST_FULL)
            if len(full) == 0 or not self._grow():
                break
            k = int(full[0])
            n += inflight_start_batch(self.ctl, self.slots, self.index, topic, channel, conn, now_ns, deadline_ns,
                                      ids[k:], _as_i64(log_pos)[k:], attempts[k:], out_slots[k:])
        return n

    def finish_batch(self, channel: int, msg_ids: np.ndarray, conn: int, out_status: np.ndarray,
                     out_slots: np.ndarray) -> int:
        """FIN from `conn`; out_status[i] OK or a failure, out_slots[i] the freed slot or -1. -> number finished."""
        return inflight_finish_batch(self.ctl, self.slots, self.index, channel, _as_i64(msg_ids), conn,
                                     out_status, out_slots)

    def lookup(self, channel: int, msg_id: int, conn: int) -> int:
        """Slot of an in-flight message owned by `conn`, or ST_NOT_FOUND / ST_BAD_STATE / ST_NOT_OWNER."""
        return inflight_lookup(self.slots, self.index, channel, _id_i64(msg_id), conn)

    def touch(self, slot: int, deadline_ns: int) -> int:
        return inflight_touch(self.ctl, self.slots, slot, deadline_ns)

    def requeue(self, slot: int, due_ns: int = 0) -> int:
        """REQUEUED (due_ns <= 0) or DEFERRED until due_ns."""
        return inflight_requeue(self.ctl, self.slots, slot, due_ns)

    def redeliver(self, slot: int, conn: int, now_ns: int, deadline_ns: int) -> int:
        return inflight_redeliver(self.ctl, self.slots, slot, conn, now_ns, deadline_ns)

    def release(self, slot: int) -> int:
        return inflight_release(self.ctl, self.slots, self.index, slot)

    def set_log_pos(self, slot: int, pos: int) -> int:
        """Point a live slot at log position `pos` (its message's body was copied there; the old copy must stay
        readable until this returned). One store-release of the slot's LOG_POS word, which nothing else
        publishes with it, so a SIGKILL leaves the old position or the new one, each naming the same message.
        -> OK, or ST_BAD_SLOT for a slot out of range or free."""
        if not 0 <= slot < self.reserved or int(self.slots[slot * SLOT_WORDS + S_TAG]) & 3 == FREE:
            return ST_BAD_SLOT
        py_store_release(self.slots, slot * SLOT_WORDS + S_LOG_POS, pos)
        return OK

    def iter_conn(self, conn: int) -> np.ndarray:
        """Slots in flight at `conn`, ascending (for requeue-at-once on disconnect)."""
        out = np.empty(min(self.capacity, 1024), np.int64)
        n = inflight_iter_conn(self.ctl, self.slots, conn, out)
        if n > out.shape[0]:
            out = np.empty(n, np.int64)
            n = inflight_iter_conn(self.ctl, self.slots, conn, out)
        return out[:n]

    def recover(self) -> np.ndarray:
        """Rebuild free list, count and index from the slots; -> every non-free slot, ascending. Re-reads how
        much of the table is reserved first (a predecessor may have grown it)."""
        self._view()
        self._retry_at = 0.0
        out = np.empty(self.reserved, np.int64)
        n = inflight_recover(self.ctl, self.slots, self.index, out)
        if n < 0:
            raise ValueError("in-flight table holds two live slots with one (message id, channel)")
        return out[:n]

    def slot(self, s: int) -> SlotInfo:
        """A slot's fields; a slot past the reserved ones is free (generation 0) and is not touched."""
        if not 0 <= s < self.capacity:
            raise ValueError(f"slot {s} outside [0, {self.capacity})")
        if s >= self.reserved:
            return SlotInfo(s, FREE, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        w = self.slots[s * SLOT_WORDS:(s + 1) * SLOT_WORDS].copy()
        tag = int(w[S_TAG])
        half = S_HALF0 + ((tag >> 2) & 1) * HALF_WORDS
        return SlotInfo(s, tag & 3, tag >> 3, int(w[S_TOPIC]), int(w[S_CHANNEL]), int(w[S_MSG_ID]) & (2**64 - 1),
                        int(w[S_LOG_POS]), *(int(v) for v in w[half:half + HALF_WORDS]))

    def generation(self, s: int) -> int:
        return int(self.slots[s * SLOT_WORDS + S_TAG]) >> 3 if s < self.reserved else 0

    def check(self) -> None:
        if inflight_check(self.ctl, self.slots, self.index) != OK:
            raise AssertionError("in-flight table invariants broken")


def _as_i64(ids: np.ndarray) -> np.ndarray:
    """uint64 message ids as the int64 words the kernels compare (same bits, no copy)."""
    return ids.view(np.int64) if ids.dtype == np.uint64 else ids


def _id_i64(msg_id: int) -> int:
    return msg_id - (1 << 64) if msg_id >= (1 << 63) else msg_id


@warm_up_step
def warm_up():
    """The table's kernels as a worker calls them (workers/lane/warmup.py schedules this before fork)."""
    table = InFlightTable.create(bytearray(inflight_nbytes(64)), 0, 64)
    ids = np.array([11, 12, 13], np.uint64).view(np.int64)
    slots = np.empty(3, np.int64)
    table.start_batch(1, 1, 5, 0, 10, ids, np.array([0, 8, 16], np.int64), np.ones(3, np.int64), slots)
    table.finish_batch(1, ids[:1], 5, np.empty(1, np.int64), np.empty(1, np.int64))
    s = table.lookup(1, 12, 5)
    table.touch(s, 20)
    table.requeue(s, 0)
    table.redeliver(s, 5, 0, 30)
    table.iter_conn(5)
    table.release(s)  # a requeued message handed back to its channel
    table.recover()
