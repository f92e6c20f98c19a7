"""What nsqd checks before anything heavy (its imports, the warm-up, which can compile for tens of seconds): the data
path, and the wording of a listener that cannot be bound. Each failure is one line that says what is wrong and
what to do, instead of a traceback naming a file nsqd would have created (a journal, nsqd.dat) or an ``Address
already in use`` that names no address, after the compile.

nsqd binds its listeners for real right after ``check_data_path`` (``nsqd._bind_listeners``), and words a failure
with ``listen_error``; nsqlookupd and nsqadmin bind at once and word theirs with it too.
"""
from __future__ import annotations

import errno
import os
import tempfile


class PreflightError(Exception):
    """One line: why nsqd cannot start, and what to do."""


def check_data_path(path: str) -> None:
    if not os.path.exists(path):
        raise PreflightError(f"--data-path {path} does not exist: create it (mkdir -p {path}) or point "
                             f"--data-path at an existing directory")
    if not os.path.isdir(path):
        raise PreflightError(f"--data-path {path} is not a directory: point --data-path at a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".nsqpy-probe-", dir=path)
    except OSError as e:
        raise PreflightError(f"--data-path {path} is not writable ({e.strerror}): give the user nsqd runs as "
                             f"write access to it, or point --data-path elsewhere") from None
    os.close(fd)
    os.unlink(probe)


def listen_error(flag: str, address: str, e: OSError) -> str:
    """The line for a listener that cannot be bound (NSQ's ``listen (addr) failed`` words, and the way out)."""
    if e.errno == errno.EADDRINUSE:
        return (f"listen ({address}) failed - address already in use: another process listens there (an nsqd "
                f"already running?); stop it or choose another {flag}")
    if e.errno == errno.EADDRNOTAVAIL:
        return f"listen ({address}) failed - no such local address: {flag} must name an address of this host"
    if e.errno == errno.EACCES:
        return (f"listen ({address}) failed - permission denied: a port below 1024 needs privileges; choose "
                f"another {flag}")
    return f"listen ({address}) failed - {e.strerror or e}"
