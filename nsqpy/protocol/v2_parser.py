"""Server-role incremental parser for NSQ's V2 TCP protocol: bytes in, commands out, no sockets.

Theory of operation
-------------------
`feed(chunk)` appends the chunk to whatever is still unparsed and parses as far as the data goes. Lines end in
`\\n` (one trailing `\\r` removed) and split on each single space. A command with a body hands over to a body
reader (`v2_bodies`) until the body is complete. The parser checks everything nsqd checks while reading a
command, in nsqd's order: the client state (it tracks the state itself, see `states`), the parameter count,
names, numbers, message IDs and sizes. It yields commands only once they are complete and valid.

The limits it checks are a `nsqpy.protocol.limits.Limits` (nsqd's defaults, or `NsqdOptions.limits()` in the
broker: the same object IDENTIFY reads). Durations there are whole ms; a REQ or DPUB timeout is compared in Go's
form, `ms * time.Millisecond` wrapped as int64, against the limit times one millisecond.

Two batch paths keep per-message work out of Python:
* a run of two or more `FIN` lines is split by one kernel call into one `FinBatch`;
* a run of two or more `RDY` lines becomes one `Rdy` holding the last count (each count is still checked).

With `stop_after_sub`, `feed` stops right after a `SUB` (the last item is then the `Sub`): the broker may move the connection to the
topic's owner process, which continues with the bytes from `take_buffer()`; a broker that keeps the connection
calls `feed(b"")` to parse the rest.
Kernels accept only the plain well-formed form; any other line goes through the Python path, which is the
reference for every error text.

Errors
------
`feed()` returns a list. If the input holds an error, the error (a `ProtocolError` instance, not raised) is the
last item, preceded by every command that came before it in the stream; the caller executes those in order,
then sends `err.frame()` and closes (an empty frame means close silently: `DropConnection`). All parse errors
are fatal; after one the parser refuses input (`feed` raises RuntimeError). `iter_commands()` wraps this as a
generator that raises the error after yielding the commands before it.

Buffering bounds
----------------
What stays buffered between feeds is at most: a partial command line (< 16 KiB: nsqd's read buffer is 16 KiB
and a longer line drops the connection), a partial body whose size already passed its limit (max_body_size
for IDENTIFY/AUTH, max_msg_size for PUB/DPUB) or a partial MPUB (at most max_body_size, see `v2_bodies`).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from nsqpy.ipc.numba_cache import warm_up_step
from nsqpy.protocol import kernels
from nsqpy.protocol.commands import (
    Auth, Cls, Dpub, Fin, FinBatch, Identify, Nop, Pub, Rdy, Req, Sub, Touch)
from nsqpy.protocol.errors import (
    BadChannel, BadProtocol, BadTopic, DropConnection, Invalid, ProtocolError, go_quote, raw_text)
from nsqpy.protocol.limits import MS as _MS, Limits
from nsqpy.protocol.names import is_valid_name, parse_base10, wrap_int64
from nsqpy.protocol.states import (
    IGNORED_IN, STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED, TRANSITIONS, check_state)
from nsqpy.protocol.v2_bodies import DONE, MpubBody, SizedBody, u8_view

__all__ = ["Limits", "V2Parser", "iter_commands", "MAGIC_V2", "MAX_LINE"]

MAGIC_V2 = b"  V2"
MAX_LINE = 16384       # nsqd's bufio read buffer: a line (with its "\n") longer than this drops the connection
_FIN_LINE = 21         # the shortest FIN line: "FIN " + 16 + "\n"
_MAX_FIN_BATCH = 65536  # caps one FinBatch's arrays (1.6 MB); a longer run in one chunk gives several batches


class V2Parser:
    """Incremental V2 command parser for one connection (see the module docstring for the contract)."""

    def __init__(self, limits: Limits = Limits(), *, expect_magic: bool = True, state: int = STATE_INIT,
                 stop_after_sub: bool = False):
        self.limits = limits
        self.stop_after_sub = stop_after_sub
        self.state = state
        self.error: ProtocolError | None = None
        self._need_magic = expect_magic
        self._buf = bytearray()
        self._scanned = 0     # bytes of a partial line already searched for "\n"
        self._body = None     # SizedBody | MpubBody while a body is being read
        self._lines = {
            b"IDENTIFY": self._identify, b"AUTH": self._auth, b"SUB": self._sub, b"PUB": self._pub,
            b"MPUB": self._mpub, b"DPUB": self._dpub, b"RDY": self._rdy, b"FIN": self._fin, b"REQ": self._req,
            b"TOUCH": self._touch, b"CLS": self._cls, b"NOP": self._nop,
        }

    @property
    def buffered(self) -> int:
        """Bytes held between feeds (bounded, see the module docstring)."""
        return len(self._buf)

    def take_buffer(self) -> bytes:
        """Hand over every byte received but not parsed (after a SUB, see `_parse`) and forget it."""
        if self._body is not None:
            raise RuntimeError("a command body is half read")
        rest = bytes(self._buf)
        self._buf = bytearray()
        self._scanned = 0
        return rest

    @property
    def idle(self) -> bool:
        """Nothing is half read: the next byte starts a command (what a compiled fast path may rely on)."""
        return not self._buf and self._body is None and not self._need_magic and self.error is None

    def feed(self, chunk: bytes | bytearray | memoryview) -> list:
        if self.error is not None:
            raise RuntimeError("V2Parser refuses input after a fatal error")
        out: list = []
        if self._buf:
            self._buf += chunk
            data = self._buf
        else:
            data = chunk if type(chunk) is bytes else bytes(chunk)
        pos, err = self._parse(data, out)
        if err is not None:
            self.error = err.with_traceback(None)
            self._buf = bytearray()
            out.append(err)
        elif data is self._buf:
            del self._buf[:pos]
        elif pos < len(data):
            self._buf = bytearray(memoryview(data)[pos:])
        return out

    # -- the loop -------------------------------------------------------------------------------------------

    def _parse(self, data, out: list) -> tuple[int, ProtocolError | None]:
        pos = 0
        end = len(data)
        try:
            if self._need_magic:
                if end < 4:
                    return 0, None
                if data[:4] != MAGIC_V2:
                    raise BadProtocol()
                self._need_magic = False
                pos = 4
            while True:
                if self._body is not None:
                    result = self._body.advance(data, pos)
                    if result[0] != DONE:
                        return result[1], None
                    self._body = None
                    pos = result[1]
                    out.append(result[2])
                    continue
                if pos >= end:
                    return pos, None
                nl = data.find(b"\n", pos + self._scanned, pos + MAX_LINE)
                if nl < 0:
                    if end - pos >= MAX_LINE:
                        raise DropConnection("line longer than the 16 KiB read buffer")
                    self._scanned = end - pos
                    return pos, None
                self._scanned = 0
                if data.startswith(b"FIN ", nl + 1) and data.startswith(b"FIN ", pos):
                    pos, done = self._fin_run(data, pos, out)
                    if done:
                        continue
                elif data.startswith(b"RDY", nl + 1) and data.startswith(b"RDY", pos):
                    pos, done = self._rdy_run(data, pos, out)
                    if done:
                        continue
                line = data[pos:nl]
                pos = nl + 1
                if line.endswith(b"\r"):
                    line = line[:-1]
                params = line.split(b" ")
                handler = self._lines.get(bytes(params[0]))
                if handler is None:
                    raise Invalid(f"invalid command {raw_text(bytes(params[0]))}")
                result = handler(params)
                if result is None:
                    continue
                if isinstance(result, (SizedBody, MpubBody)):
                    self._body = result
                else:
                    out.append(result)
                    if type(result) is Sub and self.stop_after_sub:
                        # Stop right after a SUB: the broker may hand the connection to another process,
                        # which then takes the unparsed rest with `take_buffer()`; otherwise feed(b"") resumes.
                        return pos, None
        except ProtocolError as err:
            return pos, err

    def _fin_run(self, data, pos: int, out: list) -> tuple[int, bool]:
        if self.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            return pos, False
        cap = min((len(data) - pos) // _FIN_LINE + 1, _MAX_FIN_BATCH)
        ids = np.empty((cap, 16), dtype=np.uint8)
        values = np.empty(cap, dtype=np.uint64)
        valid = np.empty(cap, dtype=np.bool_)
        n, new_pos = kernels.fin_run(u8_view(data), pos, len(data), MAX_LINE, ids, values, valid)
        if n == 0:
            return pos, False
        out.append(Fin(ids[0].tobytes()) if n == 1 else FinBatch(ids[:n], values[:n], valid[:n]))
        return new_pos, True

    def _rdy_run(self, data, pos: int, out: list) -> tuple[int, bool]:
        if self.state != STATE_SUBSCRIBED:
            return pos, False
        n, last, new_pos = kernels.rdy_run(u8_view(data), pos, len(data), self.limits.max_rdy_count)
        if n == 0:
            return pos, False
        out.append(Rdy(last))
        return new_pos, True

    # -- one handler per verb: check state, then params, in nsqd's order -----------------------------------

    def _check(self, verb: str) -> None:
        err = check_state(verb, self.state)
        if err is not None:
            raise err

    def _identify(self, params):
        self._check("IDENTIFY")
        return SizedBody("IDENTIFY", Identify, self.limits.max_body_size, per_message=False)

    def _auth(self, params):
        self._check("AUTH")
        if len(params) != 1:
            raise Invalid("AUTH invalid number of parameters")
        return SizedBody("AUTH", Auth, self.limits.max_body_size, per_message=False)

    def _sub(self, params):
        self._check("SUB")
        if len(params) < 3:
            raise Invalid("SUB insufficient number of parameters")
        topic = _topic(params[1], "SUB topic name")
        channel = bytes(params[2])
        if not is_valid_name(channel):
            raise BadChannel(f"SUB channel name {go_quote(channel)} is not valid")
        self.state = TRANSITIONS["SUB"]
        return Sub(topic, channel.decode("ascii"))

    def _rdy(self, params):
        if self.state in IGNORED_IN["RDY"]:
            return None
        self._check("RDY")
        count = 1
        if len(params) > 1:
            count = wrap_int64(_number(params[1], "RDY could not parse count"))
        limit = self.limits.max_rdy_count
        if count < 0 or count > limit:
            raise Invalid(f"RDY count {count} out of range 0-{limit}")
        return Rdy(count)

    def _fin(self, params):
        return Fin(self._message_id("FIN", params, 2))

    def _touch(self, params):
        return Touch(self._message_id("TOUCH", params, 2))

    def _req(self, params):
        msg_id = self._message_id("REQ", params, 3)
        duration = _duration_ns(_number(params[2], "REQ could not parse timeout"))
        max_ns = self.limits.max_req_timeout_ms * _MS
        clamped = 0 if duration < 0 else min(duration, max_ns)  # nsqd clamps REQ, it does not reject it
        return Req(msg_id, clamped // _MS)

    def _message_id(self, verb: str, params, need: int) -> bytes:
        self._check(verb)
        if len(params) < need:
            raise Invalid(f"{verb} insufficient number of params")
        msg_id = bytes(params[1])
        if len(msg_id) != 16:
            raise Invalid("invalid message ID")
        return msg_id

    def _cls(self, params):
        self._check("CLS")
        self.state = TRANSITIONS["CLS"]
        return Cls()

    def _nop(self, params):
        return Nop()

    def _pub(self, params):
        if len(params) < 2:
            raise Invalid("PUB insufficient number of parameters")
        topic = _topic(params[1], "PUB topic name")
        return SizedBody("PUB", lambda body: Pub(topic, body), self.limits.max_msg_size, per_message=True)

    def _mpub(self, params):
        if len(params) < 2:
            raise Invalid("MPUB insufficient number of parameters")
        topic = _topic(params[1], "E_BAD_TOPIC MPUB topic name")  # nsqd repeats the code in this one text
        return MpubBody(topic, self.limits.max_body_size, self.limits.max_msg_size)

    def _dpub(self, params):
        if len(params) < 3:
            raise Invalid("DPUB insufficient number of parameters")
        topic = _topic(params[1], "DPUB topic name")
        value = _number(params[2], "DPUB could not parse timeout")
        duration = _duration_ns(value)
        max_ms = self.limits.max_req_timeout_ms
        if duration < 0 or duration > max_ms * _MS:
            raise Invalid(f"DPUB timeout {value} out of range 0-{max_ms}")
        defer_ms = duration // _MS
        return SizedBody("DPUB", lambda body: Dpub(topic, defer_ms, body), self.limits.max_msg_size,
                         per_message=True)


def _topic(raw, what: str) -> str:
    raw = bytes(raw)
    if not is_valid_name(raw):
        raise BadTopic(f"{what} {go_quote(raw)} is not valid")
    return raw.decode("ascii")


def _number(raw, error_text: str) -> int:
    """A plain unsigned decimal parameter, or the fatal E_INVALID '<error_text> <raw>' nsqd sends."""
    raw = bytes(raw)
    value = parse_base10(raw)
    if value is None:
        raise Invalid(f"{error_text} {raw_text(raw)}")
    return value


def _duration_ns(ms: int) -> int:
    """Go's `time.Duration(ms) * time.Millisecond` on a uint64 count: both steps wrap as int64."""
    return wrap_int64(wrap_int64(ms) * _MS)


def iter_commands(parser: V2Parser, chunk: bytes) -> Iterator:
    """Yield the commands of `chunk`, then raise the error that followed them, if any."""
    for item in parser.feed(chunk):
        if isinstance(item, ProtocolError):
            raise item
        yield item


@warm_up_step
def warm_up():
    """The V2 codec's kernels (nsqpy/protocol/kernels.py) as a worker's parser and ID generator call them: SUB, RDY,
    a batch of FINs (fin_run), REQ, TOUCH, NOP, MPUB, PUB, DPUB, message IDs (workers/lane/warmup.py schedules
    this before fork)."""
    import time
    from nsqpy.protocol import client as enc
    from nsqpy.protocol.ids import IdGenerator
    one = b"0123456789abcdef"
    stream = (b"  V2" + enc.sub("t", "c") + enc.rdy(5) + enc.rdy(6) + enc.fin(one) + enc.fin(one) + enc.fin(one)
              + enc.req(one, 0) + enc.touch(one) + enc.nop())
    sub = V2Parser(stop_after_sub=True)
    sub.feed(stream)
    sub.feed(b"")  # the FINs after the SUB: the batched FIN kernel (fin_run)
    V2Parser(expect_magic=False).feed(enc.mpub("t", [b"a", b"bc"]) + enc.pub("t", b"x") + enc.dpub("t", 5, b"y"))
    IdGenerator(1).next_ids(4, time.time_ns())
