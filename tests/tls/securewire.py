"""A blocking V2 client that negotiates TLS, snappy or deflate (tests/broker/wire.py's ``Conn`` plus the upgrade
sequence of spec 1.8), written from the spec: the broker's relay is tested against it, not against itself."""
from __future__ import annotations

import json
import socket
import ssl
import time
import zlib

import snappy  # python-snappy's framed stream codec (pure Python over cramjam)

from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_RESPONSE
from tests.broker.wire import DEADLINE, Conn


class SecureConn(Conn):
    """``Conn`` whose bytes pass through an optional TLS layer and an optional compression layer."""

    compress = decompress = None

    def send(self, *parts):
        data = b"".join(parts)
        if self.compress is not None:
            data = self.compress(data)
        self.sock.sendall(data)

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            return False
        except (ConnectionResetError, ssl.SSLError):
            self.reset = True
            data = b""
        if not data:
            self.eof = True
            return True
        if self.decompress is not None:
            data = self.decompress(data)
        self.frames.extend(self.decoder.feed(data))
        return True

    def negotiate(self, tls=None, snappy_on=False, deflate=False, deflate_level=6, **fields):
        """IDENTIFY with feature_negotiation; perform what was granted; return the JSON reply."""
        body = dict(feature_negotiation=True, tls_v1=tls is not None, snappy=snappy_on, deflate=deflate,
                    deflate_level=deflate_level, **fields)
        self.sock.sendall(C.identify(body))
        frame = self._read_plain_frame()
        assert frame[0] == FRAME_RESPONSE and frame[1][:1] == b"{", frame
        reply = json.loads(frame[1])
        if reply["tls_v1"]:
            self.sock.settimeout(DEADLINE)
            self.sock = tls.wrap_socket(self.sock, server_hostname="localhost")
            assert self._read_plain_frame() == (FRAME_RESPONSE, b"OK")
        if reply["snappy"]:
            enc, dec = snappy.StreamCompressor(), snappy.StreamDecompressor()
            self.compress, self.decompress = enc.compress, dec.decompress
        elif reply["deflate"]:
            enc, dec = zlib.compressobj(reply["deflate_level"], zlib.DEFLATED, -15), zlib.decompressobj(-15)
            self.compress = lambda d: enc.compress(d) + enc.flush(zlib.Z_SYNC_FLUSH)
            self.decompress = dec.decompress
        if reply["snappy"] or reply["deflate"]:
            self.expect_response(b"OK")
        return reply

    def _read_plain_frame(self):
        """One frame read byte-exactly (nothing past it may be consumed before an upgrade)."""
        head = self._exactly(4)
        size = int.from_bytes(head, "big")
        rest = self._exactly(size)
        return int.from_bytes(rest[:4], "big"), rest[4:]

    def _exactly(self, n):
        self.sock.settimeout(DEADLINE)
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "connection closed during the upgrade"
            out += chunk
        return out


def secure(address, tls=None, snappy_on=False, deflate=False, **fields):
    c = SecureConn(address)
    c.negotiate(tls, snappy_on, deflate, **fields)
    return c
