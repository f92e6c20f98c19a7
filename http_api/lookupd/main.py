"""The ``nsqlookupd`` command: NSQ's discovery daemon, started with NSQ's flags.

    nsqlookupd --tcp-address=0.0.0.0:4160 --http-address=0.0.0.0:4161 [--broadcast-address=...]

Processes (under ``nsqpy.workers.processes.supervisor``, the broker's supervisor: restarts with back-off, TERM -> deadline ->
KILL):

    supervisor   parses the options, binds the TCP and HTTP listeners and the registry's unix socket (abstract
                 namespace: nothing on disk), forks the two children, prints NSQ's listening lines once both
                 reported ready
    registry     owns the registration database; serves V1 to nsqd nodes and the HTTP workers' queries
                 (nsqpy/lookupd/registry.py)
    http         gunicorn's arbiter and its ``--http-workers`` asgi workers running the Falcon app
                 (http_api/lookupd/app.py, server.py); each request is answered from the registry, so every
                 worker sees the same registrations

Why this split: one owner makes consistency trivial (every read and write is one step of one event loop), and
HTTP scales by workers that hold no state. The cost is one unix-socket round trip per HTTP request (measured in
benchmarks/results/lookupd_bench.json, see ARCHITECTURE.md "nsqlookupd").
"""
from __future__ import annotations

import os
import platform
import secrets
import socket
import sys

from nsqpy.config.nsqlookupd import NsqlookupdOptions
from nsqpy.config.support import daemon_options
from nsqpy.listeners import bind_or_say, shown_address
from nsqpy.lookupd.queries import NSQ_VERSION
from nsqpy.sdnotify import Notifier

__all__ = ["main", "version_string"]


def version_string() -> str:
    return (f"nsqlookupd v{NSQ_VERSION}-nsqpy (built w/{platform.python_implementation().lower()}"
            f"{platform.python_version()})")


# Each child dies with the supervisor by SIGKILL (nsqpy.workers.processes.supervisor forks it so): nothing to save, and its ports
# must be free for the next nsqlookupd at once; the arbiter's workers die with the arbiter the same way.
def _registry_child(opts, tcp, http, query, hostname, log):
    def run(restarted, ready_fd):
        from nsqpy.lookupd.registry import registry_main
        ports = tcp.getsockname()[1], http.getsockname()[1]  # IDENTIFY's reply names both
        http.close()
        registry_main(opts, tcp, query, *ports, hostname, ready_fd, log)
    return run


def _http_child(opts, tcp, http, query, query_address, log):
    def run(restarted, ready_fd):
        from nsqpy.http_api.lookupd.server import serve
        tcp.close()
        query.close()
        serve(http, query_address, opts.http_workers, ready_fd, log)
    return run


def main(argv=None) -> int:
    from nsqpy.workers.processes.supervisor import Supervisor  # the broker's supervisor serves here too

    started = daemon_options(NsqlookupdOptions, sys.argv[1:] if argv is None else argv, "nsqlookupd", version_string)
    if isinstance(started, int):
        return started
    opts, log, support = started
    notifier = Notifier.from_environ(os.environ)  # systemd's Type=notify (a no-op without $NOTIFY_SOCKET)
    sup = Supervisor(log, notifier=notifier)
    sup.trap_stop_signals()
    listeners = []
    try:
        for flag, address in (("--tcp-address", opts.tcp_address), ("--http-address", opts.http_address)):
            sock = bind_or_say(flag, address, log)
            if sock is None:
                return 1
            listeners.append(sock)
        log.info(version_string())
        for line in support.warnings:
            log.warn(line)
        for line in support.notes:
            log.info(line)
        tcp, http = listeners
        query = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listeners.append(query)
        query_address = f"\0nsqpy-lookupd-{os.getpid()}-{secrets.token_hex(6)}"  # abstract: no file to remove
        query.bind(query_address)
        query.listen(128)
        hostname = socket.gethostname()
        sup.add("registry", _registry_child(opts, tcp, http, query, hostname, log))
        sup.add("http", _http_child(opts, tcp, http, query, query_address, log))
        sup.start()
        if sup.wait_ready():
            log.info(f"TCP: listening on {shown_address(tcp)}")
            log.info(f"HTTP: listening on {shown_address(http)}")
            # every port bound, each child up
            notifier.ready(f"serving TCP on {shown_address(tcp)}, HTTP on {shown_address(http)}")
        elif not sup.stop_requested:  # (a stop asked for during start-up is a clean stop: run() makes it)
            log.fatal("a process failed to start")
            sup.shutdown()
            return 1
        return sup.run()
    finally:
        for sock in listeners:
            sock.close()


if __name__ == "__main__":
    sys.exit(main())
