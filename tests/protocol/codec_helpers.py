"""Shared helpers for the protocol tests (imported by path: tests/protocol has no __init__.py)."""

from __future__ import annotations

from nsqpy.protocol import FinBatch, Rdy, V2Parser
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.states import STATE_INIT

ID = b"0123456789abcdef"
ID2 = b"fedcba9876543210"


def parse(data: bytes, state: int = STATE_INIT, **limits) -> list:
    """Everything one feed of `data` (no magic) gives, errors included."""
    from nsqpy.protocol import Limits
    parser = V2Parser(Limits(**limits), expect_magic=False, state=state)
    return parser.feed(data)


def parse_chunks(chunks, state: int = STATE_INIT, expect_magic: bool = False) -> list:
    parser = V2Parser(expect_magic=expect_magic, state=state)
    out = []
    for chunk in chunks:
        out += parser.feed(chunk)
        if out and isinstance(out[-1], ProtocolError):
            break
    return out


def normalize(items: list) -> list:
    """Batch forms expanded (FinBatch -> Fins) and runs of Rdy collapsed to the last: how many lines land in
    one batch depends on chunking, what they mean does not."""
    flat = []
    for item in items:
        if isinstance(item, FinBatch):
            flat.extend(item.fins())
        elif isinstance(item, Rdy) and flat and isinstance(flat[-1], Rdy):
            flat[-1] = item
        else:
            flat.append(item)
    return flat
