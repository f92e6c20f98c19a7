"""One-writer row tables in shared memory: numbers a process publishes for any other process to read.

Theory of operation
-------------------
The stats plane (``nsqpy/broker/stats.py``) needs every topic, channel and client counter of a worker in other
processes (the HTTP API, statsd), with no lock a crashed writer could leave held and no per-increment cost. This
module knows nothing of topics: it gives a writer a growable table of fixed-size rows and readers a consistent
copy of it.

* **Board** (one segment, created before fork by the supervisor, fixed size): per writer one line of words only
  it writes (``GEN`` of its current table, ``DONE``, publication time, its pid and start time, a few user words)
  and one line of its own for readers (``REQUEST``). A reader that wants fresh numbers takes a ticket
  (fetch_add on ``REQUEST``) and waits until the writer stored ``DONE`` >= its ticket: the writer reads
  ``REQUEST`` once per loop iteration (one plain load), publishes what changed and then stores the value it read.
* **Table** (one segment per writer and generation, created by the writer under the broker's segment-name prefix,
  so shutdown and dead-instance cleanup remove it; only once it has a row, so an idle writer holds none): a header
  line, a line with ``HWM`` (rows in use are below it) and then ``capacity`` rows of ROW_WORDS int64 words. When
  rows run out the writer creates the next generation with twice the capacity, copies the rows, publishes the new
  ``GEN`` on the board and unlinks the old name (readers that still map it read a consistent, stale copy until
  they look at the board again). A restarted writer unlinks its predecessor's table and starts over. Generation
  numbers come from the board's ``GENS`` word and are never reused. So memory grows with the rows in use, never
  with a worst case; freed rows are reused (a free list), the table never shrinks.
* **Row**: ``GEN | KIND | UID | body (29 words)``. The body's first IMMUTABLE_WORDS words are written once, when
  the row is created (a name, a parent's UID); then come two copies of COPY_WORDS counters (double buffering, as
  ``ipc/msglog_layout``): an update writes the copy the readers are not told to read and then store-releases
  ``GEN + 1``, whose parity names the copy to read. KIND 0 is a free row. Rows are reused; UIDs never are (they
  carry the writer's first generation in their top bits), which is what makes a reused row detectable.

Why a crashed writer can never make a reader spin or read torn data:
    create  UID is stored (and fenced) before the body, KIND is store-released last; a writer dying before that
            leaves KIND 0: the row is simply not there.
    update  the writer only ever touches the copy readers are not reading; dying mid-update leaves GEN alone, so
            the readable copy is the last whole one.
    free    one store of KIND 0.
A reader copies a row and accepts it only if KIND, UID and GEN read the same after the copy (with a fence in
between); otherwise it copies again, at most ``tries`` times (only a live writer updating that very row more than
``tries`` times during one copy could exhaust that), then leaves the row out and counts it as torn. It never
waits on the writer.

Memory ordering follows ``ipc/atomics``: writer stores, then a release store of the publishing word; reader
acquire-loads it, reads, fences, re-checks. A batch of updates starts with one fence so that the previous GEN
stores are ordered before the new copy writes (the seqlock writer's barrier).
"""
from __future__ import annotations

import errno

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, warm_up_step
from nsqpy.ipc.atomics import cpu_pause, fence, load_acquire, py_fetch_add, py_load_acquire, py_store_release, \
    store_release
from nsqpy.ipc.layout import LINE, LINE_WORDS, HEADER_WORDS, check_header, magic, stamp_header, words
from nsqpy.ipc.shm import Segment, SegmentError, _start_time, own_start, unlink_name

__all__ = ["Board", "RowTable", "RowWriter", "RowReader", "ROW_WORDS", "R_GEN", "R_KIND", "R_UID", "R_BODY",
           "BODY_WORDS", "IMMUTABLE_WORDS", "COPY_WORDS", "COPY_A", "COPY_B", "FREE", "counters_of",
           "UID_SHIFT", "USER_WORDS", "writer_alive", "warm_up"]

ROW_WORDS = 32
R_GEN, R_KIND, R_UID, R_BODY = 0, 1, 2, 3
BODY_WORDS = ROW_WORDS - R_BODY
IMMUTABLE_WORDS = 11                # body words 0..10 (row words 3..13): written once, at creation
COPY_WORDS = 9
COPY_A = R_BODY + IMMUTABLE_WORDS   # row word 14
COPY_B = COPY_A + COPY_WORDS        # row word 23 (the last copy ends at word 31)
assert COPY_B + COPY_WORDS == ROW_WORDS
FREE = 0
UID_SHIFT = 40                      # uid = first generation << UID_SHIFT | counter
TRIES = 64

TABLE_MAGIC = magic("NSQROWS1")
TABLE_VERSION = 1
T_HWM = LINE_WORDS                  # line 1, word 0
ROWS_AT = 2 * LINE_WORDS            # rows start at line 2
MIN_CAPACITY = 64
_PADS = [(0,) * (COPY_WORDS - k) for k in range(COPY_WORDS + 1)]  # counters are tuples of up to COPY_WORDS ints

BOARD_MAGIC = magic("NSQBOARD")
BOARD_VERSION = 1
B_GLOBAL = LINE_WORDS               # line 1: words the board's creator writes (e.g. the broker's start time)
B_GEN, B_DONE, B_PUBLISHED_NS, B_PID, B_PID_START, B_ROWS, B_PUBLISHES, B_GENS = range(8)
B_USER = 8                          # writer words 8..15 are the user's (what the writer wants to show)
USER_WORDS = LINE_WORDS - B_USER


# ---- kernels --------------------------------------------------------------------------------------------
@njit(nogil=True, **JIT)
def _create(tbl, idx, kinds, uids, bodies):
    for j in range(idx.size):
        r = ROWS_AT + idx[j] * ROW_WORDS
        # the row is free now (readers skip it); one that began copying its previous incarnation must find the
        # new UID before any word of the new body: UID first, then the fence, then the body
        store_release(tbl, r + R_UID, uids[j])
        fence()
        tbl[r + R_GEN] = 0
        for k in range(BODY_WORDS):
            tbl[r + R_BODY + k] = bodies[j, k]
        store_release(tbl, r + R_KIND, kinds[j])


@njit(nogil=True, **JIT)
def _update(tbl, idx, counters):
    fence()  # the last batch's GEN stores before this batch's copy writes (see the module docstring)
    for j in range(idx.size):
        r = ROWS_AT + idx[j] * ROW_WORDS
        g = tbl[r + R_GEN]
        c = r + (COPY_B if (g + 1) & 1 else COPY_A)
        for k in range(COPY_WORDS):
            tbl[c + k] = counters[j, k]
        store_release(tbl, r + R_GEN, g + 1)


@njit(nogil=True, **JIT)
def _free(tbl, idx):
    for j in range(idx.size):
        store_release(tbl, ROWS_AT + idx[j] * ROW_WORDS + R_KIND, FREE)


@njit(nogil=True, **JIT)
def _copy(tbl, hwm, out, tries, counts):
    """Copy every live row below hwm into out (compacted); counts = [rows copied, rows left out as torn]."""
    n = 0
    torn = 0
    for i in range(hwm):
        r = ROWS_AT + i * ROW_WORDS
        settled = False
        for _ in range(tries):
            k1 = load_acquire(tbl, r + R_KIND)
            if k1 == FREE:
                settled = True
                break
            u1 = load_acquire(tbl, r + R_UID)
            g1 = load_acquire(tbl, r + R_GEN)
            for w in range(ROW_WORDS):
                out[n, w] = tbl[r + w]
            fence()
            if load_acquire(tbl, r + R_GEN) == g1 and load_acquire(tbl, r + R_UID) == u1 \
                    and load_acquire(tbl, r + R_KIND) == k1:
                out[n, R_GEN] = g1
                out[n, R_KIND] = k1
                out[n, R_UID] = u1
                n += 1
                settled = True
                break
            cpu_pause()
        if not settled:
            torn += 1
    counts[0] = n
    counts[1] = torn


def counters_of(rows: np.ndarray) -> np.ndarray:
    """The readable copy of the counters of each copied row: (n, COPY_WORDS)."""
    odd = (rows[:, R_GEN] & 1).astype(bool)[:, None]
    return np.where(odd, rows[:, COPY_B:COPY_B + COPY_WORDS], rows[:, COPY_A:COPY_A + COPY_WORDS])


# ---- the board ------------------------------------------------------------------------------------------
class Board:
    """Per-writer lines: the writer's (GEN, DONE, ...) and the readers' (REQUEST). Created once, before fork."""

    def __init__(self, buf, writers: int):
        self.writers = writers
        self.w = words(buf, 0, self.nbytes(writers) // 8, "stats board")
        check_header(self.w[:HEADER_WORDS], BOARD_MAGIC, BOARD_VERSION, self.nbytes(writers), (writers,),
                     what="stats board", names=("writers",))

    @staticmethod
    def nbytes(writers: int) -> int:
        return LINE * (2 + 2 * writers)

    @classmethod
    def create(cls, buf, writers: int) -> "Board":
        w = words(buf, 0, cls.nbytes(writers) // 8, "stats board")
        w[:] = 0
        stamp_header(w[:HEADER_WORDS], BOARD_MAGIC, BOARD_VERSION, cls.nbytes(writers), (writers,))
        return cls(buf, writers)

    @classmethod
    def attach(cls, buf) -> "Board":
        """A board someone else created (its writer count is read from its header)."""
        hdr = words(buf, 0, HEADER_WORDS, "stats board")
        _, writers = check_header(hdr, BOARD_MAGIC, BOARD_VERSION, what="stats board")[:2]
        return cls(buf, writers)

    def _line(self, writer: int) -> int:
        return (2 + 2 * writer) * LINE_WORDS

    def _request(self, writer: int) -> int:
        return (3 + 2 * writer) * LINE_WORDS

    # board-wide words (line 1), written by the creator
    def set_global(self, k: int, value: int) -> None:
        py_store_release(self.w, B_GLOBAL + k, value)

    def global_word(self, k: int) -> int:
        return int(py_load_acquire(self.w, B_GLOBAL + k))

    # writer words
    def word(self, writer: int, k: int) -> int:
        return int(py_load_acquire(self.w, self._line(writer) + k))

    def set_word(self, writer: int, k: int, value: int) -> None:
        py_store_release(self.w, self._line(writer) + k, value)

    def request_view(self, writer: int) -> np.ndarray:
        """The writer's REQUEST word as a one-element view (the writer compares it once per loop iteration: an
        x86 load is an acquire load, and a stale value only delays the answer to the next iteration)."""
        i = self._request(writer)
        return self.w[i:i + 1]

    # readers
    def take_ticket(self, writer: int) -> int:
        """Ask writer for a fresh publication; it is done once ``done(writer) >= `` the returned ticket."""
        return int(py_fetch_add(self.w, self._request(writer), 1)) + 1

    def done(self, writer: int) -> int:
        return self.word(writer, B_DONE)

    def gen(self, writer: int) -> int:
        return self.word(writer, B_GEN)


# ---- a writer's table -----------------------------------------------------------------------------------
class RowTable:
    """One generation of a writer's rows, in its own segment."""

    def __init__(self, seg: Segment):
        self.seg = seg
        hdr = words(seg.buf, 0, HEADER_WORDS, "row table")
        size, self.capacity, row_words, self.generation = check_header(
            hdr, TABLE_MAGIC, TABLE_VERSION, what=f"row table {seg.name}")[:4]
        if row_words != ROW_WORDS or size != self.nbytes(self.capacity):
            raise SegmentError(errno.EINVAL, f"row table {seg.name}: {row_words}-word rows, {size} bytes")
        self.tbl = words(seg.buf, 0, size // 8, "row table")

    @staticmethod
    def nbytes(capacity: int) -> int:
        return 8 * (ROWS_AT + capacity * ROW_WORDS)

    @classmethod
    def create(cls, name: str, capacity: int, generation: int) -> "RowTable":
        size = cls.nbytes(capacity)
        try:
            seg = Segment.create(name, size)
        except SegmentError as e:
            if e.errno != errno.EEXIST:
                raise
            unlink_name(name)  # left by a writer that died between creating it and publishing it
            seg = Segment.create(name, size)
        w = words(seg.buf, 0, size // 8, "row table")
        stamp_header(w[:HEADER_WORDS], TABLE_MAGIC, TABLE_VERSION, size, (capacity, ROW_WORDS, generation))
        return cls(seg)

    @classmethod
    def attach(cls, name: str) -> "RowTable":
        return cls(Segment.attach(name))

    @property
    def hwm(self) -> int:
        return int(py_load_acquire(self.tbl, T_HWM))

    def close(self) -> None:
        self.tbl = None
        self.seg.close()


class RowWriter:
    """The writer's side: row allocation, batched creates/updates/frees, growth by generations.

    ``name_of(generation)`` names the table segments (the caller's naming scheme, under its instance prefix).
    Changes are queued and take effect in ``flush`` (creates, then updates, then frees: a row replaced in one
    batch is gone only after its replacement is readable)."""

    def __init__(self, board: Board, writer: int, name_of, capacity: int = MIN_CAPACITY):
        self.board, self.writer, self.name_of = board, writer, name_of
        self.capacity = max(capacity, MIN_CAPACITY)
        old = board.gen(writer)
        if old:
            board.set_word(writer, B_GEN, 0)  # readers see no rows until this writer's first table
            unlink_name(name_of(old))  # a predecessor's table (it crashed, or this is a restart)
        # generation numbers are never reused: this writer's uids carry its first one, its tables the next ones
        self.generation = board.word(writer, B_GENS) + 1
        unlink_name(name_of(self.generation))  # a table a predecessor created but died before publishing
        board.set_word(writer, B_GENS, self.generation)
        self.table = None           # created with the first row: an idle writer holds no table
        self._uid = self.generation << UID_SHIFT
        self._free = []
        self.hwm = 0
        self.live = 0
        self.publishes = 0
        self._new = []      # (idx, kind, uid, body)
        self._upd = []      # (idx, counters)
        self._gone = []
        pid, start = own_start()
        board.set_word(writer, B_PID_START, start)
        board.set_word(writer, B_PID, pid)  # last: a reader that sees the pid sees its start time too

    def create(self, kind: int, body) -> tuple[int, int]:
        """Queue a new row (body: up to BODY_WORDS ints; the counters' first copy at COPY_A - R_BODY);
        -> (row index, uid)."""
        idx = self._free.pop() if self._free else self._grow_hwm()
        self._uid += 1
        self._new.append((idx, kind, self._uid, body))
        self.live += 1
        return idx, self._uid

    def _grow_hwm(self) -> int:
        self.hwm += 1
        return self.hwm - 1

    def update(self, idx: int, counters: tuple) -> None:
        """Queue new counters for row idx (a tuple of up to COPY_WORDS ints; the rest read 0)."""
        self._upd.append((idx, counters))

    def free(self, idx: int) -> None:
        self._gone.append(idx)
        self.live -= 1

    def flush(self) -> int:
        """Apply the queued changes (growing the table first if new rows do not fit); -> how many there were."""
        changes = len(self._new) + len(self._upd) + len(self._gone)
        if self.table is None or self.hwm > self.table.capacity:
            if self.hwm == 0:
                self._status()
                return changes
            self._grow()
        tbl = self.table.tbl
        if self._new:
            n = len(self._new)
            idx = np.fromiter((x[0] for x in self._new), np.int64, n)
            kinds = np.fromiter((x[1] for x in self._new), np.int64, n)
            uids = np.fromiter((x[2] for x in self._new), np.int64, n)
            bodies = np.array([list(x[3]) + [0] * (BODY_WORDS - len(x[3])) for x in self._new], np.int64)
            _create(tbl, idx, kinds, uids, bodies.reshape(n, BODY_WORDS))
            self._new.clear()
        if int(tbl[T_HWM]) != self.hwm:
            py_store_release(tbl, T_HWM, self.hwm)
        if self._upd:
            n = len(self._upd)
            idx = np.fromiter((x[0] for x in self._upd), np.int64, n)
            pad = _PADS
            counters = np.array([x[1] + pad[len(x[1])] for x in self._upd], np.int64)
            _update(tbl, idx, counters.reshape(n, COPY_WORDS))
            self._upd.clear()
        if self._gone:
            _free(tbl, np.array(self._gone, np.int64))
            self._free.extend(self._gone)  # reusable from the next batch on (readers check the UID)
            self._gone.clear()
        self._status()
        return changes

    def _status(self) -> None:
        self.publishes += 1
        self.board.set_word(self.writer, B_ROWS, self.live)
        self.board.set_word(self.writer, B_PUBLISHES, self.publishes)

    def _grow(self) -> None:
        """The next generation, with room for every row in use (capacity doubles at least); the old table is
        copied verbatim (this process is its only writer, so every row in it is whole)."""
        old = self.table
        capacity = old.capacity if old is not None else self.capacity
        while capacity < self.hwm:
            capacity *= 2
        gen = self.board.word(self.writer, B_GENS) + 1
        new = RowTable.create(self.name_of(gen), capacity, gen)
        self.board.set_word(self.writer, B_GENS, gen)
        if old is not None:
            used = ROWS_AT + int(old.tbl[T_HWM]) * ROW_WORDS
            new.tbl[ROWS_AT:used] = old.tbl[ROWS_AT:used]
            new.tbl[T_HWM] = old.tbl[T_HWM]
        self.table = new
        self.board.set_word(self.writer, B_GEN, gen)  # readers move over from here on
        if old is not None:
            old.close()
            unlink_name(self.name_of(old.generation))

    def done(self, ticket: int, published_ns: int) -> None:
        """Everything up to the request ``ticket`` is published."""
        self.board.set_word(self.writer, B_PUBLISHED_NS, published_ns)
        self.board.set_word(self.writer, B_DONE, ticket)

    def set_user(self, k: int, value: int) -> None:
        self.board.set_word(self.writer, B_USER + k, value)

    def close(self) -> None:
        if self.table is not None:
            self.table.close()
            self.table = None


class RowReader:
    """A reader's view of one writer's rows; follows the writer's table generations."""

    def __init__(self, board: Board, writer: int, name_of, tries: int = TRIES):
        self.board, self.writer, self.name_of, self.tries = board, writer, name_of, tries
        self.table = None
        self.torn = 0
        self._counts = np.zeros(2, np.int64)

    def _table(self, gen: int):
        if self.table is not None and self.table.generation == gen:
            return self.table
        if self.table is not None:
            self.table.close()
            self.table = None
        try:
            self.table = RowTable.attach(self.name_of(gen))
        except (SegmentError, ValueError):
            return None  # replaced meanwhile (grown, or its writer restarted): the caller looks again
        return self.table

    def rows(self) -> np.ndarray:
        """A consistent copy of every live row: (n, ROW_WORDS) int64 (empty if the writer has no table yet)."""
        for _ in range(8):
            gen = self.board.gen(self.writer)
            if gen == 0:
                return np.zeros((0, ROW_WORDS), np.int64)
            table = self._table(gen)
            if table is None:
                continue
            hwm = min(table.hwm, table.capacity)
            out = np.empty((hwm, ROW_WORDS), np.int64)
            _copy(table.tbl, hwm, out, self.tries, self._counts)
            self.torn += int(self._counts[1])
            return out[:int(self._counts[0])]
        return np.zeros((0, ROW_WORDS), np.int64)

    def close(self) -> None:
        if self.table is not None:
            self.table.close()
            self.table = None


def writer_alive(board: Board, writer: int) -> bool:
    """Whether the process that last wrote writer's line still runs (its pid with the same start time)."""
    pid = board.word(writer, B_PID)
    return pid > 0 and _start_time(pid) == board.word(writer, B_PID_START)


@warm_up_step
def warm_up() -> None:
    """Compile (or load) the kernels on throwaway memory, in the supervisor before fork."""
    tbl = np.zeros(ROWS_AT + 4 * ROW_WORDS, np.int64)
    idx = np.arange(2, dtype=np.int64)
    _create(tbl, idx, np.ones(2, np.int64), np.arange(1, 3, dtype=np.int64), np.zeros((2, BODY_WORDS), np.int64))
    _update(tbl, idx, np.ones((2, COPY_WORDS), np.int64))
    out = np.empty((2, ROW_WORDS), np.int64)
    _copy(tbl, 2, out, TRIES, np.zeros(2, np.int64))
    _free(tbl, idx)
