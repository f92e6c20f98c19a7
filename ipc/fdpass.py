"""Passing a connection (its fd plus a small header) between processes over a Unix SOCK_SEQPACKET socketpair.

Theory of operation
-------------------
The acceptor hands each accepted TCP socket to a worker, and a worker moves a subscriber's socket to the channel's
owner at SUB. Each hand-over is ONE datagram on a SOCK_SEQPACKET socketpair (created by the supervisor before
fork): the fixed header, the blob, and at most one fd as SCM_RIGHTS ancillary data. SEQPACKET keeps message
boundaries and sends a message whole or not at all, so there are no partial reads or writes to reassemble: a
non-blocking receive gets one complete hand-over or EAGAIN.

Wire format of one message (little-endian)::

    +--------+--------+--------+----------+-----------+-------------------+
    | magic  | kind   | n_fds  | blob_len | conn_id   | blob              |   + SCM_RIGHTS: n_fds (0 or 1) fds
    | u32    | u16    | u16    | u32      | u64       | blob_len bytes    |
    +--------+--------+--------+----------+-----------+-------------------+
      "NSQF"   caller's  checked   <= MAX_BLOB            session state, bytes already read from the socket

``kind`` is the caller's (e.g. NEW_CONNECTION, MOVE_SUBSCRIBER); this module only carries it.

Resource handling. Sending duplicates the fd into the message: the sender still owns its copy and closes it
when ``send``/``try_send`` reports success. A received fd belongs to the receiver (``Handoff.fd``, -1 when none)
and is opened close-on-exec. If a received message is malformed, its fds are closed before the error is raised,
so nothing leaks. Fds still queued when the receiving process dies are closed by the kernel: such a connection is
dropped (the client sees a disconnect), never leaked.

sendmsg/recvmsg are called directly rather than through socket.send_fds/recv_fds: in Python 3.11 those drop
their ``flags`` argument, so MSG_DONTWAIT would be ignored and a "non-blocking" send could block.

Error handling. EINTR is retried (by Python, PEP 475). EAGAIN is "not now": ``try_send`` returns False and
``try_recv`` None, for use from a selectors/asyncio loop (wait for POLLOUT / POLLIN and call again); the blocking
``send``/``recv`` poll with an optional timeout (TimeoutError). The peer's death shows as end-of-file on receive
(after the messages it sent before dying) and as EPIPE / ECONNRESET on send: both raise PeerGone. A message that
is not ours (bad magic, wrong size, an unexpected fd count, truncation) raises FdPassError.
"""
from __future__ import annotations

import array
import select
import socket
import struct
import time
from typing import NamedTuple

__all__ = ["FdChannel", "Handoff", "PeerGone", "FdPassError", "channel_pair", "MAX_BLOB", "HEADER"]

HEADER = struct.Struct("<IHHIQ")
MAGIC = int.from_bytes(b"NSQF", "little")
MAX_BLOB = 64 * 1024
# The most fds we accept in one message: more than we send, so that a peer sending too many is caught as an
# error (MSG_CTRUNC would otherwise close the extra fds silently).
_MAX_RECV_FDS = 4
_ANC_SPACE = socket.CMSG_SPACE(_MAX_RECV_FDS * 4)
_SNDBUF = 4 * (HEADER.size + MAX_BLOB)


class PeerGone(ConnectionError):
    """The process at the other end closed its end or died."""


class FdPassError(RuntimeError):
    """A message that does not follow the format (its fds were closed)."""


class Handoff(NamedTuple):
    kind: int
    conn_id: int
    blob: bytes
    fd: int  # owned by the receiver; -1 when the message carried none


def channel_pair() -> tuple[FdChannel, FdChannel]:
    """Two connected ends; create before fork, keep one end in each process and close the other."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    return FdChannel(a), FdChannel(b)


class FdChannel:
    """One end of a hand-over channel. The try_* methods never block, whatever the socket's blocking mode."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket):
        if sock.type != socket.SOCK_SEQPACKET:
            raise ValueError("FdChannel needs a SOCK_SEQPACKET socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def try_send(self, kind: int, conn_id: int, blob: bytes = b"", fd: int = -1) -> bool:
        """Queue one hand-over; False when the socket buffer is full (EAGAIN: wait for POLLOUT, call again)."""
        if len(blob) > MAX_BLOB:
            raise ValueError(f"blob of {len(blob)} bytes exceeds {MAX_BLOB}")
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))] if fd >= 0 else []
        header = HEADER.pack(MAGIC, kind, len(anc), len(blob), conn_id)
        try:
            self.sock.sendmsg([header, blob], anc, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except BlockingIOError:
            return False
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise PeerGone(f"hand-over peer gone: {exc.strerror}") from exc
        return True

    def send(self, kind: int, conn_id: int, blob: bytes = b"", fd: int = -1, timeout: float | None = None) -> None:
        """Send one hand-over, waiting for buffer space (TimeoutError after `timeout` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.try_send(kind, conn_id, blob, fd):
            self._wait(select.POLLOUT, deadline)

    def try_recv(self) -> Handoff | None:
        """One complete hand-over, or None when none is queued (EAGAIN)."""
        try:
            data, anc, flags, _ = self.sock.recvmsg(HEADER.size + MAX_BLOB, _ANC_SPACE,
                                                   socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return None
        except ConnectionResetError as exc:
            raise PeerGone(f"hand-over peer gone: {exc.strerror}") from exc
        fds = _fds_of(anc)
        if not data and not fds:
            raise PeerGone("hand-over peer closed its end")
        try:
            return _parse(data, fds, flags)
        except FdPassError:
            for f in fds:
                _close_quietly(f)
            raise

    def recv(self, timeout: float | None = None) -> Handoff:
        """Wait for one hand-over (TimeoutError after `timeout` seconds; PeerGone at end-of-file)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (msg := self.try_recv()) is None:
            self._wait(select.POLLIN, deadline)
        return msg

    def _wait(self, event: int, deadline: float | None) -> None:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("fd hand-over timed out")
        poller = select.poll()
        poller.register(self.sock, event)
        poller.poll(None if left is None else left * 1000)


def _parse(data: bytes, fds: list[int], flags: int) -> Handoff:
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        raise FdPassError("hand-over message truncated")
    if len(data) < HEADER.size:
        raise FdPassError(f"hand-over message of {len(data)} bytes is shorter than its header")
    magic, kind, n_fds, blob_len, conn_id = HEADER.unpack_from(data)
    if magic != MAGIC or HEADER.size + blob_len != len(data) or n_fds != len(fds) or n_fds > 1:
        raise FdPassError(f"malformed hand-over (magic {magic:#x}, {len(data)} bytes, {len(fds)} fds)")
    return Handoff(kind, conn_id, data[HEADER.size:], fds[0] if fds else -1)


def _fds_of(anc) -> list[int]:
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return fds.tolist()


def _close_quietly(fd: int) -> None:
    try:
        socket.close(fd)
    except OSError:
        pass
