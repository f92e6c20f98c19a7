"""Server-to-client V2 frames.

```
frame:   [int32 size][int32 frame_type][data ...]      size = len(data) + 4 (it counts frame_type)
message: [int64 timestamp_ns][uint16 attempts][16 ASCII hex id][body ...]   (the data of a type-2 frame)
```
All integers are big-endian. Batches of message frames are written by `kernels.frame_messages`; this module is
the one-at-a-time path and the constants both share.
"""

from __future__ import annotations

import struct

__all__ = [
    "FRAME_RESPONSE", "FRAME_ERROR", "FRAME_MESSAGE", "FRAME_HEADER_SIZE", "MESSAGE_HEADER_SIZE", "MSG_ID_LENGTH",
    "encode_frame", "response_frame", "message_frame", "message_frame_size",
    "OK", "HEARTBEAT", "CLOSE_WAIT", "OK_FRAME", "HEARTBEAT_FRAME", "CLOSE_WAIT_FRAME", "frame_message_batch",
]

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

FRAME_HEADER_SIZE = 8      # size + frame_type
MSG_ID_LENGTH = 16         # ASCII hex
MESSAGE_HEADER_SIZE = 26   # timestamp 8 + attempts 2 + id 16

OK = b"OK"
HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"

_FRAME_HEADER = struct.Struct(">ii")
_MESSAGE_PREFIX = struct.Struct(">iiqH")  # size, frame_type, timestamp, attempts


def encode_frame(frame_type: int, data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def response_frame(data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, FRAME_RESPONSE) + data


OK_FRAME = response_frame(OK)
HEARTBEAT_FRAME = response_frame(HEARTBEAT)
CLOSE_WAIT_FRAME = response_frame(CLOSE_WAIT)


def message_frame_size(body_length: int) -> int:
    """Bytes one message frame takes on the wire, headers included."""
    return FRAME_HEADER_SIZE + MESSAGE_HEADER_SIZE + body_length


def message_frame(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """One message frame. `msg_id` is the 16 ASCII hex bytes (see `ids.id_to_hex`)."""
    if len(msg_id) != MSG_ID_LENGTH:
        raise ValueError(f"message id must be {MSG_ID_LENGTH} bytes, got {len(msg_id)}")
    size = 4 + MESSAGE_HEADER_SIZE + len(body)
    return _MESSAGE_PREFIX.pack(size, FRAME_MESSAGE, timestamp_ns, attempts) + msg_id + body


def frame_message_batch(out, out_pos: int, timestamps, attempts, ids, src, offsets, lengths) -> int:
    """Write many message frames into the uint8 array `out` at `out_pos` in one kernel call.

    timestamps int64 ns, attempts (any int dtype), ids uint64 (written as 16 hex chars), and bodies
    `src[offsets[i] : offsets[i] + lengths[i]]` where `src` is a uint8 array. Returns the bytes written, or -1
    with nothing written when `out` lacks room (see `message_frame_size`).
    """
    from nsqpy.protocol import kernels  # here, not at the top: this module must import without numba (client)
    return kernels.frame_messages(out, out_pos, timestamps, attempts, ids, src, offsets, lengths)
