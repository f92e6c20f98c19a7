"""Numba kernels converting between the log's V2 message frames and go-diskqueue records (``nsqpy/store``), so
that saving or loading a million messages is a few calls, not a Python loop per message.

    V2 frame           [u32 BE size = 4 + len(message)][u32 BE type = 2][message]
    diskqueue record   [i32 BE len(message)][message]
    message            [i64 BE timestamp][u16 BE attempts][16 hex ASCII id][body]
"""
from numba import njit

from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE, warm_up_step  # (importing ipc fixes numba's cache directory first)

MESSAGE_HEADER = 26
OK, CUT, BAD_LENGTH = 0, 1, 2   # scan_records: stopped at the limit / at a record cut short / at a bad length


@njit(nogil=True, inline="always", **JIT_CALLEE)
def _get_be(buf, at, nbytes):
    v = 0
    for k in range(nbytes):
        v = (v << 8) | buf[at + k]
    return v


@njit(nogil=True, **JIT)
def frames_to_records(buf, end):
    """Rewrite the V2 message frames in buf[:end] in place as diskqueue records; returns the new end (4 bytes
    less per frame)."""
    read = 0
    write = 0
    while read < end:
        size = _get_be(buf, read, 4)
        n = size - 4
        for k in range(4):
            buf[write + k] = (n >> (8 * (3 - k))) & 0xFF
        src = read + 8
        dst = write + 4
        for k in range(n):     # dst < src: a forward copy is safe
            buf[dst + k] = buf[src + k]
        read += 4 + size
        write += 4 + n
    return write


@njit(nogil=True, **JIT_CALLEE)
def _hex_id(buf, at):
    """The 64-bit id of 16 hex ASCII digits (as int64 bits), or 0 when they are not hex."""
    v = 0
    for k in range(16):
        c = buf[at + k]
        if 48 <= c <= 57:
            d = c - 48
        elif 97 <= c <= 102:
            d = c - 87
        elif 65 <= c <= 70:
            d = c - 55
        else:
            return 0
        v = (v << 4) | d
    return v


@njit(nogil=True, **JIT)
def scan_records(buf, start, limit, max_message, out_off, out_len, out_ts, out_att, out_id):
    """Parse diskqueue records in buf[start:limit] into the out arrays (body offset and length, timestamp,
    attempts, id; 0 for an id that is not 16 hex digits), at most out_off.size of them.
    Returns (records parsed, position after them, OK | CUT | BAD_LENGTH)."""
    pos = start
    n = 0
    while pos < limit and n < out_off.size:
        if pos + 4 > limit:
            return n, pos, CUT
        size = _get_be(buf, pos, 4)
        if size >= 1 << 31 or size < MESSAGE_HEADER or size > max_message:
            return n, pos, BAD_LENGTH
        if pos + 4 + size > limit:
            return n, pos, CUT
        at = pos + 4
        ts = _get_be(buf, at, 8)
        out_ts[n] = ts
        out_att[n] = _get_be(buf, at + 8, 2)
        out_id[n] = _hex_id(buf, at + 10)
        out_off[n] = at + MESSAGE_HEADER
        out_len[n] = size - MESSAGE_HEADER
        n += 1
        pos = at + size
    return n, pos, OK


@warm_up_step
def warm_up():
    """The go-diskqueue conversions as persistence calls them (workers/lane/warmup.py schedules this)."""
    import numpy as np
    frame = np.frombuffer(b"\x00\x00\x00\x1f\x00\x00\x00\x02" + bytes(8) + bytes(2) + b"0123456789abcdef" + b"x",
                          np.uint8).copy()
    end = frames_to_records(frame, len(frame))
    cols = [np.zeros(2, np.int64) for _ in range(5)]
    scan_records(np.frombuffer(frame.tobytes(), np.uint8), 0, end, 1 << 20, *cols)  # a file's bytes: read-only
