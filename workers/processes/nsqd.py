"""The ``nsqd`` command: NSQ's broker, started with NSQ's flags.

    nsqd --tcp-address=127.0.0.1:4150 --data-path=/var/lib/nsqd --workers=2

Builds the options (flags > --config TOML > defaults), checks them against what nsqpy implements
(``nsqpy.config.support``: a refused security flag such as --tls-cert or --auth-http-address is one FATAL line
and exit code 1 before anything is created; an accepted flag without effect is one WARNING line), binds the
listeners, imports the broker, creates the shared resources (``nsqpy.workers.processes.plan``), and forks the
acceptor, the workers and the scanner under the supervisor.

Start-up order (a warm start; ARCHITECTURE.md "Deploy"):
  1. flags, the data path, and every listener bound (not listening yet): ~0.1 s after exec, so an address in use
     is one FATAL line before anything heavy runs;
  2. the broker's modules (numpy, numba, the kernels' modules): ~0.4 s; a SIGTERM/SIGINT until here exits 0 at once;
  3. the kernel cache is known warm: the listeners listen, so a client that connects from here on is queued by
     the kernel (not refused) and served once the children are up;
  4. the kernels load (~0.3 s), a crashed instance is salvaged, the shared memory is created, the children fork
     and the workers load the saved queues;
  5. NSQ's listening lines, each once its listener's connections are served: TCP's once the acceptor, the workers
     and the scanner are ready, HTTP's once the HTTP processes are too (gunicorn's workers booted); then systemd's
     READY=1.
On a first start (a cold kernel cache, a compile of tens of seconds) the listeners listen only after the compile:
a client is refused during it, not left waiting.
"""
import gc
import os
import platform
import sys
import time

from nsqpy.process import exit_at_once, launched_as, stop_cleanly_while_importing

stop_cleanly_while_importing("nsqd")  # the broker's imports take half a second (_import_the_broker)

from nsqpy.config import NsqdOptions  # noqa: E402 (after the handlers above)
from nsqpy.config.support import check_support  # noqa: E402
from nsqpy.listeners import LISTEN_BACKLOG, bind_listener, shown_address  # noqa: E402
from nsqpy.log import Logger  # noqa: E402
from nsqpy.preflight import PreflightError, check_data_path, listen_error  # noqa: E402
from nsqpy.sdnotify import Notifier  # noqa: E402
from nsqpy.workers.processes.supervisor import Supervisor  # noqa: E402


def _import_the_broker():
    """The modules of the broker's processes (numpy, numba, the kernels' modules numba loads at import): about
    0.4 s, so imported only once the listeners are bound. Importing them creates some 100,000 objects, all of them
    kept: the collector's passes over them during the imports are a share of every start (benchmarks/first_start.py
    measures it). Collection resumes right after, with those objects frozen (outside its passes for good: else the
    first passes after the imports would traverse them all)."""
    collecting = gc.isenabled()
    gc.disable()
    import nsqpy.store.metadata  # noqa: F401
    import nsqpy.workers.connections.tls_context  # noqa: F401
    import nsqpy.workers.lane.warmup  # noqa: F401
    import nsqpy.workers.processes.acceptor  # noqa: F401
    import nsqpy.workers.processes.http  # noqa: F401
    import nsqpy.workers.processes.plan  # noqa: F401
    import nsqpy.workers.processes.scanner  # noqa: F401
    import nsqpy.workers.processes.worker  # noqa: F401
    import nsqpy.workers.storage.broker_crash  # noqa: F401
    import nsqpy.workers.storage.nsqd_dat  # noqa: F401
    gc.freeze()
    if collecting:
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


class Listeners:
    """nsqd's listening sockets, bound first thing (``_bind_listeners``): ``tcp``, ``http`` and ``https`` (None when
    off). ``listen`` makes them accept connections (queued by the kernel until the children serve them); ``say``
    prints NSQ's listening lines."""

    def __init__(self, tcp, http, https):
        self.tcp, self.http, self.https = tcp, http, https
        self.listening = False

    def each(self):
        return [(name, sock) for name, sock in (("TCP", self.tcp), ("HTTP", self.http), ("HTTPS", self.https))
                if sock is not None]

    def listen(self):
        if not self.listening:
            for _, sock in self.each():
                sock.listen(LISTEN_BACKLOG)
            self.listening = True

    def say(self, log, names):
        for name, sock in self.each():
            if name in names:
                log.info(f"{name}: listening on {shown_address(sock)}")

    def serving(self):
        return ", ".join(f"{name} on {shown_address(sock)}" for name, sock in self.each())


def _check(opts, log):
    """Refused flags, a bad TLS certificate, a bad data path and a listener that cannot be bound stop nsqd before
    anything else is done; -> (the support report, the bound ``Listeners``)."""
    support = check_support(opts)
    for line in support.refusals:
        log.fatal(line)
    if support.refusals:
        raise StartError(None)
    from nsqpy.workers.connections.tls_context import server_context
    try:  # as in nsqd (each worker loads its own context after fork)
        server_context(opts)
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        raise StartError(f"failed to load TLS certificate/key: {e}") from None
    try:  # before the imports and the warm-up, which can compile for tens of seconds
        check_data_path(opts.data_directory())
    except PreflightError as e:
        raise StartError(str(e)) from None
    return support, _bind_listeners(opts)


def _listeners(opts):
    """(flag, address) of each listener nsqd will bind (an empty address: that listener is off)."""
    https = opts.https_address if opts.tls_cert and opts.http_address else ""
    return [("--tcp-address", opts.tcp_address), ("--http-address", opts.http_address), ("--https-address", https)]


def _bind_listeners(opts):
    """Every listener bound, none listening yet (a connection is refused until ``Listeners.listen``): an address in
    use is one FATAL line naming it now, port 0 is resolved once, and every child (a restarted one too) serves the
    same socket."""
    bound = []
    try:
        for flag, address in _listeners(opts):
            bound.append(bind_listener(address, listen=False) if address else None)
    except OSError as e:
        raise StartError(listen_error(flag, address, e)) from None
    except ValueError:
        raise StartError(f"{flag}={address}: the port is not a number") from None
    finally:
        if len(bound) < 3:
            for sock in bound:
                if sock is not None:
                    sock.close()
    bound[0].set_inheritable(True)
    return Listeners(*bound)


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


def _prepare(plan, log, listeners):
    """nsqd.dat, warm-up, salvage of a crashed instance, shared memory. The listeners listen before the kernels
    load when they are cached (a connection then waits in the backlog for the workers), after the compile when
    not (a client is refused during a first start's compile)."""
    from nsqpy.store import metadata
    from nsqpy.workers.lane.warmup import cache_is_cold, warm_up
    from nsqpy.workers.storage.broker_crash import SalvageError, salvage
    try:
        metadata.load(plan.data_path)  # a corrupt nsqd.dat stops nsqd here, as Go nsqd: never forget topics
    except ValueError as e:
        raise StartError(str(e)) from None
    if not cache_is_cold():
        listeners.listen()
    else:
        log.info("a first start compiles the kernels before it listens; `nsqd --compile-only` right after an install "
                 "or upgrade does it ahead of time")
    try:
        t0 = time.monotonic()
        plan.background = warm_up(plan.prefix, log)  # a first start: the forward lane compiles meanwhile
        log.debug(f"kernels ready in {time.monotonic() - t0:.2f}s")
        salvage(plan, log)  # what a crashed instance of this data path left in shared memory, to disk first
        plan.create()
    except SalvageError as e:
        raise StartError(str(e)) from None
    except (OSError, ValueError) as e:
        plan.destroy()
        raise StartError(f"failed to start: {e}") from None
    plan.listener = listeners.tcp
    listeners.listen()  # (a cold cache: now, before the children accept on them)


def _add_broker(sup, plan, log):
    """The acceptor, the workers and the scanner, stopped in that order (what feeds the workers first)."""
    from nsqpy.workers.processes.acceptor import acceptor_main
    from nsqpy.workers.processes.scanner import scanner_main
    from nsqpy.workers.processes.worker import worker_main
    sup.add("acceptor", lambda restarted, ready: acceptor_main(plan, restarted, ready, log), kind=b"a")
    for w in range(plan.workers):
        sup.add(f"worker {w}", lambda restarted, ready, w=w: worker_main(plan, w, restarted, ready, log),
                stop_order=1, restart_to_stop=True, kind=b"w")
    links = plan.link_set  # the scanner's SIGTERM handler sets a flag its idle wait (up to 50 ms) would see late:
    wake_scanner = lambda: os.eventfd_write(links.eventfd(links.SCANNER), 1)  # noqa: E731 (its eventfd ends it)
    sup.add("scanner", lambda restarted, ready: scanner_main(plan, restarted, ready, log), stop_order=2, kind=b"s",
            on_term=wake_scanner)
    counters = {f"worker {w}": w for w in range(plan.workers)}
    counters["scanner"] = -1
    sup.on_restart = lambda child: child.name in counters and plan.control.count_restart(counters[child.name])


def _add_http(sup, plan, opts, log, http_sock, https_sock):
    """gunicorn arbiters for HTTP (and HTTPS, on producer slots of its own), and the statsd pusher."""
    from nsqpy.workers.processes.http import http_main, http_slots, split_slots, statsd_main
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
    from nsqpy.workers.processes.worker import EXIT_UNSAVED
    code = sup.run()
    return code or (0 if sup.clean_exit else EXIT_UNSAVED)


def compile_only(log):
    """--compile-only: every warm-up step, the deferred ones too, into numba's cache (in one process per core when
    it is cold); -> the exit code. The next nsqd of these sources, wherever installed, then only loads them."""
    from nsqpy.ipc import numba_cache
    from nsqpy.workers.lane.warmup import cache_is_cold, warm_up
    if not numba_cache.CACHE_ENABLED:
        log.fatal("numba's cache directory is not writable (ipc/numba_cache.py): the kernels would compile for "
                  "this process only")
        return 1
    t0 = time.monotonic()
    cold = cache_is_cold()
    warm_up(f"/nsqpy-compile{os.getpid()}-", log, defer=False)  # a line per step compiled (warmup.Progress)
    log.info(f"kernels ready in {time.monotonic() - t0:.2f}s in {numba_cache.CACHE_DIR}"
             + ("" if cold else " (every one was in the cache already)"))
    return 0


def main(argv=None):
    """The command; -> its exit code. Run as the ``nsqd`` program (console script, ``python -m``), it ends the
    process itself once everything is saved (``exit_at_once``: an interpreter holding numba takes 0.05-0.1 s to
    tear down, for nothing)."""
    code = _main(argv)
    if argv is None and launched_as("nsqd"):
        exit_at_once(code)
    return code


def _main(argv):
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
        support, listeners = _check(opts, log)
    except StartError as e:
        if e.args[0]:
            log.fatal(e.args[0])
        return 1
    _import_the_broker()  # (a SIGTERM/SIGINT until here exits 0 at once: nothing is created yet)
    from nsqpy.workers.lane.warmup import mark_keeper
    from nsqpy.workers.processes.plan import Plan
    from nsqpy.workers.storage.nsqd_dat import MetadataSync
    try:
        notifier = Notifier.from_environ(os.environ)  # systemd's Type=notify (a no-op without $NOTIFY_SOCKET)
        sup = Supervisor(log, shutdown_timeout=SHUTDOWN_TIMEOUT, notifier=notifier)
        sup.trap_stop_signals()
        notifier.status("starting: loading the kernels (compiling them on a first start)")
        _say_hello(log, opts, support)
        plan = Plan(opts, log)
        _prepare(plan, log, listeners)
        sync = MetadataSync(plan, NSQ_VERSION)
        _add_broker(sup, plan, log)
        if listeners.http is not None:
            _add_http(sup, plan, opts, log, listeners.http, listeners.https)
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
    listeners.say(log, ("TCP",))
    if not sup.wait_ready():  # the others
        return _failed_start(sup, log)
    sup.periodic.append(sync.poll)
    sup.periodic.append(mark_keeper())  # the kernel cache of a broker running for months stays "in use"
    listeners.say(log, ("HTTP", "HTTPS"))
    notifier.ready(f"serving {listeners.serving()}")  # every port bound, every child up
    return _supervise(sup)


if __name__ == "__main__":
    sys.exit(main())
