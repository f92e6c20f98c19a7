"""The message log's segment window: one reserved address range into which segments are mapped at fixed slots.

Theory of operation
-------------------
Kernels want one array, the log wants many segments (created, spilled to disk and released one at a time). So each
process reserves W * segment_size bytes of address space once (PROT_NONE, MAP_NORESERVE: no memory, no swap is
committed), and maps segment k over slot ``k % W`` with MAP_FIXED|MAP_SHARED from the segment's fd (a /dev/shm
object or a file: the kernels cannot tell). Releasing a slot maps fresh PROT_NONE over it, so the range stays
reserved and nothing else of the process is ever placed inside it. The numpy views (``data``, ``data64``) span the
whole range (until the log grows the window); touching an unmapped slot is a SIGSEGV, i.e. a kernel bug, never
silent corruption.
A segment file is sparse (only what the log reached is reserved, see ``nsqpy.ipc.msglog``): mapping it whole commits
nothing, so a slot costs address space only, and big segments (up to ``MAX_SEGMENT_SIZE``; 128 MiB for a 64 MiB
--max-msg-size) cost no more than small ones until they fill. A window holds the segments retained now, not the
whole budget: it starts at INITIAL_WINDOW slots and the log replaces it by one twice as big when it outgrows it
(``MessageLog._fit``), so its views move then; kernels get them from the log on every call.

A segment file being written for the first time is mapped with MADV_RANDOM (``map(..., writing=True)``), and so
is the head's segment when a restarted owner maps the log again (it writes on there). Without
it, the first write fault of a fresh file reads ahead: the kernel allocates and zero-fills up to read_ahead_kb of
page cache (the disk's setting: 128 KiB on many hosts, 8 MiB on this project's build VM, where it stalled the
owner for milliseconds at every 8 MiB segment, by hand), all at once in the faulting call. The segment written
before it gets the kernel's normal readahead back: from then on it is only read, maybe from disk after its pages
were evicted. A /dev/shm segment has no readahead to turn off.

Python's ``mmap`` module cannot map at a fixed address, hence libc ``mmap`` through ctypes (``nsqpy.ipc.rawmap``); it
runs only when a segment is created, attached or released.

Resource handling: ``close()`` unmaps the whole range; the views must not be used after it (the owning
``MessageLog`` drops them first). A forked child inherits the range and its mappings as they were at fork.
"""
from __future__ import annotations

import mmap

import numpy as np

from nsqpy.ipc.rawmap import madvise, mmap_at, munmap

__all__ = ["SegmentWindow"]

_PROT_NONE = 0
_MAP_FIXED = 0x10
_MAP_NORESERVE = 0x4000
_RESERVE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE


class _ArrayAt:
    """Exposes raw memory to numpy via the array interface (no copy, no ownership)."""

    def __init__(self, addr: int, nbytes: int):
        self.__array_interface__ = {"data": (addr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


class SegmentWindow:
    """W slots of ``segment_size`` bytes at one fixed address range of this process."""

    def __init__(self, slots: int, segment_size: int):
        self.slots = slots
        self.segment_size = segment_size
        self.nbytes = slots * segment_size
        self._base = mmap_at(None, self.nbytes, _PROT_NONE, _RESERVE, -1, 0)
        self.data = np.asarray(_ArrayAt(self._base, self.nbytes))
        self.data64 = self.data.view(np.int64)
        self.mapped = [-1] * slots  # segment number mapped at each slot by this process, -1 for none
        self.writing = -1           # the segment mapped with MADV_RANDOM (module docstring), -1 for none

    def _slot_addr(self, slot: int) -> int:
        return self._base + slot * self.segment_size

    def map(self, k: int, fd: int, offset: int, writing: bool = False) -> None:
        """Map segment k (bytes [offset, offset + segment_size) of fd) at its slot; ``writing``: a file whose
        pages are written for the first time now (module docstring)."""
        slot = k % self.slots
        mmap_at(self._slot_addr(slot), self.segment_size, mmap.PROT_READ | mmap.PROT_WRITE,
              mmap.MAP_SHARED | _MAP_FIXED, fd, offset)
        self.mapped[slot] = k
        if writing:
            before = self.writing
            if before >= 0 and self.mapped[before % self.slots] == before:
                madvise(self._slot_addr(before % self.slots), self.segment_size, mmap.MADV_NORMAL)
            madvise(self._slot_addr(slot), self.segment_size, mmap.MADV_RANDOM)
            self.writing = k

    def unmap(self, k: int) -> None:
        """Release segment k's slot (keeps the address range reserved)."""
        slot = k % self.slots
        if self.mapped[slot] != k:
            return
        mmap_at(self._slot_addr(slot), self.segment_size, _PROT_NONE, _RESERVE | _MAP_FIXED, -1, 0)
        self.mapped[slot] = -1
        if self.writing == k:
            self.writing = -1

    def close(self) -> None:
        if self._base is None:
            return
        self.data = self.data64 = None
        munmap(self._base, self.nbytes)
        self._base = None
