"""Wake-ups between processes: an eventfd per reading process plus a "sleeping" flag in shared memory.

Theory of operation
-------------------
A reader that runs out of work must block without CPU, and a writer must not make a syscall per record. So a
reader announces that it is about to sleep, and only a writer that sees the announcement pays for a syscall:

    reader (before blocking)                  writer (after committing records to the reader's ring)
    1. store_release(SLEEPING, 1)             1. store_release(TAIL, ...)      (ring_commit)
    2. fence (seq_cst)                        2. fence (seq_cst)
    3. re-check every ring it reads           3. if load_acquire(SLEEPING) == 1
       work found: cas(SLEEPING, 1 -> 0)            and cas(SLEEPING, 1 -> 0) == 1:
       and do it, else                                  write(eventfd of the reader, 1)
    4. poll(eventfd); read it to zero; cas(SLEEPING, 1 -> 0) (needed after a timeout only)

This is Dekker's pattern: each side stores, fences, then loads what the other stored, so at least one of them
sees the other: either the reader's re-check (3) finds the record, or the writer finds the flag set and writes
the eventfd. No wake-up is lost on any CPU that LLVM's seq_cst fence covers. The CAS makes exactly one writer pay
for the syscall when several commit while the reader sleeps; a busy reader never sets the flag, so a busy path
makes no syscall at all. A writer that wins the CAS after the reader already cancelled its sleep leaves one count
in the eventfd: the next sleep returns at once, re-checks and sleeps again (harmless).

Layout at ``offset`` (8-aligned):

    +0               header line: magic 'NSQPYWAK' | version | layout bytes | readers
    +128 * (1 + r)   reader r's line: SLEEPING flag | eventfd writes made for r (statistics)

The eventfds are created by the supervisor before it forks (``make_eventfd``) and inherited; this module never
creates processes.
"""
from __future__ import annotations

import errno
import os
import select

from numba import njit

from nsqpy.ipc.numba_cache import JIT, warm_up_step
from nsqpy.ipc.atomics import cas, fence, fetch_add, load_acquire, store_release
from nsqpy.ipc.layout import LINE, LINE_WORDS, check_header, line_words, magic, stamp_header, words

__all__ = ["Wakeups", "make_eventfd", "wake_arm", "wake_disarm", "wake_check", "W_SLEEPING", "W_SIGNALS"]

WAKE_MAGIC = magic("NSQPYWAK")
WAKE_VERSION = 1
W_SLEEPING, W_SIGNALS = 0, 1  # word offsets inside a reader's line
_FIRST = line_words(1)


@njit(nogil=True, inline="always", **JIT)
def _line(reader):
    return _FIRST + reader * LINE_WORDS


@njit(nogil=True, **JIT)
def wake_arm(flags, reader):
    """Reader, before its last re-check: announce that it is going to sleep."""
    store_release(flags, _line(reader) + W_SLEEPING, 1)
    fence()


@njit(nogil=True, **JIT)
def wake_disarm(flags, reader):
    """Reader, when it found work after arming (or woke up): True if no writer had claimed the wake-up."""
    return cas(flags, _line(reader) + W_SLEEPING, 1, 0) == 1


@njit(nogil=True, **JIT)
def wake_check(flags, reader):
    """Writer, right after committing to a ring of ``reader``: True if the caller must write the reader's
    eventfd (at most one writer gets True per sleep)."""
    fence()
    at = _line(reader) + W_SLEEPING
    if load_acquire(flags, at) == 1 and cas(flags, at, 1, 0) == 1:
        fetch_add(flags, _line(reader) + W_SIGNALS, 1)
        return True
    return False


def make_eventfd() -> int:
    """A non-blocking eventfd for one reading process (create before fork; it is inherited)."""
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


class Wakeups:
    """The sleeping flags of ``readers`` processes at ``offset`` of ``buf``, and their eventfds (``fds[r]``).

    Resource handling: the eventfds belong to the supervisor that made them; ``Wakeups`` never closes them.
    """

    def __init__(self, buf, offset: int, fds):
        self.flags = words(buf, offset, self.size_for(len(fds)) // 8, "wake-up flags")
        self.fds = list(fds)

    @staticmethod
    def size_for(readers: int) -> int:
        return LINE * (1 + readers)

    @classmethod
    def create(cls, buf, offset: int, fds) -> "Wakeups":
        flags = words(buf, offset, cls.size_for(len(fds)) // 8, "wake-up flags")
        flags[LINE_WORDS:] = 0
        stamp_header(flags, WAKE_MAGIC, WAKE_VERSION, cls.size_for(len(fds)), (len(fds),))
        return cls(buf, offset, fds)

    @classmethod
    def attach(cls, buf, offset: int, fds) -> "Wakeups":
        head = words(buf, offset, LINE_WORDS, "wake-up flags")
        check_header(head, WAKE_MAGIC, WAKE_VERSION, cls.size_for(len(fds)), (len(fds),),
                     what="wake-up flags", names=("readers",))
        return cls(buf, offset, fds)

    # writer side -------------------------------------------------------------------------------------------
    def notify(self, reader: int) -> bool:
        """Call after committing records for ``reader``; makes the syscall only if it sleeps."""
        if wake_check(self.flags, reader):
            os.eventfd_write(self.fds[reader], 1)
            return True
        return False

    def signals(self, reader: int) -> int:
        return int(self.flags[_line(reader) + W_SIGNALS])

    # reader side -------------------------------------------------------------------------------------------
    def prepare_sleep(self, reader: int, has_work) -> bool:
        """Arm the flag and re-check with ``has_work()``. True: go to sleep (poll ``fds[reader]``, e.g. with
        asyncio's add_reader, then call ``woke``); False: work arrived, the flag is cleared, do the work."""
        wake_arm(self.flags, reader)
        if has_work():
            wake_disarm(self.flags, reader)
            return False
        return True

    def woke(self, reader: int) -> None:
        """After the eventfd polled readable or the wait timed out: reset the eventfd and the flag."""
        try:
            os.eventfd_read(self.fds[reader])
        except BlockingIOError:
            pass
        except OSError as exc:  # pragma: no cover - only EAGAIN is expected from a non-blocking eventfd
            if exc.errno != errno.EAGAIN:
                raise
        wake_disarm(self.flags, reader)

    def sleep(self, reader: int, has_work, timeout: float | None = None) -> bool:
        """Block until a writer notifies ``reader`` (or work is already there); False only on timeout."""
        if not self.prepare_sleep(reader, has_work):
            return True
        poller = select.poll()
        poller.register(self.fds[reader], select.POLLIN)
        ready = poller.poll(None if timeout is None else timeout * 1000)
        self.woke(reader)
        return bool(ready) or has_work()


@warm_up_step
def warm_up():
    """The wake-up flags' kernels (workers/lane/warmup.py schedules this before fork)."""
    wake = Wakeups.create(bytearray(Wakeups.size_for(1)), 0, [-1])
    wake.prepare_sleep(0, lambda: True)
    wake_check(wake.flags, 0)  # notify's test (notify itself would write to the eventfd, -1 here)
