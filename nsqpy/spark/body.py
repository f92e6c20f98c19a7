"""Row -> message body: the one place that decides how a Spark row becomes the bytes NSQ carries.

Three forms, as Spark's Kafka sink has its `value` column: a named column (binary or string; other scalars
as their text), the row itself when it already is bytes or str (an RDD of bodies), or the whole row as one
JSON object (`json_rows`), with Spark's own JSON conventions for what JSON has no type for (binary as base64,
timestamps and dates in ISO 8601, decimals as text).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json

__all__ = ["BodyEncoder"]

_SCALARS = (int, float, bool, decimal.Decimal, datetime.date, datetime.datetime)


def _json_default(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if hasattr(value, "asDict"):                       # a nested Row
        return value.asDict(recursive=True)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def _as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, _SCALARS):
        return str(value).encode("ascii")
    raise TypeError(f"a message body must be bytes or str, got {type(value).__name__}: pass column= or "
                    f"json_rows=True")


class BodyEncoder:
    """Picklable; `encode(row)` -> bytes. NSQ refuses empty bodies, so a null or empty one is an error here,
    where the row is known, rather than an E_BAD_MESSAGE for a whole MPUB later."""

    def __init__(self, column: str | int | None = None, json_rows: bool = False):
        self.column = column
        self.json_rows = json_rows

    def encode(self, row) -> bytes:
        if self.json_rows:
            if hasattr(row, "asDict"):
                row = row.asDict(recursive=True)
            body = json.dumps(row, default=_json_default, separators=(",", ":"), ensure_ascii=False)
            return body.encode("utf-8")
        if self.column is not None:
            value = row[self.column]
        elif isinstance(row, (bytes, bytearray, memoryview, str)):
            value = row
        elif hasattr(row, "asDict") and len(row) == 1:  # a one-column DataFrame
            value = row[0]
        elif hasattr(row, "asDict") and "body" in row.__fields__:
            value = row["body"]
        else:
            raise TypeError(f"cannot tell the body of {type(row).__name__}: pass column= or json_rows=True")
        return self.check(value)

    def check(self, value) -> bytes:
        if value is None:
            raise ValueError(f"null message body (column {self.column!r}); NSQ has no empty messages")
        body = _as_bytes(value)
        if not body:
            raise ValueError(f"empty message body (column {self.column!r}); NSQ has no empty messages")
        return body

    def encode_arrow(self, batches):
        """Bodies from Arrow RecordBatches (the data source writers): a column is taken whole, never as Rows."""
        for batch in batches:
            if self.json_rows:
                yield from map(self.encode, batch.to_pylist())
            else:
                yield from map(self.check, batch.column(self.column).to_pylist())
