"""A real server process started by a test: its output collected by a reader thread, so that tests wait on log
lines with a deadline (``wait_for_line``, never a sleep), and a SIGTERM stop with a deadline (then SIGKILL of its
whole process group and an AssertionError with its output)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time


class LoggedProcess:
    name = "process"

    def __init__(self, module, args):
        self.lines: list[str] = []
        self._cond = threading.Condition()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            with self._cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for_line(self, pattern, timeout=10.0, start=0):
        pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    m = pattern.search(self.lines[i])
                    if m:
                        return m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no line matching {pattern.pattern!r}; output:\n" + "\n".join(self.lines))
                self._cond.wait(left)

    def output(self):
        with self._cond:
            return "\n".join(self.lines)

    def child_pids(self):
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]

    @contextlib.contextmanager
    def starting(self):
        """Around a subclass's waits for its start-up lines: a start that fails stops the process (no fixture
        holds it yet, so nothing else would: it would outlive the test), then the failure goes on."""
        try:
            yield
        except BaseException:
            try:
                self.stop()
            except AssertionError:
                pass  # it did not stop within the deadline and was killed: the start's failure is the one to report
            raise

    def stop(self, timeout=30.0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"{self.name} did not stop within its deadline:\n" + self.output())
        self._reader.join(5)
        return code


def running(pid):
    """The process exists and is not a zombie (a zombie holds no port and no mapping any more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def group_pids(pgid):
    """The processes of process group ``pgid`` (zombies included)."""
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]
