"""Compiled recognisers of V2's publish commands in their plainest form: the broker's fast path (the pump,
workers/lane/pump.py) asks them whether one socket read is exactly one whole PUB or MPUB, and how many bytes a read
that began one still lacks.

They only ever *accept*: a read they take is one the reference parser (``v2_parser``) reads as that same single
command, and anything else (an error, ``\\r\\n``, an extra parameter, a second command, an incomplete one) they
decline, leaving it to the parser, which gives NSQ's exact reply. Topic names are not checked here: the pump
stages a read only for a name it already learnt from the parser. tests/protocol/test_v2_recognisers.py holds
them to the parser's byte tables.

Kernels are pure functions over a uint8 buffer and ints (``buf[at:at + got]`` is the read), compiled with the
broker's options (``nsqpy.ipc.numba_cache``); the pump inlines them in its read loop and the warm-up compiles that.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE
from nsqpy.ipc.sysio import be32
from nsqpy.protocol.names import MAX_NAME_LENGTH

__all__ = ["lone_pub_line", "lone_mpub_line", "short_by"]

_PUB = np.frombuffer(b"PUB ", np.uint8).copy()
_MPUB = np.frombuffer(b"MPUB ", np.uint8).copy()


@njit(inline="always", **JIT_CALLEE)
def _verb_line(buf, at, got, verb):
    """The offset of the "\\n" ending `<verb><name>` at the start of buf[at:at+got] (verb with its space; a name of
    1 to MAX_NAME_LENGTH bytes, not checked here), else -1."""
    k = verb.size
    if got < k:
        return -1
    for i in range(k):
        if buf[at + i] != verb[i]:
            return -1
    for i in range(k + 1, min(got, k + MAX_NAME_LENGTH + 1)):
        if buf[at + i] == 10:
            return i
    return -1


@njit(**JIT)
def lone_pub_line(buf, at, got, max_msg):
    """The offset of the "\\n" when buf[at:at+got] is exactly one `PUB <name>\\n<size><body>` with
    0 < size <= max_msg (the name is not checked here), else -1."""
    if got < 11:
        return -1
    nl = _verb_line(buf, at, got, _PUB)
    if nl < 0 or nl + 5 >= got:
        return -1
    size = be32(buf, at + nl + 1)
    if size <= 0 or size > max_msg or nl + 5 + size != got:
        return -1
    return nl


@njit(**JIT)
def lone_mpub_line(buf, at, got, max_msg, max_body):
    """(offset of the "\\n", message count) when buf[at:at+got] is exactly one `MPUB <name>\\n<body size><count>`
    followed by count `<size><body>` that fill the body exactly, with 0 < body size <= max_body, count > 0 and
    0 < each size <= max_msg (the name is not checked here), else (-1, 0). Anything else (nsqd's errors included)
    is the parser's."""
    if got < 18:
        return -1, 0
    nl = _verb_line(buf, at, got, _MPUB)
    if nl < 0 or nl + 9 > got:
        return -1, 0
    body = be32(buf, at + nl + 1)
    n = be32(buf, at + nl + 5)
    if body <= 4 or body > max_body or nl + 5 + body != got or n <= 0:
        return -1, 0
    p = nl + 9
    for _ in range(n):
        if p + 4 > got:
            return -1, 0
        size = be32(buf, at + p)
        if size <= 0 or size > max_msg:
            return -1, 0
        p += 4 + size
    if p != got:
        return -1, 0
    return nl, n


@njit(**JIT)
def short_by(buf, at, got):
    """How many bytes buf[at:at+got] lacks to be one whole `PUB <name>\n<size><body>` or `MPUB <name>\n<body size>
    <body>` when it is the start of one and already holds the size (the rest of a command the kernel had only
    partly received), else 0. Nothing is validated here: a read completed this way still goes through
    lone_pub_line/lone_mpub_line (or to the parser)."""
    nl = _verb_line(buf, at, got, _MPUB)
    if nl < 0:
        nl = _verb_line(buf, at, got, _PUB)
    if nl < 0 or nl + 5 > got:
        return 0
    total = nl + 5 + be32(buf, at + nl + 1)
    return total - got if total > got else 0
