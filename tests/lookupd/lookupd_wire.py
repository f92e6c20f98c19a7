"""Helpers of the lookupd tests: real nsqlookupd processes (``python -m nsqpy.http_api.lookupd.main``) on port 0 that
announce their addresses in NSQ's listening lines, plain HTTP to them, and raw V1 sockets.

Fixtures are in ``conftest.py``: ``lookupd_factory(*flags)`` (each stopped with SIGTERM at teardown, exit 0
required) and ``registered_nsqd(*lookupds)``, real nsqd nodes (the broker suite's ``nsqd_factory``) started with
``--http-address=`` and ``--broadcast-http-port`` (IDENTIFY needs a non-zero http_port; it is only announced) and
``--broadcast-address=127.0.0.1``, so that consumers reach them by what lookupd hands out.

Every wait polls a condition with a deadline (``eventually``); the deadlines are generous because the machine is
small and shared, and they cost nothing when things are right.
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import struct
from urllib.parse import quote

from nsqpy.protocol import v1
from tests.logged_process import LoggedProcess
from tests.polling import wait_until

TCP_RE = re.compile(r"TCP: listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)$")
HTTP_RE = re.compile(r"HTTP: listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)$")
DEADLINE = 30.0


def eventually(cond, timeout=DEADLINE, what="condition", pause=0.02):
    return wait_until(cond, timeout, what, pause)


class Lookupd(LoggedProcess):
    name = "nsqlookupd"

    def __init__(self, *flags):
        super().__init__("nsqpy.http_api.lookupd.main", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", *flags])
        with self.starting():
            tcp = self.wait_for_line(TCP_RE, DEADLINE)
            http = self.wait_for_line(HTTP_RE, DEADLINE)
        self.tcp_address = (tcp.group(1), int(tcp.group(2)))
        self.http_address = (http.group(1), int(http.group(2)))

    @property
    def tcp(self) -> str:
        return f"{self.tcp_address[0]}:{self.tcp_address[1]}"

    @property
    def http(self) -> str:
        return f"{self.http_address[0]}:{self.http_address[1]}"

    def request(self, method, path, body=None, headers=None):
        """-> (status, {lower-case header: value}, body bytes)."""
        conn = http.client.HTTPConnection(*self.http_address, timeout=DEADLINE)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def get_json(self, path):
        status, headers, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def lookup(self, topic):
        """The /lookup reply, or None for 404 TOPIC_NOT_FOUND."""
        status, _, body = self.request("GET", f"/lookup?topic={quote(topic, safe='')}")  # '#' would end the path
        if status == 404:
            return None
        assert status == 200, body
        return json.loads(body)

    def producer_ports(self, topic):
        """The tcp ports /lookup lists for ``topic`` (sorted), [] when it is unknown or has none."""
        found = self.lookup(topic)
        return sorted(p["tcp_port"] for p in found["producers"]) if found else []


# ---- raw V1 ----------------------------------------------------------------------------------------------

class V1Conn:
    """A raw V1 connection: send bytes, read `[size][data]` replies with a deadline, see the close."""

    def __init__(self, address, magic=True):
        self.sock = socket.create_connection(address, timeout=DEADLINE)
        self.decoder = v1.ReplyDecoder()
        self.replies: list[bytes] = []
        if magic:
            self.send(v1.MAGIC_V1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def send(self, *parts):
        self.sock.sendall(b"".join(parts))

    def raw_until_closed(self) -> bytes:
        """Every byte until the peer closes (the reply to a fatal error, then EOF)."""
        out = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return out
            if not chunk:
                return out
            out += chunk

    def reply(self) -> bytes:
        while not self.replies:
            chunk = self.sock.recv(65536)
            assert chunk, "lookupd closed the connection"
            self.replies.extend(self.decoder.feed(chunk))
        return self.replies.pop(0)

    def identify(self, **fields) -> dict:
        body = {"broadcast_address": "127.0.0.1", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0",
                "hostname": "test-host", **fields}
        self.send(v1.identify(body))
        return json.loads(self.reply())


def identify_body(fields: dict) -> bytes:
    body = json.dumps(fields).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(body)) + body
