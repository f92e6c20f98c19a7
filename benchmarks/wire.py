"""A blocking V2 client connection for the load generators: the codec's encoders and frame decoder on a socket.

It answers heartbeats with NOP wherever it reads, so a tool survives runs longer than the heartbeat interval,
and turns error frames into `BenchError` carrying nsqd's text.
"""

from __future__ import annotations

import socket

import numpy as np

from nsqpy.protocol import client, kernels
from nsqpy.protocol.errors import ERROR_CLASSES
from nsqpy.protocol.frames import FRAME_ERROR, FRAME_RESPONSE, HEARTBEAT, OK, message_frame

from benchmarks.common import BenchError

USER_AGENT = "nsqpy-bench/0.1"
RECV_SIZE = 1 << 18
_FIN_PREFIX = np.frombuffer(b"FIN ", dtype=np.uint8)
_REQ_PREFIX = np.frombuffer(b"REQ ", dtype=np.uint8)
_REQ_SUFFIX = np.frombuffer(b" 0\n", dtype=np.uint8)
_ID_SPAN = np.arange(16, dtype=np.int64)


class Connection:
    """One TCP connection that has sent the magic and IDENTIFY (without feature negotiation: the reply is OK)."""

    def __init__(self, address: tuple[str, int], timeout: float = 10.0, identify_extra: dict | None = None):
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = client.FrameDecoder()
        self.pending: list[tuple[int, bytes]] = []
        self.send(client.magic() + client.identify({
            "client_id": "bench", "hostname": socket.gethostname(), "user_agent": USER_AGENT,
            "feature_negotiation": False, **(identify_extra or {})}))
        self.expect_ok("IDENTIFY")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_reply(self) -> bytes:
        """The next response frame's data, skipping (and answering) heartbeats. Error frames raise."""
        while True:
            while self.pending:
                frame_type, data = self.pending.pop(0)
                if frame_type == FRAME_RESPONSE and data == HEARTBEAT:
                    self.send(client.nop())
                    continue
                if frame_type == FRAME_ERROR:
                    raise BenchError(data.decode("ascii", "replace"))
                if frame_type != FRAME_RESPONSE:
                    raise BenchError(f"unexpected frame type {frame_type} while waiting for a reply")
                return data
            chunk = self.sock.recv(RECV_SIZE)
            if not chunk:
                raise BenchError("connection closed by the server")
            self.pending.extend(self.decoder.feed(chunk))

    def expect_ok(self, what: str) -> None:
        data = self.next_reply()
        if data != OK:
            raise BenchError(f"{what}: expected OK, got {data[:80]!r}")

    def subscribe(self, topic: str, channel: str, rdy: int) -> None:
        self.send(client.sub(topic, channel))
        self.expect_ok("SUB")
        self.send(client.rdy(rdy))

    def close(self) -> None:
        self.sock.close()

    def close_after_server(self, timeout: float = 10.0) -> None:
        """Half-close, discard what still arrives until the server closes too, then close. A plain close with
        unread data sends a reset, and a reset makes the server's kernel drop what it had not read yet: a
        reader's last FINs, which the server then never counts."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(timeout)
            while self.sock.recv(RECV_SIZE):
                pass
        except OSError:
            pass
        self.sock.close()


def fin_lines(buffer: np.ndarray, body_offsets: np.ndarray) -> bytes:
    """`FIN <id>\\n` for every message of a decoded batch, built in three array operations.

    The raw id of a message sits in the 16 bytes before its body (see `client.MessageBatch`). This is the
    batch form of `client.fin`, kept here because the codec has no batch FIN encoder yet.
    """
    lines = np.empty((len(body_offsets), 21), dtype=np.uint8)
    lines[:, :4] = _FIN_PREFIX
    lines[:, 4:20] = buffer[(body_offsets - 16)[:, None] + _ID_SPAN]
    lines[:, 20] = 10
    return lines.tobytes()


def req_lines(buffer: np.ndarray, body_offsets: np.ndarray) -> bytes:
    """`REQ <id> 0\n` for every message of a decoded batch (``fin_lines``' REQ form)."""
    lines = np.empty((len(body_offsets), 23), dtype=np.uint8)
    lines[:, :4] = _REQ_PREFIX
    lines[:, 4:20] = buffer[(body_offsets - 16)[:, None] + _ID_SPAN]
    lines[:, 20:] = _REQ_SUFFIX
    return lines.tobytes()


def mpub_pipelined(conn: Connection, topic: str, count: int, body: bytes, window: int = 32) -> None:
    """Publish `count` copies of body as MPUBs of 200, at most `window` of them waiting for their OK."""
    batch = client.mpub(topic, [body] * 200)
    sent = waiting = 0
    while sent < count:
        k = min(200, count - sent)
        conn.send(batch if k == 200 else client.mpub(topic, [body] * k))
        sent += k
        waiting += 1
        if waiting == window:
            conn.expect_ok("MPUB")
            waiting -= 1
    for _ in range(waiting):
        conn.expect_ok("MPUB")


def warm_up() -> None:
    """Compile (or load from numba's cache) the batch decoder once, before workers fork: otherwise every worker
    pays that (~0.5 s) inside its measured run."""
    frame = message_frame(0, 1, b"0" * 16, b"warm")
    client.decode_message_batch(memoryview(bytearray(frame * 2)), 0)


class MessageStream:
    """Message frames of a subscribed connection, decoded a whole receive buffer at a time.

    `read(timeout)` receives once and returns the `MessageBatch`es found (offsets index `self.array`), which
    stay valid until the next `read`; leftover partial frames move to the front of the buffer then. Heartbeats
    are answered, `E_FIN_FAILED`-style non-fatal errors counted in `nonfatal_errors`, and fatal ones raise.
    """

    def __init__(self, conn: Connection, buffer_size: int = 4 << 20):
        if conn.pending or conn.decoder.buffered:
            raise BenchError("messages arrived before RDY was sent")
        self.conn = conn
        self.buffer = bytearray(buffer_size)   # > max-msg-size (1 MiB) plus headers: any frame fits
        self.array = np.frombuffer(self.buffer, dtype=np.uint8)
        self.view = memoryview(self.buffer)
        self.start = 0       # first byte not consumed yet
        self.end = 0         # first byte not received yet
        self.nonfatal_errors = 0

    def read(self, timeout: float) -> list:
        if self.start:
            left = self.end - self.start
            self.buffer[:left] = self.buffer[self.start:self.end]
            self.start, self.end = 0, left
        if self.end == len(self.buffer):
            raise BenchError("a frame larger than the receive buffer")
        self.conn.sock.settimeout(max(timeout, 0.001))
        try:
            n = self.conn.sock.recv_into(self.view[self.end:])
        except TimeoutError:
            return []
        if n == 0:
            raise BenchError("connection closed by the server")
        self.end += n
        batches = []
        while True:
            batch = client.decode_message_batch(self.view[:self.end], self.start)
            if len(batch):
                batches.append(batch)
            self.start += batch.consumed
            if batch.status == kernels.OTHER_FRAME:
                if not self._other_frame():
                    break
            elif batch.status in (kernels.OK, kernels.NEED_MORE):
                break
            else:
                raise BenchError(f"corrupt frame stream (status {batch.status})")
        return batches

    def _other_frame(self) -> bool:
        """Handle the complete non-message frame at `start`; False when it is still incomplete."""
        size = int.from_bytes(self.buffer[self.start:self.start + 4], "big")
        stop = self.start + 4 + size
        if stop > self.end:
            return False
        frame_type = int.from_bytes(self.buffer[self.start + 4:self.start + 8], "big")
        data = bytes(self.buffer[self.start + 8:stop])
        self.start = stop
        if frame_type == FRAME_ERROR:
            code = data.split(b" ", 1)[0].decode("ascii", "replace")
            if ERROR_CLASSES.get(code) is None or ERROR_CLASSES[code].fatal:
                raise BenchError(data.decode("ascii", "replace"))
            self.nonfatal_errors += 1
        elif data == HEARTBEAT:
            self.conn.send(client.nop())
        return True
