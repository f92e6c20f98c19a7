"""systemd's service notifications (sd_notify(3)): one datagram of ``KEY=value`` lines to ``$NOTIFY_SOCKET``.

A unit with ``Type=notify`` counts the daemon as started only when it sends ``READY=1``, shows its ``STATUS=`` line
in ``systemctl status``, knows a stop has begun from ``STOPPING=1``, and with ``WatchdogSec=`` kills and restarts
a daemon that sends no ``WATCHDOG=1`` for that long (``$WATCHDOG_USEC``; a daemon pings at half of it).

The entry point builds one ``Notifier`` from its environment (``Notifier.from_environ(os.environ)``) and passes it
down; without ``$NOTIFY_SOCKET`` (not under systemd) every call does nothing. Only the main process may notify
(systemd's default ``NotifyAccess=main``): the supervisor does, never a child.

    notifier = Notifier.from_environ(os.environ)
    notifier.status("warming up")
    ...                                          # every port bound, every child up
    notifier.ready("serving TCP on 0.0.0.0:4150")
    while running: notifier.keepalive()          # at least every notifier.keepalive_wait() seconds
    notifier.stopping("saving messages")

Error handling: a notification that cannot be sent (the socket gone, a full queue) is dropped; the daemon runs on,
as with libsystemd's sd_notify.
"""
from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self, address: str | None = None, watchdog_s: float | None = None):
        """``address``: $NOTIFY_SOCKET's value (``@name`` for the abstract namespace), None for no notifications;
        ``watchdog_s``: systemd's watchdog timeout in seconds, or None."""
        self.address = "\0" + address[1:] if address and address.startswith("@") else address
        self.watchdog_s = watchdog_s if address else None
        self._next_ping = time.monotonic()

    @classmethod
    def from_environ(cls, environ) -> Notifier:
        """From $NOTIFY_SOCKET and $WATCHDOG_USEC (honoured only when $WATCHDOG_PID, if set, is this process)."""
        address = environ.get("NOTIFY_SOCKET") or None
        watchdog_s = None
        pid = environ.get("WATCHDOG_PID")
        if environ.get("WATCHDOG_USEC", "").isdigit() and (not pid or pid == str(os.getpid())):
            watchdog_s = int(environ["WATCHDOG_USEC"]) / 1e6 or None
        return cls(address, watchdog_s)

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *lines: str) -> bool:
        """One datagram of these lines; False when there is no socket or it could not be sent."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(lines).encode(), self.address)
        except OSError:
            return False
        return True

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def ready(self, status: str | None = None) -> bool:
        """Start-up is complete: every port accepts connections and every child is up."""
        self._next_ping = time.monotonic() + (self.watchdog_s or 0) / 2
        return self.send("READY=1", *([f"STATUS={status}"] if status else []), f"MAINPID={os.getpid()}")

    def stopping(self, status: str | None = None) -> bool:
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def keepalive(self) -> None:
        """Ping the watchdog if half of its timeout passed since the last ping (call it from the main loop)."""
        if self.watchdog_s is None:
            return
        now = time.monotonic()
        if now >= self._next_ping:
            self.send("WATCHDOG=1")
            self._next_ping = now + self.watchdog_s / 2

    def keepalive_wait(self, longest: float) -> float:
        """How long the main loop may wait before its next ``keepalive``: at most ``longest``."""
        if self.watchdog_s is None:
            return longest
        return max(0.0, min(longest, self._next_ping - time.monotonic()))
