"""gunicorn run programmatically inside nsqd's "http" child (see workers/processes/http.py for the theory of operation).

Kept apart from workers/processes/http.py so that the supervisor, which imports that module to bind the listener, never
imports gunicorn.
"""
from __future__ import annotations

import fcntl
import os
import signal
import time

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.sock import TCP6Socket, TCPSocket

from nsqpy.http_api.asgi_worker import HeaderDeadlineWorker
from nsqpy.http_api.gunicorn_log import NsqGunicornLog

from nsqpy.process import die_with_parent, ignore_interrupt, wait_for_exits

GRACEFUL = 3  # seconds gunicorn's workers get to finish their requests at shutdown

# asgi: gunicorn's asgi worker with a bound on header time (http_api/asgi_worker.py); sync and gthread as gunicorn's
_WORKER_CLASSES = {"sync": "sync", "gthread": "gthread", "asgi": HeaderDeadlineWorker}


class _Arbiter(Arbiter):
    """gunicorn's arbiter without its sleeps on nsqd's start and stop paths, and without a lost SIGTERM:

    * ``spawn_workers`` sleeps up to 0.1 s (at random) after each fork, to spread the workers' boots: with two
      workers, up to 0.2 s more before HTTP is served, during which the arbiter does not look at a SIGTERM either.
    * A worker's SIGTERM between its fork and its own handlers (``init_signals``) reached the arbiter's handler,
      inherited through fork, which only queues it in that process's copy of the arbiter: the stop was lost and
      the worker killed after the graceful timeout (3 s). Each worker is forked with SIGTERM blocked, and
      unblocks it once its handlers are set (``post_worker_init``): a SIGTERM meanwhile waits for them.
    * ``stop`` reaps its workers on a 0.1 s poll (``time.sleep(0.1)`` between reaps), so even workers that exit at
      once cost a stop 0.1 s. Here the exits are waited for (``wait_for_exits``: a pidfd each) until gunicorn's
      graceful timeout, then gunicorn's ``stop`` runs as before and finds nothing left to wait for (what did not
      exit in time is killed there, as before). A SIGINT or SIGQUIT during that wait does not shorten it (gunicorn's
      quick shutdown): nsqd's HTTP processes ignore SIGINT, and nsqd sends neither."""

    def spawn_workers(self):
        for _ in range(self.num_workers - len(self.WORKERS)):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                self.spawn_worker()  # (in the worker it never returns: gunicorn exits it)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def stop(self, graceful=True):
        if graceful and self.WORKERS:
            self.kill_workers(signal.SIGTERM)
            wait_for_exits(list(self.WORKERS), time.monotonic() + self.cfg.graceful_timeout)
            self.reap_workers()
        super().stop(graceful)


class _Booted:
    """How many of an arbiter's workers have booted (loaded the app, set their handlers): a counter in a memfd,
    under a POSIX record lock (``lockf``), shared by the workers forked after it was made. Not ``flock``: forked
    workers share the fd's open file description, which owns a flock, so two workers counting at once both held
    it, both counted 1 and the ready byte never came (one start in ~30 with two workers). A record lock belongs to
    the process. ``count`` -> True for the worker that completes the first ``n`` (later boots, replacements of dead
    workers, count on without effect)."""

    def __init__(self, n):
        self.n = n
        self.fd = os.memfd_create("nsqd-http-booted")
        os.write(self.fd, b"\0" * 8)

    def count(self):
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            done = int.from_bytes(os.pread(self.fd, 8, 0), "little") + 1
            os.pwrite(self.fd, done.to_bytes(8, "little"), 0)
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
        return done == self.n


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
        self.booted = None  # _Booted: the ready byte once every worker has booted
        _Log.nsq_log, _Log.nsq_level = log, level
        super().__init__()

    def load_config(self):
        app = self

        def pre_fork(arbiter, worker):
            # arbiter.WORKERS holds the live workers only (a dead one is reaped before its replacement forks)
            live = {getattr(w, "nsq_slot", None) for w in arbiter.WORKERS.values()}
            worker.nsq_slot = next(s for s in app.slots if s not in live)

        def post_fork(arbiter, worker):  # in the new worker (SIGTERM blocked: _Arbiter.spawn_workers)
            die_with_parent(arbiter.pid)  # one writer per ring: no worker outlives its arbiter
            app.slot = worker.nsq_slot

        def post_worker_init(worker):  # after init_signals and the app's load: it serves from here on
            ignore_interrupt()  # ^C: nsqd's supervisor decides (gunicorn's handler would stop at once)
            if app.booted.count():  # the last of the first workers: HTTP is served ("every child is up")
                os.write(app.ready_fd, b"h")
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

        def when_ready(arbiter):
            ignore_interrupt()
            app.booted = _Booted(app.n_workers)  # before the arbiter forks its workers

        settings = {
            "workers": self.n_workers, "worker_class": _WORKER_CLASSES[self.worker_class], "threads": self.threads,
            "timeout": 60, "graceful_timeout": GRACEFUL, "keepalive": 75, "logger_class": _Log,
            "proc_name": "nsqd-http", "pre_fork": pre_fork, "post_fork": post_fork, "when_ready": when_ready,
            "post_worker_init": post_worker_init,
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
        arbiter = _Arbiter(self)
        fd = os.dup(self.sock.fileno())  # gunicorn closes the fd it is given
        cls = TCP6Socket if self.sock.family == TCP6Socket.FAMILY else TCPSocket
        arbiter.LISTENERS = [cls(self.sock.getsockname(), self.cfg, arbiter.log, fd=fd)]
        arbiter.run()
