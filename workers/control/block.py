"""The broker's control block: a few shared words per process, each with one writer (one exception below).

Layout (int64 words after the common header line, one LINE per process so writers never share a cache line):

    line 0          header (magic 'NSQCTRL1', version, size, workers)
    line 1          scanner: epoch (bumped by every scanner start), restarts seen by the supervisor
    line 2 + w      worker w: connections it serves (written by worker w, read by the acceptor), restarts, then
                    its suspect words (what it is doing, for its replacement: workers/storage/poison.py), then its
                    flags (quiesced: at shutdown it takes no more publishes, see Worker.stop; busy: it used
                    more than its busy share of a core over its last load period, so auto placement moves no
                    producer to it, see Worker.move_producer) and the time of its
                    last failure to store messages (nsqpy/broker/health.py), then the producers other workers
                    moved to it (--producer-placement=auto; the one word with several writers: a sender adds one
                    when it hands a producer over, worker w subtracts one when such a session leaves, both with
                    an atomic add, and a replacement of w resets it)
    then            per worker, FULL_SLOTS words: the topics it owns that are full (written by worker w)
    then            per worker, FULL_SLOTS words: the kind of each slot's mark (crc << 8 | MARK_*, worker w)
    then            per worker, REASON_SLOTS x REASON_WORDS words: a reject mark's channel and limit (worker w)

The acceptor picks the worker with the fewest connections; workers compare the scanner epoch once per loop
iteration and re-post their timers when it moved (the scanner restarted and cleared its heaps).

Full topics: a worker that cannot append to a topic it owns marks it (slot crc32 % FULL_SLOTS holds the crc with
a marker bit), and the other workers refuse publishes to it at once (E_PUB_FAILED, as nsqd) instead of forwarding
records the owner could not take. Two full topics on one slot: the later wins, the other's publishes are
forwarded and land in the log's overdraft (nsqpy.ipc.msglog.OVERDRAFT_SEGMENTS); a topic never looks full by mistake.

Bounded channels (workers/domain/policy.py: max_depth / max_bytes) use the same mark with a kind beside it, in the
slot's kind word (written before the mark, read after it): ``MARK_FULL`` (its log cannot take more: refuse),
``MARK_CHANNEL_FULL`` (a channel with ``overflow`` reject is at its limit: refuse, naming the channel and the
limit, from a small table of reasons: REASON_SLOTS per worker, each holding its topic's crc, so a collision
only loses the channel's name from the error) and ``MARK_BLOCKED`` (a channel with ``overflow`` block is at its limit: senders park the publish and hold
its producer until the owner clears the mark). Whoever only asks ``topic_full`` (the compiled forward lane) sees
any mark, and leaves the publish to Python, which asks ``mark_kind``.
"""
import numpy as np

from nsqpy.ipc.atomics import py_fetch_add, py_load_acquire, py_store_release
from nsqpy.ipc.layout import LINE, LINE_WORDS, HEADER_WORDS, check_header, magic, stamp_header, words

MAGIC = magic("NSQCTRL1")
VERSION = 3
SCANNER_EPOCH, SCANNER_RESTARTS = LINE_WORDS, LINE_WORDS + 1
W_CONNS, W_RESTARTS = 0, 1
W_FLAGS = 13            # after workers/storage/poison.py's words: F_* bits, written by the worker only
F_QUIESCED = 1          # it stopped taking publishes (shutdown)
F_BUSY = 2              # over its busy share of a core in its last load period (auto placement)
W_STORAGE_FAILED = 14   # ns time of the worker's last failure to store (0: its last store worked): /ping's health
W_MOVED_IN = 15         # round-trip producers moved to this worker as their topics' owner (auto placement)
FULL_SLOTS = 256
_FULL_MARK = 1 << 40
MARK_FULL, MARK_CHANNEL_FULL, MARK_BLOCKED = 0, 1, 2
LIMITS = ("max_depth", "max_bytes")   # the limit a channel mark names (its index in the reason word)
REASON_SLOTS = 32       # reasons of reject marks per worker (crc32 % REASON_SLOTS)
REASON_WORDS = 11       # the topic's crc, name length | limit << 8, the limit's value, the channel's name (64 bytes)
NAME_BYTES = 8 * (REASON_WORDS - 3)


def nbytes(workers):
    return LINE * (2 + workers) + 8 * workers * (2 * FULL_SLOTS + REASON_SLOTS * REASON_WORDS)


class Control:
    def __init__(self, seg, workers):
        self.seg = seg
        self.workers = workers
        self.w = words(seg.buf, 0, nbytes(workers) // 8, "control block")
        check_header(self.w[:HEADER_WORDS], MAGIC, VERSION, nbytes(workers), (workers,), what="control block")

    @classmethod
    def create(cls, seg, workers):
        w = words(seg.buf, 0, nbytes(workers) // 8, "control block")
        w[:] = 0
        stamp_header(w[:HEADER_WORDS], MAGIC, VERSION, nbytes(workers), (workers,))
        return cls(seg, workers)

    def _worker(self, w, field):
        return (2 + w) * LINE_WORDS + field

    def add_connections(self, w, delta):
        py_fetch_add(self.w, self._worker(w, W_CONNS), delta)

    def set_connections(self, w, n):
        py_store_release(self.w, self._worker(w, W_CONNS), n)

    def connections(self, w):
        return int(py_load_acquire(self.w, self._worker(w, W_CONNS)))

    def least_loaded(self, besides=None):
        return min((w for w in range(self.workers) if w != besides), key=self.connections)

    def add_moved_in(self, w, delta):
        py_fetch_add(self.w, self._worker(w, W_MOVED_IN), delta)

    def set_moved_in(self, w, n):
        py_store_release(self.w, self._worker(w, W_MOVED_IN), n)

    def moved_in(self, w):
        """Producers moved to worker w because it owns their topics (it counts them; others read)."""
        return int(py_load_acquire(self.w, self._worker(w, W_MOVED_IN)))

    def clear_flags(self, w):
        """A worker (or its replacement) starting: neither quiesced nor busy."""
        py_store_release(self.w, self._worker(w, W_FLAGS), 0)

    def _flags(self, w):
        return int(py_load_acquire(self.w, self._worker(w, W_FLAGS)))

    def _set_flag(self, w, bit, on):
        v = self._flags(w)  # only worker w writes its flags: a load and a store do
        py_store_release(self.w, self._worker(w, W_FLAGS), v | bit if on else v & ~bit)

    def set_quiesced(self, w, flag):
        self._set_flag(w, F_QUIESCED, flag)

    def quiesced(self, w):
        return bool(self._flags(w) & F_QUIESCED)

    def set_busy(self, w, flag):
        self._set_flag(w, F_BUSY, flag)

    def busy(self, w):
        return bool(self._flags(w) & F_BUSY)

    def set_storage_failed(self, w, when_ns):
        py_store_release(self.w, self._worker(w, W_STORAGE_FAILED), when_ns)

    def storage_failed(self, w):
        """ns time of worker w's last failure to store messages, still unresolved (0: none)."""
        return int(py_load_acquire(self.w, self._worker(w, W_STORAGE_FAILED)))

    def count_restart(self, w):
        """Called by the supervisor; w = -1 for the scanner."""
        idx = SCANNER_RESTARTS if w < 0 else self._worker(w, W_RESTARTS)
        py_fetch_add(self.w, idx, 1)

    def restarts(self):
        return [int(self.w[self._worker(w, W_RESTARTS)]) for w in range(self.workers)] + \
            [int(self.w[SCANNER_RESTARTS])]

    def _full_slot(self, w, crc):
        return (2 + self.workers) * LINE_WORDS + w * FULL_SLOTS + crc % FULL_SLOTS

    def _kind_at(self, w, crc):
        return self._full_slot(w, crc) + FULL_SLOTS * self.workers

    def _reason_at(self, w, crc):
        return (2 + self.workers) * LINE_WORDS + 2 * FULL_SLOTS * self.workers + \
            (w * REASON_SLOTS + crc % REASON_SLOTS) * REASON_WORDS

    def set_topic_full(self, w, crc, full):
        """Worker w (the owner) marks or clears the topic whose name has this crc32."""
        self.set_topic_mark(w, crc, MARK_FULL if full else None)

    def set_topic_mark(self, w, crc, kind, channel="", limit=0, value=0):
        """Worker w (the owner) marks the topic (``kind``: MARK_*; None clears its mark). A channel mark names the
        channel and its limit (``limit`` an index of LIMITS, ``value`` its value) for the senders' errors."""
        i = self._full_slot(w, crc)
        if kind is None:
            if int(self.w[i]) == _FULL_MARK | crc:
                py_store_release(self.w, i, 0)
            return
        if kind == MARK_CHANNEL_FULL:
            r = self._reason_at(w, crc)
            name = channel.encode()[:NAME_BYTES]
            self.w[r + 3:r + REASON_WORDS].view(np.uint8)[:len(name)] = np.frombuffer(name, np.uint8)
            self.w[r + 1], self.w[r + 2] = len(name) | limit << 8, value
            py_store_release(self.w, r, crc)
        py_store_release(self.w, self._kind_at(w, crc), crc << 8 | kind)
        py_store_release(self.w, i, _FULL_MARK | crc)

    def mark_kind(self, w, crc):
        """The kind (MARK_*) of the topic's mark, or None when it has none."""
        if not self.topic_full(w, crc):
            return None
        word = int(py_load_acquire(self.w, self._kind_at(w, crc)))
        return word & 0xFF if word >> 8 == crc else MARK_FULL  # (a mark of an older layout: full)

    def refusal(self, w, crc, topic):
        """Why a publish to the marked ``topic`` is refused (nsqd's E_PUB_FAILED reason after 'PUB failed '), or
        None when it is not refused (no mark, or MARK_BLOCKED: the publish waits)."""
        kind = self.mark_kind(w, crc)
        if kind is None or kind == MARK_BLOCKED:
            return None
        if kind == MARK_FULL:
            return f"topic {topic} is full"
        r = self._reason_at(w, crc)
        lengths, value = int(self.w[r + 1]), int(self.w[r + 2])
        name = bytes(self.w[r + 3:r + REASON_WORDS].view(np.uint8)[:lengths & 0xFF]).decode(errors="replace")
        if int(py_load_acquire(self.w, r)) != crc:  # another topic's reason took the slot since
            return f"channel of topic {topic} is full"
        return f"channel {topic}:{name} is full ({LIMITS[(lengths >> 8) & 1]} {value})"

    def full_word(self, w, crc):
        """(index into ``self.w``, value it holds while the topic is full): ``topic_full`` for compiled code."""
        return self._full_slot(w, crc), _FULL_MARK | crc

    def topic_full(self, w, crc):
        return int(self.w[self._full_slot(w, crc)]) == _FULL_MARK | crc  # a stale answer costs one publish

    def suspect(self, w):
        """Worker w's suspect words (workers/storage/poison.py): what it is doing, for its replacement."""
        from nsqpy.workers.storage.poison import Suspect
        return Suspect(self.w, self._worker(w, 0))

    def bump_scanner_epoch(self):
        py_fetch_add(self.w, SCANNER_EPOCH, 1)

    def scanner_epoch(self):
        return int(self.w[SCANNER_EPOCH])  # read every loop iteration: a plain (x86: acquire) load is enough
