"""One V2 connection to one nsqd: bootstrap, a read loop, coalesced writes and in-order replies.

Theory of operation
-------------------
`connect()` runs NSQ's bootstrap in order (spec 7.1): magic, IDENTIFY with feature negotiation, then the granted
upgrades (TLS, then snappy or deflate), each confirmed by one `OK` frame, then AUTH when the server requires it. While
bootstrapping, frames are read one at a time, because the bytes right after the IDENTIFY reply may already be
compressed: whatever was read past that frame is run through the decompressor once it exists.

After that a single task reads: bytes -> (decompress) -> `FrameDecoder` -> frames. Heartbeats are answered
with NOP here, so every user of a connection gets liveness for free. NSQ replies to PUB, MPUB, DPUB, SUB, CLS
(and IDENTIFY/AUTH) exactly once and in order, so `command()` appends a future to a FIFO and the reader
resolves the oldest one with each response or error frame: that is what lets many commands be in flight on
one connection (pipelining). The only non-fatal errors (E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED) answer
commands that have no reply, so they never consume a future; they go to `on_error`.

Writes are appended to a list and flushed once per event-loop turn, so a burst of FINs or PUBs becomes one
send (and one deflate sync flush) rather than one syscall each.

Error handling: a fatal error frame fails the oldest pending command with the matching `ProtocolError`; any
end of the connection (EOF, garbage, read deadline, fatal error) fails every other pending command with
`ConnectionClosed` and calls `on_close` once.

Reply deadline (`reply_timeout`, the producer's write_timeout): while commands wait for replies, one must come
back within that many seconds of the previous reply (or of the command, after an idle spell); otherwise nsqd
is taken for unresponsive (stopped, partitioned, its socket buffers full) and the connection is aborted, which
fails every pending command with `ConnectionClosed`. Measuring from the last reply rather than from each
command keeps a deep pipeline from timing out while nsqd answers it steadily. One timer per connection, re-armed
lazily, so a reply costs a clock read and no timer.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import ssl
import struct

from nsqpy.client.compression import Deflate, Snappy, check_supported
from nsqpy.client.config import Config
from nsqpy.client.errors import ClientError, ConnectionClosed, from_error_frame
from nsqpy.protocol import client as wire
from nsqpy.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, OK

__all__ = ["Connection"]

log = logging.getLogger("nsqpy.client")
_FRAME_HEADER = struct.Struct(">ii")
_READ_CHUNK = 1 << 18
_DRAIN_ABOVE = 1 << 20   # bytes queued in the transport before a command waits for the socket (back-pressure)
MAX_FRAME = 64 << 20     # nsqpy's --max-msg-size is tested to 64 MiB; anything larger is a corrupt stream


class Connection:
    def __init__(self, host: str, port: int, config: Config, *, on_message=None, on_error=None, on_close=None):
        self.host, self.port, self.config = host, port, config
        self.on_message, self.on_error, self.on_close = on_message, on_error, on_close
        self.identity: dict = {}          # the IDENTIFY JSON reply ({} from a server without negotiation)
        self.max_rdy_count = 2500
        self.closed = False
        self.fatal_error = None          # the fatal error frame nsqd sent before closing, if any
        # Consumer bookkeeping (the consumer owns these; kept here because they are per connection).
        self.rdy = 0
        self.in_flight = 0
        self.last_message_at = 0.0
        self.last_rdy_at = 0.0
        self.closing = False             # CLS sent
        self._pending: collections.deque[asyncio.Future] = collections.deque()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._codec: Deflate | Snappy | None = None
        self._inbuf = bytearray()
        self._out: list[bytes] = []
        self._flush_handle = None
        self._read_task: asyncio.Task | None = None
        self.reply_timeout: float | None = None   # see the module docstring; None: replies may take any time
        self._replied_at = 0.0
        self._reply_timer: asyncio.TimerHandle | None = None
        self.done = asyncio.get_running_loop().create_future()   # resolved (with the cause) when closed

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"<Connection {self.address} rdy={self.rdy} in_flight={self.in_flight}>"

    # -- bootstrap ---------------------------------------------------------------------------------------------

    async def connect(self, bootstrap_timeout: float | None = None) -> "Connection":
        """Dial and bootstrap; the bootstrap (IDENTIFY, upgrades, AUTH) must finish within `bootstrap_timeout`
        (default read_timeout)."""
        cfg = self.config
        check_supported(cfg.snappy)
        try:
            async with asyncio.timeout(cfg.dial_timeout):
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=_READ_CHUNK)
            # The bootstrap reads are bounded by read_timeout: a server that accepts and then says nothing
            # must not hang the caller.
            async with asyncio.timeout(bootstrap_timeout or cfg.read_timeout):
                await self._bootstrap()
        except BaseException:
            self._abort()
            raise
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop())
        return self

    async def _bootstrap(self) -> None:
        cfg = self.config
        self._writer.write(wire.magic() + wire.identify(cfg.identify_body()))
        data = await self._expect_response()
        if data != OK:
            try:
                self.identity = json.loads(data)
            except ValueError:
                raise ClientError(f"{self.address}: IDENTIFY reply is neither OK nor JSON: {data[:80]!r}") from None
            self.max_rdy_count = int(self.identity.get("max_rdy_count", 2500))
        if self.identity.get("tls_v1"):
            if self._inbuf:
                raise ClientError(f"{self.address}: bytes before the TLS handshake")
            context = cfg.tls_context or ssl.create_default_context()
            await self._writer.start_tls(context, server_hostname=cfg.tls_server_hostname or self.host)
            await self._expect_ok("TLS")
        snappy, deflate = self.identity.get("snappy"), self.identity.get("deflate")
        if snappy or deflate:
            if snappy and deflate:
                raise ClientError(f"{self.address}: server granted both snappy and deflate")
            level = int(self.identity.get("deflate_level") or cfg.deflate_level)
            self._codec = Snappy() if snappy else Deflate(level)
            rest = bytes(self._inbuf)   # read past the IDENTIFY reply: already compressed
            self._inbuf.clear()
            self._inbuf += self._codec.decode(rest)
            await self._expect_ok("snappy" if snappy else "deflate")
        if self.identity.get("auth_required"):
            if not cfg.auth_secret:
                raise ClientError(f"{self.address}: nsqd requires AUTH and no auth_secret is set")
            self._write_now(wire.auth(cfg.auth_secret))
            await self._expect_response()

    async def _expect_ok(self, what: str) -> None:
        data = await self._expect_response()
        if data != OK:
            raise ClientError(f"{self.address}: expected OK after the {what} upgrade, got {data[:80]!r}")

    async def _expect_response(self) -> bytes:
        while True:
            frame_type, data = await self._read_one_frame()
            if frame_type == FRAME_ERROR:
                raise from_error_frame(data)
            if frame_type != FRAME_RESPONSE:
                raise ClientError(f"{self.address}: unexpected frame type {frame_type} during bootstrap")
            if data != HEARTBEAT:
                return data
            self._write_now(wire.nop())

    async def _read_one_frame(self) -> tuple[int, bytes]:
        while True:
            if len(self._inbuf) >= 8:
                size, frame_type = _FRAME_HEADER.unpack_from(self._inbuf)
                if size < 4 or size > MAX_FRAME:
                    raise wire.FrameDecodeError(f"bad frame size {size}")
                if len(self._inbuf) >= 4 + size:
                    data = bytes(self._inbuf[8:4 + size])
                    del self._inbuf[:4 + size]
                    return frame_type, data
            chunk = await self._reader.read(_READ_CHUNK)
            if not chunk:
                raise ConnectionClosed(f"{self.address}: closed during bootstrap")
            self._inbuf += self._codec.decode(chunk) if self._codec else chunk

    # -- steady state ------------------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        decoder = wire.FrameDecoder(MAX_FRAME)
        cause: BaseException | None = None
        try:
            chunk = bytes(self._inbuf)
            self._inbuf.clear()
            while True:
                if chunk:
                    self._dispatch(decoder.feed(chunk))
                async with asyncio.timeout(self.config.read_timeout):
                    chunk = await self._reader.read(_READ_CHUNK)
                if not chunk:
                    cause = ConnectionClosed(f"{self.address}: closed by the server")
                    break
                if self._codec:
                    chunk = self._codec.decode(chunk)
        except asyncio.CancelledError:
            cause = ConnectionClosed(f"{self.address}: closed")
        except TimeoutError:
            cause = ConnectionClosed(f"{self.address}: nothing read for {self.config.read_timeout}s")
        except Exception as err:   # garbage frames, decompression errors, socket errors: this link is done
            cause = err
        self._finish(cause)

    def _dispatch(self, frames) -> None:
        if self.reply_timeout and frames:
            self._replied_at = asyncio.get_running_loop().time()   # a heartbeat counts too: nsqd is alive
        for frame_type, data in frames:
            if frame_type == FRAME_MESSAGE:
                self.on_message(self, wire.decode_message(data))
            elif frame_type == FRAME_RESPONSE:
                if data == HEARTBEAT:
                    self.send(wire.nop())
                elif self._pending:
                    _resolve(self._pending.popleft(), data)
                else:
                    log.warning("%s: response %r with no command waiting", self.address, data[:80])
            elif frame_type == FRAME_ERROR:
                err = from_error_frame(data)
                if not err.fatal:
                    if self.on_error:
                        self.on_error(self, err)
                    continue
                self.fatal_error = err
                if self._pending:
                    _resolve(self._pending.popleft(), err)
                else:
                    log.error("%s: %s", self.address, err)
                    if self.on_error:
                        self.on_error(self, err)
            else:
                raise wire.FrameDecodeError(f"unknown frame type {frame_type}")

    # -- writing -----------------------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue a command that gets no reply (RDY, FIN, REQ, TOUCH, NOP); it goes out this loop turn."""
        if self.closed:
            raise ConnectionClosed(f"{self.address}: closed")
        self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    async def command(self, data: bytes) -> bytes:
        """Send a command that gets one reply and wait for it; raises the error frame's ProtocolError."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.send(data)
        if self.reply_timeout and not self._pending:
            self._replied_at = loop.time()   # the clock starts now, not at the last reply before an idle spell
            if self._reply_timer is None:
                self._reply_timer = loop.call_later(self.reply_timeout, self._check_replies)
        self._pending.append(fut)
        if self._writer.transport.get_write_buffer_size() > _DRAIN_ABOVE:
            self._flush()
            try:
                await self._writer.drain()
            except OSError:
                pass   # the connection is gone: `fut` is failed with the reason
        return await fut

    def _check_replies(self) -> None:
        self._reply_timer = None
        if self.closed or not self._pending:
            return
        loop = asyncio.get_running_loop()
        idle = loop.time() - self._replied_at
        if idle < self.reply_timeout:
            self._reply_timer = loop.call_later(self.reply_timeout - idle, self._check_replies)
            return
        self._writer.transport.abort()   # a dead peer: do not wait to flush what is queued for it
        self._finish(ConnectionClosed(f"{self.address}: no reply within {self.reply_timeout:g}s"))

    async def close_when_idle(self) -> None:
        """Close once the commands already sent have their replies (each is bounded by reply_timeout)."""
        if self._pending:
            await asyncio.wait(list(self._pending))
        self.close()
        await self.wait_closed()

    def _flush(self) -> None:
        self._flush_handle = None
        if not self._out or self.closed:
            return
        data = b"".join(self._out)
        self._out.clear()
        self._write_now(data)

    def _write_now(self, data: bytes) -> None:
        self._writer.write(self._codec.encode(data) if self._codec else data)

    # -- closing -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush what is queued and close; pending commands fail with ConnectionClosed."""
        if self.closed:
            return
        self._flush()
        if self._read_task is not None and not self._read_task.done():
            self._read_task.cancel()     # the read loop calls _finish
        else:
            self._finish(ConnectionClosed(f"{self.address}: closed"))

    async def wait_closed(self) -> None:
        await asyncio.shield(self.done)

    def _abort(self) -> None:
        self.closed = True
        if self._writer is not None:
            self._writer.transport.abort()
        if not self.done.done():
            self.done.set_result(None)

    def _finish(self, cause: BaseException | None) -> None:
        if self.closed:
            return
        self.closed = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._reply_timer is not None:
            self._reply_timer.cancel()
            self._reply_timer = None
        if self._writer is not None:
            self._writer.close()
        while self._pending:
            _resolve(self._pending.popleft(),
                     cause if isinstance(cause, ConnectionClosed) else ConnectionClosed(f"{self.address}: {cause}"))
        if not self.done.done():
            self.done.set_result(cause)
        if self.on_close:
            self.on_close(self, cause)


def _resolve(fut: asyncio.Future, value) -> None:
    if fut.done():
        return
    if isinstance(value, BaseException):
        fut.set_exception(value)
    else:
        fut.set_result(value)
