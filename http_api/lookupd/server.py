"""gunicorn, run programmatically in nsqlookupd's "http" child, serving ``nsqpy.http_api.lookupd.app``.

The listening socket is bound by the ``nsqlookupd`` supervisor (so port 0 is known before anything forks and a
restarted arbiter serves the same port); the arbiter gets it as a ready listener. The workers are gunicorn's asgi
workers with a bound on header time (``http_api/asgi_worker.py``, as nsqd's default): one event loop each serves
every connection, so clients that send their requests slowly hold connections, not workers, and each is closed if
a request's headers take more than HEADER_TIMEOUT. Each worker holds one ``RemoteQueries`` connection to the
registry process (made lazily after fork), asked from the event loop (a unix-socket round trip per request).
gunicorn's own log lines go through nsqpy's logger in NSQ's format (its chatter as DEBUG); there is no access log,
the app logs each request as nsqlookupd does. NOTIFY_SOCKET is removed from the environment first: under systemd, gunicorn would otherwise
tell systemd "READY" on behalf of the whole daemon, which is the supervisor's job.

Workers die with the arbiter (PR_SET_PDEATHSIG), so a SIGKILLed arbiter leaves no orphan serving stale sockets.
"""
from __future__ import annotations

import os

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.sock import TCP6Socket, TCPSocket

from nsqpy.http_api.asgi_worker import HeaderDeadlineWorker
from nsqpy.http_api.gunicorn_log import NsqGunicornLog
from nsqpy.process import die_with_parent, ignore_interrupt

__all__ = ["serve", "LookupdGunicorn"]

GRACEFUL = 5          # seconds gunicorn's workers get to finish their requests at shutdown
KEEPALIVE = 75        # seconds an idle keep-alive connection stays open (as nsqd's HTTP API)


class _Log(NsqGunicornLog):
    """nsqlookupd's HTTP log lines through nsqpy's logger (http_api/gunicorn_log.py)."""


class LookupdGunicorn(BaseApplication):
    def __init__(self, sock, query_address, workers, ready_fd, log):
        self.sock = sock
        self.query_address = query_address
        self.n_workers = max(1, workers)
        self.ready_fd = ready_fd
        self.nsq_log = log
        _Log.nsq_log = log
        super().__init__()

    def load_config(self):
        ready_fd = self.ready_fd

        def post_fork(arbiter, worker):  # in the new worker
            die_with_parent(arbiter.pid)

        def when_ready(arbiter):
            ignore_interrupt()  # ^C: nsqlookupd's supervisor decides (gunicorn's handler would stop at once)
            os.write(ready_fd, b"h")

        settings = {"workers": self.n_workers, "worker_class": HeaderDeadlineWorker, "timeout": 60,
                    "graceful_timeout": GRACEFUL, "keepalive": KEEPALIVE,
                    "logger_class": _Log, "proc_name": "nsqlookupd-http", "post_fork": post_fork,
                    "post_worker_init": lambda worker: ignore_interrupt(), "when_ready": when_ready,
                    "accesslog": None, "control_socket_disable": True}
        for key, value in settings.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self):
        from nsqpy.http_api.lookupd.app import create_app
        from nsqpy.lookupd.queries import RemoteQueries
        return create_app(RemoteQueries(self.query_address), self.nsq_log, asgi=True)

    def run(self):
        os.environ.pop("NOTIFY_SOCKET", None)
        arbiter = Arbiter(self)
        fd = os.dup(self.sock.fileno())  # gunicorn closes the fd it is given
        cls = TCP6Socket if self.sock.family == TCP6Socket.FAMILY else TCPSocket
        arbiter.LISTENERS = [cls(self.sock.getsockname(), self.cfg, arbiter.log, fd=fd)]
        arbiter.run()


def serve(sock, query_address: str, workers: int, ready_fd: int, log) -> None:
    """Run gunicorn's arbiter in this process on the bound ``sock`` until it stops (SIGTERM: gracefully);
    ``ready_fd`` gets one byte once the arbiter is up."""
    LookupdGunicorn(sock, query_address, workers, ready_fd, log).run()
