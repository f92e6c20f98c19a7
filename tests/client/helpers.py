"""Polling with a deadline (never a sleep as synchronisation) and unique names for tests sharing a broker."""

import http.server
import itertools
import json
import os
import threading

from tests.polling import wait_until  # noqa: F401  (re-exported for the client and tools tests)

_seq = itertools.count()
DEADLINE = 90.0   # generous: a cold numba cache makes a broker's first messages take tens of seconds


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_seq)}"


def addr(nsqd) -> str:
    return "%s:%d" % nsqd.address


class JsonServer:
    """A tiny HTTP server on port 0 in a thread answering every GET with ``reply(path) -> (status, JSON body)``
    and NSQ's header: a stand-in for nsqlookupd's or nsqd's HTTP API where a test scripts the answers."""

    def __init__(self, reply):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                status, body = reply(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("X-NSQ-Content-Type", "nsq; version=1.0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = "127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
