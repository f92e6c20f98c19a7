"""The rings between the broker's processes, the wake-ups that go with them, and the replies to commands.

Theory of operation: every pair of processes that sends records in one direction has its own SPSC ring
(``nsqpy.ipc.ring``), so every shared word has one writer and a crashed process leaves nothing half-locked:

    pub(i, j)          producer slot i -> worker j   publishes (and commands) for topics that j owns (i != j)
    to_scanner(i)      worker i -> scanner           START / REMOVE / RESET timer events
    from_scanner(i)    scanner -> worker i           EXPIRED timers

Producer slots: slots 0 .. workers-1 are the workers; slots workers .. producers-1 belong to other processes that
send publishes or commands to topic owners (HTTP API workers, a lookupd registrar). They only write pub rings.
Every worker drains the pub rings of every producer slot but its own (``inputs_of``).

Sizes, from one budget: every pub ring has the capacity ``pub_capacity(budget, workers, producers)``: the budget
(``--ring-budget``) divided over the producers x workers - workers pub rings, rounded down to a power of two and
clamped to [RING_FLOOR, RING_MAX] (so with many workers the floor can take the rings past the budget; the
broker says so at start). Scanner rings have SCANNER_CAPACITY. No data page of any ring is reserved at creation:
its producer reserves them as it first reaches them, and starts a lap early while its reader keeps up (``nsqpy.ipc.ring``,
lazy pages), so a ring costs what it ever held at once, and an idle broker only its fixed part (below). A
publish bigger than ``Link.large_forward`` (an eighth of a pub ring, so that several fit at once: a record may
take at most half) goes by file (workers/processes/worker.py).

Replies to commands (``reply_words``, ``post_reply``, ``reply``, ``wait_reply``): each producer slot has a reply
line holding one (STATUS, SEQ) word pair per owner worker, written only by that owner (one writer per word):

    producer slot s                                     owner j
    seq = a number above every SEQ of its line
    COMMAND record carrying (s, seq) -> pub(s, j), wake j
                                                        carries it out, then post_reply(s, j, seq, status):
                                                        STATUS = status; store_release(SEQ, seq); wake s
    wait_reply(s, j, seq, timeout): load_acquire(SEQ) == seq -> STATUS (else sleep on s's eventfd, re-check)

A producer has at most one command outstanding per owner; an owner answers the commands of one ring in order, so
a late answer to a command its sender gave up on is overwritten by the next before that one is waited for, and
a SEQ equal to the awaited number always comes with its own STATUS. A process that takes over a slot (a restarted
HTTP worker) starts above ``last_seq(s)``. Waiting uses the slot's wake-up line and eventfd, with the same
protocol as the rings' readers: an owner's ``post_reply`` writes the eventfd only when the producer sleeps. A
worker (slots below ``workers``) must not block in ``wait_reply``: its loop would stall; it polls ``reply``.

Wake-ups: a reader that finds its rings empty arms its sleeping flag, re-checks, and only then blocks on its
eventfd (in the worker's epoll loop, or ``sleep`` for the scanner); a writer writes the eventfd only when it finds
the flag armed. So an idle reader costs nothing, a busy one pays no syscall per record, and no wake-up is lost.
Wake-up lines and eventfds: 0 .. workers-1 the workers, ``workers`` the scanner, workers+1 .. producers the
other producer slots (``proc_of``).

Layout of the segment (offsets from its payload; the fixed part up to the data areas is reserved at creation):

    +0          header line: magic 'NSQLINKS' | version | size | workers | producers | pub capacity | scanner cap.
    +LINE       wake-up lines (nsqpy.ipc.wake), producers + 1 readers
    then        reply lines: per producer slot, 2 x workers words, each slot's padded to LINE
    then        ring control blocks (nsqpy.ipc.ring CONTROL_BYTES each, packed): pub(i, j) for i < producers, j <
                workers, i != j (in that order), then to_scanner(i), from_scanner(i) for each worker
    page-aligned: the data areas, in the same order, each its capacity (a multiple of the page size)

So an idle broker's links cost ~ LINE x (producers + 2) + 16 x producers x workers + CONTROL_BYTES x (producers
x workers + workers) bytes: 0.16 MiB at 16 workers and 8 other producer slots, 1.8 MiB at 64 (ARCHITECTURE.md,
"Shared memory per broker").

Resource handling: the supervisor creates the segment and the eventfds before forking; every child uses the
inherited mapping, so a restarted child finds the rings where its predecessor left them. A restarted reader
re-reads what was read but not released (``Ring`` consumer recovery), a restarted writer resumes at the committed
tail (producer recovery): at worst a duplicate, never a loss. Ring pages are reserved through ``reserve``
(``nsqpy.ipc.shm.Segment.reserver()``); without it (a plain buffer) every page counts as backed.
"""
import mmap
import select
import time

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, warm_up_step
from nsqpy.ipc.atomics import py_load_acquire, py_store_release
from nsqpy.ipc.layout import LINE, HEADER_WORDS, LayoutError, align_up, check_header, magic, stamp_header, words
from nsqpy.ipc.wake import Wakeups, make_eventfd
from nsqpy.ipc.ring import (C_HEAD, C_READ, CONTROL_BYTES, P_TAIL, HEADER_BYTES, Ring, record_size, ring_consumer_recover,
                      ring_producer_recover)

MAGIC = magic("NSQLINKS")
VERSION = 2
RING_MAX = 32 << 20          # bytes: the largest pub ring (what every pub ring had before the budget)
RING_FLOOR = 256 << 10       # bytes: the smallest pub ring, however many rings share the budget
RING_BUDGET = 1 << 30        # bytes: the default --ring-budget
SCANNER_CAPACITY = 8 << 20
LARGE_FORWARD_SHARE = 8      # a record bigger than capacity / this goes by file
DRAIN_BATCH = 256
REPLY_STATUS, REPLY_SEQ = 0, 1


def pub_rings(workers, producers):
    """How many pub rings a broker has."""
    return producers * workers - workers


def pub_capacity(budget, workers, producers):
    """Capacity of each pub ring: the budget's share per ring, a power of two in [RING_FLOOR, RING_MAX]."""
    share = budget // max(1, pub_rings(workers, producers))
    cap = 1 << (share.bit_length() - 1) if share > 0 else 0
    return min(RING_MAX, max(RING_FLOOR, cap))


def _reply_line_bytes(workers):
    return align_up(16 * workers, LINE)


def _layout(workers, producers, capacity):
    """-> ([(kind, i, j, control offset, data offset, capacity)], reply offset, fixed bytes, total bytes)."""
    reply_at = LINE + Wakeups.size_for(producers + 1)
    ctl_at = reply_at + producers * _reply_line_bytes(workers)
    keys = [("pub", i, j, capacity) for i in range(producers) for j in range(workers) if i != j]
    for i in range(workers):
        keys += [("to_scanner", i, 0, SCANNER_CAPACITY), ("from_scanner", i, 0, SCANNER_CAPACITY)]
    fixed = ctl_at + len(keys) * CONTROL_BYTES
    data_at = align_up(fixed, mmap.PAGESIZE)
    rings = []
    for k, (kind, i, j, cap) in enumerate(keys):
        rings.append((kind, i, j, ctl_at + k * CONTROL_BYTES, data_at, cap))
        data_at += cap
    return rings, reply_at, fixed, data_at


def nbytes(workers, producers=None, capacity=RING_MAX):
    """Size of the links segment (address space: its data pages are reserved lazily)."""
    return _layout(workers, workers if producers is None else producers, capacity)[3]


def fixed_nbytes(workers, producers=None, capacity=RING_MAX):
    """Bytes of the links segment that are reserved at creation (everything but the ring data)."""
    return _layout(workers, workers if producers is None else producers, capacity)[2]


def holds_records(buf) -> bool:
    """Whether the links segment in ``buf`` (a dead instance's) holds a committed record in a pub ring that its
    owner never released: a message acknowledged to its producer, still on its way to the topic's owner (which
    may not even have created the topic's log yet). A header never stamped (the instance died while starting):
    False. One this code cannot read (another layout version): True, the safe answer (``workers/storage/
    leftovers.py`` keeps what may hold messages for its own next start)."""
    try:
        hdr = words(buf, 0, HEADER_WORDS, "links")
        if not hdr.any():
            return False
        workers, producers, capacity = int(hdr[3]), int(hdr[4]), int(hdr[5])
        rings, _, _, size = _layout(workers, producers, capacity)
        check_header(hdr, MAGIC, VERSION, size, (workers, producers, capacity, SCANNER_CAPACITY), what="links")
    except (LayoutError, ValueError):
        return True
    return any(not Ring(buf, off, None, 1).is_empty() for kind, _, _, off, _, _ in rings if kind == "pub")


class Link:
    """One ring, seen from one side."""

    def __init__(self, ring, links, reader):
        self.ring = ring
        self.links = links
        self.reader = reader  # process number of the reading side, for wake-ups
        self.mask = ring.capacity - 1

    @property
    def capacity(self):
        return self.ring.capacity

    @property
    def large_forward(self):
        """Bytes: a publish bigger than this goes by file, not through the ring."""
        return self.ring.capacity // LARGE_FORWARD_SHARE

    # writer side
    def send(self, rtype, payload):
        """Write and commit one record; False when the ring has no room for it now (or no page for it)."""
        return self.ring.write(payload, rtype)

    def has_room(self, n):
        return self.ring.free() >= record_size(n) * 2 and self.ring.can_claim(n)

    def wait_for_room(self, n, timeout):
        """Wait (at most timeout seconds) for the reader to free room; the reader was already woken."""
        if not self.has_room(n):
            select.select([], [], [], timeout)  # no event for "room freed": a short bounded wait

    # reader side
    def empty(self):
        # Plain numpy reads: an x86 load is an acquire load, and a stale answer only delays a record to the next
        # look (the wake-up protocol re-checks with real atomics before anyone sleeps). Called every iteration,
        # where a kernel dispatch would cost more than the check.
        ctl = self.ring.ctl
        return ctl[P_TAIL] == ctl[C_READ]

    def drain(self, handle, max_records=DRAIN_BATCH):
        """Call handle(rtype, payload) for committed records in order; a record is released once handle returned.
        A handler that returns False (exactly: it cannot take the record now, e.g. the log is full) stops the
        drain, and that record is offered again next time. -> records done."""
        batch = self._read(max_records)
        if batch is None:
            return 0
        offs, lens, types = batch
        data = self.ring.data
        done = 0
        try:
            for k in range(len(offs)):
                off, length = int(offs[k]), int(lens[k])
                if handle(int(types[k]), data[off:off + length]) is False:
                    break
                done += 1
        finally:  # a handler that raised: what it had not finished is offered again, never skipped
            self._release(offs, lens, done)
        return done

    def drain_runs(self, plan, handle, max_records=DRAIN_BATCH):
        """drain for runs of records: plan(data, offs, lens, types) -> the runs' (first record, record count) in
        order, covering the batch; handle(run index, first, count) -> False stops the drain, and that run's records
        are offered again next time. Records are released once their run was handled. -> records done."""
        batch = self._read(max_records)
        if batch is None:
            return 0
        offs, lens, types = batch
        done = 0
        try:
            for j, (first, count) in enumerate(plan(self.ring.data, offs, lens, types)):
                if handle(j, first, count) is False:
                    break
                done += count
        finally:
            self._release(offs, lens, done)
        return done

    def _read(self, max_records):
        ring = self.ring
        if ring.ctl[P_TAIL] == ring.ctl[C_READ]:
            return None
        batch = ring.read_batch(max_records)
        return batch if len(batch[0]) else None

    def _release(self, offs, lens, done):
        """Release the first ``done`` records of the batch just read; the rest are offered again. -> done."""
        ring = self.ring
        if done == len(offs):
            ring.release()
            return done
        end = head = int(ring.ctl[C_HEAD])
        if done:
            start_idx = int(offs[done - 1]) - HEADER_BYTES  # its position: head plus the distance, padding included
            end = head + ((start_idx - (head & self.mask)) & self.mask) + record_size(int(lens[done - 1]))
        ring.release(end)
        ring.ctl[C_READ] = end  # offer the refused record again
        return done


class LinkSet:
    """All rings of one broker in ``seg`` (module docstring). ``producers`` (>= workers, default workers) counts
    the producer slots; ``capacity`` is every pub ring's (create: default RING_MAX; attach: read from the
    header); ``reserve`` backs pages of the segment (``Segment.reserver()``; None: all counted as backed)."""

    def __init__(self, seg, workers, producers=None, eventfds=None, create=False, capacity=None, reserve=None):
        producers = workers if producers is None else producers
        if producers < workers:
            raise ValueError(f"{producers} producer slots for {workers} workers: the workers are producers too")
        self.seg = seg
        self.workers = workers
        self.producers = producers
        self.SCANNER = workers
        hdr = words(seg.buf, 0, HEADER_WORDS, "links")
        if capacity is None:
            capacity = RING_MAX if create else int(hdr[5])
        self.pub_capacity = capacity
        self.rings, self._reply_at, self.fixed, size = _layout(workers, producers, capacity)
        self._reserve = reserve
        fds = eventfds or [make_eventfd() for _ in range(producers + 1)]
        params = (workers, producers, capacity, SCANNER_CAPACITY)
        if create:
            if reserve is not None:
                reserve(0, self.fixed)
            hdr[:] = 0
            self._replies_all()[:] = 0
            for kind, i, j, off, data_off, cap in self.rings:
                Ring.create(seg.buf, off, cap, max_batch=1, data_offset=data_off, reserve=reserve)
            self.wakeups = Wakeups.create(seg.buf, LINE, fds)
            stamp_header(hdr, MAGIC, VERSION, size, params)
        check_header(hdr, MAGIC, VERSION, size, params, what="links",
                     names=("workers", "producers", "pub ring capacity", "scanner ring capacity"))
        if not create:
            self.wakeups = Wakeups.attach(seg.buf, LINE, fds)
        self.eventfds = fds
        self._by_key = {}
        for kind, i, j, off, _, cap in self.rings:
            reader = j if kind == "pub" else (self.SCANNER if kind == "to_scanner" else i)
            self._by_key[(kind, i, j)] = (off, reader)

    @classmethod
    def create(cls, seg, workers, producers=None, capacity=None, reserve=None):
        return cls(seg, workers, producers, create=True, capacity=capacity, reserve=reserve)

    def _link(self, kind, i, j=0):
        off, reader = self._by_key[(kind, i, j)]
        return Link(Ring(self.seg.buf, off, None, DRAIN_BATCH, self._reserve), self, reader)

    def pub(self, slot, owner):
        """The ring from producer slot ``slot`` to worker ``owner``."""
        return self._link("pub", slot, owner)

    def inputs_of(self, owner):
        """The pub rings worker ``owner`` drains: from every producer slot but its own, in slot order."""
        return [self.pub(i, owner) for i in range(self.producers) if i != owner]

    def watch(self, links):
        """A ``Pending`` over these rings (read side): which of them hold committed records, in one call."""
        return Pending(self.seg.buf, [link.ring.ctl for link in links])

    def to_scanner(self, i):
        return self._link("to_scanner", i)

    def from_scanner(self, i):
        return self._link("from_scanner", i)

    def recover_reader(self, link):
        ring_consumer_recover(link.ring.ctl)

    def recover_writer(self, link):
        ring_producer_recover(link.ring.ctl)

    # ---- replies to commands (module docstring) ---------------------------------------------------------
    def _replies_all(self):
        return words(self.seg.buf, self._reply_at, self.producers * _reply_line_bytes(self.workers) // 8,
                     "reply lines")

    def reply_words(self, slot):
        """Producer slot ``slot``'s reply line: words 2j (STATUS) and 2j+1 (SEQ) are owner j's."""
        if not 0 <= slot < self.producers:
            raise ValueError(f"producer slot {slot} outside [0, {self.producers})")
        return words(self.seg.buf, self._reply_at + slot * _reply_line_bytes(self.workers), 2 * self.workers,
                     "reply line")

    def proc_of(self, slot):
        """The wake-up line (and eventfd) of producer slot ``slot``."""
        return slot if slot < self.workers else slot + 1

    def post_reply(self, slot, owner, seq, status):
        """(Owner) answer command ``seq`` of producer slot ``slot``: STATUS, then SEQ with a store-release, then a
        wake-up if the producer sleeps."""
        w = self.reply_words(slot)
        w[2 * owner + REPLY_STATUS] = status
        py_store_release(w, 2 * owner + REPLY_SEQ, seq)
        self.wake(self.proc_of(slot))

    def reply(self, slot, owner, seq):
        """(Producer) owner's status for command ``seq``, or None while it has not answered it."""
        w = self.reply_words(slot)
        if int(py_load_acquire(w, 2 * owner + REPLY_SEQ)) != seq:
            return None
        return int(w[2 * owner + REPLY_STATUS])

    def last_seq(self, slot):
        """The highest sequence answered in slot's line (a process taking over the slot numbers from above it)."""
        w = self.reply_words(slot)
        return max(int(py_load_acquire(w, 2 * o + REPLY_SEQ)) for o in range(self.workers))

    def wait_reply(self, slot, owner, seq, timeout):
        """(Producer, not a worker) block until owner answered command ``seq``; -> its status, or None after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        proc = self.proc_of(slot)
        while True:
            status = self.reply(slot, owner, seq)
            left = deadline - time.monotonic()
            if status is not None or left <= 0:
                return status
            self.wakeups.sleep(proc, lambda: self.reply(slot, owner, seq) is not None, left)

    # ---- wake-ups (nsqpy.ipc.wake: Dekker's store-fence-load on both sides) ---------------------------------
    def eventfd(self, proc):
        return self.eventfds[proc]

    def wake(self, proc):
        """After committing records for proc: one eventfd write, only if proc is going to sleep (-> True: it
        was)."""
        return self.wakeups.notify(proc)

    def prepare_sleep(self, proc, still_empty):
        """True when proc may block on its eventfd (its rings stayed empty after it armed the flag)."""
        return self.wakeups.prepare_sleep(proc, lambda: not still_empty())

    def awake(self, proc):
        """proc woke up (eventfd readable, or other I/O): reset the eventfd and the flag."""
        self.wakeups.woke(proc)

    def sleep(self, proc, timeout, still_empty):
        """Block up to timeout seconds unless a ring of proc has something (the scanner's idle wait)."""
        self.wakeups.sleep(proc, lambda: not still_empty(), timeout)


@njit(nogil=True, **JIT)
def _nonempty(words, tails, reads, out):
    n = 0
    for i in range(tails.shape[0]):
        if words[tails[i]] != words[reads[i]]:
            out[n] = i
            n += 1
    return n


class Pending:
    """Which of a reader's input rings hold committed records: one compiled pass over their tail and read words
    (a worker has workers - 1 + external producer slots of them, 9 by default at 2 workers and 71 at 64: checked
    one by one in Python that cost about 0.4 us each, every loop iteration and before every local publish).
    Plain loads, as ``Link.empty``: a stale answer only delays a record to the next look."""

    def __init__(self, buf, ctls):
        base = buf.ctypes.data
        self._words = np.frombuffer(buf, np.int64, buf.nbytes // 8)
        self._tails = np.array([(c.ctypes.data - base) // 8 + P_TAIL for c in ctls], np.int64)
        self._reads = np.array([(c.ctypes.data - base) // 8 + C_READ for c in ctls], np.int64)
        self._out = np.empty(len(ctls), np.int64)

    def any(self):
        return _nonempty(self._words, self._tails, self._reads, self._out) > 0

    def which(self):
        """Indices (into the rings given) of those with records."""
        return self._out[:_nonempty(self._words, self._tails, self._reads, self._out)].tolist()


@warm_up_step
def warm_up():
    """Pending's kernel on a small ring (workers/lane/warmup.py schedules this before fork)."""
    buf = np.zeros(Ring.size_for(1 << 12), np.uint8)
    ring = Ring.create(buf, 0, 1 << 12)
    Pending(buf, [ring.ctl]).which()
