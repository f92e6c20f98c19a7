"""The supervisor: forks the broker's children, restarts the dead ones, and shuts everything down.

Theory of operation (after gunicorn's arbiter): nothing that could start a thread or an event loop runs here
before the children are forked, because fork only copies the calling thread. Signal handlers only record the
signal and wake the main loop through ``signal.set_wakeup_fd``; the loop reaps children with ``WNOHANG`` and
dispatches. SIGTERM/SIGINT: TERM to every child, wait up to ``shutdown_timeout``, KILL what is left, then run the
cleanup callbacks (segment unlinks).

Restarts: a child that dies is forked again with ``restarted=True`` so it re-attaches to the shared memory it left
behind. Crashes alone never stop the broker: its messages live in that shared memory, and giving up would lose
them all, where a child that crashes in a loop loses nothing more by being tried again. A crash loop is slowed
instead, with exponential back-off as systemd and gunicorn do: the first death within QUICK seconds of a start is
restarted at once, the next ones after BACKOFF_FIRST, then twice as long each time, at most BACKOFF_MAX; a child
that lived QUICK seconds starts the series again. A restart that is due later is a deadline of the main loop, not
a sleep: signals and other children's deaths are handled meanwhile, and a child waiting for its restart is simply
not running (a SIGTERM then has nothing to stop there). Every restart is logged with its delay, and counted
(``Child.restarts``, ``restart_counts``, the ``on_restart`` callback).

The broker stops by itself only when it cannot run at all, and logs why: a child said so (``EXIT_CANNOT_RUN``),
or fork failed FORK_ATTEMPTS times in a row for one child (with the same back-off between attempts).

Exit-code contract
    children    0 = clean stop (a child should only ever return at shutdown); EXIT_CANNOT_RUN (3) = a configuration
                or environment error that a restart cannot cure: the supervisor stops the broker; anything else,
                or death by a signal = a crash: restarted (with back-off) unless shutting down.
    supervisor  ``run`` returns 0 after SIGTERM/SIGINT, EXIT_CANNOT_RUN after a child's EXIT_CANNOT_RUN (an init
                system should not restart it either: systemd's ``RestartPreventExitStatus=3``), 1 when forking
                kept failing (resources may come back: restarting later can help).

Ready: every child writes one byte to the ready pipe when its set-up has succeeded, a byte that names its kind (a
worker writes b"w"); ``wait_ready`` returns once all have, or once those of the kinds asked for have, so that each
"listening" line is printed only when that listener's connections will really be served.
"""
import errno
import os
import select
import signal
import time

from nsqpy.process import die_with_parent, ignore_interrupt, wait_for_exits
from nsqpy.sdnotify import Notifier

EXIT_CANNOT_RUN = 3
QUICK = 1.0             # a death sooner than this after the start is a quick death (back-off grows)
BACKOFF_FIRST = 0.1     # the delay after the second quick death in a row (the first is restarted at once)
BACKOFF_MAX = 10.0
FORK_ATTEMPTS = 10      # consecutive failed forks of one child before the broker stops
POLL = 1.0              # the main loop's longest wait (signals and deaths wake it sooner)
PERIODIC = 0.25         # ... when there are periodic hooks


def backoff(failures, first=BACKOFF_FIRST, cap=BACKOFF_MAX):
    """Seconds before the next attempt after ``failures`` quick failures in a row: 0, first, 2 first, ... cap."""
    if failures <= 1:
        return 0.0
    return min(cap, first * 2.0 ** (failures - 2))


class Child:
    __slots__ = ("name", "target", "pid", "started", "quick_deaths", "restarts", "due", "fork_failures",
                 "stop_order", "restart_to_stop", "kind", "on_term")

    def __init__(self, name, target, stop_order=0, restart_to_stop=False, kind=None, on_term=None):
        self.name = name
        self.on_term = on_term  # called right after its SIGTERM at shutdown (e.g. to wake it from a timed wait)
        self.kind = kind  # the byte it writes to the ready pipe (None: not waited for by kind)
        self.stop_order = stop_order  # shutdown stops lower orders first and waits for them
        self.restart_to_stop = restart_to_stop  # waiting for its restart at shutdown: start it to stop it
        self.target = target  # target(restarted: bool, ready_fd: int) -> never returns normally
        self.pid = 0          # 0: not running (not started yet, or waiting for its restart)
        self.started = 0.0
        self.quick_deaths = 0
        self.restarts = 0
        self.due = None       # time.monotonic() at which a restart is due, while waiting for it
        self.fork_failures = 0


class Supervisor:
    def __init__(self, log, shutdown_timeout=10.0, backoff_first=BACKOFF_FIRST, backoff_max=BACKOFF_MAX,
                 notifier=None):
        self.log = log
        self.notifier = notifier or Notifier()  # systemd's: watchdog pings from the main loop, STOPPING=1
        self.children = []
        self.cleanups = []
        self.shutdown_timeout = shutdown_timeout
        self.backoff_first = backoff_first
        self.backoff_max = backoff_max
        self._stopping = False
        self._signals = []
        self._ready_r, self._ready_w = os.pipe()
        self._ready = {}        # start-up: {kind byte: children of that kind that reported ready}
        self._waited_kinds = set()  # the kinds a wait_ready by kind saw ready
        self.on_restart = None  # callback(child) after a restart (for stats)
        self.periodic = []      # callables run every loop turn, at most PERIODIC apart (nsqd.dat upkeep)
        self.clean_exit = True  # shutdown: every child exited 0 (none killed, none died with an error)

    def add(self, name, target, stop_order=0, restart_to_stop=False, kind=None, on_term=None):
        """``stop_order``: at shutdown, children are stopped in groups of ascending order, each group after the
        previous one exited (nsqd: what feeds the workers first, then the workers, then the scanner).
        ``restart_to_stop``: a child that is waiting for its restart when the shutdown begins is started then
        (nsqd's workers: their stop saves the messages they hold). ``kind``: the byte the child writes to the
        ready pipe, for ``wait_ready`` by kind. ``on_term``: called right after the child's SIGTERM at shutdown
        (nsqd's scanner: an eventfd write ends its timed wait, where its signal handler only sets a flag)."""
        self.children.append(Child(name, target, stop_order, restart_to_stop, kind, on_term))

    def restart_counts(self):
        """{child name: restarts so far}."""
        return {c.name: c.restarts for c in self.children}

    def _backoff(self, failures):
        return backoff(failures, self.backoff_first, self.backoff_max)

    # ---- forking ---------------------------------------------------------------------------------------
    def _spawn(self, child, restarted):
        """Fork the child; False (logged) when fork itself failed."""
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            child.fork_failures += 1
            self.log.error(f"{child.name}: cannot fork ({e}); attempt {child.fork_failures} of {FORK_ATTEMPTS}")
            return False
        if pid == 0:
            code = 1
            try:
                die_with_parent(parent)  # a SIGKILLed supervisor takes its children with it (nothing orphaned)
                os.close(self._ready_r)
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGTERM, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                ignore_interrupt()  # a terminal's ^C reaches the whole group: the supervisor TERMs its children
                os.environ.pop("NOTIFY_SOCKET", None)  # only the supervisor speaks to systemd (gunicorn would too)
                child.target(restarted, self._ready_w)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                import traceback
                self.log.error(f"{child.name} failed: {traceback.format_exc().strip()}")
            finally:
                os._exit(code)
        child.pid = pid
        child.started = time.monotonic()
        child.fork_failures = 0
        self.log.info(f"{child.name}: started (pid {pid})")
        return True

    def start(self):
        """Fork every child. One that could not be forked stays not running, and ``wait_ready`` reports it."""
        for child in self.children:
            self._spawn(child, False)

    def wait_ready(self, kinds=None, timeout=120.0):
        """Block until every child has reported ready once, or with ``kinds`` (bytes, one per kind) every child of
        those kinds; False on timeout or the death of a child waited for. Children of kinds an earlier call waited
        for are not watched again: clients may already be served by them, and ``run`` restarts one that dies."""
        waited = [c for c in self.children if c.kind is None or c.kind[0] not in self._waited_kinds]
        if kinds is not None:
            waited = [c for c in waited if c.kind is not None and c.kind[0] in kinds]
        for child in waited:
            if not child.pid:
                self.log.error(f"{child.name} could not be started")
                return False
        if kinds is None:
            need = {None: len(self.children)}  # every child's byte, whatever its kind
        else:
            need = {k: sum(c.kind[0] == k for c in waited) for k in kinds}
        deadline = time.monotonic() + timeout
        while not self._all_ready(need):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            r, _, _ = select.select([self._ready_r], [], [], min(left, 0.2))
            if r:
                for kind in os.read(self._ready_r, len(self.children)):
                    self._ready[kind] = self._ready.get(kind, 0) + 1
            for child in waited:
                pid, _ = self._waitpid(child.pid)
                if pid:
                    if not self.stop_requested:  # (a signal to the whole group may have stopped it first)
                        self.log.error(f"{child.name} exited during start-up")
                    return False
        self._waited_kinds.update(kinds or ())
        return True

    def _all_ready(self, need):
        """need: {kind: children} ({None: n} counts every byte)."""
        if None in need:
            return sum(self._ready.values()) >= need[None]
        return all(self._ready.get(k, 0) >= n for k, n in need.items())

    @staticmethod
    def _waitpid(pid):
        try:
            return os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return pid, 0

    # ---- main loop -------------------------------------------------------------------------------------
    def _on_signal(self, signum, frame):
        self._signals.append(signum)

    @property
    def stop_requested(self):
        """A SIGTERM/SIGINT arrived (and ``run`` has not acted on it yet): start-up gives way to a clean stop."""
        return self._stopping or any(s in (signal.SIGTERM, signal.SIGINT) for s in self._signals)

    def trap_stop_signals(self):
        """From now on SIGTERM/SIGINT are only recorded; ``run`` acts on them. Call it first thing: a stop that
        arrives while nsqd warms up or starts its children would otherwise kill this process alone (leaving
        orphaned children and shared memory behind). Children reset the handlers at fork."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def run(self):
        """Supervise until SIGTERM/SIGINT, or until the broker cannot run; returns the process exit code."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        for fd in (wake_r, self._ready_r):
            os.set_blocking(fd, False)
        code = 0
        wait = 0.0  # first look at once: a child may have died before SIGCHLD was handled here
        try:
            while not self._stopping:
                try:
                    select.select([wake_r, self._ready_r], [], [], wait)
                except InterruptedError:
                    pass
                for fd in (wake_r, self._ready_r):
                    try:
                        os.read(fd, 4096)
                    except BlockingIOError:
                        pass
                while self._signals:
                    sig = self._signals.pop(0)
                    if sig in (signal.SIGTERM, signal.SIGINT):
                        self.log.info(f"{signal.Signals(sig).name}: signal received, shutting down")
                        self._stopping = True
                if not self._stopping:
                    code = self._reap() or self._restart_due()
                    self._stopping = code != 0
                for fn in self.periodic:
                    fn()
                self.notifier.keepalive()
                wait = self.notifier.keepalive_wait(self._wait())
        finally:
            self.shutdown()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
        return code

    def _wait(self):
        """How long the loop may sleep: until the next restart is due, at most POLL."""
        longest = PERIODIC if self.periodic else POLL
        dues = [c.due for c in self.children if c.due is not None]
        return min(longest, max(0.0, min(dues) - time.monotonic())) if dues else longest

    def _reap(self):
        """Collect dead children and schedule their restarts; an exit code to stop with, or 0."""
        for child in self.children:
            if not child.pid:
                continue  # waiting for its restart (waitpid(0) would reap any child)
            pid, status = self._waitpid(child.pid)
            if not pid:
                continue
            dead, child.pid = child.pid, 0
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_CANNOT_RUN:
                self.log.fatal(f"{child.name} (pid {dead}) cannot run (exit code {EXIT_CANNOT_RUN}: a configuration "
                               f"or environment error, which restarting cannot cure); stopping the broker")
                return EXIT_CANNOT_RUN
            how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"exit code {os.waitstatus_to_exitcode(status)}")
            now = time.monotonic()
            child.quick_deaths = child.quick_deaths + 1 if now - child.started < QUICK else 0
            delay = self._backoff(child.quick_deaths)
            child.due = now + delay
            when = f"in {delay:.2f}s (quick death {child.quick_deaths} in a row)" if delay else "at once"
            self.log.warn(f"{child.name} (pid {dead}) died ({how}); restarting {when}")
        return 0

    def _restart_due(self):
        """Fork the children whose restart is due; an exit code to stop with, or 0."""
        now = time.monotonic()
        for child in self.children:
            if child.due is None or child.due > now:
                continue
            if self._spawn(child, True):
                child.due = None
                child.restarts += 1
                if self.on_restart is not None:
                    self.on_restart(child)
            elif child.fork_failures >= FORK_ATTEMPTS:
                self.log.fatal(f"{child.name}: fork failed {child.fork_failures} times in a row; the broker cannot "
                               f"run, stopping it")
                return 1
            else:
                child.due = now + self._backoff(child.fork_failures + 1)
        return 0

    def _stop_group(self, group, deadline):
        """TERM these children and reap them until the deadline; KILL what is left."""
        for child in group:
            try:
                os.kill(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            if child.on_term is not None:
                try:
                    child.on_term()
                except OSError as e:
                    self.log.error(f"{child.name}: could not wake it at stop: {e}")
        still = set(wait_for_exits([c.pid for c in group], deadline))  # each exit wakes it (no polling)
        alive = []
        for c in group:
            pid, status = (0, 0) if c.pid in still else self._waitpid(c.pid)
            if not pid:
                alive.append(c)
            elif status != 0 and not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM):
                self.clean_exit = False  # (a child without a SIGTERM handler dies of it: that is its stop)
                self.log.warn(f"{c.name} stopped with exit status {os.waitstatus_to_exitcode(status)}")
        if alive:
            self.clean_exit = False
        for child in alive:
            self.log.warn(f"{child.name} did not stop in time; killing it")
            try:
                os.kill(child.pid, signal.SIGKILL)
                os.waitpid(child.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def shutdown(self):
        self._stopping = True
        self.notifier.stopping("stopping: saving what the processes hold")
        for child in self.children:
            if not child.pid and child.due is not None and child.restart_to_stop:
                self._spawn(child, True)  # waiting for its restart: a worker must still save what it holds
            child.due = None
        if any(not c.pid and c.restart_to_stop for c in self.children):
            self.clean_exit = False  # one could not be forked: what it held is left for the next start
        t0 = time.monotonic()
        deadline = t0 + self.shutdown_timeout
        took = []  # (what, seconds) per step, for the line that says where the stop's time went
        for order in sorted({c.stop_order for c in self.children}):
            group = [c for c in self.children if c.stop_order == order and c.pid]
            t = time.monotonic()
            self._stop_group(group, deadline)
            if group:
                took.append((_names(group), time.monotonic() - t))
        for child in self.children:
            child.pid = 0
        t = time.monotonic()
        for fn in reversed(self.cleanups):
            try:
                fn()
            except OSError as e:
                if e.errno != errno.ENOENT:
                    self.log.error(f"cleanup failed: {e}")
        if self.cleanups:
            took.append(("cleanups", time.monotonic() - t))
        self.cleanups.clear()
        if took:
            self.log.info(f"stopped in {time.monotonic() - t0:.3f}s: "
                          + ", ".join(f"{what} {s:.3f}s" for what, s in took))


def _names(group):
    """The children of a stop group as the stop's line names them: 'acceptor+http', 'worker 0..3'."""
    names = [c.name for c in group]
    return "+".join(names) if len(names) <= 3 else f"{names[0]}..{names[-1].rpartition(' ')[2]}"
