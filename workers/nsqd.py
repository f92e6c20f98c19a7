"""The ``nsqd`` command: NSQ's broker, started with NSQ's flags.

    nsqd --tcp-address=127.0.0.1:4150 --data-path=/var/lib/nsqd --workers=2

Builds the options (flags > --config TOML > defaults), checks them against what nsqpy implements
(``nsqpy.config.support``: a refused security flag such as --tls-cert or --auth-http-address is one FATAL line
and exit code 1 before anything is created; an accepted flag without effect is one WARNING line), creates the
shared resources (``workers.plan``), binds the listener, forks the acceptor, the workers and the scanner under
the supervisor, and prints NSQ's start-up lines once every child reported ready, so that the "listening on" line
means connections are served.
"""
import platform
import sys
import time

from nsqpy.config import NsqdOptions
from nsqpy.config.support import check_support
from nsqpy.log import Logger
from workers.acceptor import acceptor_main
from workers.plan import Plan
from workers.scanner import scanner_main
from workers.supervisor import Supervisor
from workers.warmup import warm_up
from workers.worker import worker_main

NSQ_VERSION = "1.3.0"


def version_string():
    return f"nsqd v{NSQ_VERSION}-nsqpy (built w/{platform.python_implementation().lower()}{platform.python_version()})"


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


def main(argv=None):
    opts = NsqdOptions.parse_or_exit(sys.argv[1:] if argv is None else argv, "nsqd")
    if opts.version:
        print(version_string())
        return 0
    log = Logger(opts.log_prefix, opts.log_level.name.lower())
    support = check_support(opts)  # before anything is created: a refused flag leaves nothing behind
    for line in support.refusals:
        log.fatal(line)
    if support.refusals:
        return 1
    sup = Supervisor(log)
    sup.trap_stop_signals()
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
    plan = Plan(opts, log)
    try:
        t0 = time.monotonic()
        warm_up(plan.prefix)
        log.debug(f"kernels ready in {time.monotonic() - t0:.2f}s")
        plan.create()
        host, port = plan.bind()
    except (OSError, ValueError) as e:  # ValueError: a --tcp-address whose port is not a number
        log.fatal(f"failed to start: {e}")
        plan.destroy()
        return 1
    sup.cleanups.append(plan.destroy)
    sup.add("acceptor", lambda restarted, ready: acceptor_main(plan, restarted, ready, log))
    for w in range(plan.workers):
        sup.add(f"worker {w}", lambda restarted, ready, w=w: worker_main(plan, w, restarted, ready, log))
    sup.add("scanner", lambda restarted, ready: scanner_main(plan, restarted, ready, log))
    counters = {f"worker {w}": w for w in range(plan.workers)}
    counters["scanner"] = -1
    sup.on_restart = lambda child: child.name in counters and plan.control.count_restart(counters[child.name])
    sup.start()
    if not sup.wait_ready():
        log.fatal("a process failed to start")
        sup.shutdown()
        return 1
    shown = f"[{host}]" if ":" in host else host
    log.info(f"TCP: listening on {shown}:{port}")
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
