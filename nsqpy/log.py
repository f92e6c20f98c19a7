"""NSQ's log line format, so that tools and test harnesses that parse nsqd's output keep working.

    [nsqd] 2026/11/21 21:23:38.921369 INFO: TCP: listening on 127.0.0.1:4150

The prefix is the daemon's ``--log-prefix``; the level word follows NSQ's ``lg`` package (WARN prints as
``WARNING``). Lines go to stderr, like Go's default logger, and each is written with one ``write`` call so lines of
the broker's processes never interleave mid-line.
"""
import os
import sys
import time

LEVELS = {"debug": 1, "info": 2, "warn": 3, "warning": 3, "error": 4, "fatal": 5}
_WORDS = {1: "DEBUG", 2: "INFO", 3: "WARNING", 4: "ERROR", 5: "FATAL"}


class Logger:
    def __init__(self, prefix="[nsqd] ", level="info", stream=None):
        self.prefix = prefix
        self.level = LEVELS[level.lower()]
        self._fd = (stream or sys.stderr).fileno()

    def log(self, level, msg):
        if level < self.level:
            return
        now = time.time()
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now))
        line = f"{self.prefix}{stamp}.{int(now % 1 * 1e6):06d} {_WORDS[level]}: {msg}\n"
        try:
            os.write(self._fd, line.encode())
        except OSError:
            pass  # a closed stderr must never take the broker down

    def debug(self, msg):
        self.log(1, msg)

    def info(self, msg):
        self.log(2, msg)

    def warn(self, msg):
        self.log(3, msg)

    def error(self, msg):
        self.log(4, msg)

    def fatal(self, msg):
        self.log(5, msg)
