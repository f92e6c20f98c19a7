"""Shared memory for nsqpy: atomics, segments, layouts, rings, wake-ups (imports nothing else of nsqpy).

Importing any ``ipc`` module runs this first, which fixes numba's cache directory before a kernel is compiled
(see ``nsqpy.ipc.numba_cache``).
"""
from nsqpy.ipc import numba_cache as _numba_cache

_numba_cache.configure()
