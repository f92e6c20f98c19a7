"""Go ``time.Duration`` text, both ways, over exact integer nanoseconds.

NSQ's flags and config files spell durations the way Go's ``time.ParseDuration``
reads them (``1m0s``, ``250ms``, ``1.5h``), and its /info and /config endpoints
report them as int64 nanoseconds.  nsqpy keeps every duration as an ``int`` of
nanoseconds so nothing is lost to float rounding, and prints them the way Go's
``Duration.String`` does so ``-h`` output and logs read like nsqd's.

The parser follows Go's grammar and its corner cases on purpose: a bare ``0``
(optionally signed) needs no unit, any other number does; ``.5s`` and ``5.s``
are valid but ``.s`` is not; both micro signs are accepted for ``us``; the
fraction is scaled in float64 and truncated, exactly as Go does, so ``1.1ns``
is 1ns; anything beyond the int64 range is an error.
"""

NANOSECOND = 1
MICROSECOND = 1_000
MILLISECOND = 1_000_000
SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

_UNITS = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # U+00B5 MICRO SIGN, what Go prints
    "\u03bcs": MICROSECOND,  # U+03BC GREEK SMALL LETTER MU
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}
_INT64_LIMIT = 1 << 63
_DIGITS = "0123456789"


class DurationError(ValueError):
    """The text is not something Go's time.ParseDuration accepts; str() is Go's message."""


def parse_duration(text: str) -> int:
    """Parse Go duration text into integer nanoseconds."""
    quoted = '"' + text + '"'
    rest = text
    negative = False
    if rest[:1] in ("-", "+"):
        negative = rest[0] == "-"
        rest = rest[1:]
    if rest == "0":
        return 0
    if rest == "":
        raise DurationError("time: invalid duration " + quoted)
    total = 0
    while rest:
        value, fraction, scale, rest = _number(rest, quoted)
        unit_end = 0
        while unit_end < len(rest) and rest[unit_end] != "." and rest[unit_end] not in _DIGITS:
            unit_end += 1
        unit_text, rest = rest[:unit_end], rest[unit_end:]
        if not unit_text:
            raise DurationError("time: missing unit in duration " + quoted)
        unit = _UNITS.get(unit_text)
        if unit is None:
            raise DurationError('time: unknown unit "%s" in duration %s' % (unit_text, quoted))
        if value > _INT64_LIMIT // unit:
            raise DurationError("time: invalid duration " + quoted)
        value *= unit
        if fraction:
            # Go computes this in float64 and truncates; doing the same keeps
            # results bit-identical (e.g. "1.1ns" == 1, "0.3333333333s" rounding).
            value += int(float(fraction) * (float(unit) / scale))
            if value > _INT64_LIMIT:
                raise DurationError("time: invalid duration " + quoted)
        total += value
        if total > _INT64_LIMIT:
            raise DurationError("time: invalid duration " + quoted)
    if negative:
        return -total
    if total > _INT64_LIMIT - 1:
        raise DurationError("time: invalid duration " + quoted)
    return total


def _number(rest: str, quoted: str) -> tuple[int, int, float, str]:
    """Split off ``digits[.digits]``: (integer part, fraction digits as int, 10**len, rest)."""
    end = 0
    while end < len(rest) and rest[end] in _DIGITS:
        end += 1
    whole_text, rest = rest[:end], rest[end:]
    if whole_text and int(whole_text) > _INT64_LIMIT:
        raise DurationError("time: invalid duration " + quoted)
    fraction, scale, has_fraction_digits = 0, 1.0, False
    if rest[:1] == ".":
        rest = rest[1:]
        end, overflow = 0, False
        while end < len(rest) and rest[end] in _DIGITS:
            # Like Go, stop accumulating (but keep consuming) once the next
            # digit would overflow: further digits cannot change the result.
            if not overflow:
                widened = fraction * 10 + int(rest[end])
                overflow = fraction > (_INT64_LIMIT - 1) // 10 or widened > _INT64_LIMIT
                if not overflow:
                    fraction, scale = widened, scale * 10
            end += 1
        has_fraction_digits = end > 0
        rest = rest[end:]
    if not whole_text and not has_fraction_digits:
        raise DurationError("time: invalid duration " + quoted)
    return int(whole_text or "0"), fraction, scale, rest


def format_duration(nanoseconds: int) -> str:
    """Render integer nanoseconds the way Go's Duration.String does."""
    if nanoseconds == 0:
        return "0s"
    sign = "-" if nanoseconds < 0 else ""
    magnitude = abs(nanoseconds)
    if magnitude < MICROSECOND:
        return "%s%dns" % (sign, magnitude)
    if magnitude < MILLISECOND:
        return sign + _decimal(magnitude, 3) + "\u00b5s"
    if magnitude < SECOND:
        return sign + _decimal(magnitude, 6) + "ms"
    hours, remainder = divmod(magnitude, HOUR)
    minutes, remainder = divmod(remainder, MINUTE)
    text = _decimal(remainder, 9) + "s"
    if hours:
        text = "%dh%dm%s" % (hours, minutes, text)
    elif minutes:
        text = "%dm%s" % (minutes, text)
    return sign + text


def _decimal(value: int, places: int) -> str:
    """value / 10**places with trailing fractional zeros dropped."""
    whole, fraction = divmod(value, 10**places)
    digits = str(fraction).rjust(places, "0").rstrip("0")
    return "%d.%s" % (whole, digits) if digits else str(whole)
