"""A command's TCP listeners, bound by its supervisor before it forks (nsqlookupd's TCP and HTTP, nsqadmin's
HTTP), and an address as NSQ's listening lines show it."""
from __future__ import annotations

import socket

from nsqpy.preflight import listen_error

__all__ = ["LISTEN_BACKLOG", "bind_listener", "bind_or_say", "shown_address"]

LISTEN_BACKLOG = 1024  # connections the kernel queues before they are accepted


def bind_listener(address: str, listen: bool = True) -> socket.socket:
    """A listening socket on ``host:port`` (``[v6]:port``; an empty host is every IPv4 address). OSError when
    it cannot bind, ValueError when the port is not a number. ``listen=False``: bound only (the port is taken and
    port 0 resolved, but a connection is refused until the caller calls ``listen(LISTEN_BACKLOG)``)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        if listen:
            sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def shown_address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_or_say(flag: str, address: str, log) -> socket.socket | None:
    """``bind_listener``, or None after one FATAL line saying which flag's address could not be bound and why."""
    try:
        return bind_listener(address)
    except OSError as e:
        log.fatal(listen_error(flag, address, e))
    except ValueError:
        log.fatal(f"{flag}={address}: the port is not a number")
    return None
