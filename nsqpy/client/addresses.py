"""`host:port` text -> (host, port), as NSQ's flags and both client libraries accept it."""

from __future__ import annotations

__all__ = ["parse_address"]


def parse_address(address) -> tuple[str, int]:
    if isinstance(address, tuple):
        return address[0], int(address[1])
    host, sep, port = str(address).rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected <host>:<port>, got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
