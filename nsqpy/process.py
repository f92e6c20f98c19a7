"""Process plumbing shared by the broker's supervisor and the gunicorn-hosted HTTP servers."""
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid=None, sig=signal.SIGKILL):
    """Ask the kernel to send ``sig`` (SIGKILL) to this (just forked) process when its parent dies, so that a
    crashed supervisor or arbiter never leaves children behind serving clients or holding shared memory. With
    ``parent_pid`` (the parent's pid before the fork), a parent that died before the request was made is caught
    too: exit at once."""
    import ctypes  # (here: a daemon imports this module first thing, and ctypes only matters after a fork)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        return  # not Linux, or refused: the supervisor's own shutdown still stops its children
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def _stop_before_start(signum, frame):
    raise SystemExit(0)


def stop_cleanly_while_importing(program):
    """When this process is ``program`` (run by its console script or ``python -m``): a SIGTERM/SIGINT that arrives
    while it still imports its modules ends it with exit code 0, as a stop at any later moment does (nothing has
    been created yet). The supervisor's own traps replace these handlers once it exists."""
    main = sys.modules.get("__main__")
    launched = os.path.basename(sys.argv[0] if sys.argv else "") == program or (
        getattr(main, "__spec__", None) is not None and main.__spec__.name.endswith(program))
    if launched and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _stop_before_start)


def ignore_interrupt():
    """SIGINT ignored from now on: a terminal's ^C reaches every process of the daemon's group, and its supervisor
    alone decides (it TERMs its children in order). A gunicorn arbiter and its workers call this from the hooks
    that run after gunicorn installed its own handlers (``when_ready``, ``post_worker_init``, which gunicorn calls
    with one argument)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
