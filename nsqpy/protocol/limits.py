"""nsqd's limits: every number the V2 parser, IDENTIFY, the broker and the HTTP API check, in one object.

Theory of operation
-------------------
`Limits` is the one form of nsqd's limit options the code reads. `NsqdOptions.limits()` (nsqpy/config/nsqd.py)
is the one derivation from the options: it converts each duration once, here with `to_ms`, and nothing converts
a limit again on its way to a check. The V2 parser (`V2Parser(limits)`), IDENTIFY (`ServerSettings.limits`), the
broker's workers and the HTTP API all hold the same object.

Units: sizes and counts are plain ints; every duration is whole milliseconds, named ``*_ms`` (the unit of the
wire: IDENTIFY's fields and reply, REQ, DPUB, /pub?defer). A flag's duration (Go ``time.Duration``, int
nanoseconds in `NsqdOptions`) becomes ms the way nsqd turns it into what it compares and reports: Go's
``d / time.Millisecond``, truncated toward zero (``--msg-timeout=1500us`` is 1 ms, ``-1500us`` is -1 ms).
nsqd keeps the nanoseconds for what it applies (a client's default msg timeout, the REQ clamp); nsqpy applies
the whole milliseconds IDENTIFY reports, so what a client is told is what it gets. Only sub-millisecond parts of
a flag differ, below the 100 ms sampling of nsqd's own timeout scanner.

Defaults: the field defaults are NSQ v1.3.0's (nsqd/options.go, nsqd/client_v2.go). They are the only copy:
`NsqdOptions` takes its flags' defaults from `NSQ_DEFAULTS`, and `ServerSettings()` uses `Limits()`.
`client_timeout_ms` and `default_output_buffer_size` are nsqd internals with no flag.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits", "NSQ_DEFAULTS", "MS", "to_ms"]

MS = 1_000_000  # nanoseconds in a millisecond: Go's time.Millisecond


def to_ms(nanoseconds: int) -> int:
    """Whole milliseconds of a Go duration, truncated toward zero like Go's ``d / time.Millisecond``."""
    whole = abs(nanoseconds) // MS
    return -whole if nanoseconds < 0 else whole


@dataclass(frozen=True, slots=True)
class Limits:
    """nsqd's limits (NSQ's defaults): sizes in bytes, durations in whole ms."""

    max_msg_size: int = 1_048_576             # --max-msg-size: PUB, DPUB, each MPUB message, /pub, /mpub
    max_body_size: int = 5_242_880            # --max-body-size: IDENTIFY, AUTH, MPUB bodies, /mpub
    max_rdy_count: int = 2500                 # --max-rdy-count: RDY, IDENTIFY's reply
    max_req_timeout_ms: int = 3_600_000       # --max-req-timeout: REQ is clamped to it, DPUB and defer refused
    max_msg_timeout_ms: int = 900_000         # --max-msg-timeout: IDENTIFY msg_timeout, the TOUCH total
    msg_timeout_ms: int = 60_000              # --msg-timeout: a client's default in-flight timeout
    max_heartbeat_interval_ms: int = 60_000   # --max-heartbeat-interval: IDENTIFY heartbeat_interval
    max_output_buffer_size: int = 65_536      # --max-output-buffer-size: IDENTIFY output_buffer_size
    min_output_buffer_timeout_ms: int = 25    # --min-output-buffer-timeout: IDENTIFY output_buffer_timeout
    max_output_buffer_timeout_ms: int = 30_000  # --max-output-buffer-timeout: IDENTIFY output_buffer_timeout
    output_buffer_timeout_ms: int = 250       # --output-buffer-timeout: a client's default
    max_deflate_level: int = 6                # --max-deflate-level: caps IDENTIFY's deflate_level
    max_channel_consumers: int = 0            # --max-channel-consumers: SUB (0: no limit)
    client_timeout_ms: int = 60_000           # no flag: a client's default heartbeat is half of it
    default_output_buffer_size: int = 16_384  # no flag: a client's default output buffer


NSQ_DEFAULTS = Limits()
