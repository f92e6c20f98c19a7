"""gunicorn run programmatically inside nsqd's "http" child (see workers/processes/http.py for the theory of operation).

Kept apart from workers/processes/http.py so that the supervisor, which imports that module to bind the listener, never
imports gunicorn.
"""
from __future__ import annotations

import os

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.sock import TCP6Socket, TCPSocket

from nsqpy.http_api.asgi_worker import HeaderDeadlineWorker
from nsqpy.http_api.gunicorn_log import NsqGunicornLog

from nsqpy.process import die_with_parent, ignore_interrupt

GRACEFUL = 3  # seconds gunicorn's workers get to finish their requests at shutdown

# asgi: gunicorn's asgi worker with a bound on header time (http_api/asgi_worker.py); sync and gthread as gunicorn's
_WORKER_CLASSES = {"sync": "sync", "gthread": "gthread", "asgi": HeaderDeadlineWorker}


class _Log(NsqGunicornLog):
    """nsqd's HTTP log lines through nsqpy's logger (http_api/gunicorn_log.py)."""


class NsqdGunicorn(BaseApplication):
    """The arbiter of nsqd's HTTP (or HTTPS) workers. ``deps(slot)`` builds the app's NsqdDeps in a worker, on
    the producer slot it was given (workers/processes/http.py's ``build_deps``); ``slots``: the ones its workers share."""

    def __init__(self, plan, sock, ready_fd, log, level, deps, workers, worker_class, threads, slots, tls=False):
        self.plan = plan
        self.sock = sock
        self.ready_fd = ready_fd
        self.nsq_log = log
        self.level = level
        self.deps = deps
        self.slots = slots
        self.tls = tls  # the HTTPS arbiter: gunicorn wraps each accepted connection (--tls-cert, --tls-key)
        self.n_workers = max(1, min(workers, len(self.slots)))
        self.worker_class = worker_class
        self.threads = threads
        self.slot = None  # in a worker: its producer slot
        _Log.nsq_log, _Log.nsq_level = log, level
        super().__init__()

    def load_config(self):
        app = self

        def pre_fork(arbiter, worker):
            # arbiter.WORKERS holds the live workers only (a dead one is reaped before its replacement forks)
            live = {getattr(w, "nsq_slot", None) for w in arbiter.WORKERS.values()}
            worker.nsq_slot = next(s for s in app.slots if s not in live)

        def post_fork(arbiter, worker):  # in the new worker
            die_with_parent(arbiter.pid)  # one writer per ring: no worker outlives its arbiter
            app.slot = worker.nsq_slot

        def when_ready(arbiter):
            ignore_interrupt()  # ^C: nsqd's supervisor decides (gunicorn's handler would stop at once)
            os.write(self.ready_fd, b"h")

        settings = {
            "workers": self.n_workers, "worker_class": _WORKER_CLASSES[self.worker_class], "threads": self.threads,
            "timeout": 60, "graceful_timeout": GRACEFUL, "keepalive": 75, "logger_class": _Log,
            "proc_name": "nsqd-http", "pre_fork": pre_fork, "post_fork": post_fork, "when_ready": when_ready,
            "post_worker_init": lambda worker: ignore_interrupt(),
            "limit_request_line": 8190, "accesslog": None, "control_socket_disable": True,
        }
        if self.tls:
            opts = self.plan.opts
            settings.update(certfile=opts.tls_cert, keyfile=opts.tls_key, proc_name="nsqd-https")
            if opts.tls_client_auth_policy == "require-verify":
                settings.update(cert_reqs=2, ca_certs=opts.tls_root_ca_file or None)  # ssl.CERT_REQUIRED
        if self.worker_class != "gthread":
            del settings["threads"]  # the others warn about it
        for key, value in settings.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self):
        from nsqpy.http_api.nsqd_app import create_app

        return create_app(self.deps(self.slot), asgi=self.worker_class == "asgi")

    def run(self):
        arbiter = Arbiter(self)
        fd = os.dup(self.sock.fileno())  # gunicorn closes the fd it is given
        cls = TCP6Socket if self.sock.family == TCP6Socket.FAMILY else TCPSocket
        arbiter.LISTENERS = [cls(self.sock.getsockname(), self.cfg, arbiter.log, fd=fd)]
        arbiter.run()
