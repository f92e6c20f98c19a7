"""Decoding a JSON object the way Go's encoding/json fills a struct, for the IDENTIFY bodies of V2 and V1.

Keys match field names exactly or case-insensitively, unknown keys are ignored, a repeated key's last value
wins, `null` leaves the default, and a value of the wrong JSON type (a string for an int, 1.5 or 1e3 for an
int, a number for a bool, an int out of the field's range) fails the whole decode, as in Go.
"""

from __future__ import annotations

import json

__all__ = ["INT32", "INT64", "decode_struct"]

INT64 = (-(1 << 63), (1 << 63) - 1)
INT32 = (-(1 << 31), (1 << 31) - 1)

# field name -> (Python type, int range or None, default)
FieldSpec = dict[str, tuple[type, "tuple[int, int] | None", object]]


def _reject_constant(name: str):
    raise ValueError(name)  # NaN and Infinity are not JSON to Go


def decode_struct(body: bytes, fields: FieldSpec) -> dict | None:
    """The decoded fields (defaults filled in), or None when Go's json.Unmarshal would fail."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"), parse_constant=_reject_constant)
    except ValueError:
        return None
    if doc is None:  # Unmarshal of `null` into a struct is a no-op
        doc = {}
    if not isinstance(doc, dict):
        return None
    folded = {name.lower(): name for name in fields}
    out = {name: default for name, (_, _, default) in fields.items()}
    for key, value in doc.items():
        name = key if key in fields else folded.get(key.lower())
        if name is None or value is None:
            continue
        kind, bounds, _ = fields[name]
        if type(value) is not kind or (bounds is not None and not bounds[0] <= value <= bounds[1]):
            return None
        out[name] = value
    return out
