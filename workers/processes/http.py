"""The HTTP API's processes: gunicorn, forked from the nsqd supervisor, serving ``nsqpy.http_api.nsqd_app``.

    supervisor --fork--> "http": gunicorn's arbiter (restarted by the supervisor if it dies)
                              --fork--> gunicorn worker 0..N-1 (restarted by the arbiter; each a producer slot)

Theory of operation
-------------------
* nsqd binds --http-address (and --https-address) before anything else, as it binds the TCP listener
  (``nsqd._bind_listeners``): a bind error stops nsqd at start, port 0 is resolved once, and a restarted arbiter
  serves the same socket (connections queue in its backlog meanwhile). The arbiter gets it as a pre-set
  listener, never binds itself. With HTTPS, a second arbiter serves the same app on producer slots of its own
  (``split_slots``).
* Each gunicorn worker inherits the Plan through two forks and builds, after its fork, a ``StatsReader`` (reads)
  and a ``ControlPlane`` (publishes, commands) on its own producer slot. Slots: ``plan.workers`` upwards,
  ``plan.producers - 1`` left to the nsqlookupd registrar. The arbiter picks the slot in ``pre_fork``: the
  lowest one no live gunicorn worker holds. A dead worker has been reaped before its replacement is forked, so
  the replacement takes the free slot over, and ``ControlPlane`` resumes that ring at its committed tail: a 200
  OK for /pub means committed, and a SIGKILLed worker loses none of them (at worst its last publish is appended
  twice, if it died between commit and answer: the client saw no answer and may retry anyway).
* Gunicorn workers die with their arbiter (PR_SET_PDEATHSIG): a replacement arbiter's workers take the same
  slots, and a ring has one writer.
* gunicorn's own systemd notification is switched off (NOTIFY_SOCKET removed): nsqd's supervisor is the
  service. Its log lines go through nsqpy's logger in NSQ's format (its INFO chatter at DEBUG).
* Ready: the last of the arbiter's first workers to boot (app loaded, handlers set: ``post_worker_init``)
  writes the child's ready byte; only then does nsqd count HTTP as served (its ``serving ...: every process is
  up`` line and systemd's READY=1; after a cold start, its ``HTTP: listening on`` line too). /config/log_level
  is shared by the HTTP processes through one word of shared memory.
"""
from __future__ import annotations

import mmap
import os
import signal
import socket
import sys

from nsqpy.broker.health import unhealthy_reason

WORKER_CLASSES = ("sync", "gthread", "asgi")
PUBLISH_TIMEOUT = 10.0   # seconds a /pub waits for room in the owner's ring before 503 EXITING
COMMAND_TIMEOUT = 10.0   # seconds a /topic/... or /channel/... waits for the owner's answer


def split_slots(plan, https):
    """(HTTP slots, HTTPS slots): with HTTPS, each arbiter gets --http-workers slots of its own."""
    slots = http_slots(plan)
    if not https:
        return slots, []
    n = max(1, min(plan.opts.http_workers, len(slots) // 2))
    return slots[:n], slots[n:2 * n]


def http_slots(plan) -> list:
    """The producer slots gunicorn workers may use (the last one is the nsqlookupd registrar's)."""
    return list(range(plan.workers, plan.producers - 1))


def http_main(plan, sock, restarted, ready_fd, log, version_line, workers, worker_class, threads, slots=None,
              tls=False):
    os.environ.pop("NOTIFY_SOCKET", None)
    from nsqpy.workers.processes.http_gunicorn import NsqdGunicorn  # here, not at the top: the supervisor never imports gunicorn
    # What each gunicorn worker imports to build its app (build_deps, create_app): imported once here, before the
    # arbiter forks them, instead of after each fork (falcon, the app, prometheus_client: ~0.2 s per worker on a
    # loaded machine, on the cores the broker's own processes start on). Nothing here starts a thread or a loop.
    import nsqpy.broker.stats  # noqa: F401
    import nsqpy.http_api.metrics  # noqa: F401
    import nsqpy.http_api.nsqd_app  # noqa: F401
    import nsqpy.workers.control.client  # noqa: F401
    if worker_class == "asgi":
        import falcon.asgi  # noqa: F401

    level = SharedLevel(log.level)
    slots = http_slots(plan) if slots is None else slots
    deps = lambda slot: build_deps(plan, slot, log, level, version_line)  # noqa: E731 (in each gunicorn worker)
    NsqdGunicorn(plan, sock, ready_fd, log, level, deps, workers, worker_class, threads, slots, tls).run()


class SharedLevel:
    """The log level of the HTTP processes: one byte of an anonymous shared mapping made before gunicorn forks
    its workers, so a PUT /config/log_level in one worker is seen by all (the broker's workers keep theirs)."""

    def __init__(self, level):
        self._map = mmap.mmap(-1, mmap.PAGESIZE)
        self._map[0] = level

    def get(self) -> int:
        return self._map[0]

    def set(self, level: int) -> None:
        self._map[0] = level


def build_deps(plan, slot, log, level, version_line):
    """The app's dependencies in a gunicorn worker: the stats plane and a control plane on ``slot``."""
    from nsqpy.http_api.metrics import broker_metrics
    from nsqpy.http_api.nsqd_app import NsqdDeps, PublishRefused
    from nsqpy.broker.stats import StatsReader
    from nsqpy.workers.control import commands as CMD
    from nsqpy.workers.control.client import TIMEOUT, ControlPlane, PublishFailed, PublishTimeout
    from nsqpy.workers.storage.policy_file import PolicyBook

    reader = StatsReader.from_plan(plan)
    cp = ControlPlane(plan, slot)
    opts = plan.opts

    def publish(topic, bodies, defer_ms):
        try:
            cp.publish(topic, bodies, defer_ms, PUBLISH_TIMEOUT)
        except (PublishFailed, PublishTimeout) as e:
            log.error(f"HTTP: publish to {topic} failed: {e}")
            raise PublishRefused(str(e)) from None

    def command(op, topic, channel):
        status = cp.command(op, topic, channel, COMMAND_TIMEOUT)
        if status == TIMEOUT:
            log.error(f"HTTP: {op} {topic} {channel or ''}: no answer from the topic's owner in time")
            return "TIMEOUT"
        return CMD.STATUS_NAMES.get(status, str(status))

    def get_lookupd():
        from nsqpy.workers.processes.lookupd_link import get_addresses  # lazily: only /config/nsqlookupd_tcp_addresses needs it
        return get_addresses(plan)

    def set_lookupd(addrs):
        from nsqpy.workers.processes.lookupd_link import set_addresses  # every broker process sees the change (a shared file)
        set_addresses(plan, addrs)

    tcp_port = plan.listener.getsockname()[1] if plan.listener is not None else -1
    http_port = getattr(plan, "http_port", -1)
    info = {"version": "1.3.0", "broadcast_address": opts.broadcast_address, "hostname": socket.gethostname(),
            "http_port": http_port, "tcp_port": tcp_port,
            "start_time": reader.board.global_word(0), "max_heartbeat_interval": opts.max_heartbeat_interval,
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": opts.max_output_buffer_timeout, "max_deflate_level": opts.max_deflate_level}
    return NsqdDeps(opts=opts, stats=reader.stats, publish=publish, command=command, info=info,
                    version_line=version_line, health=lambda: unhealthy_reason(plan), get_lookupd=get_lookupd,
                    set_lookupd=set_lookupd, get_log_level=level.get, set_log_level=level.set,
                    metrics=lambda: broker_metrics(reader, lambda: _extras(plan, reader)), log=log,
                    https_port=getattr(plan, "https_port", -1), policies=PolicyBook(plan.data_path, opts, log))


def _extras(plan, reader):
    """What /metrics adds to the stats: processes (pid by name), restarts, full topics per worker."""
    from nsqpy.ipc.statrows import B_PID
    from nsqpy.workers.control.block import FULL_SLOTS

    board = reader.board
    processes = {f"worker {w}": board.word(w, B_PID) for w in range(plan.workers)}
    processes.update({"http": os.getpid(), "http arbiter": os.getppid()})
    restarts = plan.control.restarts()
    names = [f"worker {w}" for w in range(plan.workers)] + ["scanner"]
    ctl = plan.control
    full = [int((ctl.w[ctl._full_slot(w, 0):ctl._full_slot(w, 0) + FULL_SLOTS] != 0).sum())
            for w in range(plan.workers)]
    return {"processes": processes, "restarts": dict(zip(names, restarts)), "topics_full": full}


def statsd_main(plan, restarted, ready_fd, log, http_port):
    """The statsd pusher: one process (not every gunicorn worker), pushing every --statsd-interval."""
    from nsqpy.http_api.statsd import StatsdPusher
    from nsqpy.broker.stats import StatsReader

    pusher = StatsdPusher(StatsReader.from_plan(plan), plan.opts, http_port, log)
    os.write(ready_fd, b"d")
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    pusher.run()
