"""Message IDs: 64-bit snowflake values, sent as 16 lowercase ASCII hex bytes.

    id = ((now_ns >> 20) - 1288834974288) << 22 | node_id << 12 | seq12

`now_ns >> 20` is a ~1.05 ms tick. NSQ's generator refuses to run when the clock goes backwards or the 4096
sequence numbers of one tick are used up, and its caller sleeps and retries. A sans-IO generator cannot sleep,
so `IdGenerator` instead never lets its tick go backwards and, when a tick's sequence is exhausted, borrows the
next tick. IDs stay unique and increasing per generator either way (one generator per topic, as in NSQ).
"""

from __future__ import annotations

import numpy as np

from nsqpy.protocol import kernels

__all__ = ["TWEPOCH", "MAX_NODE_ID", "snowflake", "id_to_hex", "hex_to_id", "IdGenerator"]

TWEPOCH = 1288834974288
MAX_NODE_ID = 1023
SEQUENCE_MASK = 0xFFF

_HEX_DIGITS = frozenset(b"0123456789abcdef")


def snowflake(now_ns: int, node_id: int, seq: int) -> int:
    """The ID NSQ's formula gives for a clock reading, a node id (0-1023) and a 12-bit sequence number."""
    return (((now_ns >> 20) - TWEPOCH) << 22 | node_id << 12 | (seq & SEQUENCE_MASK)) & 0xFFFFFFFFFFFFFFFF


def id_to_hex(value: int) -> bytes:
    """64-bit ID -> its 16 lowercase hex ASCII bytes (big-endian, as nsqd's `GUID.Hex`)."""
    return b"%016x" % value


def hex_to_id(raw: bytes) -> int | None:
    """16 lowercase hex ASCII bytes -> the 64-bit ID; None for anything else. nsqd never issues such an ID, so
    FIN/REQ/TOUCH with one fail later as "not in flight" (non-fatal), they are not a parse error."""
    if len(raw) != 16 or not _HEX_DIGITS.issuperset(raw):
        return None
    return int(raw, 16)


class IdGenerator:
    """Per-topic ID source. Not thread-safe: a topic has one owner worker."""

    __slots__ = ("node_id", "last_tick", "sequence")

    def __init__(self, node_id: int):
        if not 0 <= node_id <= MAX_NODE_ID:
            raise ValueError(f"node_id {node_id} out of range 0-{MAX_NODE_ID}")
        self.node_id = node_id
        self.last_tick = -1
        self.sequence = 0

    def next_id(self, now_ns: int) -> int:
        tick = now_ns >> 20
        if tick <= self.last_tick:
            tick = self.last_tick
            self.sequence += 1
            if self.sequence > SEQUENCE_MASK:
                tick += 1
                self.sequence = 0
        else:
            self.sequence = 0
        self.last_tick = tick
        return ((tick - TWEPOCH) << 22 | self.node_id << 12 | self.sequence) & 0xFFFFFFFFFFFFFFFF

    def next_ids(self, n: int, now_ns: int) -> np.ndarray:
        """`n` consecutive IDs as a uint64 array, in one kernel call (for an MPUB)."""
        out = np.empty(n, dtype=np.uint64)
        self.last_tick, self.sequence = kernels.snowflake_fill(
            out, now_ns >> 20, self.last_tick, self.sequence, self.node_id)
        return out
