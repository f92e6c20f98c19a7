"""A worker's deferred messages: DPUB messages its channels reached early, and REQ with a delay.

Theory of operation
-------------------
NSQ holds any number of deferred messages; they used to wait in the in-flight table (state DEFERRED), whose fixed
size then capped them (150,000 DPUBs over a 131,072-slot table lost 18,928 silently). Now they have a store of
their own that grows on demand, so the in-flight table only holds what consumers actually hold.

An entry names a message by where its body is, not by a copy of it: (topic, channel, message id, log position,
attempts, due time). The body stays in the topic's message log (a held position: it sets the channel's low-water
mark, and ``Worker.compact`` moves it forward when it would pin old segments), so a deferred message costs its
own bytes in the log plus one 64-byte entry.

Entries live in chunks of ``CHUNK`` entries, each chunk one shared-memory segment made when the store first needs
it (an idle worker has none), so a replacement worker finds them after a SIGKILL. The writing process is the
worker alone. An entry's TAG word is written last when it is added (WAITING) and first when it is freed (FREE),
each as a single store; an entry is therefore either wholly there or not at the instant of a SIGKILL. Everything
else is derived and rebuilt by ``recover``: the free list, the per-channel counts and the due-time heap (an
``nsqpy.ipc.heap`` min-heap in process memory; handles are entry numbers).

Due entries are popped from the heap (``due``) but stay WAITING until the channel has given each an in-flight
slot (``free`` afterwards). A crash in between leaves both: recovery frees an entry whose (id, channel) has a live
in-flight slot (the slot is delivered), and pushes every other WAITING entry again (one already due comes due at
once). So no message is lost, and none is delivered twice by the broker itself.

Position updates (``set_log_pos``) are one store of a word that the log keeps valid either way: the old copy is
reclaimed only after the new position was stored.
"""
import numpy as np

import errno

from nsqpy.ipc.heap import TimerHeap, heap_nbytes
from nsqpy.ipc.layout import LayoutError
from nsqpy.ipc.numba_cache import warm_up_step
from nsqpy.ipc.shm import Segment, SegmentError, segment_name, unlink_name

CHUNK = 1 << 14          # entries per chunk (1 MiB of shared memory)
ENTRY_WORDS = 8
TAG, TOPIC, CHANNEL, MSG_ID, LOG_POS, ATTEMPTS, DUE = range(7)
FREE, WAITING = 0, 1


class DeferredNoSpace(OSError):
    """The store could not grow (no shared memory left); nothing of the call was added."""


class LocalChunks:
    """Chunks in process memory: unit tests, and anything that need not survive its process."""

    def __init__(self):
        self.made = []

    def create(self, k):
        words = np.zeros(CHUNK * ENTRY_WORDS, np.int64)
        self.made.append(words)
        return words

    def attach(self, k):
        return self.made[k] if k < len(self.made) else None

    def destroy(self):
        self.made.clear()


class ShmChunks:
    """Chunks as shared-memory segments named from the broker instance and the worker, so that the worker's
    replacement attaches them; the supervisor's cleanup removes them with the instance's other segments."""

    def __init__(self, data_path, node_id, worker):
        self._name = lambda k: segment_name(data_path, node_id, f"defer{worker}", k)
        self._segs = []

    def create(self, k):
        try:
            seg = Segment.create(self._name(k), CHUNK * ENTRY_WORDS * 8)
        except SegmentError as e:
            if e.errno != errno.EEXIST:
                raise
            unlink_name(self._name(k))  # left by a crash before the chunk was in use: it holds nothing
            seg = Segment.create(self._name(k), CHUNK * ENTRY_WORDS * 8)
        self._segs.append(seg)
        return np.frombuffer(seg.buf, np.int64, CHUNK * ENTRY_WORDS)

    def attach(self, k):
        try:
            seg = Segment.attach(self._name(k))
        except SegmentError:
            return None
        except LayoutError:  # created but not stamped when its creator died: never used
            unlink_name(self._name(k))
            return None
        self._segs.append(seg)
        return np.frombuffer(seg.buf, np.int64, CHUNK * ENTRY_WORDS)

    def destroy(self):
        for seg in self._segs:
            seg.close()
            seg.unlink()
        self._segs.clear()


class DeferredStore:
    def __init__(self, chunks, recovering=False):
        self._chunks = chunks
        self.rows = []                      # per chunk: (CHUNK, ENTRY_WORDS) int64 view
        self._free = np.empty(0, np.int64)  # a stack: lowest entry numbers on top (the end)
        self._top = 0
        self.counts = {}                    # channel key -> WAITING entries (due or not)
        self._heap = None
        self._out_h = np.empty(4096, np.int64)
        self._out_k = np.empty(4096, np.int64)
        if recovering:
            self._attach_all()
        self._make_heap()

    # ---- growth ----------------------------------------------------------------------------------------
    @property
    def capacity(self):
        return len(self.rows) * CHUNK

    def __len__(self):
        return self.capacity - self._top

    def _attach_all(self):
        while True:
            words = self._chunks.attach(len(self.rows))
            if words is None:
                return
            self.rows.append(words.reshape(CHUNK, ENTRY_WORDS))

    def _grow(self, need):
        """Chunks until `need` entries are free; DeferredNoSpace when a chunk cannot be made."""
        added = 0
        while self._top < need:
            try:
                words = self._chunks.create(len(self.rows))
            except OSError as e:
                raise DeferredNoSpace(e.errno, f"deferred messages: cannot grow the store: {e}") from None
            k = len(self.rows)
            self.rows.append(words.reshape(CHUNK, ENTRY_WORDS))
            fresh = np.arange(k * CHUNK + CHUNK - 1, k * CHUNK - 1, -1, dtype=np.int64)
            self._free = np.concatenate([fresh, self._free[:self._top]])
            self._top += CHUNK
            added += 1
        if added:
            self._make_heap(keep=True)

    def _make_heap(self, keep=False):
        cap = max(self.capacity, 1)
        old = self._heap
        self._heap = TimerHeap.create(np.zeros(heap_nbytes(cap, cap), np.uint8), 0, cap, cap)
        if keep and old is not None and len(old):
            n = len(old)
            self._heap.rebuild(old.keys[:n].copy(), old.vals[:n].copy())

    # ---- entries ---------------------------------------------------------------------------------------
    def reserve(self, n):
        """Make room for n more entries now (DeferredNoSpace if the store cannot grow): the next add of up to n
        entries cannot fail."""
        if self._top < n:
            self._grow(n)

    def _take(self, n):
        self.reserve(n)
        self._top -= n
        return self._free[self._top:self._top + n][::-1].copy()

    def add(self, topic, channel, ids, positions, attempts, dues):
        """Add n waiting messages of one channel; -> their entry numbers. All or nothing."""
        n = len(ids)
        idx = self._take(n)
        block = np.zeros((n, ENTRY_WORDS), np.int64)
        block[:, TOPIC] = topic
        block[:, CHANNEL] = channel
        block[:, MSG_ID] = ids
        block[:, LOG_POS] = positions
        block[:, ATTEMPTS] = attempts
        block[:, DUE] = dues
        for k, sel in self._by_chunk(idx):
            rows, at = self.rows[k], idx[sel] & (CHUNK - 1)
            rows[at] = block[sel]            # TAG stays FREE ...
            rows[at, TAG] = WAITING          # ... until every other word is written: the entry exists from here
        self.counts[channel] = self.counts.get(channel, 0) + n
        heap = self._heap
        for i, due in zip(idx.tolist(), block[:, DUE].tolist()):
            heap.push(due, i)
        return idx

    def _by_chunk(self, idx):
        chunk = idx // CHUNK
        if len(idx) and chunk[0] == chunk[-1] and (chunk == chunk[0]).all():
            yield int(chunk[0]), slice(None)
            return
        for k in np.unique(chunk).tolist():
            yield k, chunk == k

    def _field(self, idx, field):
        out = np.empty(len(idx), np.int64)
        for k, sel in self._by_chunk(idx):
            out[sel] = self.rows[k][idx[sel] & (CHUNK - 1), field]
        return out

    def fields(self, idx):
        """-> (topic, channel, msg_id, log_pos, attempts, due) arrays for these entries."""
        out = np.empty((len(idx), ENTRY_WORDS), np.int64)
        for k, sel in self._by_chunk(idx):
            out[sel] = self.rows[k][idx[sel] & (CHUNK - 1)]
        return out[:, TOPIC], out[:, CHANNEL], out[:, MSG_ID], out[:, LOG_POS], out[:, ATTEMPTS], out[:, DUE]

    def free(self, idx):
        """These entries are done (delivered through an in-flight slot, or dropped)."""
        idx = np.asarray(idx, np.int64)
        if len(idx) == 0:
            return
        channels = self._field(idx, CHANNEL)
        for k, sel in self._by_chunk(idx):
            self.rows[k][idx[sel] & (CHUNK - 1), TAG] = FREE
        heap = self._heap
        if len(idx) > 64 and len(idx) * 4 > len(heap):
            n = len(heap)  # many at once (a channel emptied): one O(n) rebuild instead of n removals
            keys, vals = heap.keys[:n].copy(), heap.vals[:n].copy()
            keep = ~np.isin(vals, idx)
            heap.clear()
            heap.rebuild(keys[keep], vals[keep])
        else:
            for i in idx.tolist():
                if i in heap:
                    heap.remove(i)
        ch, cnt = np.unique(channels, return_counts=True)
        for c, m in zip(ch.tolist(), cnt.tolist()):
            left = self.counts.get(c, 0) - m
            if left > 0:
                self.counts[c] = left
            else:
                self.counts.pop(c, None)
        self._push_free(idx)

    def _push_free(self, idx):
        n = len(idx)
        if self._top + n > len(self._free):
            self._free = np.concatenate([self._free[:self._top], np.empty(n, np.int64)])
        self._free[self._top:self._top + n] = np.sort(idx)[::-1]
        self._top += n

    def set_log_pos(self, idx, positions):
        for k, sel in self._by_chunk(idx):
            self.rows[k][idx[sel] & (CHUNK - 1), LOG_POS] = positions[sel]

    # ---- time ------------------------------------------------------------------------------------------
    def earliest(self):
        top = self._heap.peek()
        return None if top is None else top[0]

    def due(self, now_ns):
        """Pop every entry due at now_ns; -> their numbers (still WAITING: deliver, then ``free``)."""
        heap, out_h, out_k = self._heap, self._out_h, self._out_k
        parts = []
        while True:
            n = heap.peek_and_shift(now_ns, out_h, out_k)
            if n:
                parts.append(out_h[:n].copy())
            if n < len(out_h):
                break
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    # ---- bulk ------------------------------------------------------------------------------------------
    def waiting(self):
        """Entry numbers of every WAITING entry (recovery, channel and topic sweeps)."""
        parts = [np.nonzero(rows[:, TAG] == WAITING)[0] + k * CHUNK for k, rows in enumerate(self.rows)]
        return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)

    def of_channel(self, channel):
        idx = self.waiting()
        return idx[self._field(idx, CHANNEL) == channel] if len(idx) else idx

    def of_topic(self, topic):
        idx = self.waiting()
        return idx[self._field(idx, TOPIC) == topic] if len(idx) else idx

    def drop_channel(self, channel):
        """Free every entry of the channel (deleted or emptied); -> how many."""
        if not self.counts.get(channel):
            return 0
        idx = self.of_channel(channel)
        self.free(idx)
        return len(idx)

    def low_water(self, lows):
        """lows[channel] = min(lows[channel], oldest position a waiting entry of the channel holds)."""
        if not self.counts:
            return
        idx = self.waiting()
        ch, pos = self._field(idx, CHANNEL), self._field(idx, LOG_POS)
        ok = ch < len(lows)
        np.minimum.at(lows, ch[ok], pos[ok])

    def recover(self):
        """Rebuild the derived state from the tags after a restart; -> the WAITING entry numbers."""
        idx = self.waiting()
        used = np.zeros(self.capacity, bool)
        used[idx] = True
        free = np.nonzero(~used)[0][::-1].astype(np.int64)
        self._free, self._top = free, len(free)
        self.counts = {}
        self._make_heap()
        if len(idx):
            _, channel, _, _, _, due = self.fields(idx)
            ch, cnt = np.unique(channel, return_counts=True)
            self.counts = dict(zip(ch.tolist(), cnt.tolist()))
            self._heap.rebuild(due.copy(), idx.copy())
        return idx

    def destroy(self):
        self.rows = []
        self._chunks.destroy()


@warm_up_step
def warm_up():
    """The heap's kernels with the store's argument types (workers/lane/warmup.py schedules this before fork)."""
    store = DeferredStore(LocalChunks())
    ids = np.arange(3, dtype=np.int64)
    idx = store.add(1, 1, ids, ids * 8, np.zeros(3, np.int64), np.array([5, 1, 9], np.int64))
    store.free(store.due(5))
    store.earliest()
    store.low_water(np.full(4, 1 << 62, np.int64))
    store.free(idx[2:])
    store.recover()


@warm_up_step(deferred="rare")
def warm_up_rare():
    """A restarted worker's store rebuilding its heap from entries still waiting (rare)."""
    store = DeferredStore(LocalChunks())
    ids = np.arange(2, dtype=np.int64)
    store.add(1, 1, ids, ids * 8, np.zeros(2, np.int64), np.array([5, 9], np.int64))
    store.recover()
