"""Topic and channel names, and NSQ's way of reading numbers off a command line."""

from __future__ import annotations

import re

__all__ = ["is_valid_name", "is_ephemeral", "parse_base10", "wrap_int64", "MAX_NAME_LENGTH"]

MAX_NAME_LENGTH = 64  # bytes, including a "#ephemeral" suffix
_NAME = re.compile(rb"[.a-zA-Z0-9_-]+(#ephemeral)?")


def is_valid_name(name: bytes | str) -> bool:
    """`^[.a-zA-Z0-9_-]+(#ephemeral)?$`, 1-64 bytes: the rule for both topics and channels."""
    raw = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else name
    return 1 <= len(raw) <= MAX_NAME_LENGTH and _NAME.fullmatch(raw) is not None


def is_ephemeral(name: str) -> bool:
    return name.endswith("#ephemeral")


def parse_base10(raw: bytes) -> int | None:
    """nsqd's ByteToBase10: ASCII digits only (no sign, no space) else None; the empty string is 0 and the
    value wraps modulo 2**64 like Go's uint64."""
    if not raw:
        return 0
    if not raw.isdigit():  # bytes.isdigit() is ASCII-only
        return None
    return int(raw) & 0xFFFFFFFFFFFFFFFF


def wrap_int64(value: int) -> int:
    """Go's int64 conversion of an out-of-range integer (two's complement wrap)."""
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value
