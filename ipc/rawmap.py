"""Shared mappings made with libc's mmap (through ctypes), for the two things Python's ``mmap`` cannot do.

* ``map_fd``: a shared mapping that keeps no file descriptor. Python's ``mmap.mmap`` holds a dup of the fd for the
  mapping's lifetime (Python 3.11 has no ``trackfd=False``), so every topic's control block cost its owner one fd
  for as long as the topic lived: with ``ulimit -n`` at its usual 1024, about a thousand topics per worker. The
  mapping is returned as a uint8 numpy array whose owner unmaps it when the last view of it is collected, so
  closing early can never leave a dangling view (the same guarantee ``mmap.mmap.close`` gives with BufferError).
* ``mmap_at``: a mapping at a fixed address (the message log's segment window, ``nsqpy.ipc.msglog_window``).
"""
from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

__all__ = ["map_fd", "mmap_at", "munmap", "madvise", "PROT_RW"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE


def mmap_at(addr, length, prot, flags, fd, offset):
    """libc mmap; -> the address. OSError on failure."""
    got = _libc.mmap(addr, length, prot, flags, fd, offset)
    if got is None or got == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {length} bytes failed: {os.strerror(err)}")
    return got


def munmap(addr, length):
    _libc.munmap(addr, length)


def madvise(addr, length, advice):
    """libc madvise (``mmap.MADV_*``); advice only, so a failure is ignored."""
    _libc.madvise(addr, length, advice)


class _Mapping:
    """Owns one mapping; numpy arrays over it keep it alive, and it unmaps when the last of them is gone."""

    def __init__(self, addr: int, length: int):
        self.addr, self.length = addr, length
        self.__array_interface__ = {"data": (addr, False), "shape": (length,), "typestr": "|u1", "version": 3}

    def __del__(self):
        munmap(self.addr, self.length)


def map_fd(fd: int, length: int) -> np.ndarray:
    """Map ``length`` bytes of fd shared and read-write; the fd may be closed right after (none is kept)."""
    return np.asarray(_Mapping(mmap_at(None, length, PROT_RW, mmap.MAP_SHARED, fd, 0), length))
