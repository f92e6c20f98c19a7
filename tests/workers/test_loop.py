"""The worker's event loop (workers/loop.py): readers, timers and idle callbacks, with and without --busy-poll.
Busy polling must not change what runs when, only how the loop waits: an event during the polling window is
handled, a timer inside it fires on time, and an idle loop goes back to sleeping in epoll (little CPU)."""
import os
import resource
import time

import pytest

from workers.loop import Loop


@pytest.mark.parametrize("busy_poll", [0.0, 0.0005])
def test_events_timers_and_idle_callbacks_run_as_without_busy_polling(busy_poll):
    loop = Loop(busy_poll=busy_poll)
    r, w = os.pipe()
    got, idles = [], []

    def on_read():
        got.append(os.read(r, 100))
        if len(got) == 1:
            os.write(w, b"second")  # arrives while the loop polls busily after handling the first
        else:
            loop.call_later(0.0002, lambda: got.append(b"timer"))  # inside the polling window
            loop.call_later(0.05, loop.stop)

    loop.add_reader(r, on_read)
    loop.add_idle(lambda: idles.append(1) and False)
    os.write(w, b"first")
    loop.run()
    loop.close()
    os.close(r)
    os.close(w)
    assert got == [b"first", b"second", b"timer"]
    assert idles


def test_an_idle_loop_sleeps_after_its_polling_window():
    """After one event, a loop with a 1 ms window sleeps in epoll until its timer (0.3 s): it uses far less CPU
    than that time (a spinning loop would use all of it)."""
    loop = Loop(busy_poll=0.001)
    r, w = os.pipe()
    loop.add_reader(r, lambda: os.read(r, 100))
    os.write(w, b"x")
    loop.call_later(0.3, loop.stop)
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.monotonic()
    loop.run()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    loop.close()
    os.close(r)
    os.close(w)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert wall >= 0.3 and cpu < wall / 3
