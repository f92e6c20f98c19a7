"""A real server process on a pseudo-terminal that is its controlling terminal, as in an operator's shell: its
process group is the terminal's foreground group, so ``interrupt`` (^C typed into the terminal) sends SIGINT to
that whole group, the daemon's children included, as the terminal's line discipline does."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading

from tests.logged_process import LoggedProcess

# the child's first act: a session of its own whose controlling terminal is the pty on its stdin, then the command
_ADOPT_TERMINAL = ("import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                   "os.execv(sys.argv[1], sys.argv[1:])")


class TerminalProcess(LoggedProcess):
    name = "process on a terminal"

    def __init__(self, module, args):  # noqa: D107  (LoggedProcess's interface, on a pty)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._master, slave = os.openpty()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _ADOPT_TERMINAL, sys.executable, "-m", module, *args],
                                         stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        finally:
            os.close(slave)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        pending = b""
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError as e:  # EIO: every holder of the terminal's other side has closed it
                if e.errno != errno.EIO:
                    raise
                data = b""
            if not data:
                break
            pending += data
            *whole, pending = pending.split(b"\n")
            with self._cond:
                self.lines.extend(line.decode(errors="replace").rstrip("\r") for line in whole)
                self._cond.notify_all()
        with self._cond:
            if pending:
                self.lines.append(pending.decode(errors="replace"))
            self._cond.notify_all()
        os.close(self._master)

    def interrupt(self):
        """Type ^C into the terminal."""
        os.write(self._master, b"\x03")
