"""The worker's event loop (workers/processes/event_loop.py): readers, timers and idle callbacks in order, and an idle loop sleeps
in epoll (little CPU)."""
import os
import resource
import time

from nsqpy.workers.processes.event_loop import Loop


def test_events_timers_and_idle_callbacks_run_in_order():
    loop = Loop()
    r, w = os.pipe()
    got, idles = [], []

    def on_read():
        got.append(os.read(r, 100))
        if len(got) == 1:
            os.write(w, b"second")
        else:
            loop.call_later(0.0002, lambda: got.append(b"timer"))
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


def test_an_idle_loop_sleeps():
    """After one event the loop sleeps in epoll until its timer (0.3 s): it uses far less CPU than that time (a
    spinning loop would use all of it)."""
    loop = Loop()
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


def test_next_timeout_is_the_first_timers_wait():
    """What the loop waits for, and what the forward lane's own path asks when it goes on without the loop."""
    loop = Loop()
    assert loop.next_timeout() == -1
    loop.call_later(30.0, lambda: None)
    assert 0 < loop.next_timeout() <= 30.0
    loop.call_later(-1.0, lambda: None)  # already due
    assert loop.next_timeout() == 0
    loop.close()
