"""Readers for the binary part that follows some V2 command lines (IDENTIFY, AUTH, PUB, DPUB, MPUB).

A reader is created once its command line has been validated. `advance(data, pos)` is called with the
unconsumed bytes and returns one of:

* `(NEED, keep_from)`: wait for more input; every byte from `keep_from` on must be handed back at the next
  call, which then starts at `pos = 0` of the new data (so readers keep cursors relative to that point);
* `(DONE, new_pos, command)`;
* it raises `ProtocolError`.

Buffering bounds (why a parser can never hold more than this for a body):
* a sized body (IDENTIFY, AUTH, PUB, DPUB) is only waited for once its size has passed NSQ's checks, so at
  most max_body_size (IDENTIFY, AUTH) or max_msg_size (PUB, DPUB) bytes;
* an MPUB is read the way nsqd reads it: count, then each message's size and body straight from the stream;
  the declared body size is checked (<= max_body_size) but then ignored, because nsqd ignores it. Each message
  is validated (<= max_msg_size) before it is waited for, and the whole run of messages may not outgrow
  max_body_size, the limit the declared size was checked against. nsqd has no such total cap (it keeps
  reading); a client that declares a small size and sends more than max_body_size gets E_BAD_BODY here.
"""

from __future__ import annotations

import struct
from typing import Callable

import numpy as np

from nsqpy.protocol import kernels
from nsqpy.protocol.commands import Mpub
from nsqpy.protocol.errors import BadBody, BadMessage, ProtocolError

NEED = 0
DONE = 1

_I32 = struct.Struct(">i")


def u8_view(data: bytes | bytearray) -> np.ndarray:
    """A read-only uint8 view, so kernels see one array type whether the data is bytes or bytearray."""
    arr = np.frombuffer(data, dtype=np.uint8)
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr


class SizedBody:
    """`[int32 size][size bytes]` for IDENTIFY, AUTH (E_BAD_BODY, checked "too big" first, as nsqd does) and
    PUB, DPUB (E_BAD_MESSAGE, checked "<= 0" first)."""

    __slots__ = ("verb", "make", "limit", "size", "per_message")

    def __init__(self, verb: str, make: Callable[[bytes], object], limit: int, per_message: bool):
        self.verb = verb
        self.make = make
        self.limit = limit
        self.per_message = per_message
        self.size = -1

    def advance(self, data, pos: int):
        if self.size < 0:
            if len(data) - pos < 4:
                return NEED, pos
            self.size = self._checked_size(_I32.unpack_from(data, pos)[0])
            pos += 4
        end = pos + self.size
        if len(data) < end:
            return NEED, pos
        return DONE, end, self.make(bytes(data[pos:end]))

    def _checked_size(self, size: int) -> int:
        verb, limit = self.verb, self.limit
        if self.per_message:
            if size <= 0:
                raise BadMessage(f"{verb} invalid message body size {size}")
            if size > limit:
                raise BadMessage(f"{verb} message too big {size} > {limit}")
        else:
            if size > limit:
                raise BadBody(f"{verb} body too big {size} > {limit}")
            if size <= 0:
                raise BadBody(f"{verb} invalid body size {size}")
        return size


class MpubBody:
    """`[int32 body_size][int32 count] count x ([int32 size][bytes])`, split by one kernel call per feed."""

    __slots__ = ("topic", "max_body", "max_msg", "stage", "count", "done", "cursor", "offsets", "lengths")

    def __init__(self, topic: str, max_body: int, max_msg: int):
        self.topic = topic
        self.max_body = max_body
        self.max_msg = max_msg
        self.stage = 0          # 0: body size, 1: count, 2: messages
        self.count = 0
        self.done = 0           # messages split so far
        self.cursor = 0         # offset of message `done`, relative to the first message
        self.offsets = self.lengths = None

    def advance(self, data, pos: int):
        if self.stage < 2:
            pos = self._read_header(data, pos)
            if self.stage < 2:
                return NEED, pos
        return self._split(data, pos)

    def _read_header(self, data, pos: int) -> int:
        while self.stage < 2 and len(data) - pos >= 4:
            value = _I32.unpack_from(data, pos)[0]
            pos += 4
            if self.stage == 0:
                if value <= 0:
                    raise BadBody(f"MPUB invalid body size {value}")
                if value > self.max_body:
                    raise BadBody(f"MPUB body too big {value} > {self.max_body}")
            elif value <= 0 or value > (self.max_body - 4) // 5:  # 4 = the count, 5 = a size + 1 byte
                raise BadBody(f"MPUB invalid message count {value}")
            else:
                self.count = value
            self.stage += 1
        return pos

    def _split(self, data, start: int):
        buf = u8_view(data)[start:]
        limit = self.max_body - 4  # bytes the messages may take (see module docstring)
        while True:
            self._reserve(len(buf))
            status, self.done, self.cursor, bad = kernels.mpub_split(
                buf, self.cursor, len(buf), limit, self.count, self.done, self.max_msg, self.offsets, self.lengths)
            if status != kernels.NEED_SPACE:
                break
        if status == kernels.OK:
            return DONE, start + self.cursor, self._command(data, start)
        if status == kernels.NEED_MORE:
            return NEED, start
        raise self._error(status, bad)

    def _reserve(self, available: int) -> None:
        """Size the offset arrays to what the data can hold (a message takes >= 5 bytes), not to the declared
        count, so a tiny MPUB claiming a million messages allocates nothing big."""
        have = 0 if self.offsets is None else len(self.offsets)
        if have and self.done < have:
            return
        want = min(self.count, max(2 * have, (available - self.cursor) // 5 + 1))
        offsets = np.empty(want, dtype=np.int64)
        lengths = np.empty(want, dtype=np.int64)
        if have:
            offsets[:have] = self.offsets
            lengths[:have] = self.lengths
        self.offsets, self.lengths = offsets, lengths

    def _command(self, data, start: int) -> Mpub:
        n = self.count
        offsets, lengths = self.offsets[:n], self.lengths[:n]
        if isinstance(data, bytes):  # the caller's chunk is immutable: point into it, no copy
            offsets += start
            return Mpub(self.topic, data, offsets, lengths)
        return Mpub(self.topic, bytes(data[start:start + self.cursor]), offsets, lengths)

    def _error(self, status: int, bad: int) -> ProtocolError:
        index = self.done
        if status == kernels.BAD_SIZE:
            return BadMessage(f"MPUB invalid message({index}) body size {bad}")
        if status == kernels.TOO_BIG:
            return BadMessage(f"MPUB message too big {bad} > {self.max_msg}")
        return BadBody(f"MPUB body too big, its messages exceed {self.max_body} bytes")
