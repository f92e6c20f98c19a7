"""The acceptor process: accepts TCP connections and hands each to the least loaded worker (SCM_RIGHTS).

It never reads from a connection. Load is the connection count each worker publishes in the control block plus
what this process handed out in the last few milliseconds (a burst of connects must not all land on the worker
whose count has not caught up yet).

Accept errors (after trio's serve_listeners policy): running out of fds or kernel memory (EMFILE, ENFILE,
ENOBUFS, ENOMEM) is logged and retried after a short pause, since connections finishing will free resources;
a connection that died in the backlog (ECONNABORTED, EPROTO) is skipped silently; anything else is a bug and
ends the process, which the supervisor restarts.
"""
import errno
import os
import signal
import time

from nsqpy.workers.connections.handover import NEW_CONNECTION

RESOURCE_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
SKIP_ERRORS = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR}
RECENT = 0.05


def acceptor_main(plan, restarted, ready_fd, log):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener = plan.listener
    listener.setblocking(True)
    control = plan.control
    senders = [send_end for _, send_end in plan.inboxes]
    recent = [0] * plan.workers
    window = time.monotonic()
    os.write(ready_fd, b"a")
    while True:
        try:
            conn, _ = listener.accept()
        except OSError as e:
            if e.errno in RESOURCE_ERRORS:
                log.error(f"TCP: accept failed: {e}; retrying")
                time.sleep(0.1)  # back off while resources free up; nothing else to wait on
                continue
            if e.errno in SKIP_ERRORS:
                continue
            raise
        now = time.monotonic()
        if now - window > RECENT:
            recent = [0] * plan.workers
            window = now
        w = min(range(plan.workers), key=lambda i: control.connections(i) + recent[i])
        recent[w] += 1
        try:
            senders[w].send(NEW_CONNECTION, 0, b"", conn.fileno(), timeout=5)
        except Exception as e:
            log.error(f"TCP: could not hand a connection to worker {w}: {e}")
        finally:
            conn.close()
