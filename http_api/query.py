"""nsqd's reading of a query string (Go's ``url.ParseQuery``), so the same URLs succeed and fail as with nsqd.

Parameters come from the query string only (spec 2.1). Go is stricter than ``urllib.parse``: a malformed ``%``
escape or a ``;`` anywhere in a key or value fails the whole query (nsqd answers 400 INVALID_REQUEST), and ``+``
is a space. Values are bytes in Go; here they are str decoded as UTF-8 with surrogateescape, so a non-UTF-8 name
reaches ``is_valid_name`` intact (and fails it) instead of raising somewhere else.
"""
from __future__ import annotations

import re

__all__ = ["BadQuery", "parse_query", "BOOL_PARAMS", "parse_bool"]

_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")

# nsqd's boolParams: anything else is "not given" (callers pick the default)
BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}


class BadQuery(ValueError):
    """The query string is not one Go's url.ParseQuery accepts."""


def _unescape(raw: bytes) -> str:
    if _ESCAPE.search(raw):
        raise BadQuery(f"invalid URL escape in {raw[:40]!r}")
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == 0x25:  # '%'
            out.append(int(raw[i + 1:i + 3], 16))
            i += 3
            continue
        out.append(0x20 if c == 0x2B else c)  # '+' is a space in a query
        i += 1
    return out.decode("utf-8", "surrogateescape")


def parse_query(raw: bytes | str) -> dict[str, list[str]]:
    """{key: [values in order]}; raises BadQuery where Go's url.ParseQuery returns an error."""
    if isinstance(raw, str):
        raw = raw.encode("latin-1", "surrogateescape")  # WSGI hands the raw bytes over as latin-1
    params: dict[str, list[str]] = {}
    for part in raw.split(b"&"):
        if not part:
            continue
        if b";" in part:
            raise BadQuery("invalid semicolon separator in query")
        key, _, value = part.partition(b"=")
        params.setdefault(_unescape(key), []).append(_unescape(value))
    return params


def parse_bool(params: dict, key: str, default: bool) -> bool:
    """nsqd's boolean parameters: true/1/false/0; missing or anything else gives ``default``."""
    values = params.get(key)
    return BOOL_PARAMS.get(values[0], default) if values else default
