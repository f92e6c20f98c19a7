"""HTTP requests from nsqadmin to nsqd and nsqlookupd, with NSQ's V1 conventions and Go's error texts.

    client = Upstream(connect_timeout=2.0, request_timeout=5.0, tls=ssl_context_or_None)
    doc = client.get_json("http://127.0.0.1:4161/nodes")     # raises UpstreamError
    client.post("http://127.0.0.1:4151/topic/pause?topic=t")
    results = client.fan_out(fetch, items)                    # [(item, value or UpstreamError)], in parallel

Error texts are the ones Go's nsqadmin puts in its ``message`` warnings and 502 replies, so an operator sees the
same sentence from both: ``Get "http://h:p/stats?format=json": dial tcp h:p: connect: connection refused`` and
``got response 404 Not Found "{\\"message\\":\\"TOPIC_NOT_FOUND\\"}"``. A 403 naming an ``https_port`` (nsqd with
``--tls-required``) is retried once over HTTPS on that port, as Go's client does.

Resource handling: ``request_timeout`` bounds each whole request (connect, send, headers and body), as Go's
Client.Timeout does; one connection per request (the nodes are few and the requests small; no pool to go stale
when a node restarts); the fan-out runs on one bounded thread pool per client, so a page over 100 nodes makes at
most ``MAX_PARALLEL`` requests at once.
"""
from __future__ import annotations

import http.client
import io
import json
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

__all__ = ["Upstream", "UpstreamError", "go_quote", "tls_context"]

MAX_PARALLEL = 32
MAX_BODY = 64 << 20     # a /stats of many topics and clients is megabytes; more than this is not an nsqd


class UpstreamError(Exception):
    """One failed request, its text as Go's http client and nsqadmin would say it."""


def go_quote(body: bytes) -> str:
    """Go's %q of a byte string: double quotes, backslash escapes (close enough for ASCII JSON bodies)."""
    return json.dumps(body.decode("utf-8", "replace"), ensure_ascii=False)


def tls_context(insecure_skip_verify=False, root_ca_file="", cert="", key="") -> ssl.SSLContext:
    """The client TLS settings of nsqadmin's --http-client-tls-* flags; raises OSError/ssl.SSLError like Go's
    start-up checks (the caller turns them into one line)."""
    ctx = ssl.create_default_context(cafile=root_ca_file or None)
    if insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


_REASONS = http.client.responses


def _dial_text(host, port, err) -> str:
    if isinstance(err, ConnectionRefusedError):
        why = "connect: connection refused"
    elif isinstance(err, (socket.timeout, TimeoutError)):
        why = "i/o timeout"
    elif isinstance(err, socket.gaierror):
        why = f"lookup {host}: {err.strerror or err}"
    else:
        why = f"connect: {getattr(err, 'strerror', None) or err}"
    return f"dial tcp {host}:{port}: {why}"


class _DeadlineSocket:
    """What http.client needs of a socket (sendall, makefile), every call bounded by one deadline for the whole
    request (Go's Client.Timeout), so a node that answers a byte at a time cannot hold a page for longer."""

    def __init__(self, sock, deadline: float):
        self.sock = sock
        self.deadline = deadline

    def _arm(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("request deadline")
        self.sock.settimeout(left)

    def sendall(self, data):
        self._arm()
        self.sock.sendall(data)

    def makefile(self, mode="rb", *args, **kwargs):
        return io.BufferedReader(_DeadlineReader(self))

    def close(self):
        """A no-op: http.client closes its connection's socket as soon as the headers say the server closes (an
        HTTP/1.0 reply, ``Connection: close``), before the body is read through ``makefile``'s reader, which a
        real socket keeps open for. ``Upstream._request`` closes the socket once the body is in."""


class _DeadlineReader(io.RawIOBase):
    def __init__(self, owner: _DeadlineSocket):
        super().__init__()
        self.owner = owner

    def readable(self):
        return True

    def readinto(self, buffer):
        self.owner._arm()
        return self.owner.sock.recv_into(buffer, len(buffer))


class Upstream:
    def __init__(self, connect_timeout: float = 2.0, request_timeout: float = 5.0, tls: ssl.SSLContext | None = None):
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.tls = tls or ssl.create_default_context()
        self._pool = ThreadPoolExecutor(MAX_PARALLEL, thread_name_prefix="upstream")

    def _request(self, method: str, url: str) -> tuple[int, bytes]:
        verb = method.capitalize()
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            sock = socket.create_connection((host, port), timeout=self.connect_timeout)
        except OSError as e:
            raise UpstreamError(f'{verb} "{url}": {_dial_text(host, port, e)}') from None
        try:
            deadline = time.monotonic() + self.request_timeout
            sock.settimeout(self.request_timeout)
            if parts.scheme == "https":
                sock = self.tls.wrap_socket(sock, server_hostname=host)
            conn = http.client.HTTPConnection(host, port)
            conn.sock = _DeadlineSocket(sock, deadline)
            conn.request(method, target, headers={"Accept": "application/vnd.nsq; version=1.0",
                                                  "User-Agent": "nsqadmin/nsqpy"})
            resp = conn.getresponse()
            body = resp.read(MAX_BODY)
            return resp.status, body
        except (socket.timeout, TimeoutError):
            raise UpstreamError(f'{verb} "{url}": context deadline exceeded (Client.Timeout exceeded while '
                                f'awaiting headers)') from None
        except (OSError, http.client.HTTPException, ssl.SSLError) as e:
            raise UpstreamError(f'{verb} "{url}": {e}') from None
        finally:
            sock.close()

    def _v1(self, method: str, url: str) -> bytes:
        status, body = self._request(method, url)
        if status == 403 and not url.startswith("https"):
            try:
                https_port = int(json.loads(body)["https_port"])
            except (ValueError, KeyError, TypeError):
                https_port = None
            if https_port:
                parts = urlsplit(url)
                url = parts._replace(scheme="https", netloc=f"{parts.hostname}:{https_port}").geturl()
                status, body = self._request(method, url)
        if status != 200:
            raise UpstreamError(f"got response {status} {_REASONS.get(status, '')} {go_quote(body)}")
        return body

    def get_json(self, url: str):
        body = self._v1("GET", url)
        try:
            return json.loads(body)
        except ValueError as e:
            raise UpstreamError(f"invalid JSON from {url}: {e}") from None

    def post(self, url: str) -> None:
        self._v1("POST", url)

    def fan_out(self, fn, items) -> list:
        """[(item, fn(item) or the UpstreamError it raised)] in the order of ``items``, run in parallel."""
        items = list(items)

        def one(item):
            try:
                return fn(item)
            except UpstreamError as e:
                return e
        if len(items) <= 1:
            return [(item, one(item)) for item in items]
        return list(zip(items, self._pool.map(one, items)))
