"""bench_writer's epoll driver: one process keeps one PUB (or MPUB) outstanding on each of many connections, in a
numba-compiled loop, so that a round trip costs the generator about what it costs a C client.

Theory of operation
-------------------
Python does the set-up (connect, TCP_NODELAY, magic, IDENTIFY: `wire.Connection`) and hands over the
non-blocking sockets' descriptors. `drive` then registers them with one epoll instance (level-triggered, the
connection's index as user data), sends every connection its first command and loops on `epoll_wait`:

* readable: one recv into that connection's own buffer, then every complete frame
  (`[size][type][data]`, big-endian, size counting the type) is handled and a partial one is kept at the
  buffer's front for the next recv, so frames split or coalesced anywhere are fine. An `OK` response counts
  `batch` messages and sends the next command; `_heartbeat_` is answered with NOP and not counted; an error
  frame (or anything else) counts one error and stops that connection only.
* writable: only asked for while a connection has unsent bytes. A send goes straight to the socket; whatever
  the socket does not take waits in the connection's output queue (the rest of a large MPUB, a NOP queued
  behind it) and is sent, in order, as the socket drains.

The monotonic clock (`nsqpy.ipc.sysio.monotonic`, the clock of Python's `time.monotonic`) is read once per
`epoll_wait` return, which also bounds its timeout: a vDSO call of tens of ns against a round trip of
several µs. After `stop_at` no new command is sent; the loop still waits for the replies in flight (up to
`drain_s` more), so the counts agree with what the server counted. A reply still missing then counts as an
error ("unanswered").

Results land in `counts` (indexes MSGS...ERROR_LEN below) and `error_text` (the first error's text); the
Python wrapper `publish` turns them into the worker's counter dict.
"""

from __future__ import annotations

import socket

import numpy as np
from numba import boolean, float64, int64, njit, void

from nsqpy.ipc.sysio import (BYTES, EPOLL_CLOEXEC, EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, EINTR, be32, close,
                               epoll_add, epoll_create1, epoll_modify, epoll_remove, epoll_wait, errno,
                               event_data, event_mask, events_buffer, monotonic, recv_into, send_from)

IN_SIZE = 1 << 14          # per-connection receive buffer: replies are OK, heartbeats and short error texts
NOP_ROOM = 256             # output queue room beyond one command: NOPs owed while a large MPUB is still leaving
DRAIN_S = 5.0              # how long replies in flight at the stop time are waited for
ERROR_TEXT_SIZE = 256
FRAME_RESPONSE, FRAME_ERROR = 0, 1

# counts[] slots
MSGS, ERRORS, NOPS, UNANSWERED, PENDING, FIRST_ERROR, ERROR_LEN, N_COUNTS = range(8)
# per-connection state columns, and the connection states
FD, STATE, HAVE, OUT_LO, OUT_HI, WANT_OUT, N_COLS = range(7)
IDLE, WAITING, DEAD = 0, 1, 2
# why a connection stopped (counts[FIRST_ERROR] holds the first)
ERROR_FRAME, UNEXPECTED, CLOSED, RECV_FAILED, SEND_FAILED, BAD_FRAME, NO_REPLY, EPOLL_FAILED = range(1, 9)
REASONS = {CLOSED: "connection closed by the server", RECV_FAILED: "recv failed", SEND_FAILED: "send failed",
           BAD_FRAME: "corrupt frame stream", NO_REPLY: "no reply within the drain time after the stop",
           EPOLL_FAILED: "epoll_wait failed"}

# Every function has its one signature, so importing this module compiles it (or loads it from numba's cache)
# once, before any worker forks, and a call with a literal or a narrower int never compiles a second copy.
STATE_TABLE = int64[:, ::1]
COUNTS = int64[::1]
WORDS = np.frombuffer(b"OK_heartbeat_NOP\n", np.uint8)   # the responses compared, and the NOP: see _read


@njit(boolean(BYTES, int64, int64, BYTES), cache=True)
def _equals(buf, start, n, word) -> bool:
    if n != word.size:
        return False
    for k in range(n):
        if buf[start + k] != word[k]:
            return False
    return True


@njit(void(BYTES, int64, BYTES, int64, int64), cache=True)
def _copy(dst, at, src, start, n) -> None:
    """dst[at:at+n] = src[start:start+n] byte by byte (forward, so safe within one buffer when at < start);
    a plain loop compiles in a fraction of the time numba's slice assignment takes."""
    for k in range(n):
        dst[at + k] = src[start + k]


@njit(void(int64, int64, STATE_TABLE, COUNTS, BYTES, int64, BYTES, int64, int64), cache=True)
def _fail(ep, i, st, counts, error_text, reason, src, start, n) -> None:
    """Stop connection i and count one error; the first error's reason (and text src[start:start+n]) is kept."""
    if st[i, STATE] == WAITING:
        counts[PENDING] -= 1
    st[i, STATE] = DEAD
    epoll_remove(ep, st[i, FD])
    counts[ERRORS] += 1
    if counts[FIRST_ERROR] == 0:
        counts[FIRST_ERROR] = reason
        n = min(n, error_text.size)
        _copy(error_text, 0, src, start, n)
        counts[ERROR_LEN] = n


@njit(boolean(int64, int64, STATE_TABLE, BYTES, int64, BYTES), cache=True)
def _queue(ep, i, st, out, cap, src) -> bool:
    """Send src on connection i after anything already queued; what the socket does not take is queued and
    EPOLLOUT asked for. False when the send failed or the queue is full."""
    n = src.size
    lo, hi = st[i, OUT_LO], st[i, OUT_HI]
    sent = 0
    if lo == hi:
        lo = hi = 0
        sent = send_from(st[i, FD], src, 0, n)
        if sent < 0:
            return False
        if sent == n:
            st[i, OUT_LO] = st[i, OUT_HI] = 0
            return True
    base = i * cap
    if hi + n - sent > cap:  # move the unsent bytes to the front (forward copy: dst < src)
        _copy(out, base, out, base + lo, hi - lo)
        lo, hi = 0, hi - lo
        if hi + n - sent > cap:
            return False
    _copy(out, base + hi, src, sent, n - sent)
    st[i, OUT_LO], st[i, OUT_HI] = lo, hi + n - sent
    if not st[i, WANT_OUT]:
        st[i, WANT_OUT] = 1
        epoll_modify(ep, st[i, FD], EPOLLIN | EPOLLOUT, i)
    return True


@njit(boolean(int64, int64, STATE_TABLE, BYTES, int64), cache=True)
def _flush(ep, i, st, out, cap) -> bool:
    """Send connection i's queued bytes while the socket takes them; False when a send failed."""
    lo, hi = st[i, OUT_LO], st[i, OUT_HI]
    while lo < hi:
        sent = send_from(st[i, FD], out, i * cap + lo, hi - lo)
        if sent < 0:
            return False
        if sent == 0:
            break
        lo += sent
    st[i, OUT_LO] = lo
    if lo == hi and st[i, WANT_OUT]:
        st[i, WANT_OUT] = 0
        epoll_modify(ep, st[i, FD], EPOLLIN, i)
    return True


@njit(void(int64, int64, STATE_TABLE, BYTES, int64, BYTES, COUNTS, BYTES), cache=True)
def _send_command(ep, i, st, out, cap, command, counts, error_text) -> None:
    if _queue(ep, i, st, out, cap, command):
        st[i, STATE] = WAITING
        counts[PENDING] += 1
    else:
        _fail(ep, i, st, counts, error_text, SEND_FAILED, command, 0, 0)


@njit(void(int64, int64, STATE_TABLE, BYTES, BYTES, int64, BYTES, BYTES, int64, boolean, COUNTS, BYTES),
      cache=True)
def _read(ep, i, st, inbuf, out, cap, command, words, batch, stopping, counts, error_text) -> None:
    """One recv on connection i, then every complete frame in its buffer; a partial frame is kept."""
    base, have = i * IN_SIZE, st[i, HAVE]
    got = recv_into(st[i, FD], inbuf, base + have, IN_SIZE - have)
    if got == -1:
        return
    if got <= 0:
        _fail(ep, i, st, counts, error_text, CLOSED if got == 0 else RECV_FAILED, inbuf, 0, 0)
        return
    have += got
    pos = 0
    while have - pos >= 4:
        size = be32(inbuf, base + pos)
        if size < 4 or size > IN_SIZE - 4:
            _fail(ep, i, st, counts, error_text, BAD_FRAME, inbuf, 0, 0)
            return
        if have - pos < 4 + size:
            break
        frame_type, data, n = be32(inbuf, base + pos + 4), base + pos + 8, size - 4
        pos += 4 + size
        if frame_type == FRAME_RESPONSE and _equals(inbuf, data, n, words[:2]) and st[i, STATE] == WAITING:
            counts[MSGS] += batch
            counts[PENDING] -= 1
            st[i, STATE] = IDLE
            if not stopping:
                _send_command(ep, i, st, out, cap, command, counts, error_text)
        elif frame_type == FRAME_RESPONSE and _equals(inbuf, data, n, words[2:13]):
            counts[NOPS] += 1
            if not _queue(ep, i, st, out, cap, words[13:]):
                _fail(ep, i, st, counts, error_text, SEND_FAILED, inbuf, 0, 0)
        else:
            _fail(ep, i, st, counts, error_text, ERROR_FRAME if frame_type == FRAME_ERROR else UNEXPECTED,
                  inbuf, data, n)
        if st[i, STATE] == DEAD:
            return
    _copy(inbuf, base, inbuf, base + pos, have - pos)  # keep the partial frame at the front
    st[i, HAVE] = have - pos


@njit(void(int64[::1], BYTES, BYTES, int64, float64, float64, COUNTS, BYTES), cache=True, nogil=True)
def drive(fds, command, words, batch, stop_at, drain_s, counts, error_text) -> None:
    """Keep one `command` outstanding on every socket in `fds` until `stop_at` (time.monotonic() seconds),
    then wait up to `drain_s` for the replies in flight. Fills `counts` and `error_text`; `words` is WORDS."""
    n = fds.size
    cap = command.size + NOP_ROOM
    st = np.zeros((n, N_COLS), np.int64)
    inbuf = np.empty(n * IN_SIZE, np.uint8)
    out = np.empty(n * cap, np.uint8)
    events = events_buffer(max(n, 1))
    ep = np.int64(epoll_create1(EPOLL_CLOEXEC))
    for i in range(n):
        st[i, FD] = fds[i]
        epoll_add(ep, fds[i], EPOLLIN, i)
        _send_command(ep, i, st, out, cap, command, counts, error_text)
    drain_until = stop_at + drain_s
    while counts[PENDING] > 0:
        now = monotonic()
        stopping = now >= stop_at
        if now >= drain_until:
            break
        limit = drain_until if stopping else stop_at
        ready = epoll_wait(ep, events.ctypes.data, n, min(int((limit - now) * 1000.0) + 1, 60_000))
        if ready < 0:
            if errno() == EINTR:
                continue
            if counts[FIRST_ERROR] == 0:
                counts[FIRST_ERROR] = EPOLL_FAILED
            counts[ERRORS] += 1
            break
        for e in range(ready):
            mask, i = event_mask(events, e), event_data(events, e)
            if st[i, STATE] == DEAD:
                continue
            if mask & EPOLLOUT and not _flush(ep, i, st, out, cap):
                _fail(ep, i, st, counts, error_text, SEND_FAILED, inbuf, 0, 0)
                continue
            if mask & (EPOLLIN | EPOLLERR | EPOLLHUP):
                _read(ep, i, st, inbuf, out, cap, command, words, batch, stopping, counts, error_text)
    counts[UNANSWERED] = counts[PENDING]
    counts[ERRORS] += counts[PENDING]
    if counts[PENDING] and counts[FIRST_ERROR] == 0:
        counts[FIRST_ERROR] = NO_REPLY
    close(ep)


def publish(socks: list[socket.socket], command: bytes, batch: int, stop_at: float,
            drain_s: float = DRAIN_S) -> dict:
    """Drive these connected, IDENTIFYed sockets (made non-blocking here) with `command` until `stop_at`.

    Returns {"msgs", "errors", "nops", "unanswered", "error_text"}; msgs is `batch` per OK received.
    """
    for sock in socks:
        sock.setblocking(False)
    fds = np.array([s.fileno() for s in socks], dtype=np.int64)
    counts, text = np.zeros(N_COUNTS, np.int64), np.zeros(ERROR_TEXT_SIZE, np.uint8)
    drive(fds, np.frombuffer(command, np.uint8).copy(), WORDS.copy(), batch, stop_at, drain_s, counts, text)
    reason = int(counts[FIRST_ERROR])
    error_text = bytes(text[:counts[ERROR_LEN]]).decode("ascii", "replace") or REASONS.get(reason, "")
    if reason == UNEXPECTED:
        error_text = f"unexpected frame: {error_text[:80]!r}"
    return {"msgs": int(counts[MSGS]), "errors": int(counts[ERRORS]), "nops": int(counts[NOPS]),
            "unanswered": int(counts[UNANSWERED]), "error_text": error_text}
