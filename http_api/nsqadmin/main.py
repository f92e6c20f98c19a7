"""The ``nsqadmin`` command: NSQ's web UI and JSON API for a cluster, started with NSQ's flags.

    nsqadmin --lookupd-http-address=127.0.0.1:4161 [--http-address=0.0.0.0:4171] [--base-path=/admin]

Processes, as nsqlookupd's HTTP (under ``nsqpy.workers.processes.supervisor``: restart with back-off, TERM -> deadline -> KILL):

    supervisor   parses and checks the options (Go's start-up checks: one line and exit 1 on a bad address, TLS
                 file or graphite URL), binds the HTTP listener, forks the child, prints NSQ's listening line
                 once it reported ready
    http         gunicorn's arbiter and its one gthread worker running the Falcon app (http_api/nsqadmin/)
"""
from __future__ import annotations

import os
import socket
import sys
from urllib.parse import urlsplit

from nsqpy.config.nsqadmin import NsqadminOptions
from nsqpy.config.support import daemon_options
from nsqpy.listeners import bind_or_say, shown_address
from nsqpy.lookupd.queries import NSQ_VERSION
from nsqpy.sdnotify import Notifier

__all__ = ["main", "version_string"]


def version_string() -> str:
    import platform
    return (f"nsqadmin v{NSQ_VERSION}-nsqpy (built w/{platform.python_implementation().lower()}"
            f"{platform.python_version()})")


def start_errors(opts) -> list[str]:
    """Go's nsqadmin.New checks, each failure one line."""
    errors = []
    for flag, addresses in (("--lookupd-http-address", opts.lookupd_http_address),
                            ("--nsqd-http-address", opts.nsqd_http_address)):
        for address in addresses:
            host, sep, port = address.rpartition(":")
            try:
                if not sep or not port.isdigit():
                    raise ValueError("missing port in address")
                socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
            except (OSError, ValueError) as e:
                errors.append(f"failed to resolve {flag} ({address}) - {e}")
    if opts.http_client_tls_cert or opts.http_client_tls_root_ca_file:
        from nsqpy.admin.upstream import tls_context
        try:
            tls_context(opts.http_client_tls_insecure_skip_verify, opts.http_client_tls_root_ca_file,
                        opts.http_client_tls_cert, opts.http_client_tls_key)
        except (OSError, ValueError) as e:
            errors.append(f"failed to load the --http-client-tls-* files - {e}")
    if opts.proxy_graphite or opts.graphite_url:
        parts = urlsplit(opts.graphite_url)
        if opts.proxy_graphite and (parts.scheme not in ("http", "https") or not parts.netloc):
            errors.append(f"failed to parse --graphite-url ({opts.graphite_url}) - not an http(s) URL")
    return errors


# The child dies with the supervisor by SIGKILL (nsqpy.workers.processes.supervisor forks it so): nothing to save, and the port must
# be free for the next nsqadmin at once; the arbiter's worker dies with the arbiter the same way.
def _http_child(opts, sock, log):
    def run(restarted, ready_fd):
        from nsqpy.http_api.nsqadmin.server import serve
        serve(sock, opts, ready_fd, log)
    return run


def main(argv=None) -> int:
    from nsqpy.workers.processes.supervisor import Supervisor

    started = daemon_options(NsqadminOptions, sys.argv[1:] if argv is None else argv, "nsqadmin", version_string)
    if isinstance(started, int):
        return started
    opts, log, support = started
    errors = start_errors(opts)
    for line in errors:
        log.fatal(line)
    if errors:
        return 1
    log.info(version_string())
    for line in support.warnings:
        log.warn(line)
    for line in support.notes:
        log.info(line)
    notifier = Notifier.from_environ(os.environ)  # systemd's Type=notify (a no-op without $NOTIFY_SOCKET)
    sup = Supervisor(log, notifier=notifier)
    sup.trap_stop_signals()
    sock = bind_or_say("--http-address", opts.http_address, log)
    if sock is None:
        return 1
    try:
        sup.add("http", _http_child(opts, sock, log))
        sup.start()
        if sup.wait_ready():
            log.info(f"HTTP: listening on {shown_address(sock)}")
            notifier.ready(f"serving HTTP on {shown_address(sock)}")
        elif not sup.stop_requested:  # a stop asked for during start-up is a clean stop: run() makes it
            log.fatal("a process failed to start")
            sup.shutdown()
            return 1
        return sup.run()
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
