"""A scripted stand-in for nsqd on port 0: each accepted connection runs `script(index, sock)` in a thread, so
a test can send exactly the bytes it wants (garbage, half a frame, an upgrade) and watch the client cope."""

import json
import socket
import struct
import threading


class FakeNsqd:
    def __init__(self, script):
        self.script = script
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.connections = 0
        self.errors = []
        self._threads = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            index = self.connections
            self.connections += 1
            t = threading.Thread(target=self._run, args=(index, conn), daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self, index, conn):
        try:
            with conn:
                self.script(index, conn)
        except Exception as err:   # the client hanging up is fine; anything else is shown by the test
            if not isinstance(err, (ConnectionError, OSError)):
                self.errors.append(err)

    def close(self):
        self._closed = True
        self.sock.close()
        for t in self._threads:
            t.join(10)


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("client closed")
        data += chunk
    return data


def recv_line(sock):
    line = b""
    while not line.endswith(b"\n"):
        line += recv_exact(sock, 1)
    return line


def recv_sized(sock):
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    return recv_exact(sock, size)


def frame(frame_type, data):
    return struct.pack(">ii", len(data) + 4, frame_type) + data


def message(attempts, msg_id, body, ts=1):
    return frame(2, struct.pack(">qH", ts, attempts) + msg_id + body)


def handshake(sock, reply=None):
    """Read the magic and IDENTIFY; answer OK or the given JSON reply. Returns the IDENTIFY body."""
    assert recv_exact(sock, 4) == b"  V2"
    assert recv_line(sock) == b"IDENTIFY\n"
    body = json.loads(recv_sized(sock))
    sock.sendall(frame(0, b"OK" if reply is None else json.dumps(reply).encode()))
    return body
