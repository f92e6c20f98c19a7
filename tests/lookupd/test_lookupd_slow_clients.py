"""nsqlookupd's HTTP API is not blocked by clients that send their requests slowly (gunicorn's asgi worker with a
bound on header time, http_api/asgi_worker.py): with 2 and then 500 connections sending headers at one byte a
second, fresh /pings are all answered, and a request whose headers take longer than HEADER_TIMEOUT loses its
connection. Consumers that discover nodes through /lookup depend on this."""
from __future__ import annotations

import socket
import time

from lookupd_wire import eventually
from nsqpy.http_api.asgi_worker import HEADER_TIMEOUT
from tests.slow_clients import SlowClients, closed_by_server, ping

PINGS = 20


def answered(address, n=PINGS):
    return [ping(address) for _ in range(n)]


def test_slow_clients_do_not_block_ping(lookupd_factory):
    lk = lookupd_factory("--http-workers=2")
    with SlowClients(lk.http_address, 2) as slow:
        assert answered(lk.http_address) == [(200, b"OK")] * PINGS
    with SlowClients(lk.http_address, 500) as slow:
        got = answered(lk.http_address)
        print(f"/ping answered {sum(g == (200, b'OK') for g in got)} of {PINGS} during 500 slow clients")
        assert got == [(200, b"OK")] * PINGS
        assert lk.lookup("none") is None   # 404 TOPIC_NOT_FOUND from the registry, beside them
    assert lk.request("GET", "/info")[0] == 200


def test_headers_slower_than_the_bound_lose_the_connection(lookupd_factory):
    """A request whose headers trickle, and a connection that sends nothing, are closed once HEADER_TIMEOUT has
    passed (not before), with no reply; a prompt request beside them is answered."""
    lk = lookupd_factory()
    silent = socket.create_connection(lk.http_address, timeout=30)
    with SlowClients(lk.http_address, 1) as slow:
        start = time.monotonic()
        eventually(lambda: slow.closed_by_server() == 1 and closed_by_server(silent), timeout=HEADER_TIMEOUT + 60,
                   what="slow and silent clients closed", pause=0.1)
        assert time.monotonic() - start >= HEADER_TIMEOUT - 1  # not before the bound (1 s: this side's timing)
        assert slow.socks[0].recv(100) == b"" and silent.recv(100) == b""  # no reply: no request was read
    silent.close()
    assert ping(lk.http_address) == (200, b"OK")


def test_help_names_the_header_bound_and_the_exposed_worker_classes():
    from nsqpy.config.nsqd import NsqdOptions
    from nsqpy.config.nsqlookupd import NsqlookupdOptions

    def help_of(cls, name):
        return cls.__dataclass_fields__[name].metadata["option"][1]
    bound = f"within {HEADER_TIMEOUT:g} s"
    assert bound in help_of(NsqlookupdOptions, "http_workers")
    nsqd = help_of(NsqdOptions, "http_worker_class")
    assert bound in nsqd and "sync and gthread are exposed to slow clients" in nsqd
