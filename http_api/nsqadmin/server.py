"""gunicorn, run programmatically in nsqadmin's "http" child, serving ``nsqpy.http_api.nsqadmin.app``.

The same arbiter set-up as nsqlookupd's (``nsqpy.http_api.lookupd.server``: the supervisor binds the socket, gunicorn's
log goes through nsqpy's logger, workers die with the arbiter), with one difference: one ``gthread`` worker with
``THREADS`` threads instead of several sync workers. nsqadmin holds state that every request must see (options
changed through ``/config``, the health tracker's samples, the nodes it has seen, the notification queue), and
its requests spend their time waiting on nsqd and nsqlookupd, not on the CPU: threads in one process fit both.
"""
from __future__ import annotations

from nsqpy.http_api.gunicorn_log import NsqGunicornLog
from nsqpy.http_api.lookupd.server import LookupdGunicorn

__all__ = ["serve", "THREADS"]

THREADS = 16


class _Log(NsqGunicornLog):
    """nsqadmin's HTTP log lines through nsqpy's logger."""


class AdminGunicorn(LookupdGunicorn):
    def __init__(self, sock, opts, ready_fd, log):
        self.opts = opts
        super().__init__(sock, None, 1, ready_fd, log)
        _Log.nsq_log = log

    def load_config(self):
        super().load_config()
        for key, value in {"worker_class": "gthread", "threads": THREADS, "proc_name": "nsqadmin-http",
                           "logger_class": _Log, "keepalive": 5}.items():
            self.cfg.set(key, value)

    def load(self):
        from nsqpy.http_api.nsqadmin.app import create_app
        from nsqpy.admin.service import AdminService
        return create_app(AdminService(self.opts, self.nsq_log), self.nsq_log)


def serve(sock, opts, ready_fd: int, log) -> None:
    """Run gunicorn's arbiter in this process on the bound ``sock`` until it stops (SIGTERM: gracefully);
    ``ready_fd`` gets one byte once the arbiter is up."""
    AdminGunicorn(sock, opts, ready_fd, log).run()
