"""Child processes of the benchmark tools: servers that announce themselves with NSQ's listening line, and the
tools themselves run as subprocesses that print one JSON line.

A server (nsqd, nsqpy's broker, or a stand-in) is ready once it has logged `TCP: listening on HOST:PORT`; with
`--tcp-address=...:0` that line is also the only way to learn the port. `ListeningProcess` reads the child's
stderr until that line or a deadline, never sleeping, then drains both pipes in background threads so a chatty
child can never block on a full pipe.
"""

from __future__ import annotations

import collections
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time

from benchmarks.common import BenchError, log

LISTENING = re.compile(rb"TCP: listening on (\S+):(\d+)")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ListeningProcess:
    """Start `argv`, wait (up to `ready_timeout` s) for its TCP listening line; `stop()` sends SIGTERM and waits
    `stop_timeout` s for a clean exit (a broker with thousands of topics needs longer than the default) before it
    SIGKILLs the child's whole process group (started as a session of its own: no worker outlives it)."""

    def __init__(self, argv: list[str], ready_timeout: float = 60.0, cwd: str = REPO, stop_timeout: float = 15.0):
        self.argv = argv
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.address: tuple[str, int] | None = None
        self.stderr_tail: collections.deque = collections.deque(maxlen=200)
        self._stdout: list[bytes] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> "ListeningProcess":
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        fd = self.proc.stderr.fileno()
        deadline = time.monotonic() + self.ready_timeout
        pending = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while self.address is None:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self._fail(f"no listening line within {self.ready_timeout:.0f}s")
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._fail(f"exited with {self.proc.wait()} before listening")
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self.stderr_tail.append(line)
                    match = LISTENING.search(line)
                    if match and self.address is None:
                        self.address = (match.group(1).decode(), int(match.group(2)))
        self._drain(self.proc.stderr, self.stderr_tail.append)
        self._drain(self.proc.stdout, self._stdout.append)
        return self

    def _drain(self, pipe, sink) -> None:
        def pump():
            for line in pipe:
                sink(line.rstrip(b"\n"))
        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def _fail(self, why: str) -> None:
        self._kill()
        tail = b"\n".join(self.stderr_tail).decode(errors="replace")[-2000:]
        raise BenchError(f"{' '.join(self.argv)}: {why}\n{tail}")

    @property
    def address_text(self) -> str:
        return "%s:%d" % self.address

    def stop(self, timeout: float | None = None) -> int:
        """SIGTERM, wait (SIGKILL of the process group after `timeout`, default `stop_timeout`), and collect the
        output. Returns the exit code."""
        timeout = self.stop_timeout if timeout is None else timeout
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{self.argv[0]}: no clean exit within {timeout:.0f}s: SIGKILL")
                self._kill()
        for thread in self._threads:
            thread.join(timeout)
        return self.proc.returncode

    def json_result(self) -> dict:
        """The last JSON line the child printed on stdout (after `stop()`)."""
        return last_json(self._stdout)

    def __enter__(self) -> "ListeningProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def last_json(lines) -> dict:
    for line in reversed(lines):
        line = line.strip()
        if line.startswith(b"{" if isinstance(line, bytes) else "{"):
            return json.loads(line)
    raise BenchError("no JSON result line on stdout")


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_tool(module: str, *args: str, timeout: float = 600.0) -> tuple[int, dict]:
    """Run one benchmark tool to completion; (exit code, its JSON result)."""
    try:
        done = subprocess.run(python_module(module, *args), cwd=REPO, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{module} {' '.join(args)}: still running after {timeout:.0f}s") from None
    sys.stderr.write(done.stderr.decode(errors="replace"))
    if done.returncode not in (0, 1):
        raise BenchError(f"{module} {' '.join(args)}: exit code {done.returncode}")
    return done.returncode, last_json(done.stdout.splitlines())
