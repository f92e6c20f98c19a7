"""The ``nsqd`` command: NSQ's broker, started with NSQ's flags.

    nsqd --tcp-address=127.0.0.1:4150 --data-path=/var/lib/nsqd --workers=2

Builds the options (flags > --config TOML > defaults), checks them against what nsqpy implements
(``nsqpy.config.support``: a refused security flag such as --tls-cert or --auth-http-address is one FATAL line
and exit code 1 before anything is created; an accepted flag without effect is one WARNING line), creates the
shared resources (``nsqpy.workers.processes.plan``), binds the listener, forks the acceptor, the workers and the scanner under
the supervisor, and prints NSQ's start-up lines as the children report ready, so that each "listening on" line
means that listener's connections are served: TCP's once the acceptor, the workers and the scanner are, HTTP's
once every child is.
"""
import gc
import os
import platform
import sys
import time

from nsqpy.process import stop_cleanly_while_importing

stop_cleanly_while_importing("nsqd")  # the imports below take half a second

# Importing numpy, numba and the kernels numba loads at import creates some 100,000 objects, all of them kept:
# the collector's passes over them during the imports are a share of every start (benchmarks/first_start.py
# measures it). Collection resumes right after, with those objects frozen (outside its passes for good: else the
# first passes after the imports would traverse them all).
_collecting = gc.isenabled()
gc.disable()
from nsqpy.config import NsqdOptions
from nsqpy.config.support import check_support
from nsqpy.log import Logger
from nsqpy.preflight import PreflightError, check_addresses, check_data_path, listen_error
from nsqpy.sdnotify import Notifier
from nsqpy.store import metadata
from nsqpy.workers.processes.acceptor import acceptor_main
from nsqpy.workers.processes.http import bind_http, bind_https, http_main, http_slots, shown_address, split_slots, statsd_main
from nsqpy.workers.storage.nsqd_dat import MetadataSync
from nsqpy.workers.processes.plan import Plan
from nsqpy.workers.storage.broker_crash import SalvageError, salvage
from nsqpy.workers.processes.scanner import scanner_main
from nsqpy.workers.processes.supervisor import Supervisor
from nsqpy.workers.connections.tls_context import server_context
from nsqpy.workers.lane.warmup import mark_keeper, warm_up
from nsqpy.workers.processes.worker import EXIT_UNSAVED, worker_main
gc.freeze()
if _collecting:
    gc.enable()

NSQ_VERSION = "1.3.0"


def version_string():
    return f"nsqd v{NSQ_VERSION}-nsqpy (built w/{platform.python_implementation().lower()}{platform.python_version()})"


BROKER_KINDS = b"aws"  # the ready bytes of the acceptor, the workers and the scanner: TCP is served once they wrote
SHUTDOWN_TIMEOUT = 60.0  # seconds the workers get to save their messages at a stop (then they are killed and
                         # the next start salvages what they left in shared memory)
MAPS_PER_TOPIC = 4      # control block, segment window, its first segment, slack for a spill segment
MAPS_RESERVED = 2000    # the interpreter, numpy, numba and the broker's own segments


def topics_per_worker():
    """How many topics one worker can map under this host's vm.max_map_count, or None if it cannot be read."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        return None
    return max(0, limit - MAPS_RESERVED) // MAPS_PER_TOPIC


class StartError(RuntimeError):
    """A reason nsqd cannot start: one FATAL line, exit code 1."""


def _check(opts, log):
    """Refused flags and a bad TLS certificate stop nsqd before anything is created; -> the support report."""
    support = check_support(opts)
    for line in support.refusals:
        log.fatal(line)
    if support.refusals:
        raise StartError(None)
    try:  # as in nsqd (each worker loads its own context after fork)
        server_context(opts)
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        raise StartError(f"failed to load TLS certificate/key: {e}") from None
    try:  # before the warm-up, which can compile for tens of seconds
        check_data_path(opts.data_directory())
        check_addresses(_listeners(opts))
    except PreflightError as e:
        raise StartError(str(e)) from None
    return support


def _listeners(opts):
    """(flag, address) of each listener nsqd will bind (an empty address: that listener is off)."""
    https = opts.https_address if opts.tls_cert and opts.http_address else ""
    return [("--tcp-address", opts.tcp_address), ("--http-address", opts.http_address), ("--https-address", https)]


def _say_hello(log, opts, support):
    log.info(version_string())
    log.info(f"ID: {opts.node_id}")
    for line in support.warnings:
        log.warn(line)
    for line in support.notes:
        log.info(line)
    per_worker = topics_per_worker()
    if per_worker is not None and per_worker < 100_000:
        log.info(f"vm.max_map_count allows about {per_worker} topics per worker ({per_worker * max(1, opts.workers)} "
                 f"in all); deploy/sysctl.d/60-nsqpy.conf raises it")


def _prepare(plan, opts, log):
    """Warm-up, salvage of a crashed instance, shared memory and listeners; -> (tcp address, http, https)."""
    try:
        metadata.load(plan.data_path)  # a corrupt nsqd.dat stops nsqd here, as Go nsqd: never forget topics
    except ValueError as e:
        raise StartError(str(e)) from None
    try:
        t0 = time.monotonic()
        plan.background = warm_up(plan.prefix, log)  # a first start: the forward lane compiles meanwhile
        log.debug(f"kernels ready in {time.monotonic() - t0:.2f}s")
        salvage(plan, log)  # what a crashed instance of this data path left in shared memory, to disk first
        plan.create()
        which = 0  # the listener being bound: _listeners(opts)[which]
        try:
            address = plan.bind()
            which = 1
            http_sock = bind_http(opts)  # before fork, like the TCP listener: the HTTP child restarts on it
            which = 2
            https_sock = bind_https(opts) if http_sock is not None else None
        except OSError as e:  # taken since the preflight check
            plan.destroy()
            raise StartError(listen_error(*_listeners(opts)[which], e)) from None
    except SalvageError as e:
        raise StartError(str(e)) from None
    except (OSError, ValueError) as e:  # ValueError: a --tcp-address whose port is not a number
        plan.destroy()
        raise StartError(f"failed to start: {e}") from None
    return address, http_sock, https_sock


def _add_broker(sup, plan, log):
    """The acceptor, the workers and the scanner, stopped in that order (what feeds the workers first)."""
    sup.add("acceptor", lambda restarted, ready: acceptor_main(plan, restarted, ready, log), kind=b"a")
    for w in range(plan.workers):
        sup.add(f"worker {w}", lambda restarted, ready, w=w: worker_main(plan, w, restarted, ready, log),
                stop_order=1, restart_to_stop=True, kind=b"w")
    sup.add("scanner", lambda restarted, ready: scanner_main(plan, restarted, ready, log), stop_order=2, kind=b"s")
    counters = {f"worker {w}": w for w in range(plan.workers)}
    counters["scanner"] = -1
    sup.on_restart = lambda child: child.name in counters and plan.control.count_restart(counters[child.name])


def _add_http(sup, plan, opts, log, http_sock, https_sock):
    """gunicorn arbiters for HTTP (and HTTPS, on producer slots of its own), and the statsd pusher."""
    if not http_slots(plan):
        raise StartError("the HTTP API needs at least 2 --external-producers (one producer slot per HTTP worker, "
                         "one for nsqlookupd); set --http-address= to run without it")
    plan.http_port = http_sock.getsockname()[1]
    sup.cleanups.append(http_sock.close)
    plain_slots, tls_slots = split_slots(plan, https_sock is not None)
    if https_sock is not None:
        if not tls_slots:
            raise StartError("HTTPS needs producer slots of its own: raise --external-producers or set "
                             "--https-address=")
        plan.https_port = https_sock.getsockname()[1]
        sup.cleanups.append(https_sock.close)
        sup.add("https", lambda restarted, ready: http_main(
            plan, https_sock, restarted, ready, log, version_string(), len(tls_slots), opts.http_worker_class,
            8, tls_slots, tls=True), kind=b"h")
    sup.add("http", lambda restarted, ready: http_main(plan, http_sock, restarted, ready, log, version_string(),
                                                       opts.http_workers, opts.http_worker_class, 8, plain_slots),
            kind=b"h")
    if opts.statsd_address:
        sup.add("statsd", lambda restarted, ready: statsd_main(plan, restarted, ready, log, plan.http_port),
                kind=b"d")


def _add_lookupd(sup, plan, log):
    """Registration with nsqlookupd (workers/processes/lookupd_link.py, imported here: asyncio is only needed with it)."""
    from nsqpy.workers.processes import lookupd_link
    lookupd_link.prepare(plan)
    sup.cleanups.append(lambda: lookupd_link.remove_state(plan))
    sup.add("lookupd", lambda restarted, ready: lookupd_link.lookupd_main(plan, restarted, ready, log), kind=b"l")


def _failed_start(sup, log):
    if sup.stop_requested:  # a stop asked for during start-up is a clean stop, as at any other moment
        return _supervise(sup)
    log.fatal("a process failed to start")
    sup.shutdown()
    return 1


def _supervise(sup):
    code = sup.run()
    return code or (0 if sup.clean_exit else EXIT_UNSAVED)


def compile_only(log):
    """--compile-only: every warm-up step, the deferred ones too, into numba's cache (in one process per core when
    it is cold); -> the exit code. The next nsqd of these sources, wherever installed, then only loads them."""
    from nsqpy.ipc import numba_cache
    if not numba_cache.CACHE_ENABLED:
        log.fatal("numba's cache directory is not writable (ipc/numba_cache.py): the kernels would compile for "
                  "this process only")
        return 1
    t0 = time.monotonic()
    warm_up(f"/nsqpy-compile{os.getpid()}-", log, defer=False)
    log.info(f"kernels ready in {time.monotonic() - t0:.2f}s in {numba_cache.CACHE_DIR}")
    return 0


def main(argv=None):
    opts = NsqdOptions.parse_or_exit(sys.argv[1:] if argv is None else argv, "nsqd")
    if opts.version:
        print(version_string())
        return 0
    log = Logger(opts.log_prefix, opts.log_level.name.lower())
    if opts.compile_only:
        log.info(version_string())
        return compile_only(log)
    if opts.leftovers or opts.discard_leftovers:
        from nsqpy.workers.storage import leftovers
        code, text = leftovers.discard(opts.discard_leftovers) if opts.discard_leftovers else leftovers.report()
        print(text)
        return code
    plan = None
    try:
        support = _check(opts, log)
        notifier = Notifier.from_environ(os.environ)  # systemd's Type=notify (a no-op without $NOTIFY_SOCKET)
        sup = Supervisor(log, shutdown_timeout=SHUTDOWN_TIMEOUT, notifier=notifier)
        sup.trap_stop_signals()
        notifier.status("starting: loading the kernels (compiling them on a first start)")
        _say_hello(log, opts, support)
        plan = Plan(opts, log)
        (host, port), http_sock, https_sock = _prepare(plan, opts, log)
        sync = MetadataSync(plan, NSQ_VERSION)
        _add_broker(sup, plan, log)
        if http_sock is not None:
            _add_http(sup, plan, opts, log, http_sock, https_sock)
        if opts.lookupd_tcp_address:
            _add_lookupd(sup, plan, log)
    except StartError as e:
        if e.args[0]:
            log.fatal(e.args[0])
        if plan is not None:
            plan.destroy()  # nothing was forked: no message can be in the new segments yet
            if plan.background is not None:
                plan.background.finish(timeout=0)
        return 1
    sup.cleanups.append(lambda: plan.destroy() if sup.clean_exit else plan.keep())
    if plan.background is not None:
        # last (cleanups run last first): the workers have saved their messages and nsqd.dat is written by then
        sup.cleanups.insert(0, lambda: plan.background.finish(log))
        sup.periodic.append(plan.background.reap)
    # cleanups run last first: nsqd.dat before the journals go; only once the broker ran (a start that failed
    # half-way must not replace a good nsqd.dat by what its workers had loaded so far)
    sup.cleanups.append(lambda: sup.periodic and sync.poll(force=True))
    gc.freeze()  # the children inherit start-up's objects outside the collector: none of them collects them again
    sup.start()
    # TCP is served once the acceptor, the workers and the scanner are ready (the HTTP children, statsd and the
    # lookupd link start alongside and may take longer: gunicorn's imports); each listener's line says when it is.
    if not sup.wait_ready(BROKER_KINDS):
        return _failed_start(sup, log)
    shown = f"[{host}]" if ":" in host else host
    log.info(f"TCP: listening on {shown}:{port}")
    if not sup.wait_ready():  # the others
        return _failed_start(sup, log)
    sup.periodic.append(sync.poll)
    sup.periodic.append(mark_keeper())  # the kernel cache of a broker running for months stays "in use"
    if http_sock is not None:
        log.info(f"HTTP: listening on {shown_address(http_sock)}")
    if https_sock is not None:
        log.info(f"HTTPS: listening on {shown_address(https_sock)}")
    served = [f"TCP on {shown}:{port}"] + [f"{name} on {shown_address(sock)}" for name, sock in
                                          (("HTTP", http_sock), ("HTTPS", https_sock)) if sock is not None]
    notifier.ready("serving " + ", ".join(served))  # every port bound, every child up
    return _supervise(sup)


if __name__ == "__main__":
    sys.exit(main())
