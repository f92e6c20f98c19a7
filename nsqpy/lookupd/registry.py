"""The registry process: sole owner of nsqlookupd's registration database.

It serves the V1 TCP protocol to nsqd nodes (``nsqpy/lookupd/tcp.py``) and answers the HTTP processes' queries
over a unix socket (``nsqpy/lookupd/queries.py``), all on one asyncio loop, so every change and every read is
one step of one thread: an HTTP worker never sees a half-made change, and two HTTP workers never disagree.

Both listening sockets are bound by the ``nsqlookupd`` supervisor before it forks (a restarted registry takes
them up again: nsqd reconnects and re-registers, HTTP workers reconnect on their next request); the registrations
themselves live only here, as in nsqlookupd, which also forgets them when it restarts.

Query connections are persistent (one per HTTP worker process) and answered one request at a time, in order.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal

from nsqpy.lookupd.queries import MAX_REQUEST, REPLY, REQUEST, Queries
from nsqpy.lookupd.registration_db import RegistrationDB
from nsqpy.lookupd.tcp import LookupServer

__all__ = ["registry_main", "QueryConnection"]


class QueryConnection(asyncio.Protocol):
    """One HTTP worker's query connection: requests answered in order, as they arrive; a malformed one ends the
    connection (the worker reconnects). A plain Protocol, not streams: no coroutine per request."""

    def __init__(self, queries: Queries):
        self.queries = queries
        self.buf = b""
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        buf = self.buf + data if self.buf else data
        pos, out = 0, []
        while len(buf) - pos >= REQUEST.size:
            (size,) = REQUEST.unpack_from(buf, pos)
            if size > MAX_REQUEST:
                self.transport.close()
                return
            end = pos + REQUEST.size + size
            if len(buf) < end:
                break
            try:
                request = json.loads(buf[pos + REQUEST.size:end])
                if not isinstance(request, list) or not request or not all(isinstance(a, str) for a in request):
                    raise ValueError("not a request")
            except ValueError:
                self.transport.close()
                return
            status, body = self.queries.call(*request)
            out.append(REPLY.pack(status, len(body)) + body)
            pos = end
        self.buf = buf[pos:]
        if out:
            self.transport.write(b"".join(out))


def registry_main(opts, tcp_sock, query_sock, tcp_port, http_port, hostname, ready_fd, log):
    """Run until SIGTERM; calls back through ``ready_fd`` once both servers accept."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides; a terminal's ^C reaches it too
    db = RegistrationDB()
    queries = Queries(db, opts.inactive_producer_timeout, opts.tombstone_lifetime, log)
    server = LookupServer(db, log, tcp_port, http_port, opts.broadcast_address, hostname)
    asyncio.run(_serve(server, queries, tcp_sock, query_sock, ready_fd))


async def _serve(server, queries, tcp_sock, query_sock, ready_fd):
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    tcp = await loop.create_server(server.protocol, sock=tcp_sock)
    unix = await loop.create_unix_server(lambda: QueryConnection(queries), sock=query_sock)
    os.write(ready_fd, b"r")
    await stop
    tcp.close()
    unix.close()
    server.close_all()
