"""Process plumbing shared by the broker's supervisor and the gunicorn-hosted HTTP servers."""
import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid=None, sig=signal.SIGKILL):
    """Ask the kernel to send ``sig`` (SIGKILL) to this (just forked) process when its parent dies, so that a
    crashed supervisor or arbiter never leaves children behind serving clients or holding shared memory. With
    ``parent_pid`` (the parent's pid before the fork), a parent that died before the request was made is caught
    too: exit at once."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        return  # not Linux, or refused: the supervisor's own shutdown still stops its children
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
