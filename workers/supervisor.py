"""The supervisor: forks the broker's children, restarts the dead ones, and shuts everything down.

Theory of operation (after gunicorn's arbiter): nothing that could start a thread or an event loop runs here
before the children are forked, because fork only copies the calling thread. Signal handlers only record the
signal and wake the main loop through ``signal.set_wakeup_fd``; the loop reaps children with ``WNOHANG`` and
dispatches. A child that dies is forked again at once with ``restarted=True`` so it re-attaches to the shared
memory it left behind; a child that keeps dying within a second of its start (``MAX_QUICK_DEATHS`` in a row)
is a restart storm and stops the broker with exit code 1 rather than spinning. SIGTERM/SIGINT: TERM to every
child, wait up to ``shutdown_timeout``, KILL what is left, then run the cleanup callbacks (segment unlinks).

Exit-code contract for children: 0 = clean stop (not restarted during shutdown), anything else or a signal =
crash (restarted unless shutting down).

Ready: every child writes one byte to the ready pipe when its set-up has succeeded; ``wait_ready`` returns once
all have, so "listening" lines are printed only when connections will really be served.
"""
import errno
import os
import select
import signal
import time

MAX_QUICK_DEATHS = 5
QUICK = 1.0


class Child:
    __slots__ = ("name", "target", "pid", "started", "quick_deaths", "restarts")

    def __init__(self, name, target):
        self.name = name
        self.target = target  # target(restarted: bool, ready_fd: int) -> never returns normally
        self.pid = 0
        self.started = 0.0
        self.quick_deaths = 0
        self.restarts = 0


class Supervisor:
    def __init__(self, log, shutdown_timeout=10.0):
        self.log = log
        self.children = []
        self.cleanups = []
        self.shutdown_timeout = shutdown_timeout
        self._stopping = False
        self._signals = []
        self._ready_r, self._ready_w = os.pipe()
        self.on_restart = None  # callback(child) after a restart (for stats)

    def add(self, name, target):
        self.children.append(Child(name, target))

    # ---- forking ---------------------------------------------------------------------------------------
    def _spawn(self, child, restarted):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(self._ready_r)
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
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
        self.log.info(f"{child.name}: started (pid {pid})")

    def start(self):
        for child in self.children:
            self._spawn(child, False)

    def wait_ready(self, timeout=120.0):
        """Block until every child has reported ready once; False on timeout or a child death."""
        need = len(self.children)
        deadline = time.monotonic() + timeout
        while need > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            r, _, _ = select.select([self._ready_r], [], [], min(left, 0.2))
            if r:
                need -= len(os.read(self._ready_r, need))
            for child in self.children:
                pid, _ = self._waitpid(child.pid)
                if pid:
                    self.log.error(f"{child.name} exited during start-up")
                    return False
        return True

    @staticmethod
    def _waitpid(pid):
        try:
            return os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return pid, 0

    # ---- main loop -------------------------------------------------------------------------------------
    def _on_signal(self, signum, frame):
        self._signals.append(signum)

    def trap_stop_signals(self):
        """From now on SIGTERM/SIGINT are only recorded; ``run`` acts on them. Call it first thing: a stop that
        arrives while nsqd warms up or starts its children would otherwise kill this process alone (leaving
        orphaned children and shared memory behind). Children reset the handlers at fork."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def run(self):
        """Supervise until SIGTERM/SIGINT; returns the process exit code."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        code = 0
        try:
            while not self._stopping:
                try:
                    select.select([wake_r, self._ready_r], [], [], 1.0)
                except InterruptedError:
                    pass
                for fd in (wake_r, self._ready_r):
                    try:
                        os.set_blocking(fd, False)
                        os.read(fd, 4096)
                    except BlockingIOError:
                        pass
                while self._signals:
                    sig = self._signals.pop(0)
                    if sig in (signal.SIGTERM, signal.SIGINT):
                        self.log.info(f"{signal.Signals(sig).name}: signal received, shutting down")
                        self._stopping = True
                if not self._stopping and not self._reap_and_restart():
                    code = 1
                    self._stopping = True
        finally:
            self.shutdown()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
        return code

    def _reap_and_restart(self):
        for child in self.children:
            pid, status = self._waitpid(child.pid)
            if not pid:
                continue
            how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"exit code {os.waitstatus_to_exitcode(status)}")
            alive_for = time.monotonic() - child.started
            child.quick_deaths = child.quick_deaths + 1 if alive_for < QUICK else 0
            if child.quick_deaths >= MAX_QUICK_DEATHS:
                self.log.fatal(f"{child.name} keeps dying ({how}); giving up")
                return False
            self.log.warn(f"{child.name} (pid {child.pid}) died ({how}); restarting")
            child.restarts += 1
            self._spawn(child, True)
            if self.on_restart is not None:
                self.on_restart(child)
        return True

    def shutdown(self):
        self._stopping = True
        for child in self.children:
            if child.pid:
                try:
                    os.kill(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + self.shutdown_timeout
        alive = [c for c in self.children if c.pid]
        while alive and time.monotonic() < deadline:
            alive = [c for c in alive if not self._waitpid(c.pid)[0]]
            if alive:
                time.sleep(0.01)  # polling reaped children at shutdown; no event to wait on
        for child in alive:
            self.log.warn(f"{child.name} did not stop in time; killing it")
            try:
                os.kill(child.pid, signal.SIGKILL)
                os.waitpid(child.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        for child in self.children:
            child.pid = 0
        for fn in reversed(self.cleanups):
            try:
                fn()
            except OSError as e:
                if e.errno != errno.ENOENT:
                    self.log.error(f"cleanup failed: {e}")
        self.cleanups.clear()
