"""The few libc calls that compiled network loops make (the broker's producer pump, `benchmarks.fast_writer`,
`benchmarks.fast_sink`), callable from numba nopython code: sockets (send, recv, accept4, setsockopt, close),
epoll, eventfd writes and resets, errno and the clocks.

Theory of operation
-------------------
Each call is declared once as a ctypes function object with its C `argtypes` and `restype` (so it is also
callable from Python, as `LIBC.send(...)`), and handed to numba as `types.ExternalFunction(name, signature)`,
the signature translated from those ctypes types. numba can call the ctypes object itself, but it then embeds
the function's address in the machine code and refuses `cache=True` ("uses dynamic globals"); bound by symbol
name instead, the code links against libc when it is loaded, so every loop caches like the codec's kernels.

Buffers are passed as plain addresses (`array.ctypes.data + offset`): numba accepts an integer for a `void *`
argument. Sockets are used non-blocking, so calls that would block return -1 with `errno()` == EAGAIN; send
uses MSG_NOSIGNAL so a peer that went away is an EPIPE, never a SIGPIPE.

`struct epoll_event` is packed on x86-64: 12 bytes, a uint32 event mask then a uint64 of user data (here always
a small index, stored little-endian). `events_buffer(n)` makes room for n of them; `event_mask` and
`event_data` read the i-th; `epoll_add`/`epoll_modify` write one and register it.

The helpers carry no signature and are inlined (numba's inline="always") into the kernels that call them, so
none compiles when this module is imported: with signatures, numba compiled each of these one-liners on its own,
one after the other, while nsqd imported its modules, before its parallel compile could start (a first start's
imports took over a second longer than a warm start's). Python calls `events_buffer` only; the rest are called
from kernels. A helper's arrays are uint8 buffers (`BYTES` names that type for the loops' own signatures).
"""

from __future__ import annotations

import ctypes

import numpy as np
from numba import njit, types, uint8
from numba.core.typing.ctypes_utils import from_ctypes

from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE

LIBC = ctypes.CDLL(None, use_errno=True)

EAGAIN, EINTR = 11, 4
EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP = 0x1, 0x4, 0x8, 0x10
EPOLL_CTL_ADD, EPOLL_CTL_DEL, EPOLL_CTL_MOD = 1, 2, 3
EPOLL_CLOEXEC = SOCK_CLOEXEC = 0o2000000
SOCK_NONBLOCK = 0o4000
MSG_NOSIGNAL = 0x4000
IPPROTO_TCP, TCP_NODELAY = 6, 1
CLOCK_REALTIME = 0           # what time.time_ns() reads: message timestamps
CLOCK_MONOTONIC = 1          # what time.monotonic() reads, so a stop time computed in Python compares directly
EVENT_SIZE = 12


def _extern(name: str, restype, *argtypes):
    """Declare libc's `name` on LIBC (ctypes) and return the same call as a numba external function."""
    cfunc = getattr(LIBC, name)
    cfunc.restype, cfunc.argtypes = restype, list(argtypes)
    return types.ExternalFunction(name, from_ctypes(restype)(*(from_ctypes(t) for t in argtypes)))


_int, _ptr, _size = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
send = _extern("send", ctypes.c_ssize_t, _int, _ptr, _size, _int)
recv = _extern("recv", ctypes.c_ssize_t, _int, _ptr, _size, _int)
accept4 = _extern("accept4", _int, _int, _ptr, _ptr, _int)
setsockopt = _extern("setsockopt", _int, _int, _int, _int, _ptr, ctypes.c_uint32)
close = _extern("close", _int, _int)
epoll_create1 = _extern("epoll_create1", _int, _int)
epoll_ctl = _extern("epoll_ctl", _int, _int, _int, _int, _ptr)
epoll_wait = _extern("epoll_wait", _int, _int, _ptr, _int, _int)
clock_gettime = _extern("clock_gettime", _int, _int, _ptr)
write = _extern("write", ctypes.c_ssize_t, _int, _ptr, _size)
read = _extern("read", ctypes.c_ssize_t, _int, _ptr, _size)
_errno_location = _extern("__errno_location", ctypes.POINTER(ctypes.c_int))


BYTES = uint8[::1]     # a writable, contiguous uint8 array: the buffers the helpers take


@njit(inline="always", **JIT)
def errno() -> int:
    """The calling thread's errno, as left by the last failed call."""
    return _errno_location()[0]


@njit(inline="always", **JIT_CALLEE)
def _would_block() -> bool:
    code = errno()
    return code == EAGAIN or code == EINTR


@njit(inline="always", **JIT)
def monotonic() -> float:
    """CLOCK_MONOTONIC in seconds: the clock of Python's time.monotonic() (a vDSO call, tens of ns)."""
    ts = np.zeros(2, np.int64)   # struct timespec {tv_sec, tv_nsec}
    clock_gettime(CLOCK_MONOTONIC, ts.ctypes.data)
    return ts[0] + ts[1] * 1e-9


@njit(inline="always", **JIT_CALLEE)
def realtime_ns() -> int:
    """CLOCK_REALTIME in nanoseconds: Python's time.time_ns()."""
    ts = np.zeros(2, np.int64)
    clock_gettime(CLOCK_REALTIME, ts.ctypes.data)
    return ts[0] * 1_000_000_000 + ts[1]


@njit(inline="always", **JIT_CALLEE)
def eventfd_signal(fd: int) -> int:
    """Add 1 to an eventfd (os.eventfd_write(fd, 1)): 8 on success, -1 on an error (a full counter: EAGAIN)."""
    one = np.ones(1, np.int64)
    return write(fd, one.ctypes.data, 8)


@njit(inline="always", **JIT_CALLEE)
def eventfd_clear(fd: int) -> int:
    """Reset an eventfd to zero (os.eventfd_read on a non-blocking one): 8, or -1 when it was zero (EAGAIN)."""
    value = np.zeros(1, np.int64)
    return read(fd, value.ctypes.data, 8)


@njit(inline="always", **JIT)
def events_buffer(n: int) -> np.ndarray:
    return np.zeros(n * EVENT_SIZE, np.uint8)


@njit(inline="always", **JIT_CALLEE)
def event_mask(events: np.ndarray, i: int) -> int:
    at = i * EVENT_SIZE
    return (np.int64(events[at]) | np.int64(events[at + 1]) << 8 | np.int64(events[at + 2]) << 16
            | np.int64(events[at + 3]) << 24)


@njit(inline="always", **JIT_CALLEE)
def event_data(events: np.ndarray, i: int) -> int:
    """The user data of the i-th event (the low 32 bits: an index is all we ever store)."""
    at = i * EVENT_SIZE + 4
    return (np.int64(events[at]) | np.int64(events[at + 1]) << 8 | np.int64(events[at + 2]) << 16
            | np.int64(events[at + 3]) << 24)


@njit(inline="always", **JIT_CALLEE)
def _epoll_set(epfd: int, op: int, fd: int, mask: int, data: int) -> int:
    event = np.zeros(EVENT_SIZE, np.uint8)
    for k in range(4):
        event[k] = (mask >> (8 * k)) & 0xFF
        event[4 + k] = (data >> (8 * k)) & 0xFF
    return epoll_ctl(epfd, op, fd, event.ctypes.data)


@njit(inline="always", **JIT_CALLEE)
def epoll_add(epfd: int, fd: int, mask: int, data: int) -> int:
    return _epoll_set(epfd, EPOLL_CTL_ADD, fd, mask, data)


@njit(inline="always", **JIT_CALLEE)
def epoll_modify(epfd: int, fd: int, mask: int, data: int) -> int:
    return _epoll_set(epfd, EPOLL_CTL_MOD, fd, mask, data)


@njit(inline="always", **JIT_CALLEE)
def epoll_remove(epfd: int, fd: int) -> int:
    return epoll_ctl(epfd, EPOLL_CTL_DEL, fd, 0)


@njit(inline="always", **JIT_CALLEE)
def send_from(fd: int, buf: np.ndarray, start: int, n: int) -> int:
    """send(2) of buf[start:start+n]: bytes sent, 0 when the socket is full (EAGAIN), -1 on any other error."""
    sent = send(fd, buf.ctypes.data + start, n, MSG_NOSIGNAL)
    if sent < 0:
        return 0 if _would_block() else -1
    return sent


@njit(inline="always", **JIT)
def recv_into(fd: int, buf: np.ndarray, start: int, n: int) -> int:
    """recv(2) into buf[start:start+n]: bytes read, 0 when the peer closed, -1 when nothing is there yet
    (EAGAIN), -2 on any other error."""
    got = recv(fd, buf.ctypes.data + start, n, 0)
    if got < 0:
        return -1 if _would_block() else -2
    return got


@njit(inline="always", **JIT_CALLEE)
def be32(buf: np.ndarray, at: int) -> int:
    """The big-endian uint32 at buf[at:at+4] (V2's frame and body sizes)."""
    return (np.int64(buf[at]) << 24 | np.int64(buf[at + 1]) << 16 | np.int64(buf[at + 2]) << 8
            | np.int64(buf[at + 3]))

