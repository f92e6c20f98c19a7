"""A stand-in for systemd's end of the notify protocol: an AF_UNIX datagram socket whose path goes into a daemon's
$NOTIFY_SOCKET, read with deadlines (each datagram with the time it arrived)."""
from __future__ import annotations

import socket
import time


class NotifySocket:
    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.received: list[tuple[float, dict]] = []   # (time.monotonic(), {KEY: value}) per datagram

    def close(self):
        self.sock.close()

    def next(self, timeout):
        """The next datagram as {KEY: value}; AssertionError if none arrives within ``timeout`` seconds."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"no notification within {timeout} s; so far: {self.received}") from None
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        self.received.append((time.monotonic(), fields))
        return fields

    def drain(self):
        """Read what has arrived already (so that the next reads' times are the times of sending)."""
        while True:
            self.sock.settimeout(0)
            try:
                self.sock.recv(65536)
            except BlockingIOError:
                return

    def wait_for(self, key, timeout):
        """Read until a datagram carries ``key``; returns that datagram's fields."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.next(max(0.001, deadline - time.monotonic()))
            if key in fields:
                return fields
