"""Real brokers for the HTTP tests (tests/broker/conftest.py's helpers: port 0, ready lines, clean stops), and a
small HTTP client that keeps to what the tests check: status, lower-cased headers, body."""
from __future__ import annotations

import http.client
import socket
import threading

import pytest

from tests.broker.conftest import module_nsqd_factory, nsqd_factory  # noqa: F401 (fixtures)

HTTP_TIMEOUT = 60.0  # a loaded 2-core machine; no test relies on this being short
BIG = 256 << 10      # bodies past this are sent while the reply is read (the server may answer 413 early)


@pytest.fixture(scope="module", params=["sync", "gthread", "asgi"])
def http_nsqd(module_nsqd_factory, request):  # noqa: F811
    """One broker with two workers and the HTTP API, shared by a test module: once per gunicorn worker class."""
    return module_nsqd_factory(f"--http-worker-class={request.param}")


class Http:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, address, timeout=HTTP_TIMEOUT):
        self.conn = http.client.HTTPConnection(address[0], address[1], timeout=timeout)

    def request(self, method, path, body=b"", headers=None):
        if len(body) > BIG:
            return big_request(self.conn.host, self.conn.port, method, path, body)
        self.conn.request(method, path, body=body, headers=headers or {})
        r = self.conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()

    def close(self):
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def request(address, method, path, body=b"", headers=None):
    with Http(address) as h:
        return h.request(method, path, body, headers)


def big_request(host, port, method, path, body):
    """A request whose body the server may refuse before reading it all: the body is sent from a thread (its
    errors ignored: the server closes after answering) while the reply is read here."""
    sock = socket.create_connection((host, port), timeout=HTTP_TIMEOUT)
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n".encode()

    def send():
        try:
            sock.sendall(head + body)
        except OSError:
            pass

    t = threading.Thread(target=send, daemon=True)
    t.start()
    try:
        r = http.client.HTTPResponse(sock, method=method)
        r.begin()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # stops the sender if it is still blocked in sendall
        except OSError:
            pass
        t.join()
        sock.close()
