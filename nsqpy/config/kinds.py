"""Value kinds: how one option's text becomes a typed value, from argv and from TOML.

Each kind reads a flag the way the Go ``flag.Value`` behind the NSQ flag does
(``flag.Int64`` takes ``0x10`` and ``1_000``; ``flag.Duration`` takes ``1m0s``;
``-tls-required`` is a bool-like flag) and reads a TOML value the way
``mreiferson/go-options`` coerces it (an integer duration means milliseconds; a
string list may be one comma-separated string).  Parse failures raise
``ValueError`` whose text is the reason Go's flag package would print
(``parse error``, ``value out of range``) or, for checks NSQ makes after
parsing, a short rule such as ``must be in range [1,9]``.  The flag set adds the
flag or key name, so each error stays one line.

Where go-options is sloppy nsqpy is strict instead, because the result would
surprise an operator: a TOML integer for a bool (go-options inverts it), a
non-string for a string option (go-options renders Go's ``%!s(int64=5)``) and
non-strings in a string array (go-options panics) are type errors here.
"""
from __future__ import annotations

import enum
import string

from .duration import MILLISECOND, format_duration, parse_duration

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT_CHARS = frozenset(string.ascii_letters + string.digits + "_")
_TRUE_WORDS = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE_WORDS = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_go_bool(text: str) -> bool:
    """strconv.ParseBool: the twelve spellings Go accepts, nothing else."""
    if text in _TRUE_WORDS:
        return True
    if text in _FALSE_WORDS:
        return False
    raise ValueError("parse error")


def parse_go_int(text: str, any_base: bool = True) -> int:
    """strconv.ParseInt(text, 0 or 10, 64): sign, 0x/0o/0b/leading-0 octal and _ when any_base."""
    sign, body = "", text
    if text[:1] in ("+", "-"):
        sign, body = text[0], text[1:]
    if not body or not set(body) <= _INT_CHARS:
        raise ValueError("parse error")  # also keeps int()'s whitespace and Unicode digits out
    if not any_base:
        if not body.isdigit():
            raise ValueError("parse error")
        number = int(sign + body)
    else:
        if len(body) > 1 and body[0] == "0" and body[1] not in "xXoObB":
            body = "0o" + body[1:]  # Go reads a leading 0 as octal; Python's int() refuses it
        try:
            number = int(sign + body, 0)
        except ValueError:
            raise ValueError("parse error") from None
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError("value out of range")
    return number


def _wrong_type(hint: str) -> ValueError:
    return ValueError("wrong type, " + hint)


def _is_int(raw: object) -> bool:
    return isinstance(raw, int) and not isinstance(raw, bool)


def _int64(value: int) -> int:
    """tomllib reads integers of any size; Go's TOML decoder stops at int64."""
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError("value out of range")
    return value


class Kind:
    """Base: a flag that takes a value, shown in -h as ``-name <type_name>``."""

    type_name = "value"
    is_bool = False  # bool-like flags never consume the next argument
    repeatable = False  # each occurrence adds to a list instead of replacing

    def parse(self, text: str):
        raise NotImplementedError

    def from_file(self, raw: object):
        if isinstance(raw, str):
            return self.parse(raw)
        raise _wrong_type("expected a string")

    def show(self, value) -> str | None:
        """The default as -h prints it, or None for Go's zero value (not printed)."""
        return str(value) if value else None

    def merge(self, earlier, later):
        """Combine two occurrences of the flag: the last wins unless repeatable."""
        return later

    def to_json(self, value):
        return value


class Bool(Kind):
    type_name = ""
    is_bool = True

    def parse(self, text: str) -> bool:
        return parse_go_bool(text)

    def from_file(self, raw: object) -> bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            return parse_go_bool(raw)
        raise _wrong_type("expected a boolean")

    def show(self, value: bool) -> str | None:
        return "true" if value else None


class Int(Kind):
    """A Go int64 flag, optionally limited to [low, high] as nsqd checks at start-up."""

    type_name = "int"

    def __init__(self, low: int | None = None, high: int | None = None):
        self.low, self.high = low, high

    def parse(self, text: str) -> int:
        return self.check(parse_go_int(text))

    def from_file(self, raw: object) -> int:
        if _is_int(raw):
            return self.check(_int64(raw))
        if isinstance(raw, str):
            return self.check(parse_go_int(raw, any_base=False))
        raise _wrong_type("expected an integer")

    def check(self, value: int) -> int:
        low_ok = self.low is None or value >= self.low
        high_ok = self.high is None or value <= self.high
        if low_ok and high_ok:
            return value
        if self.high is None:
            raise ValueError("must be at least %d" % self.low)
        raise ValueError("must be in range [%d,%d]" % (self.low, self.high))

    def show(self, value: int) -> str | None:
        return str(value) if value else None


class Str(Kind):
    """A plain string; ``check`` (raising ValueError) validates it where NSQ does at start-up."""

    type_name = "string"

    def __init__(self, check=None):
        self.check = check

    def parse(self, text: str) -> str:
        if self.check is not None:
            self.check(text)
        return text

    def show(self, value: str) -> str | None:
        return go_quote(value) if value else None


class Duration(Kind):
    """time.Duration held as int nanoseconds; a bare TOML integer means milliseconds."""

    type_name = "duration"

    def parse(self, text: str) -> int:
        try:
            return parse_duration(text)
        except ValueError:
            raise ValueError("parse error") from None

    def from_file(self, raw: object) -> int:
        if _is_int(raw):
            return _int64(_int64(raw) * MILLISECOND)
        if isinstance(raw, str):
            return parse_duration(raw)  # the message names the bad text, like Go's
        raise _wrong_type("expected a duration string or integer milliseconds")

    def show(self, value: int) -> str | None:
        return format_duration(value) if value else None


class StrList(Kind):
    """app.StringArray: each -flag adds one item; a TOML string is split on commas."""

    repeatable = True

    def parse(self, text: str) -> list[str]:
        return [text]

    def merge(self, earlier: list, later: list) -> list:
        return earlier + later

    def from_file(self, raw: object) -> list[str]:
        if isinstance(raw, str):
            return raw.split(",")
        if isinstance(raw, list) and all(isinstance(item, str) for item in raw):
            return list(raw)
        raise _wrong_type("expected an array of strings or a comma-separated string")

    def show(self, value: list[str]) -> str | None:
        return ",".join(value) or None


class Percentiles(Kind):
    """app.FloatArray for e2e percentiles: comma-separated, each in (0, 1], kept sorted descending."""

    repeatable = True

    def parse(self, text: str) -> list[float]:
        return self._checked([self._float(part) for part in text.split(",")])

    def from_file(self, raw: object) -> list[float]:
        if isinstance(raw, str):
            return self._checked([self._float(part.strip()) for part in raw.split(",")])
        if isinstance(raw, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
            return self._checked([float(v) for v in raw])
        raise _wrong_type("expected an array of numbers or a comma-separated string")

    def merge(self, earlier: list[float], later: list[float]) -> list[float]:
        return sorted(earlier + later, reverse=True)

    @staticmethod
    def _float(text: str) -> float:
        # Python's float() also takes spaces and "1_0"; strconv.ParseFloat does not.
        if not text or text != text.strip() or "_" in text:
            raise ValueError("parse error")
        try:
            return float(text)
        except ValueError:
            raise ValueError("parse error") from None

    @staticmethod
    def _checked(values: list[float]) -> list[float]:
        for value in values:
            if not 0 < value <= 1:  # also rejects NaN, which nsqd's own check lets through
                raise ValueError("each percentile must be in range (0,1]")
        return sorted(values, reverse=True)

    def show(self, value: list[float]) -> str | None:
        return ",".join("%f" % v for v in value) or None


class Choice(Kind):
    """A case-insensitive word that maps to a value (enum member or string)."""

    def __init__(self, choices: dict, reason: str):
        self.choices, self.reason = choices, reason

    def parse(self, text: str):
        try:
            return self.choices[text.lower()]
        except KeyError:
            raise ValueError(self.reason.format(text=text, quoted=go_quote(text))) from None

    def show(self, value) -> str | None:
        names = [name for name, choice in self.choices.items() if choice == value and name]
        return names[0] if names and value else None

    def to_json(self, value):
        return int(value) if isinstance(value, enum.IntEnum) else value


class TLSRequiredKind(Choice):
    """-tls-required: a bool flag (so ``-tls-required`` alone means true) that also takes tcp-https."""

    is_bool = True

    def parse(self, text: str):
        if text.lower() == "tcp-https":
            return self.choices["tcp-https"]
        try:
            return self.choices["true"] if parse_go_bool(text.lower()) else self.choices["false"]
        except ValueError:
            raise ValueError('strconv.ParseBool: parsing %s: invalid syntax' % go_quote(text)) from None

    def from_file(self, raw: object):
        if isinstance(raw, bool):
            return self.choices["true"] if raw else self.choices["false"]
        return super().from_file(raw)


def go_quote(text: str) -> str:
    """Go's %q for the printable-ASCII-plus-common-escapes cases that matter here."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return '"' + "".join(c if c.isprintable() else "\\x%02x" % ord(c) for c in escaped) + '"'

