"""A small epoll event loop for the broker's processes.

Theory of operation: a worker serves hundreds of sockets plus a few eventfds (ring wake-ups) and Unix sockets
(fd hand-offs). asyncio's Futures and Handles cost several microseconds per event, which is the whole budget of a
PUB round trip, so the worker drives epoll itself: level-triggered readers, a write-interest flag only while a
socket has unsent output, a heap of timers, and "idle" callbacks run once per iteration after all I/O of that
iteration was handled (that is where batched delivery and output flushing happen, so one iteration's reads share
one flush).

Error handling: a callback that raises is logged and its fd removed; the loop itself never dies from a callback.
"""
import heapq
import itertools
import os
import select
import signal
import time
import traceback

IDLE_RETRY = 0.05  # seconds before idle work that raised runs again


class Timer:
    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when, callback):
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


class Loop:
    def __init__(self, logger=None):
        self._ep = select.epoll()
        self._readers = {}
        self._writers = {}
        self._masks = {}
        self._timers = []
        self._seq = itertools.count()
        self._critical = set()
        self._idle = []
        self._running = False
        self.log = logger
        self.fast_poll = None  # poll(timeout) to use instead of epoll's when the loop would block (forward lane)

    @property
    def epoll(self):
        """The loop's epoll object (the forward lane waits on it: ``workers/lane/fastlane.py``)."""
        return self._ep

    # ---- fds -------------------------------------------------------------------------------------------
    def _update(self, fd):
        mask = (select.EPOLLIN if fd in self._readers else 0) | (select.EPOLLOUT if fd in self._writers else 0)
        old = self._masks.get(fd)
        if mask == 0:
            if old is not None:
                del self._masks[fd]
                try:
                    self._ep.unregister(fd)
                except (OSError, ValueError):
                    pass
        elif old is None:
            self._ep.register(fd, mask)
            self._masks[fd] = mask
        elif old != mask:
            self._ep.modify(fd, mask)
            self._masks[fd] = mask

    def keep_on_error(self, fd):
        """A callback of fd that raises is logged but fd stays (the pump's epoll set or a ring's eventfd: dropping
        it would silence every connection or ring of the process, not one)."""
        self._critical.add(fd)

    def add_reader(self, fd, callback):
        self._readers[fd] = callback
        self._update(fd)

    def remove_reader(self, fd):
        if self._readers.pop(fd, None) is not None:
            self._update(fd)

    def add_writer(self, fd, callback):
        if self._writers.get(fd) is not callback:
            self._writers[fd] = callback
            self._update(fd)

    def remove_writer(self, fd):
        if self._writers.pop(fd, None) is not None:
            self._update(fd)

    def forget(self, fd):
        """Drop every interest in fd (call before closing it)."""
        self._readers.pop(fd, None)
        self._writers.pop(fd, None)
        self._update(fd)

    # ---- time ------------------------------------------------------------------------------------------
    @staticmethod
    def time():
        return time.monotonic()

    def call_later(self, delay, callback):
        t = Timer(time.monotonic() + delay, callback)
        heapq.heappush(self._timers, (t.when, next(self._seq), t))
        return t

    def next_timeout(self):
        """Seconds until the first timer is due (0 if it is), or -1 without timers: how long a wait may last."""
        timers = self._timers
        return -1 if not timers else max(0.0, timers[0][0] - time.monotonic())

    def add_idle(self, callback):
        """callback() runs once after the I/O of every iteration."""
        self._idle.append(callback)

    # ---- signals ---------------------------------------------------------------------------------------
    def add_signal_handler(self, signum, callback):
        """Run callback() from the loop when signum arrives. Python runs signal handlers between bytecodes and
        epoll is retried after EINTR (PEP 475), so the signal is turned into an fd event instead."""
        if not hasattr(self, "_sig_r"):
            self._sig_r, self._sig_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._sig_handlers = {}
            signal.set_wakeup_fd(self._sig_w)
            self.add_reader(self._sig_r, self._on_signal_fd)
        self._sig_handlers[signum] = callback
        signal.signal(signum, lambda *a: None)

    def _on_signal_fd(self):
        try:
            data = os.read(self._sig_r, 64)
        except BlockingIOError:
            return
        for signum in data:
            cb = self._sig_handlers.get(signum)
            if cb is not None:
                cb()

    # ---- running ---------------------------------------------------------------------------------------
    def stop(self):
        self._running = False

    def _report(self, what):
        if self.log is not None:
            self.log.error(f"{what}: {traceback.format_exc().strip()}")

    def run(self):
        self._running = True
        timers = self._timers
        readers, writers, poll, monotonic = self._readers, self._writers, self._ep.poll, time.monotonic
        want_read = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP
        want_write = select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP
        next_timeout = self.next_timeout
        while self._running:
            timeout = next_timeout()
            for cb in self._idle:
                try:
                    if cb():
                        timeout = 0  # idle work wants another pass right away
                except Exception:
                    self._report("idle callback failed")
                    timeout = IDLE_RETRY if timeout == -1 else min(timeout, IDLE_RETRY)  # retry soon, no spin
            try:
                events = poll(timeout) if timeout == 0 or self.fast_poll is None else self.fast_poll(timeout)
            except InterruptedError:
                continue
            except Exception:
                self._report("fast poll failed")  # what it read went to its sessions or stays staged
                events = ()
            for fd, ev in events:
                if ev & want_read:
                    cb = readers.get(fd)
                    if cb is not None:
                        try:
                            cb()
                        except Exception:
                            self._failed(fd)
                if ev & want_write:
                    cb = writers.get(fd)
                    if cb is not None:
                        try:
                            cb()
                        except Exception:
                            self._failed(fd)
            if timers and timers[0][0] <= monotonic():
                self._run_timers()

    def _run_timers(self):
        timers = self._timers
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            _, _, t = heapq.heappop(timers)
            if not t.cancelled:
                try:
                    t.callback()
                except Exception:
                    self._report("timer callback failed")

    def _failed(self, fd):
        """A callback raised: log it and drop the fd, so one broken connection cannot spin the loop."""
        self._report(f"callback for fd {fd} failed")
        if fd not in self._critical:
            self.forget(fd)

    def close(self):
        self._ep.close()
