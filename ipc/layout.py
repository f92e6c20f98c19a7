"""Descriptor helpers shared by every shared-memory layout: header words, cache-line padding, attach checks.

Every layout (segment, ring, log, heap, wake flags) starts with the same header line:

    word:   0        1          2                3 .. 7
          +--------+----------+----------------+----------------------------+
          | magic  | version  | size in bytes  | layout parameters (e.g.    |
          | 8 ASCII| of this  | of the whole   | capacity), checked on      |
          | bytes  | layout   | layout         | attach like the rest       |
          +--------+----------+----------------+----------------------------+
          padded to LINE bytes, so the first counter line after it is not shared with anything

``stamp_header`` writes everything else first and publishes the magic word last with a store-release, so a
process attaching concurrently sees either no magic (not initialised yet) or a complete header.
``check_header`` refuses a wrong magic, version, size or parameter with a ``LayoutError`` naming the field:
a wrong layout is never silently reused.

Counters that different processes write live on separate lines of LINE bytes (two 64-byte cache lines: x86's
adjacent-line prefetcher pulls pairs of lines, so one line of padding is not always enough against false sharing).
"""
from __future__ import annotations

import numpy as np

from nsqpy.ipc.atomics import py_load_acquire, py_store_release

__all__ = [
    "CACHE_LINE", "LINE", "WORD", "HEADER_WORDS", "H_MAGIC", "H_VERSION", "H_SIZE", "H_PARAMS",
    "LayoutError", "align_up", "is_power_of_two", "magic", "words", "bytes_view", "line_words",
    "stamp_header", "check_header", "read_only",
]

CACHE_LINE = 64
LINE = 128
WORD = 8
LINE_WORDS = LINE // WORD
HEADER_WORDS = 8
H_MAGIC, H_VERSION, H_SIZE, H_PARAMS = 0, 1, 2, 3
MAX_PARAMS = HEADER_WORDS - H_PARAMS


class LayoutError(RuntimeError):
    """Shared memory does not hold the layout (magic, version, size or parameters) the caller expects."""


def align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def magic(tag: str) -> int:
    """An 8-character ASCII tag as the int64 that reads as that tag in a hex dump of little-endian memory."""
    raw = tag.encode("ascii")
    if len(raw) != 8:
        raise ValueError(f"magic tag must be 8 ASCII characters, got {tag!r}")
    return int.from_bytes(raw, "little", signed=True)


def _tag(word: int) -> str:
    """A word as its 8-character tag when it is printable ASCII, else as a number."""
    raw = int(word).to_bytes(8, "little", signed=True)
    return repr(raw.decode("ascii")) if all(32 <= b < 127 for b in raw) else str(int(word))


def _check_span(buf, offset: int, nbytes: int, what: str) -> memoryview:
    view = memoryview(buf).cast("B") if not isinstance(buf, np.ndarray) else memoryview(buf.reshape(-1).view(np.uint8))
    if offset < 0 or offset + nbytes > len(view):
        raise LayoutError(f"{what}: needs bytes [{offset}, {offset + nbytes}) but the buffer holds {len(view)}")
    return view


def words(buf, offset: int, nwords: int, what: str = "layout") -> np.ndarray:
    """An int64 view of ``nwords`` words at byte ``offset`` (8-aligned) of any writable buffer."""
    if offset % WORD:
        raise LayoutError(f"{what}: offset {offset} is not 8-byte aligned")
    view = _check_span(buf, offset, nwords * WORD, what)
    return np.frombuffer(view, dtype=np.int64, count=nwords, offset=offset)


def bytes_view(buf, offset: int, nbytes: int, what: str = "layout") -> np.ndarray:
    view = _check_span(buf, offset, nbytes, what)
    return np.frombuffer(view, dtype=np.uint8, count=nbytes, offset=offset)


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` when it is read-only, else a read-only view of it. numba compiles a kernel once for read-only and
    once for writable arrays: the wrappers whose kernels take a client's bytes (read-only) as well as a buffer
    of ours pass both as read-only, so a first start compiles one of them (``workers/lane/warmup.py``)."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def line_words(line: int) -> int:
    """Index of the first int64 word of LINE-sized line number ``line``."""
    return line * LINE_WORDS


def stamp_header(hdr: np.ndarray, magic_word: int, version: int, size: int, params=()) -> None:
    """Initialise a header (first HEADER_WORDS of ``hdr``); the magic word is published last."""
    if len(params) > MAX_PARAMS:
        raise ValueError(f"at most {MAX_PARAMS} layout parameters fit in a header")
    py_store_release(hdr, H_MAGIC, 0)
    hdr[H_VERSION] = version
    hdr[H_SIZE] = size
    hdr[H_PARAMS:HEADER_WORDS] = 0
    for k, value in enumerate(params):
        hdr[H_PARAMS + k] = value
    py_store_release(hdr, H_MAGIC, magic_word)


def check_header(hdr: np.ndarray, magic_word: int, version: int, size: int | None = None, params=None,
                 what: str = "layout", names=()) -> tuple[int, ...]:
    """Raise LayoutError unless the header matches; return (size, *params) as found. ``params`` may hold None
    for "any"; ``names`` names the parameters in error messages."""
    found = int(py_load_acquire(hdr, H_MAGIC))
    if found != magic_word:
        state = "not initialised (zero magic)" if found == 0 else f"magic {_tag(found)}"
        raise LayoutError(f"{what}: expected magic {_tag(magic_word)}, found {state}")
    if int(hdr[H_VERSION]) != version:
        raise LayoutError(f"{what}: layout version {int(hdr[H_VERSION])}, this code reads version {version}")
    if size is not None and int(hdr[H_SIZE]) != size:
        raise LayoutError(f"{what}: size {int(hdr[H_SIZE])} bytes, expected {size}")
    found_params = tuple(int(x) for x in hdr[H_PARAMS:HEADER_WORDS])
    if params is not None:
        for k, value in enumerate(params):
            if value is not None and found_params[k] != value:
                label = names[k] if k < len(names) else f"parameter {k}"
                raise LayoutError(f"{what}: {label} is {_tag(found_params[k])}, expected {_tag(value)}")
    return (int(hdr[H_SIZE]),) + found_params
