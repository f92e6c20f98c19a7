"""The rings between the broker's processes, and the wake-ups that go with them.

Theory of operation: every pair of processes that sends messages in one direction has its own SPSC ring
(``ipc.ring``), so every shared word has one writer and a crashed process leaves nothing half-locked:

    pub(i, j)          worker i -> worker j    publishes for topics that j owns (i != j)
    to_scanner(i)      worker i -> scanner     START / REMOVE / RESET timer events
    from_scanner(i)    scanner -> worker i     EXPIRED timers

All rings of one broker live in one segment, after the sleeping flags of the reading processes (``ipc.wake``):
a reader that finds its rings empty arms its flag, re-checks, and only then blocks on its eventfd (in the
worker's epoll loop, or ``sleep`` for the scanner); a writer writes the eventfd only when it finds the flag armed.
So an idle reader costs nothing, a busy one pays no syscall per record, and no wake-up is lost.

Resource handling: the supervisor creates the segment and the eventfds before forking; every child uses the
inherited mapping, so a restarted child finds the rings where its predecessor left them. A restarted reader
re-reads what was read but not released (``Ring`` consumer recovery), a restarted writer resumes at the committed
tail (producer recovery): at worst a duplicate, never a loss.
"""
import select

from ipc.layout import LINE, HEADER_WORDS, check_header, magic, stamp_header, words
from ipc.wake import Wakeups, make_eventfd
from ipc.ring import C_HEAD, C_READ, P_TAIL, HEADER_BYTES, Ring, record_size, ring_consumer_recover, ring_producer_recover

MAGIC = magic("NSQLINKS")
VERSION = 1
PUB_CAPACITY = 32 << 20
SCANNER_CAPACITY = 8 << 20
DRAIN_BATCH = 256


def _layout(workers):
    """[(kind, i, j, offset, capacity)] and the total size."""
    offset = LINE + Wakeups.size_for(workers + 1)
    rings = []
    for i in range(workers):
        for j in range(workers):
            if i != j:
                rings.append(("pub", i, j, offset, PUB_CAPACITY))
                offset += Ring.size_for(PUB_CAPACITY)
    for i in range(workers):
        rings.append(("to_scanner", i, 0, offset, SCANNER_CAPACITY))
        offset += Ring.size_for(SCANNER_CAPACITY)
        rings.append(("from_scanner", i, 0, offset, SCANNER_CAPACITY))
        offset += Ring.size_for(SCANNER_CAPACITY)
    return rings, offset


def nbytes(workers):
    return _layout(workers)[1]


class Link:
    """One ring, seen from one side."""

    def __init__(self, ring, links, reader):
        self.ring = ring
        self.links = links
        self.reader = reader  # process number of the reading side, for wake-ups
        self.mask = ring.capacity - 1

    # writer side
    def send(self, rtype, payload):
        """Write and commit one record; False when the ring has no room for it now."""
        return self.ring.write(payload, rtype)

    def has_room(self, n):
        return self.ring.free() >= record_size(n) * 2

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
        ring = self.ring
        if ring.ctl[P_TAIL] == ring.ctl[C_READ]:
            return 0
        offs, lens, types = ring.read_batch(max_records)
        n = len(offs)
        if n == 0:
            return 0
        head = int(ring.ctl[C_HEAD])
        data = ring.data
        done = 0
        end = head
        for k in range(n):
            off, length = int(offs[k]), int(lens[k])
            if handle(int(types[k]), data[off:off + length]) is False:
                break
            start_idx = off - HEADER_BYTES
            pos = end + ((start_idx - (end & self.mask)) & self.mask)  # skips any padding before it
            end = pos + record_size(length)
            done += 1
        if done == n:
            ring.release()
        else:
            ring.release(end)
            ring.ctl[C_READ] = end  # offer the refused record again
        return done


class LinkSet:
    def __init__(self, seg, workers, eventfds=None, create=False):
        self.seg = seg
        self.workers = workers
        self.SCANNER = workers
        self.rings, size = _layout(workers)
        hdr = words(seg.buf, 0, HEADER_WORDS, "links")
        fds = eventfds or [make_eventfd() for _ in range(workers + 1)]
        if create:
            hdr[:] = 0
            for kind, i, j, off, cap in self.rings:
                Ring.create(seg.buf, off, cap)
            self.wakeups = Wakeups.create(seg.buf, LINE, fds)
            stamp_header(hdr, MAGIC, VERSION, size, (workers,))
        check_header(hdr, MAGIC, VERSION, size, (workers,), what="links")
        if not create:
            self.wakeups = Wakeups.attach(seg.buf, LINE, fds)
        self.eventfds = fds
        self._by_key = {}
        for kind, i, j, off, cap in self.rings:
            reader = j if kind == "pub" else (self.SCANNER if kind == "to_scanner" else i)
            self._by_key[(kind, i, j)] = (off, reader)

    @classmethod
    def create(cls, seg, workers):
        return cls(seg, workers, create=True)

    def _link(self, kind, i, j=0):
        off, reader = self._by_key[(kind, i, j)]
        return Link(Ring(self.seg.buf, off, None, DRAIN_BATCH), self, reader)

    def pub(self, i, j):
        return self._link("pub", i, j)

    def to_scanner(self, i):
        return self._link("to_scanner", i)

    def from_scanner(self, i):
        return self._link("from_scanner", i)

    def recover_reader(self, link):
        ring_consumer_recover(link.ring.ctl)

    def recover_writer(self, link):
        ring_producer_recover(link.ring.ctl)

    # ---- wake-ups (ipc.wake: Dekker's store-fence-load on both sides) ---------------------------------
    def eventfd(self, proc):
        return self.eventfds[proc]

    def wake(self, proc):
        """After committing records for proc: one eventfd write, only if proc is going to sleep."""
        self.wakeups.notify(proc)

    def prepare_sleep(self, proc, still_empty):
        """True when proc may block on its eventfd (its rings stayed empty after it armed the flag)."""
        return self.wakeups.prepare_sleep(proc, lambda: not still_empty())

    def awake(self, proc):
        """proc woke up (eventfd readable, or other I/O): reset the eventfd and the flag."""
        self.wakeups.woke(proc)

    def sleep(self, proc, timeout, still_empty):
        """Block up to timeout seconds unless a ring of proc has something (the scanner's idle wait)."""
        self.wakeups.sleep(proc, lambda: not still_empty(), timeout)
