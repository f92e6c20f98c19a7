"""The supervisor's restarts (workers/processes/supervisor.py), with real forked processes and no broker.

Each test forks a supervisor process running ``Supervisor.run`` over small targets: children that exit at once
some number of times, or always, or with EXIT_CANNOT_RUN. Children and the supervisor (through its Logger) write
lines into one pipe, which the test reads with deadlines; the supervisor's own exit is awaited on a pidfd. What
must hold: a crash loop is restarted with growing delays and never given up; a SIGTERM or another child's death
during a back-off is handled at once; EXIT_CANNOT_RUN and a fork that keeps failing stop the broker, saying why.
"""
import mmap
import os
import re
import select
import signal
import struct
import time

from nsqpy.log import Logger
from nsqpy.workers.processes import supervisor as S
from nsqpy.workers.processes.supervisor import EXIT_CANNOT_RUN, Supervisor, backoff

DEADLINE = 30.0


class Counter:
    """A number shared by every process forked after it was made (anonymous shared memory)."""

    def __init__(self):
        self.m = mmap.mmap(-1, 8)

    def next(self):
        n = struct.unpack_from("<q", self.m)[0] + 1
        struct.pack_into("<q", self.m, 0, n)
        return n


class Lines:
    """One pipe: the supervisor's log and its children's lines in, the test's waits out."""

    def __init__(self):
        self.r, self.w = os.pipe()
        self.pending, self.seen = [], []
        self._rest = b""

    def emit(self, line):
        os.write(self.w, f"{line}\n".encode())

    def wait_for(self, pattern, timeout=DEADLINE, seen_too=False):
        """The first line from here on (or among those already seen) that matches pattern (its match object)."""
        pattern = re.compile(pattern)
        for m in map(pattern.search, self.seen if seen_too else ()):
            if m:
                return m
        deadline = time.monotonic() + timeout
        while True:
            while self.pending:
                line = self.pending.pop(0)
                self.seen.append(line)
                m = pattern.search(line)
                if m:
                    return m
            left = deadline - time.monotonic()
            data = os.read(self.r, 65536) if left > 0 and select.select([self.r], [], [], left)[0] else b""
            if not data:
                raise AssertionError(f"no line matching {pattern.pattern!r}:\n" + "\n".join(self.seen))
            *full, self._rest = (self._rest + data).split(b"\n")
            self.pending += [x.decode() for x in full]

    def to_the_end(self):
        """Every line, once every writer is gone (the supervisor and its children have exited)."""
        try:
            self.wait_for(r"(?!)")
        except AssertionError:
            pass
        return self.seen


class Supervised:
    """A supervisor process over ``children`` ((name, target[, kind]) tuples), logging into ``lines``.
    ``before_run(sup)`` runs in it after the children started (to break something there, or to wait for them).
    Leaving the block kills what is still running."""

    def __init__(self, lines, children, before_run=None, **kwargs):
        self.lines = lines
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.setpgid(0, 0)  # its own group, with its children: a failed test kills them all
                sup = Supervisor(Logger("", "debug", stream=open(lines.w, "w", closefd=False)),
                                 shutdown_timeout=5.0, **kwargs)
                sup.on_restart = lambda child: lines.emit(f"on_restart {child.name} {child.restarts}")
                for name, target, *kind in children:
                    sup.add(name, target, kind=kind[0] if kind else None)
                sup.trap_stop_signals()
                sup.start()
                if before_run:
                    before_run(sup)
                code = sup.run()
            finally:
                os._exit(code)
        self.code = None
        os.close(lines.w)  # the pipe ends when the supervisor and all its children are gone
        self.pidfd = os.pidfd_open(self.pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.exit_code(0) is None:
            os.killpg(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.pidfd)
        os.close(self.lines.r)

    def exit_code(self, timeout):
        """The supervisor's exit code if it exits within timeout, else None."""
        if self.code is None and select.select([self.pidfd], [], [], timeout)[0]:
            self.code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.code


def flaky(lines, name, deaths, code=1):
    """A target that exits with ``code`` at once ``deaths`` times, then runs until it is stopped."""
    counter = Counter()

    def target(restarted, ready_fd):
        n = counter.next()
        lines.emit(f"{name} start {n} {time.monotonic():.6f}")
        if n <= deaths:
            os._exit(code)
        lines.emit(f"{name} running pid {os.getpid()}")
        while True:
            signal.pause()  # SIGTERM (default action in a child) ends it
    return target


def started(lines, name):
    m = lines.wait_for(rf"^{name} start (\d+) ([0-9.]+)$")
    return int(m.group(1)), float(m.group(2))


def died(lines, name, how="exit code 1"):
    """The delay of the restart the supervisor announced for name's death."""
    m = lines.wait_for(rf"WARNING: {name} \(pid \d+\) died \({how}\); restarting (at once|in ([0-9.]+)s)")
    return float(m.group(2) or 0)


def test_backoff_series():
    assert [backoff(k, 0.1, 10.0) for k in range(10)] == [0.0, 0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0]
    assert backoff(50) == S.BACKOFF_MAX


def test_a_crash_loop_is_restarted_with_growing_delays_until_it_runs():
    deaths, first = 6, 0.05
    lines = Lines()
    with Supervised(lines, [("flaky", flaky(lines, "flaky", deaths))], backoff_first=first) as sv:
        starts, delays = [started(lines, "flaky")], []
        for _ in range(deaths):
            delays.append(died(lines, "flaky"))
            starts.append(started(lines, "flaky"))
        lines.wait_for(r"^flaky running pid \d+$")
        assert delays == [0.0] + [first * 2 ** i for i in range(deaths - 1)], delays
        assert [n for n, _ in starts] == list(range(1, deaths + 2))
        gaps = [b - a for (_, a), (_, b) in zip(starts, starts[1:])]
        for gap, delay in zip(gaps, delays):
            assert gap >= delay - 0.005, (gaps, delays)  # never restarted before its back-off is over
        os.kill(sv.pid, signal.SIGTERM)
        assert sv.exit_code(DEADLINE) == 0
        counted = [x for x in lines.to_the_end() if x.startswith("on_restart")]
        assert counted == [f"on_restart flaky {k}" for k in range(1, deaths + 1)]


def test_a_child_that_lived_quick_seconds_starts_the_series_again(monkeypatch):
    """Deaths 1, 2 quick (at once, then back-off); the 3rd incarnation lives past QUICK, so its death is
    restarted at once again, and the next quick death too (a new series)."""
    monkeypatch.setattr(S, "QUICK", 0.3)  # inherited by the forked supervisor
    lines = Lines()
    counter = Counter()

    def target(restarted, ready_fd):
        n = counter.next()
        lines.emit(f"x start {n} {time.monotonic():.6f}")
        if n == 3:
            time.sleep(0.45)  # pacing the subject: it lives past QUICK (the test waits on lines, not on this)
        if n <= 4:
            os._exit(1)
        while True:
            signal.pause()

    with Supervised(lines, [("x", target)], backoff_first=0.05) as sv:
        assert [died(lines, "x") for _ in range(4)] == [0.0, 0.05, 0.0, 0.0]
        assert started(lines, "x")[0] == 5
        os.kill(sv.pid, signal.SIGTERM)
        assert sv.exit_code(DEADLINE) == 0


def test_sigterm_and_other_deaths_during_a_back_off_are_handled_at_once():
    lines = Lines()
    loop = flaky(lines, "loop", 10**9)
    steady = flaky(lines, "steady", 0)
    with Supervised(lines, [("loop", loop), ("steady", steady)],
                    backoff_first=60.0, backoff_max=60.0) as sv:
        assert died(lines, "loop") == 0.0
        assert died(lines, "loop") == 60.0  # the loop now waits a minute for its restart...
        pid = int(lines.wait_for(r"^steady running pid (\d+)$", seen_too=True).group(1))
        os.kill(pid, signal.SIGKILL)  # ...while another child dies: restarted at once
        assert died(lines, "steady", "signal 9") == 0.0
        assert started(lines, "steady")[0] == 2
        t0 = time.monotonic()
        os.kill(sv.pid, signal.SIGTERM)
        assert sv.exit_code(DEADLINE) == 0
        assert time.monotonic() - t0 < 10.0  # far from the minute left of the back-off
        lines.wait_for(r"SIGTERM: signal received, shutting down")
        assert not [x for x in lines.to_the_end() if x.startswith("loop start 3")]


def test_exit_cannot_run_stops_the_broker_and_says_why():
    lines = Lines()
    bad = flaky(lines, "bad", 1, code=EXIT_CANNOT_RUN)
    good = flaky(lines, "good", 0)
    with Supervised(lines, [("good", good), ("bad", bad)]) as sv:
        pid = int(lines.wait_for(r"^good running pid (\d+)$", seen_too=True).group(1))
        assert sv.exit_code(DEADLINE) == EXIT_CANNOT_RUN
        lines.wait_for(rf"FATAL: bad \(pid \d+\) cannot run \(exit code {EXIT_CANNOT_RUN}: a configuration or "
                       r"environment error, which restarting cannot cure\); stopping the broker", seen_too=True)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            pass  # stopped and reaped by the supervisor before it exited
        else:
            raise AssertionError(f"the running child {pid} outlived the supervisor")
        assert not [x for x in lines.to_the_end() if x.startswith("bad start 2")]


def test_a_fork_that_keeps_failing_stops_the_broker_and_says_why():
    lines = Lines()

    def no_more_forks(sup):
        def fork():
            raise OSError(11, "Resource temporarily unavailable")
        os.fork = fork  # in the supervisor process only

    with Supervised(lines, [("c", flaky(lines, "c", 10**9))], before_run=no_more_forks,
                    backoff_first=0.001, backoff_max=0.002) as sv:
        assert sv.exit_code(DEADLINE) == 1
        for k in range(1, S.FORK_ATTEMPTS + 1):
            lines.wait_for(rf"ERROR: c: cannot fork \(.*\); attempt {k} of {S.FORK_ATTEMPTS}")
        lines.wait_for(rf"FATAL: c: fork failed {S.FORK_ATTEMPTS} times in a row; the broker cannot run")


def test_wait_ready_by_kind_returns_before_the_slower_kinds_report():
    """nsqd prints its TCP line once the broker's children are ready, before the HTTP child may be: wait_ready by
    kind returns while a child of another kind has not reported; the wait for that kind then returns once it has,
    even if a child of the first kind died meanwhile (it may already serve clients: run restarts it)."""
    lines = Lines()
    go_r, go_w = os.pipe()

    def quick(restarted, ready_fd):
        lines.emit(f"quick running pid {os.getpid()} restarted {restarted}")
        os.write(ready_fd, b"w")
        while True:
            signal.pause()

    def slow(restarted, ready_fd):
        os.read(go_r, 1)  # the test's word, given only after the supervisor said the workers were ready
        os.write(ready_fd, b"h")
        while True:
            signal.pause()

    def wait_in_two_steps(sup):
        lines.emit(f"workers ready {sup.wait_ready(b'w', timeout=DEADLINE)}")
        lines.emit(f"http ready {sup.wait_ready(timeout=DEADLINE)}")  # the rest

    try:
        with Supervised(lines, [("w0", quick, b"w"), ("w1", quick, b"w"), ("http", slow, b"h")],
                        before_run=wait_in_two_steps) as sv:
            lines.wait_for(r"^workers ready True$")
            pid = int(lines.wait_for(r"^quick running pid (\d+) restarted False$", seen_too=True).group(1))
            os.kill(pid, signal.SIGKILL)
            os.write(go_w, b"g")
            lines.wait_for(r"^http ready True$")
            lines.wait_for(r"WARNING: w[01] \(pid \d+\) died \(signal 9\); restarting")
            lines.wait_for(r"^quick running pid \d+ restarted True$")
            os.kill(sv.pid, signal.SIGTERM)
            assert sv.exit_code(DEADLINE) == 0
    finally:
        os.close(go_r)
        os.close(go_w)
