"""A worker in a crash loop never takes the broker down (the issue "nsqd never dies").

A real nsqd; one worker is SIGKILLed as soon as the supervisor logs its start, seven times in a row (the old
supervisor gave up after five quick deaths and the whole broker, messages included, went with it). The supervisor
restarts it with growing delays, and then the broker serves both workers' topics again, including a message
published before the loop. A SIGTERM while a restart is pending stops the broker at once and cleanly (no
segment, no directory journal left behind). Every wait is on the broker's log or a socket.
"""
import os
import re
import signal

from nsqpy.ipc.shm import instance_prefix
from wire import Conn, consumer, unique
from nsqpy.workers.connections.handover import owner_of

STARTED = r"worker 0: started \(pid (\d+)\)"
DIED = r"worker 0 \(pid {pid}\) died \(signal 9\); restarting (at once|in ([0-9.]+)s)"


def kill_at_start(nsqd, times, start_line=0):
    """SIGKILL worker 0 as soon as each incarnation's start is logged; the delays the supervisor announced."""
    delays = []
    for _ in range(times):
        m = nsqd.wait_for_line(STARTED, 60, start_line)
        pid = int(m.group(1))
        start_line = next(i for i, x in enumerate(nsqd.lines) if i >= start_line and m.group(0) in x) + 1
        os.kill(pid, signal.SIGKILL)
        d = nsqd.wait_for_line(DIED.format(pid=pid), 60, start_line)
        delays.append(float(d.group(2) or 0))
    return delays, start_line


def topics_of_each_worker(n=2):
    """Topic names owned by worker 0 and by worker 1 (the broker's ownership hash)."""
    names = {}
    while len(names) < n:
        t = unique()
        names.setdefault(owner_of(t, n), t)
    return [names[w] for w in range(n)]


def assert_backing_off(delays):
    """Restarted at once after the first quick death (and after the death of the worker started with the broker,
    if it had lived a second), then after 0.1 s, and twice as long each time."""
    at_once = delays.index(0.1)
    assert at_once in (1, 2) and delays[:at_once] == [0.0] * at_once, delays
    assert delays[at_once:] == [round(0.1 * 2 ** i, 2) for i in range(len(delays) - at_once)], delays


def test_a_crash_looping_worker_is_restarted_with_back_off_and_serves_again(nsqd_factory):
    nsqd = nsqd_factory()
    topics = topics_of_each_worker()
    with Conn(nsqd.address) as p:
        for t in topics:
            p.publish(t, b"before " + t.encode())
    delays, line = kill_at_start(nsqd, 7)
    assert_backing_off(delays)
    nsqd.wait_for_line(STARTED, 60, line)  # the 8th incarnation, left alone
    for t in topics:
        with consumer(nsqd.address, t, "ch", rdy=2) as c:
            assert c.read_message(timeout=60).body == b"before " + t.encode()
            with Conn(nsqd.address) as p:
                p.publish(t, b"after")
            assert c.read_message(timeout=60).body == b"after"
    out = nsqd.output()
    assert "giving up" not in out and "cannot run" not in out
    assert nsqd.proc.poll() is None


def test_sigterm_during_a_back_off_stops_the_broker_at_once(nsqd_factory):
    nsqd = nsqd_factory()
    delays, line = kill_at_start(nsqd, 7)
    assert_backing_off(delays)
    assert delays[-1] >= 1.6  # worker 0 is not running now, its restart is seconds away...
    assert nsqd.stop(timeout=30) == 0
    out = "\n".join(nsqd.lines[line:])
    assert "SIGTERM: signal received, shutting down" in out
    prefix = instance_prefix(nsqd.data_path, nsqd.node_id).strip("/")
    assert not [f for f in os.listdir(nsqd.data_path) if f.startswith(prefix)]  # the directory journals
    # ...and it was started again only to stop: a worker's stop saves the messages it holds (persistence)
    after = out.split("SIGTERM", 1)[1]
    assert len(re.findall(r"worker 0: started", after)) == 1 and "died" not in after.split("worker 0: started")[1]
