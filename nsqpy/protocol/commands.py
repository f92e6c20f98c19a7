"""The commands a V2 client sends, as frozen values the parser yields and the client encoder consumes.

Every command the parser yields has already passed the checks NSQ makes while reading it (names, numbers,
IDs, sizes, the client state); what is left to the broker is what needs the broker (auth, topic lookup,
in-flight lookup). Batch commands (`FinBatch`, `Mpub`) hold numpy arrays so that a run of FIN lines or an
MPUB of hundreds of messages is one object, never one Python object per message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Union

import numpy as np

__all__ = [
    "Identify", "Auth", "Sub", "Pub", "Mpub", "Dpub", "Rdy", "Fin", "FinBatch", "Req", "Touch", "Cls", "Nop",
    "Command", "VERBS",
]


@dataclass(frozen=True, slots=True)
class Identify:
    body: bytes  # raw JSON; `identify.negotiate_identify` validates it


@dataclass(frozen=True, slots=True)
class Auth:
    secret: bytes


@dataclass(frozen=True, slots=True)
class Sub:
    topic: str
    channel: str


@dataclass(frozen=True, slots=True)
class Pub:
    topic: str
    body: bytes


@dataclass(frozen=True, slots=True, eq=False)
class Mpub:
    """Message i is `buffer[offsets[i] : offsets[i] + lengths[i]]`. `buffer` is immutable and may be the very
    chunk handed to `feed()` (no copy) or a copy of the parser's buffer."""

    topic: str
    buffer: bytes = field(repr=False)
    offsets: np.ndarray = field(repr=False)  # int64
    lengths: np.ndarray = field(repr=False)  # int64

    def __len__(self) -> int:
        return len(self.offsets)

    def bodies(self) -> Iterator[bytes]:
        """Each message body as bytes (a copy each: for tests and slow paths, not for the hot path)."""
        buf = self.buffer
        for off, length in zip(self.offsets.tolist(), self.lengths.tolist()):
            yield buf[off:off + length]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Mpub) and self.topic == other.topic
                and list(self.bodies()) == list(other.bodies()))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Dpub:
    topic: str
    defer_ms: int  # validated 0 <= defer_ms <= max_req_timeout
    body: bytes


@dataclass(frozen=True, slots=True)
class Rdy:
    count: int  # validated 0 <= count <= max_rdy_count; for a run of RDY lines, the last one


@dataclass(frozen=True, slots=True)
class Fin:
    msg_id: bytes  # exactly 16 bytes; possibly not hex (then it is simply never in flight)


@dataclass(frozen=True, slots=True, eq=False)
class FinBatch:
    """A run of consecutive FIN lines. `ids` is (n, 16) uint8 (the raw id bytes); `values` the decoded uint64
    IDs; `valid[i]` is False when id i is not 16 lowercase hex (`values[i]` is then 0). Such an id cannot be in
    flight, so it gets the non-fatal `E_FIN_FAILED ... ID not in flight` in its turn."""

    ids: np.ndarray = field(repr=False)
    values: np.ndarray = field(repr=False)
    valid: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return len(self.values)

    def fins(self) -> list[Fin]:
        """The batch as single `Fin` commands (tests and slow paths)."""
        return [Fin(bytes(row)) for row in self.ids]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FinBatch) and self.fins() == other.fins()

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Req:
    msg_id: bytes
    timeout_ms: int  # already clamped to 0..max_req_timeout, as nsqd does


@dataclass(frozen=True, slots=True)
class Touch:
    msg_id: bytes


@dataclass(frozen=True, slots=True)
class Cls:
    pass


@dataclass(frozen=True, slots=True)
class Nop:
    pass


Command = Union[Identify, Auth, Sub, Pub, Mpub, Dpub, Rdy, Fin, FinBatch, Req, Touch, Cls, Nop]

# verb -> command class (FinBatch is the batch form of FIN).
VERBS: dict[str, type] = {
    "IDENTIFY": Identify, "AUTH": Auth, "SUB": Sub, "PUB": Pub, "MPUB": Mpub, "DPUB": Dpub, "RDY": Rdy,
    "FIN": Fin, "REQ": Req, "TOUCH": Touch, "CLS": Cls, "NOP": Nop,
}
