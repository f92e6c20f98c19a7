"""nsqd's HTTP API on its default worker class (asgi: gunicorn's asgi worker with a bound on header time,
http_api/asgi_worker.py) against clients that send their requests slowly: fresh /pings are answered beside 500
of them, and a request whose headers take longer than HEADER_TIMEOUT (or a connection that sends nothing) loses
its connection, with no reply. The sync and gthread classes are exposed to such clients (nsqd --help says so)."""
from __future__ import annotations

import socket
import time

from nsqpy.http_api.asgi_worker import HEADER_TIMEOUT
from tests.polling import wait_until
from tests.slow_clients import SlowClients, closed_by_server, ping

PINGS = 20


def test_slow_clients_neither_block_nor_stay(nsqd_factory):
    addr = nsqd_factory().http_address
    with SlowClients(addr, 500):
        assert [ping(addr) for _ in range(PINGS)] == [(200, b"OK")] * PINGS
    silent = socket.create_connection(addr, timeout=30)
    with SlowClients(addr, 1) as slow:
        start = time.monotonic()
        wait_until(lambda: slow.closed_by_server() == 1 and closed_by_server(silent), HEADER_TIMEOUT + 60,
                   "slow and silent clients closed", 0.1)
        assert time.monotonic() - start >= HEADER_TIMEOUT - 1  # not before the bound (1 s: this side's timing)
        assert slow.socks[0].recv(100) == b"" and silent.recv(100) == b""
    silent.close()
    assert ping(addr) == (200, b"OK")
