"""Timer heaps for the scanner: a binary min-heap of (deadline ns, handle) in a caller-given buffer.

Theory of operation
-------------------
Two users: the scanner keeps one heap per worker in shared memory for in-flight deadlines (handles are the
worker's timer batches, ``workers/timing/timer_batches.py``), and each worker's deferred store keeps one in its own memory for
due times (handles are store entries, ``workers/domain/deferred.py``). Each entry is a key (a time in ns) and a handle
(a small non-negative int).

As in NSQ's ``in_flight_pqueue.go`` the heap is intrusive: ``pos[handle]`` holds the entry's index in the heap
(-1 when absent), so remove(handle) and update(handle, key) are O(log n) without a search. Entries are ordered by
(key, handle), so equal deadlines pop in handle order and every sequence of operations has one exact result.

Sifting moves a "hole" instead of swapping: the entry being placed is held in registers, the entries it passes are
moved one step each, and it is written once at the end. That halves the stores of a swap-based sift.

``peek_and_shift(deadline, out_handles, out_keys)`` is NSQ's PeekAndShift, batched: it pops every entry whose key
is <= deadline (up to the room in the output arrays) in one kernel call, so a sweep costs one call.

Ownership and crashes: one writing process (the scanner); nothing here is atomic, and a reader in another process
must be handed the heap by something that orders memory (a pipe, a ring's release/acquire). A SIGKILL in the middle
of an operation can leave one entry duplicated or missing, so the heap is derived state: the in-flight table
(ipc/inflight.py) holds every deadline and is the source of truth a restarted scanner rebuilds from (``clear`` and
push, or write the arrays and ``rebuild``).

Lazy pages (``create(..., reserve=, initial=)``, for heaps in a sparse /dev/shm segment): only the first RESERVED
entries of each array are backed and initialised, and the views the kernels get (``keys``, ``vals``, ``pos``)
end there, so a kernel never touches an unreserved page (SIGBUS on a full tmpfs). With fewer handles than
RESERVED, no handle past it can be pushed, and the heap never holds more entries than handles, so keys and vals
need no more either. The heap's writer grows it when it meets a handle past its views (``grow``: reserve the
pages, set the new pos entries to -1, publish RESERVED with a store-release, view the new entries), so the
memory and the reservation word keep one writer. Another process may back pages ahead of it
(``reserve_pages``: posix_fallocate only, nothing written): in the broker a worker's timer batches (the
handles) never outnumber its in-flight slots, so the worker's in-flight table backs its heap's pages whenever
it grows itself (``nsqpy.ipc.inflight``'s ``grow_hook``), and the scanner's later ``grow`` then finds them backed even
on a full /dev/shm (reserving pages that are already backed needs no space). A crash in a growth before the
publication only makes the next one redo it.

Layout (all words int64, little-endian, at a caller-given offset that is a multiple of 8; the header line is
ipc/layout.py's)::

    +0    +---------------------------------------------------------------+
          | magic "NSQTHEAP" | version | size in bytes | capacity | n_handles |  header line (LINE bytes)
    +128  +---------------------------------------------------------------+
          | count (entries now)                                           |  control line: the kernels' `ctl`
    +256  +---------------------------------------------------------------+
          | reserved (entries backed in each array)                       |  reservation line (the grower)
    +384  +---------------------------------------------------------------+
          | keys[capacity]                                                |  keys[0] is the minimum
          +---------------------------------------------------------------+
          | handles[capacity]                                             |  handles[i] belongs to keys[i]
          +---------------------------------------------------------------+
          | pos[n_handles]                                                |  index of a handle, or -1
          +---------------------------------------------------------------+
    +384 + 16*capacity + 8*n_handles
"""
from __future__ import annotations

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE, warm_up_step
from nsqpy.ipc.atomics import py_load_acquire, py_store_release
from nsqpy.ipc.layout import LINE, LINE_WORDS, HEADER_WORDS, LayoutError, check_header, magic, stamp_header, words

__all__ = [
    "TimerHeap", "HeapFull", "HEAP_MAGIC", "HEAP_VERSION", "C_COUNT", "heap_nbytes", "heap_reserved_ranges",
    "OK", "ST_EMPTY", "ST_FULL", "ST_BAD_HANDLE", "ST_PRESENT", "ST_ABSENT", "ST_CORRUPT",
    "heap_push", "heap_peek", "heap_pop", "heap_remove", "heap_update", "heap_peek_and_shift",
    "heap_clear", "heap_rebuild", "heap_check",
]

HEAP_MAGIC = magic("NSQTHEAP")
HEAP_VERSION = 2
C_COUNT = 0  # control-line word: the number of entries
ROOT = np.int64(0)  # index 0 as a typed value: a literal 0 argument would compile its own copy of _take and
                    # everything it calls (numba specializes a callee on Literal[int] arguments)
R_RESERVED = LINE_WORDS  # word of the reservation line (counted from the control line): entries backed

OK = 0
ST_EMPTY = -1        # pop/peek on an empty heap
ST_FULL = -2         # push with size == capacity
ST_BAD_HANDLE = -3   # handle outside [0, n_handles)
ST_PRESENT = -4      # push of a handle that is already in the heap
ST_ABSENT = -5       # remove/update of a handle that is not in the heap
ST_CORRUPT = -6      # heap_check found a broken invariant


def heap_nbytes(capacity: int, n_handles: int) -> int:
    return 3 * LINE + 8 * (2 * capacity + n_handles)


def heap_reserved_ranges(capacity: int, n_handles: int, reserved: int) -> list[tuple[int, int]]:
    """Byte ranges [start, end) of a heap that are backed with ``reserved`` entries, relative to the heap."""
    arrays = 3 * LINE
    return [(0, arrays), (arrays, arrays + 8 * min(reserved, capacity)),
            (arrays + 8 * capacity, arrays + 8 * (capacity + min(reserved, capacity))),
            (arrays + 16 * capacity, arrays + 8 * (2 * capacity + min(reserved, n_handles)))]


# ---------------------------------------------------------------------------------------------------- kernels
# Arguments: ctl (the control line), keys, vals (handles), pos: 1-D int64 views of the layout.

@njit(nogil=True, inline="always", **JIT_CALLEE)
def _less(k1, h1, k2, h2):
    return k1 < k2 or (k1 == k2 and h1 < h2)


@njit(nogil=True, **JIT_CALLEE)
def _sift_up(keys, vals, pos, i, key, handle):
    while i > 0:
        parent = (i - 1) >> 1
        if not _less(key, handle, keys[parent], vals[parent]):
            break
        keys[i] = keys[parent]
        vals[i] = vals[parent]
        pos[vals[i]] = i
        i = parent
    keys[i] = key
    vals[i] = handle
    pos[handle] = i


@njit(nogil=True, **JIT_CALLEE)
def _sift_down(keys, vals, pos, size, i, key, handle):
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and _less(keys[right], vals[right], keys[child], vals[child]):
            child = right
        if not _less(keys[child], vals[child], key, handle):
            break
        keys[i] = keys[child]
        vals[i] = vals[child]
        pos[vals[i]] = i
        i = child
    keys[i] = key
    vals[i] = handle
    pos[handle] = i


@njit(nogil=True, **JIT_CALLEE)
def _place(keys, vals, pos, size, i, key, handle):
    """Put (key, handle) into the hole at index i of a heap of `size` entries and restore order."""
    if i > 0 and _less(key, handle, keys[(i - 1) >> 1], vals[(i - 1) >> 1]):
        _sift_up(keys, vals, pos, i, key, handle)
    else:
        _sift_down(keys, vals, pos, size, i, key, handle)


@njit(nogil=True, **JIT)
def _take(ctl, keys, vals, pos, i):
    """Remove the entry at index i (0 <= i < size); the last entry fills the hole."""
    last = ctl[C_COUNT] - 1
    pos[vals[i]] = -1
    ctl[C_COUNT] = last
    if i != last:
        _place(keys, vals, pos, last, i, keys[last], vals[last])


@njit(nogil=True, **JIT)
def heap_push(ctl, keys, vals, pos, key, handle):
    if handle < 0 or handle >= pos.shape[0]:
        return ST_BAD_HANDLE
    if pos[handle] >= 0:
        return ST_PRESENT
    size = ctl[C_COUNT]
    if size >= keys.shape[0]:
        return ST_FULL
    ctl[C_COUNT] = size + 1
    _sift_up(keys, vals, pos, size, key, handle)
    return OK


@njit(nogil=True, **JIT)
def heap_peek(ctl, keys, vals):
    """-> (status, key, handle) of the minimum, without removing it."""
    if ctl[C_COUNT] == 0:
        return ST_EMPTY, 0, -1
    return OK, keys[0], vals[0]


@njit(nogil=True, **JIT)
def heap_pop(ctl, keys, vals, pos):
    """-> (status, key, handle) of the removed minimum."""
    if ctl[C_COUNT] == 0:
        return ST_EMPTY, 0, -1
    key = keys[0]
    handle = vals[0]
    _take(ctl, keys, vals, pos, ROOT)
    return OK, key, handle


@njit(nogil=True, **JIT)
def heap_remove(ctl, keys, vals, pos, handle):
    """-> (status, key the handle had)."""
    if handle < 0 or handle >= pos.shape[0]:
        return ST_BAD_HANDLE, 0
    i = pos[handle]
    if i < 0:
        return ST_ABSENT, 0
    key = keys[i]
    _take(ctl, keys, vals, pos, i)
    return OK, key


@njit(nogil=True, **JIT)
def heap_update(ctl, keys, vals, pos, handle, new_key):
    if handle < 0 or handle >= pos.shape[0]:
        return ST_BAD_HANDLE
    i = pos[handle]
    if i < 0:
        return ST_ABSENT
    _place(keys, vals, pos, ctl[C_COUNT], i, new_key, handle)
    return OK


@njit(nogil=True, **JIT)
def heap_peek_and_shift(ctl, keys, vals, pos, deadline, out_handles, out_keys):
    """Pop every entry with key <= deadline, in order, into the output arrays (at most their length).
    -> the number popped; call again when it equals the room given."""
    room = min(out_handles.shape[0], out_keys.shape[0])
    n = 0
    while n < room and ctl[C_COUNT] > 0 and keys[0] <= deadline:
        out_keys[n] = keys[0]
        out_handles[n] = vals[0]
        _take(ctl, keys, vals, pos, ROOT)
        n += 1
    return n


@njit(nogil=True, **JIT)
def heap_clear(ctl, vals, pos):
    for i in range(ctl[C_COUNT]):
        h = vals[i]
        if 0 <= h < pos.shape[0]:
            pos[h] = -1
    ctl[C_COUNT] = 0


@njit(nogil=True, **JIT)
def heap_rebuild(ctl, keys, vals, pos):
    """Restore heap order and pos[] after the first `size` (key, handle) pairs were written in any order
    (Floyd's bottom-up heapify, O(n)). -> OK, or ST_BAD_HANDLE / ST_PRESENT for a bad or repeated handle."""
    size = ctl[C_COUNT]
    pos[:] = -1
    for i in range(size):
        h = vals[i]
        if h < 0 or h >= pos.shape[0]:
            return ST_BAD_HANDLE
        if pos[h] >= 0:
            return ST_PRESENT
        pos[h] = i
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(keys, vals, pos, size, i, keys[i], vals[i])
    return OK


@njit(nogil=True, **JIT)
def heap_check(ctl, keys, vals, pos):
    """Verify heap order, pos[] both ways and the size bound. -> OK or ST_CORRUPT."""
    size = ctl[C_COUNT]
    if size < 0 or size > keys.shape[0]:
        return ST_CORRUPT
    present = 0
    for h in range(pos.shape[0]):
        i = pos[h]
        if i >= 0:
            if i >= size or vals[i] != h:
                return ST_CORRUPT
            present += 1
        elif i != -1:
            return ST_CORRUPT
    if present != size:
        return ST_CORRUPT
    for i in range(1, size):
        parent = (i - 1) >> 1
        if _less(keys[i], vals[i], keys[parent], vals[parent]):
            return ST_CORRUPT
    return OK


# ---------------------------------------------------------------------------------------------- Python class

class HeapFull(Exception):
    """push on a heap holding `capacity` entries."""


class TimerHeap:
    """A min-heap of (deadline ns, handle) living in `buf` at `offset` (shared memory, an mmap, a bytearray).

    ``keys``, ``vals`` and ``pos`` are views of the reserved entries (module docstring: lazy pages), replaced by
    ``refresh`` and ``grow``. ``reserve(offset, nbytes)`` backs bytes of `buf` (``nsqpy.ipc.shm.Segment.reserver()``;
    None: all of `buf` is backed).

    Resource handling: the object holds numpy views of `buf` and never frees it; the owner of the buffer closes
    it after dropping the heap. Error handling: status codes from the kernels become exceptions here (HeapFull,
    KeyError for an absent handle, ValueError for a handle out of range or already present).
    """

    __slots__ = ("ctl", "keys", "vals", "pos", "capacity", "n_handles", "_rline", "_all_keys", "_all_vals",
                 "_all_pos", "_offset", "_reserve")

    def __init__(self, buf, offset: int = 0, reserve=None):
        """Attach to an initialised heap; LayoutError unless magic, version and size match and `buf` holds it."""
        hdr = words(buf, offset, HEADER_WORDS, "timer heap")
        size, capacity, n_handles = check_header(hdr, HEAP_MAGIC, HEAP_VERSION, what="timer heap")[:3]
        if size != heap_nbytes(capacity, n_handles):
            raise LayoutError(f"timer heap: size {size} does not match capacity {capacity}, {n_handles} handles")
        whole = words(buf, offset, size // 8, "timer heap")
        arrays = whole[3 * LINE_WORDS:]
        self.ctl = whole[LINE_WORDS:2 * LINE_WORDS]
        self._rline = whole[2 * LINE_WORDS:3 * LINE_WORDS]
        self._all_keys = arrays[:capacity]
        self._all_vals = arrays[capacity:2 * capacity]
        self._all_pos = arrays[2 * capacity:]
        self.capacity, self.n_handles = capacity, n_handles
        self._offset = offset
        self._reserve = reserve
        self.refresh()

    @classmethod
    def create(cls, buf, offset: int, capacity: int, n_handles: int, reserve=None,
               initial: int | None = None) -> TimerHeap:
        """Initialise an empty heap in `buf` (overwriting what is there) and attach to it. With ``initial`` only
        that many entries are reserved at first (``reserve`` backs their pages); None: all."""
        if capacity < 1 or n_handles < 1:
            raise ValueError("capacity and n_handles must be >= 1")
        size = heap_nbytes(capacity, n_handles)
        whole = words(buf, offset, size // 8, "timer heap")
        if reserve is not None:
            reserve(offset, 3 * LINE)
        whole[HEADER_WORDS:3 * LINE_WORDS] = 0
        stamp_header(whole[:HEADER_WORDS], HEAP_MAGIC, HEAP_VERSION, size, (capacity, n_handles))
        heap = cls(buf, offset, reserve)
        heap.grow(max(capacity, n_handles) if initial is None else initial)
        return heap

    @property
    def reserved(self) -> int:
        """Entries backed in each array, as published."""
        return int(py_load_acquire(self._rline, 0))

    def refresh(self) -> int:
        """Views up to the published reservation; -> the handles usable now."""
        r = self.reserved
        self.keys = self._all_keys[:min(r, self.capacity)]
        self.vals = self._all_vals[:min(r, self.capacity)]
        self.pos = self._all_pos[:min(r, self.n_handles)]
        return self.pos.shape[0]

    def reserve_pages(self, n: int, old: int | None = None) -> None:
        """(Any process) back the pages of the first n entries of every array (from entry ``old``, default the
        published reservation); writes nothing. Raises OSError (SegmentError) when they cannot be reserved."""
        old = self.reserved if old is None else old
        if self._reserve is None or n <= old:
            return
        base = self._offset + 3 * LINE
        for start, length in ((0, self.capacity), (8 * self.capacity, self.capacity),
                              (16 * self.capacity, self.n_handles)):
            lo, hi = min(old, length), min(n, length)
            if hi > lo:
                self._reserve(base + start + 8 * lo, 8 * (hi - lo))

    def grow(self, n: int) -> None:
        """(The heap's writer) make the first n entries usable: back their pages, mark the new handles absent,
        publish, view them (module docstring). Raises OSError (SegmentError) when they cannot be reserved."""
        old = self.reserved
        n = min(n, max(self.capacity, self.n_handles))
        if n <= old:
            self.refresh()
            return
        self.reserve_pages(n, old)
        self._all_pos[min(old, self.n_handles):min(n, self.n_handles)] = -1  # no handle present
        py_store_release(self._rline, 0, n)
        self.refresh()

    def __len__(self) -> int:
        return int(self.ctl[C_COUNT])

    def __contains__(self, handle: int) -> bool:
        return 0 <= handle < self.pos.shape[0] and self.pos[handle] >= 0

    def key_of(self, handle: int) -> int:
        i = self.pos[handle] if 0 <= handle < self.pos.shape[0] else -1
        if i < 0:
            raise KeyError(handle)
        return int(self.keys[i])

    def push(self, key: int, handle: int) -> None:
        if handle >= self.pos.shape[0]:
            self.refresh()
        self._raise(heap_push(self.ctl, self.keys, self.vals, self.pos, key, handle), handle)

    def peek(self) -> tuple[int, int] | None:
        """(key, handle) of the minimum, or None when empty."""
        st, key, handle = heap_peek(self.ctl, self.keys, self.vals)
        return None if st == ST_EMPTY else (key, handle)

    def pop(self) -> tuple[int, int] | None:
        st, key, handle = heap_pop(self.ctl, self.keys, self.vals, self.pos)
        return None if st == ST_EMPTY else (key, handle)

    def remove(self, handle: int) -> int:
        """Remove `handle`; returns the key it had."""
        st, key = heap_remove(self.ctl, self.keys, self.vals, self.pos, handle)
        self._raise(st, handle)
        return key

    def update(self, handle: int, key: int) -> None:
        self._raise(heap_update(self.ctl, self.keys, self.vals, self.pos, handle, key), handle)

    def peek_and_shift(self, deadline: int, out_handles: np.ndarray, out_keys: np.ndarray) -> int:
        """Pop every entry with key <= deadline into the int64 output arrays (up to their length); -> count."""
        return heap_peek_and_shift(self.ctl, self.keys, self.vals, self.pos, deadline, out_handles, out_keys)

    def clear(self) -> None:
        """Empty the heap (a restarted scanner: its inherited views may predate growths, so refresh first)."""
        self.refresh()
        heap_clear(self.ctl, self.vals, self.pos)

    def rebuild(self, keys: np.ndarray, handles: np.ndarray) -> None:
        """Replace the content with the given pairs in O(n) (a restarted scanner reloading its timers)."""
        self.refresh()
        n = len(keys)
        if n != len(handles) or n > self.keys.shape[0]:
            raise HeapFull(f"{n} entries for a heap of capacity {self.capacity} ({self.keys.shape[0]} reserved)")
        self.keys[:n], self.vals[:n] = keys, handles
        self.ctl[C_COUNT] = n
        st = heap_rebuild(self.ctl, self.keys, self.vals, self.pos)
        if st != OK:
            heap_clear(self.ctl, self.vals, self.pos)
            raise ValueError("rebuild: a handle is out of range or repeated")

    def check(self) -> None:
        if heap_check(self.ctl, self.keys, self.vals, self.pos) != OK:
            raise AssertionError("timer heap invariants broken")

    def _raise(self, st: int, handle: int) -> None:
        if st == OK:
            return
        if st == ST_FULL:
            raise HeapFull(f"timer heap full ({self.capacity} entries)")
        if st == ST_ABSENT:
            raise KeyError(handle)
        if st == ST_PRESENT:
            raise ValueError(f"handle {handle} is already in the heap")
        raise ValueError(f"handle {handle} outside [0, {self.pos.shape[0]}) (of {self.n_handles})")


@warm_up_step
def warm_up():
    """The heap's kernels as the scanner calls them (workers/lane/warmup.py schedules this before fork)."""
    heap = TimerHeap.create(bytearray(heap_nbytes(64, 64)), 0, 64, 64)
    heap.peek_and_shift(100, np.empty(8, np.int64), np.empty(8, np.int64))
    heap.clear()
