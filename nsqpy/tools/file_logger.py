"""One topic's rolling output file for nsq_to_file: naming, rotation, gzip, sync, and the move from the work
directory to the output directory when a file is closed.

A file is opened on the first message (so no empty files appear) in `--work-dir`, and rotated when its size
passes `--rotate-size`, when it has been open for `--rotate-interval`, or when the `<DATETIME>` part of its name
changes (hourly with the default `--datetime-format`). With `<REV>` in the format, a name already taken in the
work or output directory gets the next revision (`-1`, `-2`, ...); without it, the file is appended to.
"""

from __future__ import annotations

import gzip
import os
import socket
import time
import zlib

__all__ = ["FileLogger", "host_identifier"]


def host_identifier(template: str) -> str:
    hostname = socket.gethostname()
    if not template:
        return hostname.split(".")[0]
    return template.replace("<SHORT_HOST>", hostname.split(".")[0]).replace("<HOSTNAME>", hostname)


class FileLogger:
    def __init__(self, topic: str, opts):
        self.topic = topic
        self.opts = opts
        self.host = host_identifier(opts.host_identifier)
        self.name: str | None = None
        self._raw = None
        self._out = None
        self._datetime = ""
        self._opened_at = 0.0
        self._size = 0
        self.files_closed: list[str] = []

    def _format(self, rev: int, stamp: str) -> str:
        name = (self.opts.filename_format.replace("<TOPIC>", self.topic).replace("<HOST>", self.host)
                .replace("<PID>", str(os.getpid())).replace("<DATETIME>", stamp)
                .replace("<REV>", f"-{rev}" if rev else ""))
        if self.opts.gzip and not name.endswith(".gz"):
            name += ".gz"
        return name

    def _open(self, stamp: str) -> None:
        work, output = self.opts.work_dir or self.opts.output_dir, self.opts.output_dir
        os.makedirs(work, exist_ok=True)
        os.makedirs(output, exist_ok=True)
        rev = 0
        while True:
            name = self._format(rev, stamp)
            taken = os.path.exists(os.path.join(work, name)) or os.path.exists(os.path.join(output, name))
            if not taken or "<REV>" not in self.opts.filename_format:
                break
            rev += 1
        self.name = name
        self._raw = open(os.path.join(work, name), "ab")
        self._out = (gzip.GzipFile(fileobj=self._raw, mode="ab", compresslevel=self.opts.gzip_level)
                     if self.opts.gzip else self._raw)
        self._datetime = stamp
        self._opened_at = time.monotonic()
        self._size = 0

    def write(self, body: bytes) -> None:
        stamp = time.strftime(self.opts.datetime_format, time.gmtime() if self.opts.utc else time.localtime())
        if self._out is not None and self._needs_rotation(stamp):
            self.close()
        if self._out is None:
            self._open(stamp)
        self._out.write(body + b"\n")
        self._size += len(body) + 1

    def _needs_rotation(self, stamp: str) -> bool:
        o = self.opts
        return (stamp != self._datetime or (o.rotate_size and self._size >= o.rotate_size)
                or (o.rotate_interval and time.monotonic() - self._opened_at >= o.rotate_interval))

    def sync(self) -> None:
        if self._out is None:
            return
        if self.opts.gzip:
            self._out.flush(zlib.Z_SYNC_FLUSH)
        self._raw.flush()
        os.fsync(self._raw.fileno())

    def close(self) -> None:
        if self._out is None:
            return
        if self.opts.gzip:
            self._out.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        self._out = self._raw = None
        work = self.opts.work_dir or self.opts.output_dir
        if os.path.abspath(work) != os.path.abspath(self.opts.output_dir):
            os.replace(os.path.join(work, self.name), os.path.join(self.opts.output_dir, self.name))
        self.files_closed.append(self.name)
