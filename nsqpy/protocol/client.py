"""Client role of the V2 protocol: command encoders, an incremental frame decoder and message decoding.

Used by nsqpy's own Producer/Consumer, the benchmarks and the tests (as the reference encoder that the server
parser must understand).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from nsqpy.protocol.frames import MESSAGE_HEADER_SIZE

if TYPE_CHECKING:
    import numpy as np

# numpy and the numba kernels load only in decode_message_batch: nsqpy.client imports this module and must stay
# free of numba. MAGIC_V2 is v2_parser's constant, repeated here for the same reason (a test checks they agree).
MAGIC_V2 = b"  V2"

__all__ = [
    "magic", "identify", "auth", "sub", "pub", "mpub", "dpub", "rdy", "fin", "req", "touch", "cls", "nop",
    "Message", "decode_message", "FrameDecoder", "FrameDecodeError", "MessageBatch", "decode_message_batch",
]

_I32 = struct.Struct(">i")
_FRAME_HEADER = struct.Struct(">ii")
_MESSAGE_HEADER = struct.Struct(">qH16s")


def _text(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _with_body(line: bytes, body: bytes) -> bytes:
    return line + _I32.pack(len(body)) + body


def magic() -> bytes:
    return MAGIC_V2


def identify(data: dict) -> bytes:
    return _with_body(b"IDENTIFY\n", json.dumps(data, separators=(",", ":")).encode())


def auth(secret: str | bytes) -> bytes:
    return _with_body(b"AUTH\n", _text(secret))


def sub(topic: str, channel: str) -> bytes:
    return b"SUB %s %s\n" % (_text(topic), _text(channel))


def pub(topic: str, body: bytes) -> bytes:
    return _with_body(b"PUB %s\n" % _text(topic), body)


def mpub(topic: str, bodies: Iterable[bytes]) -> bytes:
    parts = []
    for body in bodies:
        parts.append(_I32.pack(len(body)))
        parts.append(body)
    payload = _I32.pack(len(parts) // 2) + b"".join(parts)
    return _with_body(b"MPUB %s\n" % _text(topic), payload)


def dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    return _with_body(b"DPUB %s %d\n" % (_text(topic), defer_ms), body)


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def req(msg_id: bytes, timeout_ms: int) -> bytes:
    return b"REQ %s %d\n" % (msg_id, timeout_ms)


def touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def cls() -> bytes:
    return b"CLS\n"


def nop() -> bytes:
    return b"NOP\n"


@dataclass(frozen=True, slots=True)
class Message:
    timestamp: int   # ns since the epoch
    attempts: int
    id: bytes        # 16 ASCII hex bytes, what FIN/REQ/TOUCH take
    body: bytes


def decode_message(payload: bytes) -> Message:
    """The data of a type-2 frame -> Message."""
    if len(payload) < MESSAGE_HEADER_SIZE:
        raise FrameDecodeError(f"message frame too short ({len(payload)} bytes)")
    timestamp, attempts, msg_id = _MESSAGE_HEADER.unpack_from(payload)
    return Message(timestamp, attempts, msg_id, bytes(payload[MESSAGE_HEADER_SIZE:]))


class FrameDecodeError(ValueError):
    """The server sent something that is not a V2 frame stream."""


class FrameDecoder:
    """Incremental `[size][type][data]` decoder. Holds at most one partial frame of <= max_frame_size bytes."""

    def __init__(self, max_frame_size: int = 64 << 20):
        self.max_frame_size = max_frame_size
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        self._buf += chunk
        buf = self._buf
        frames = []
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            size, frame_type = _FRAME_HEADER.unpack_from(buf, pos)
            if size < 4 or size > self.max_frame_size:
                raise FrameDecodeError(f"bad frame size {size}")
            stop = pos + 4 + size
            if stop > end:
                break
            frames.append((frame_type, bytes(buf[pos + 8:stop])))
            pos = stop
        del buf[:pos]
        return frames


@dataclass(frozen=True, slots=True, eq=False)
class MessageBatch:
    """Messages decoded from one buffer; message i's body is buffer[body_offsets[i]:+body_lengths[i]] and its
    raw id buffer[body_offsets[i] - 16 : body_offsets[i]]. `consumed` bytes were used; `status` is the kernel's
    reason for stopping (kernels.OK, NEED_MORE or OTHER_FRAME; BAD_SIZE / TOO_BIG mean a corrupt stream)."""

    buffer: bytes
    timestamps: np.ndarray = field(repr=False)
    attempts: np.ndarray = field(repr=False)
    id_values: np.ndarray = field(repr=False)
    body_offsets: np.ndarray = field(repr=False)
    body_lengths: np.ndarray = field(repr=False)
    consumed: int
    status: int

    def __len__(self) -> int:
        return len(self.timestamps)

    def raw_id(self, i: int) -> bytes:
        off = int(self.body_offsets[i])
        return self.buffer[off - 16:off]

    def message(self, i: int) -> Message:
        off, length = int(self.body_offsets[i]), int(self.body_lengths[i])
        return Message(int(self.timestamps[i]), int(self.attempts[i]), self.raw_id(i),
                       self.buffer[off:off + length])


def decode_message_batch(buffer: bytes, start: int = 0, max_frame_size: int = 64 << 20) -> MessageBatch:
    """Decode the run of message frames at `buffer[start:]` in one kernel call (the benchmark reader's path)."""
    import numpy as np
    from nsqpy.protocol import kernels
    from nsqpy.protocol.v2_bodies import u8_view
    cap = (len(buffer) - start) // (8 + MESSAGE_HEADER_SIZE) + 1
    ts = np.empty(cap, dtype=np.int64)
    attempts = np.empty(cap, dtype=np.int64)
    ids = np.empty(cap, dtype=np.uint64)
    offsets = np.empty(cap, dtype=np.int64)
    lengths = np.empty(cap, dtype=np.int64)
    status, n, pos = kernels.decode_message_frames(
        u8_view(buffer), start, len(buffer), max_frame_size, ts, attempts, ids, offsets, lengths)
    return MessageBatch(buffer, ts[:n], attempts[:n], ids[:n], offsets[:n], lengths[:n], pos - start, status)

