"""The no-op sink in compiled code: a numba epoll loop that accepts V2 connections, reads IDENTIFY, PUB, MPUB,
DPUB and NOP, answers OK to each command that wants a reply, and stores nothing. It is the floor under any broker
figure: what a round trip costs on this machine when the server does nothing, at about the cost of C.

    python -m benchmarks.sink_server --fast --tcp-address=127.0.0.1:0 [--processes N]   (N defaults to 1)

Theory of operation
-------------------
`FastSink` is a `stub_server.StubServer` (bind in the parent, fork `processes` children sharing the listener,
counters in a shared mapping summed on `stop()`) whose children run `serve` instead of a selectors loop.
`serve` keeps one epoll instance over the listener, a wake-up pipe and up to MAX_CONNS connections, each in a
slot (the slot number is the epoll user data). A readable connection gets one recv into a shared buffer, which
a byte-level state machine consumes completely, so commands may be split or coalesced anywhere:

    MAGIC (4 bytes "  V2") -> LINE (up to "\\n") -> SIZE (4 bytes, big-endian) -> [COUNT (4, MPUB only)]
    -> SKIP (the rest of the body, never copied) -> LINE ...

Only the command line is kept between reads (LINE_MAX bytes per slot). Every reply is the same 10-byte OK
frame, so a slot's output is just a number of bytes owed plus its position within a frame: sending means one
send from a buffer of repeated OK frames, and a socket that is full only makes the debt wait for EPOLLOUT.

IDENTIFY is answered OK whatever it asks (no feature negotiation: the load generators do not ask for any).
Anything else (SUB, RDY, an unknown verb, a line longer than LINE_MAX, a wrong magic) counts an error, gets
one E_INVALID frame and closes that connection. SIGTERM/SIGINT reach the loop through the wake-up pipe that
`signal.set_wakeup_fd` writes, so the child leaves `serve` and exits; counters are written straight into the
shared row as they happen.
"""

from __future__ import annotations

import os
import signal

import numpy as np
from numba import boolean, int64, njit, void

from nsqpy.protocol.frames import FRAME_ERROR, OK_FRAME, encode_frame

from nsqpy.ipc.sysio import (BYTES, EPOLL_CLOEXEC, EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, EINTR, IPPROTO_TCP,
                               SOCK_CLOEXEC, SOCK_NONBLOCK, TCP_NODELAY, accept4, close, epoll_add,
                               epoll_create1, epoll_modify, epoll_remove, epoll_wait, errno, event_data,
                               event_mask, events_buffer, recv_into, send_from, setsockopt)
from benchmarks.stub_server import COUNTERS, StubServer

MAX_CONNS = 4096           # connection slots per serving process
LINE_MAX = 256             # longest command line kept between reads
RECV_SIZE = 1 << 18
MAX_EVENTS = 256
OK_STREAM = np.frombuffer(OK_FRAME * 64, np.uint8)
INVALID_FRAME = np.frombuffer(encode_frame(FRAME_ERROR, b"E_INVALID the fast sink takes IDENTIFY, PUB, MPUB, "
                                                        b"DPUB and NOP only"), np.uint8)
# The words the parser compares: (offset, length) of each in WORDS.
WORDS = np.frombuffer(b"  V2PUB DPUB MPUB IDENTIFYNOP", np.uint8)
W_MAGIC, W_PUB, W_DPUB, W_MPUB, W_IDENTIFY, W_NOP = (0, 4), (4, 4), (8, 5), (13, 5), (18, 8), (26, 3)
# counters this loop writes, as indexes into the shared row (the order of COLUMNS)
COLUMNS = ("connections", "commands", "msgs_in", "bytes_in", "errors")
C_CONNECTIONS, C_COMMANDS, C_MSGS, C_BYTES, C_ERRORS = range(5)
# slot columns, parser phases, command kinds
FD, PHASE, NEED, KIND, ACC, BODY, COUNT, LINE_LEN, OWED, SENT_MOD, WANT_OUT, N_COLS = range(12)
MAGIC, LINE, SIZE, MPUB_COUNT, SKIP = range(5)
K_PUB, K_MPUB, K_IDENTIFY = range(3)
LISTENER, WAKE = MAX_CONNS, MAX_CONNS + 1     # epoll user data of the two non-connection descriptors
OK_FRAME_SIZE = len(OK_FRAME)
SLOTS = int64[:, ::1]
INTS = int64[::1]       # the counter row, the column indexes into it, the free-slot stack


@njit(boolean(BYTES, int64, int64, BYTES, int64, int64, boolean), cache=True)
def _word(buf, at, n, words, w_at, w_n, exact) -> bool:
    """buf[at:at+n] starts with (or, if exact, is) words[w_at:w_at+w_n]."""
    if n < w_n or (exact and n != w_n):
        return False
    for k in range(w_n):
        if buf[at + k] != words[w_at + k]:
            return False
    return True


@njit(void(int64, SLOTS, int64, INTS, INTS), cache=True)
def _close(ep, slots, s, free, nfree) -> None:
    epoll_remove(ep, slots[s, FD])
    close(slots[s, FD])
    slots[s, FD] = -1
    free[nfree[0]] = s
    nfree[0] += 1


@njit(boolean(int64, SLOTS, int64, BYTES), cache=True)
def _flush(ep, slots, s, ok_stream) -> bool:
    """Send the OK bytes slot s owes while the socket takes them; False when the connection failed."""
    owed, at = slots[s, OWED], slots[s, SENT_MOD]
    while owed > 0:
        sent = send_from(slots[s, FD], ok_stream, at, min(owed, ok_stream.size - at))
        if sent < 0:
            return False
        if sent == 0:
            break
        owed -= sent
        at = (at + sent) % OK_FRAME_SIZE
    slots[s, OWED], slots[s, SENT_MOD] = owed, at
    want = owed > 0
    if want != slots[s, WANT_OUT]:
        slots[s, WANT_OUT] = want
        epoll_modify(ep, slots[s, FD], (EPOLLIN | EPOLLOUT) if want else EPOLLIN, s)
    return True


@njit(boolean(SLOTS, int64, BYTES, BYTES), cache=True)
def _command_line(slots, s, lines, words) -> bool:
    """Dispatch slot s's complete command line; False for a command the sink does not take."""
    at, n = s * LINE_MAX, slots[s, LINE_LEN]
    if n and lines[at + n - 1] == 13:  # "\r\n"
        n -= 1
    slots[s, LINE_LEN] = 0
    if _word(lines, at, n, words, W_NOP[0], W_NOP[1], True):
        return True
    if _word(lines, at, n, words, W_PUB[0], W_PUB[1], False) or \
            _word(lines, at, n, words, W_DPUB[0], W_DPUB[1], False):
        slots[s, KIND] = K_PUB
    elif _word(lines, at, n, words, W_MPUB[0], W_MPUB[1], False):
        slots[s, KIND] = K_MPUB
    elif _word(lines, at, n, words, W_IDENTIFY[0], W_IDENTIFY[1], True):
        slots[s, KIND] = K_IDENTIFY
    else:
        return False
    slots[s, PHASE], slots[s, NEED], slots[s, ACC] = SIZE, 4, 0
    return True


@njit(void(SLOTS, int64, INTS, INTS), cache=True)
def _body_done(slots, s, row, cols) -> None:
    """A command with a body is complete: count it and owe its OK."""
    kind, body = slots[s, KIND], slots[s, BODY]
    if kind == K_PUB:
        row[cols[C_MSGS]] += 1
        row[cols[C_BYTES]] += body
    elif kind == K_MPUB:
        row[cols[C_MSGS]] += slots[s, COUNT]
        row[cols[C_BYTES]] += body - 4 - 4 * slots[s, COUNT]
    row[cols[C_COMMANDS]] += 1
    slots[s, OWED] += OK_FRAME_SIZE
    slots[s, PHASE] = LINE


@njit(boolean(SLOTS, int64, BYTES, int64, BYTES, INTS, INTS, BYTES), cache=True)
def _consume(slots, s, buf, n, lines, row, cols, words) -> bool:
    """Run slot s's parser over buf[:n]; False on a protocol error."""
    i = 0
    while i < n:
        phase = slots[s, PHASE]
        if phase == MAGIC:
            while i < n and slots[s, NEED]:
                if buf[i] != words[W_MAGIC[0] + W_MAGIC[1] - slots[s, NEED]]:
                    return False
                slots[s, NEED] -= 1
                i += 1
            if slots[s, NEED] == 0:
                slots[s, PHASE] = LINE
        elif phase == LINE:
            j = i
            while j < n and buf[j] != 10:
                j += 1
            length = slots[s, LINE_LEN]
            if length + j - i > LINE_MAX:
                return False
            for k in range(j - i):
                lines[s * LINE_MAX + length + k] = buf[i + k]
            slots[s, LINE_LEN] = length + j - i
            i = j
            if j < n:
                i += 1
                if not _command_line(slots, s, lines, words):
                    return False
                if slots[s, PHASE] == LINE:  # NOP
                    row[cols[C_COMMANDS]] += 1
        elif phase == SIZE or phase == MPUB_COUNT:
            while i < n and slots[s, NEED]:
                slots[s, ACC] = slots[s, ACC] << 8 | buf[i]
                slots[s, NEED] -= 1
                i += 1
            if slots[s, NEED] == 0:
                if phase == SIZE:
                    slots[s, BODY] = slots[s, ACC]
                    if slots[s, KIND] == K_MPUB:
                        if slots[s, BODY] < 4:
                            return False
                        slots[s, PHASE], slots[s, NEED], slots[s, ACC] = MPUB_COUNT, 4, 0
                        continue
                    slots[s, NEED] = slots[s, BODY]
                else:
                    slots[s, COUNT] = slots[s, ACC]
                    slots[s, NEED] = slots[s, BODY] - 4
                slots[s, PHASE] = SKIP
                if slots[s, NEED] == 0:
                    _body_done(slots, s, row, cols)
        else:  # SKIP
            take = min(slots[s, NEED], n - i)
            i += take
            slots[s, NEED] -= take
            if slots[s, NEED] == 0:
                _body_done(slots, s, row, cols)
    return True


@njit(void(int64, int64, INTS, INTS, BYTES, BYTES, BYTES), cache=True, nogil=True)
def serve(listen_fd, wake_fd, row, cols, ok_stream, invalid_frame, words) -> None:
    """Serve connections accepted on `listen_fd` until `wake_fd` becomes readable; count into `row`."""
    ep = np.int64(epoll_create1(EPOLL_CLOEXEC))
    epoll_add(ep, listen_fd, EPOLLIN, LISTENER)
    epoll_add(ep, wake_fd, EPOLLIN, WAKE)
    slots = np.zeros((MAX_CONNS, N_COLS), np.int64)
    lines = np.zeros(MAX_CONNS * LINE_MAX, np.uint8)
    free = np.arange(MAX_CONNS)[::-1].copy()
    nfree = np.array([MAX_CONNS])
    buf = np.empty(RECV_SIZE, np.uint8)
    events = events_buffer(MAX_EVENTS)
    nodelay = np.ones(1, np.int32)
    while True:
        ready = epoll_wait(ep, events.ctypes.data, MAX_EVENTS, -1)
        if ready < 0 and errno() == EINTR:
            continue
        if ready < 0:
            break
        for e in range(ready):
            s, mask = event_data(events, e), event_mask(events, e)
            if s == WAKE:
                close(ep)
                return
            if s == LISTENER:
                while True:
                    fd = np.int64(accept4(listen_fd, 0, 0, SOCK_NONBLOCK | SOCK_CLOEXEC))
                    if fd < 0:
                        break  # nothing left (or a sibling process took it)
                    row[cols[C_CONNECTIONS]] += 1
                    if nfree[0] == 0:
                        close(fd)
                        row[cols[C_ERRORS]] += 1
                        continue
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, nodelay.ctypes.data, 4)
                    nfree[0] -= 1
                    slot = free[nfree[0]]
                    for col in range(N_COLS):
                        slots[slot, col] = 0
                    slots[slot, FD], slots[slot, PHASE], slots[slot, NEED] = fd, MAGIC, W_MAGIC[1]
                    epoll_add(ep, fd, EPOLLIN, slot)
                continue
            if slots[s, FD] < 0:
                continue
            ok = True
            if mask & (EPOLLIN | EPOLLERR | EPOLLHUP):
                got = recv_into(slots[s, FD], buf, 0, RECV_SIZE)
                if got == 0 or got < -1:
                    _close(ep, slots, s, free, nfree)
                    continue
                if got > 0 and not _consume(slots, s, buf, got, lines, row, cols, words):
                    row[cols[C_ERRORS]] += 1
                    _flush(ep, slots, s, ok_stream)
                    send_from(slots[s, FD], invalid_frame, 0, invalid_frame.size)
                    _close(ep, slots, s, free, nfree)
                    continue
            if slots[s, OWED] or mask & EPOLLOUT:
                ok = _flush(ep, slots, s, ok_stream)
            if not ok:
                _close(ep, slots, s, free, nfree)
    close(ep)


class FastSink(StubServer):
    """A StubServer whose serving children run the compiled `serve` loop (1 process unless told otherwise)."""

    def __init__(self, address: tuple[str, int] = ("127.0.0.1", 0), processes: int = 1):
        super().__init__(None, address, processes)

    def _child(self, row: int) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _ignore)  # the C-level handler still writes to the wake-up pipe
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})  # see serve_main
        cols = np.array([COUNTERS.index(name) for name in COLUMNS], np.int64)
        serve(self.listener.fileno(), wake_r, self.counters[row], cols, OK_STREAM.copy(),
              INVALID_FRAME.copy(), WORDS.copy())


def _ignore(signum, frame) -> None:
    pass
