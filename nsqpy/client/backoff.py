"""The consumer's backoff state machine (spec 7.3), as go-nsq runs it.

A handler failure raises the level (up to the level whose delay reaches max_backoff_duration) and starts a
backoff timeout: RDY 0 on every connection for backoff_multiplier x 2^level seconds. When the timeout ends,
one connection gets RDY 1 as a probe; the next result decides: a success lowers the level (and at level 0 the
normal RDY comes back everywhere), a failure raises it again. Results that arrive while a timeout runs are
ignored, as are requeues without backoff.
"""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    def __init__(self, multiplier: float, max_duration: float):
        self.multiplier = multiplier
        self.max_duration = max_duration
        self.level = 0
        self.in_timeout = False
        self.max_level = 0
        while multiplier > 0 and multiplier * 2 ** (self.max_level + 1) <= max_duration:
            self.max_level += 1
        self.max_level = max(self.max_level, 1)

    @property
    def active(self) -> bool:
        """True while the consumer must not hand out its normal RDY."""
        return self.level > 0 or self.in_timeout

    def duration(self) -> float:
        return min(self.multiplier * 2 ** self.level, self.max_duration)

    def on_result(self, success: bool) -> str:
        """Record a result; returns what the consumer must do: "none", "resume" (normal RDY everywhere) or
        "timeout" (RDY 0 everywhere, then a probe after `duration()`)."""
        if self.in_timeout:
            return "none"
        if success:
            if self.level == 0:
                return "none"
            self.level -= 1
            return "resume" if self.level == 0 else "timeout"
        self.level = min(self.level + 1, self.max_level)
        return "timeout"
