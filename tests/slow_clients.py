"""Clients that send their HTTP request slowly: each connection sends the start of a request's headers, then one
more byte a second and never the end of them (as a slow-loris client does), and fresh requests beside them.

    with SlowClients(address, 500) as slow:
        assert ping(address) == (200, b"OK")
    slow.closed_by_server()   # how many the server has closed so far
"""
from __future__ import annotations

import http.client
import select
import socket
import threading

__all__ = ["SlowClients", "ping", "closed_by_server"]

START = b"GET /ping HTTP/1.1\r\nHost: slow\r\nX-Slow: "


def closed_by_server(sock) -> bool:
    """The server closed (or reset) this connection and sent nothing: EOF is what is readable now."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""  # readable: EOF, or a reply (not closed: it answered)
    except OSError:
        return True   # reset


class SlowClients:
    def __init__(self, address, count, interval=1.0):
        self.socks = []
        self.interval = interval
        self._stop = threading.Event()
        try:
            for _ in range(count):
                sock = socket.create_connection(address, timeout=30)
                sock.sendall(START)
                self.socks.append(sock)
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self):
        while not self._stop.wait(self.interval):  # the pace of a slow client, not synchronisation
            for sock in self.socks:
                try:
                    sock.send(b"a", socket.MSG_DONTWAIT)
                except OSError:
                    pass  # closed by the server (what the header bound does): counted by closed_by_server

    def closed_by_server(self) -> int:
        return sum(closed_by_server(s) for s in self.socks)

    def close(self):
        self._stop.set()
        thread = getattr(self, "_thread", None)
        if thread is not None:
            thread.join(30)
        for sock in self.socks:
            sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def ping(address, timeout=10.0):
    """A fresh connection's GET /ping: (status, body), or (None, the error) when it is not answered in time."""
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        conn.request("GET", "/ping")
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError as e:
        return None, repr(e)
    finally:
        conn.close()
