"""The rings between the broker's processes, and the wake-ups that go with them.

Theory of operation: every pair of processes that sends messages in one direction has its own SPSC ring
(``ipc.ring``), so every shared word has one writer and a crashed process leaves nothing half-locked:

    pub(i, j)          worker i -> worker j    publishes for topics that j owns (i != j)
    to_scanner(i)      worker i -> scanner     START / REMOVE / RESET timer events
    from_scanner(i)    scanner -> worker i     EXPIRED timers

All rings of one broker live in one segment, with one "sleeping" flag line per reading process ahead of them.

Wake-ups: a reader that finds all its rings empty sets its sleeping flag, issues a full fence, looks at its rings
once more, and only then blocks on its eventfd (in the worker's epoll loop, or ``sleep`` for the scanner). A
writer, after committing, swaps the reader's flag from 1 to 0 with a compare-and-swap (a full barrier on x86, and
it orders the commit before the flag read on weaker CPUs because ``cas`` is sequentially consistent) and writes
the eventfd only if it won the swap. So an idle reader costs nothing, a busy one pays no syscall per record, and
no wake-up is lost: either the writer sees the flag, or the reader's re-check sees the record.

Resource handling: the supervisor creates the segment and the eventfds before forking; every child uses the
inherited mapping, so a restarted child finds the rings where its predecessor left them. A restarted reader
re-reads what was read but not released (``Ring`` consumer recovery), a restarted writer resumes at the committed
tail (producer recovery): at worst a duplicate, never a loss.
"""
import os
import select

import numpy as np

from ipc.atomics import py_cas, py_fetch_add, py_load_acquire, py_store_release
from ipc.layout import LINE, LINE_WORDS, HEADER_WORDS, check_header, magic, stamp_header, words
from ipc.ring import C_HEAD, C_READ, HEADER_BYTES, Ring, record_size, ring_consumer_recover, ring_producer_recover

MAGIC = magic("NSQLINKS")
VERSION = 1
PUB_CAPACITY = 32 << 20
SCANNER_CAPACITY = 8 << 20
DRAIN_BATCH = 256


def _layout(workers):
    """[(kind, i, j, offset, capacity)] and the total size."""
    procs = workers + 1
    offset = LINE * (1 + procs)
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
        return self.ring.readable() == 0

    def drain(self, handle, max_records=DRAIN_BATCH):
        """Call handle(rtype, payload) for committed records in order; a record is released only after handle
        returned True. A False stops the drain, and that record is offered again next time. -> records done."""
        ring = self.ring
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
            if not handle(int(types[k]), data[off:off + length]):
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
    def __init__(self, seg, workers, eventfds=None):
        self.seg = seg
        self.workers = workers
        self.SCANNER = workers
        self.rings, size = _layout(workers)
        self.w = words(seg.buf, 0, LINE * (1 + workers + 1) // 8, "links")
        check_header(self.w[:HEADER_WORDS], MAGIC, VERSION, size, (workers,), what="links")
        self.eventfds = eventfds or [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(workers + 1)]
        for fd in self.eventfds:
            os.set_inheritable(fd, False)
        self._by_key = {}
        for kind, i, j, off, cap in self.rings:
            reader = j if kind == "pub" else (self.SCANNER if kind == "to_scanner" else i)
            self._by_key[(kind, i, j)] = (off, reader)

    @classmethod
    def create(cls, seg, workers):
        rings, size = _layout(workers)
        hdr = words(seg.buf, 0, LINE * (1 + workers + 1) // 8, "links")
        hdr[:] = 0
        for kind, i, j, off, cap in rings:
            Ring.create(seg.buf, off, cap)
        stamp_header(hdr[:HEADER_WORDS], MAGIC, VERSION, size, (workers,))
        return cls(seg, workers)

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

    # ---- wake-ups --------------------------------------------------------------------------------------
    def _flag(self, proc):
        return LINE_WORDS * (1 + proc)

    def eventfd(self, proc):
        return self.eventfds[proc]

    def wake(self, proc):
        if py_load_acquire(self.w, self._flag(proc)) == 1 and py_cas(self.w, self._flag(proc), 1, 0) == 1:
            try:
                os.eventfd_write(self.eventfds[proc], 1)
            except BlockingIOError:
                pass  # the counter is already non-zero: the reader will wake anyway

    def prepare_sleep(self, proc, still_empty):
        """Set the sleeping flag, fence, and re-check; True when the caller may block on its eventfd."""
        py_store_release(self.w, self._flag(proc), 1)
        py_fetch_add(self.w, self._flag(proc) + 1, 0)  # full barrier between the flag store and the re-check
        if still_empty():
            return True
        py_store_release(self.w, self._flag(proc), 0)
        return False

    def awake(self, proc):
        py_store_release(self.w, self._flag(proc), 0)

    def clear_wake(self, proc):
        try:
            os.eventfd_read(self.eventfds[proc])
        except BlockingIOError:
            pass

    def sleep(self, proc, timeout, still_empty):
        """Block up to timeout seconds unless a ring of proc has something (the scanner's idle wait)."""
        if self.prepare_sleep(proc, still_empty):
            select.select([self.eventfds[proc]], [], [], timeout)
            self.clear_wake(proc)
        self.awake(proc)
