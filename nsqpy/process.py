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


def launched_as(program):
    """This process is ``program``: run by its console script or ``python -m`` (not imported by a test)."""
    main = sys.modules.get("__main__")
    return os.path.basename(sys.argv[0] if sys.argv else "") == program or (
        getattr(main, "__spec__", None) is not None and main.__spec__.name.endswith(program))


def exit_at_once(code):
    """End this process now with ``code``, once its output is flushed: for a daemon's last step, after everything
    it holds is saved and its children are reaped. The interpreter's teardown (freeing every module's objects,
    numba's and LLVM's included: 0.05-0.1 s) would change nothing any more; atexit handlers do not run."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code if isinstance(code, int) else 1)


def _stop_before_start(signum, frame):
    raise SystemExit(0)


def stop_cleanly_while_importing(program):
    """When this process is ``program`` (run by its console script or ``python -m``): a SIGTERM/SIGINT that arrives
    while it still imports its modules ends it with exit code 0, as a stop at any later moment does (nothing has
    been created yet). The supervisor's own traps replace these handlers once it exists."""
    if launched_as(program) and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _stop_before_start)


def ignore_interrupt():
    """SIGINT ignored from now on: a terminal's ^C reaches every process of the daemon's group, and its supervisor
    alone decides (it TERMs its children in order). A gunicorn arbiter and its workers call this from the hooks
    that run after gunicorn installed its own handlers (``when_ready``, ``post_worker_init``, which gunicorn calls
    with one argument)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def wait_for_exits(pids, deadline):
    """Block until every process of ``pids`` (children of this one) has exited, or until ``deadline``
    (time.monotonic()); -> the pids still running. Each exit wakes the wait at once (a pidfd per process, polled
    together), where a loop of ``waitpid(WNOHANG)`` and sleeps took up to a sleep per child. Nothing is reaped: the
    caller collects the exit statuses with ``waitpid`` as before. Without pidfds (not Linux >= 5.3), a 10 ms poll."""
    import select
    import time
    left = {}
    try:
        try:
            for pid in pids:
                try:
                    left[os.pidfd_open(pid)] = pid
                except ProcessLookupError:
                    pass  # already reaped
        except (AttributeError, OSError):
            return _poll_exits([p for p in pids if _running(p)], deadline)
        poller = select.poll()
        for fd in left:
            poller.register(fd, select.POLLIN)
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0:
                break
            for fd, _ in poller.poll(wait * 1000):
                poller.unregister(fd)
                os.close(fd)
                del left[fd]
        return sorted(left.values())
    finally:
        for fd in left:
            os.close(fd)


def _poll_exits(pids, deadline):
    import time
    while pids and time.monotonic() < deadline:
        time.sleep(0.01)  # no exit event to wait on without pidfds
        pids = [pid for pid in pids if _running(pid)]
    return pids


def _running(pid):
    """A child that has not exited yet (a zombie has: its status waits for the caller's waitpid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False
