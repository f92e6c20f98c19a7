"""Request bodies of nsqadmin's write routes, decoded as Go's encoding/json into a struct would, with its error
texts (nsqadmin returns them as the 400's message): ``EOF`` for an empty body, ``invalid character 'x' looking for
beginning of value``, ``invalid character 'o' in literal null (expecting 'u')``, a wrong field type."""
from __future__ import annotations

import json

__all__ = ["BodyError", "decode_object", "json_error", "string_field"]

_LITERALS = {"t": "true", "f": "false", "n": "null"}


class BodyError(ValueError):
    """A field of the wrong JSON type: Go's UnmarshalTypeError text."""


def json_error(body: bytes) -> str:
    """Go's encoding/json text for a body that is not one JSON value (close to it: the common cases)."""
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return "EOF"
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        if e.pos >= len(text):
            return "unexpected EOF"
        literal = _LITERALS.get(text[e.pos])
        if literal is not None:  # Go reads a literal letter by letter
            for i, want in enumerate(literal):
                got = text[e.pos + i:e.pos + i + 1]
                if not got:
                    return "unexpected EOF"
                if got != want:
                    return f"invalid character {got!r} in literal {literal} (expecting {want!r})"
        return f"invalid character {text[e.pos]!r} looking for beginning of value"
    return "json: cannot unmarshal into Go value"


def decode_object(body: bytes) -> dict | None:
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def string_field(doc: dict, key: str) -> str:
    value = doc.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        kind = {bool: "bool", int: "number", float: "number", list: "array", dict: "object"}[type(value)]
        raise BodyError(f"json: cannot unmarshal {kind} into Go struct field .{key} of type string")
    return value
