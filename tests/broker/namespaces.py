"""Helpers for tests that reach into the broker's processes and surroundings.

* ``namespaced_factory``: start nsqd inside a private mount namespace where /dev/shm and the data path are small
  tmpfs mounts of our own, so that a test can fill them without touching the host (needs root; tests skip with
  the reason otherwise). ``unshare --mount --propagation private`` runs ``sh``, which mounts the two tmpfs and
  then execs ``python -m nsqpy.workers.processes.nsqd``, so the Popen'ed pid is the broker's supervisor, as with conftest's
  ``Nsqd``. The mounts live as long as the namespace, which ends with the broker: nothing to clean up on the host.
  Its files can still be read from outside through ``/proc/<pid>/root/...`` (``NamespacedNsqd.inside``).
* ``worker_pids`` / ``kill_workers``: SIGKILL the broker's worker processes (not the acceptor nor the scanner,
  which are children too and run the same command line): pids come from the supervisor's log lines
  ``worker N: started (pid P)``, as in test_stress.py, and each kill waits for the replacement's line.
* ``worker_serving`` / ``connections_on_every_worker``: which worker holds a connection (its socket's inode in
  the worker's /proc/<pid>/fd), and one connection on each worker, so that a test covers both the owner's own
  publishes and the ones forwarded to it through the rings.
* ``instance_shm_bytes``: what the broker's /dev/shm segments occupy (allocated blocks, not sizes).
* ``log_on_failure``: a failing assertion inside it also shows the broker's last log lines (its own account of
  why a connection closed or a worker died).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from nsqpy.ipc.shm import instance_prefix

@contextmanager
def log_on_failure(*brokers, lines=80, width=400):
    try:
        yield
    except AssertionError as e:
        logs = "\n".join(f"--- broker log (last {lines} lines, exit code {n.proc.poll()}):\n"
                         + "\n".join(line[:width] for line in n.lines[-lines:]) for n in brokers)
        raise AssertionError(f"{e}\n{logs}") from e


# ---- worker kills -------------------------------------------------------------------------------------------
WORKER_STARTED_RE = re.compile(r"(worker \d+): started \(pid (\d+)\)")
RESTART_DEADLINE = 60.0
# The supervisor gives up on a child that dies within 1 s of its start five times in a row (a restart storm):
# kills of one worker are spaced at least this long after its start, as test_stress.py does.
MIN_AGE = 1.5
_seen_started: dict[int, float] = {}   # pid -> when this process first saw its "started" line


def worker_pids(nsqd):
    """{"worker N": (pid, index of its latest 'started' line)} from the broker's log."""
    pids = {}
    for i, line in enumerate(nsqd.output().splitlines()):
        m = WORKER_STARTED_RE.search(line)
        if m:
            pids[m.group(1)] = (int(m.group(2)), i)
    for pid, _ in pids.values():
        _seen_started.setdefault(pid, time.monotonic())
    return pids


def kill_workers(nsqd, names=None, timeout=RESTART_DEADLINE):
    """SIGKILL the named workers (default: all of them, which includes every topic's owner) at once, and wait
    until the supervisor logged each replacement's start. Returns the killed pids."""
    pids = worker_pids(nsqd)
    victims = {n: pids[n] for n in (names or sorted(pids))}
    youngest = max(_seen_started[pid] for pid, _ in victims.values())
    wait = MIN_AGE - (time.monotonic() - youngest)
    if wait > 0:
        time.sleep(wait)  # spacing kills (see MIN_AGE), not synchronisation
    children = nsqd.child_pids()
    for name, (pid, _) in victims.items():
        assert pid in children, (f"{name} (pid {pid}, from the log) is no longer a child of the broker: it died by "
                                 f"itself; log:\n{nsqd.output()[-5000:]}")
        os.kill(pid, signal.SIGKILL)
    for name, (pid, line) in victims.items():
        m = nsqd.wait_for_line(re.compile(rf"{name}: started \(pid (\d+)\)"), timeout, line + 1)
        _seen_started.setdefault(int(m.group(1)), time.monotonic())
    return [pid for pid, _ in victims.values()]


# ---- which worker serves a connection -------------------------------------------------------------------------
def _server_socket_inode(broker_port, client_port):
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            cols = row.split()
            local, remote, inode = cols[1], cols[2], int(cols[9])
            if int(local.rsplit(":", 1)[1], 16) == broker_port and int(remote.rsplit(":", 1)[1], 16) == client_port:
                return inode
    return None


def worker_serving(nsqd, conn, timeout=RESTART_DEADLINE):
    """The name ("worker N") of the worker process holding the broker's end of ``conn`` (found through the
    socket's inode in /proc/net/tcp and the workers' /proc/<pid>/fd). Polls until the hand-over from the acceptor
    is done, so call it after a command on ``conn`` was answered."""
    client_port = conn.sock.getsockname()[1]
    deadline = time.monotonic() + timeout
    while True:
        inode = _server_socket_inode(nsqd.port, client_port)
        if inode is not None:
            target = f"socket:[{inode}]"
            for name, (pid, _) in worker_pids(nsqd).items():
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except FileNotFoundError:
                    continue
                for fd in fds:
                    try:
                        if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                            return name
                    except OSError:
                        pass
        assert time.monotonic() < deadline, f"no worker holds the connection from port {client_port}"
        time.sleep(0.02)  # polling /proc while the acceptor hands the connection over


def connections_on_every_worker(nsqd, connect, tries=16):
    """One connection per worker, from ``connect()`` (which must return a connection whose first command was
    answered): connects until every worker holds one (the acceptor gives each new connection to the least loaded
    worker), closing the spares. -> {"worker N": conn}."""
    want = set(worker_pids(nsqd))
    got, spare = {}, []
    try:
        for _ in range(tries):
            c = connect()
            name = worker_serving(nsqd, c)
            if name in got:
                spare.append(c)
            else:
                got[name] = c
            if set(got) == want:
                return got
        spare += got.values()
        raise AssertionError(f"after {tries} connections only {sorted(got)} of {sorted(want)} held one")
    finally:
        for c in spare:
            c.close()


# ---- /dev/shm accounting ------------------------------------------------------------------------------------
def instance_shm_bytes(data_path, node_id, root="/"):
    """Bytes allocated (st_blocks * 512) by the /dev/shm files of one broker instance."""
    prefix = instance_prefix(data_path, node_id).lstrip("/")
    shm = os.path.join(root, "dev/shm")
    total = 0
    with os.scandir(shm) as it:
        for e in it:
            if e.name.startswith(prefix):
                try:
                    total += e.stat(follow_symlinks=False).st_blocks * 512
                except FileNotFoundError:
                    pass  # unlinked while we looked
    return total


# ---- nsqd in a private mount namespace ----------------------------------------------------------------------
def namespaces_available():
    """None if this process may run nsqd in a private mount namespace with tmpfs mounts, else the reason why
    not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "needs root: mounting tmpfs on /dev/shm and the data path in a private mount namespace"
    try:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare is not usable here: {e}"
    if r.returncode != 0:
        return f"unshare --mount / mount -t tmpfs failed here (exit {r.returncode}): {r.stderr.strip()}"
    return None


def namespaced_factory(nsqd_factory, base, started, shm_size="192m", data_size="64m"):
    """A factory like conftest's ``nsqd_factory`` whose brokers run in their own mount namespace with a
    ``shm_size`` tmpfs on /dev/shm and a ``data_size`` tmpfs on their data path. ``nsqd_factory`` is conftest's
    fixture value: its module globals give the ``Nsqd`` class (reused for the log reading, waits and stop) and
    the listening-line pattern. Started brokers are appended to ``started`` (stop them with conftest's
    ``_stop_all``: its /dev/shm check looks at the host's, where these brokers leave nothing in any case)."""
    conftest = nsqd_factory.__globals__
    Nsqd, listen_re, start_deadline = conftest["Nsqd"], conftest["LISTEN_RE"], conftest["START_DEADLINE"]

    class NamespacedNsqd(Nsqd):
        def __init__(self, argv, data_path, node_id):  # Nsqd.__init__ with another command line
            self.data_path = data_path
            self.node_id = node_id
            self.lines = []
            self._cond = threading.Condition()
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
            m = self.wait_for_line(listen_re, start_deadline)
            self.host, self.port = m.group(1), int(m.group(2))

        def inside(self, path):
            """``path`` as the broker sees it (in its mount namespace), for reading from this process."""
            return f"/proc/{self.proc.pid}/root/{path.lstrip('/')}"

        def shm_bytes(self):
            return instance_shm_bytes(self.data_path, self.node_id, root=self.inside("/"))

        def usage(self):
            """(used, size) in bytes of the broker's /dev/shm and data path file systems."""
            out = {}
            for what, path in (("shm", "/dev/shm"), ("data", self.data_path)):
                st = os.statvfs(self.inside(path))
                out[what] = ((st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize)
            return out

    def start(*flags, workers=2, node_id=7):
        reason = namespaces_available()
        if reason:
            pytest.skip(reason)
        data = base / f"nsdata{len(started)}"
        data.mkdir()
        args = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={data}",
                f"--workers={workers}",
                f"--node-id={node_id}", *flags]
        nsqd_cmd = shlex.join([sys.executable, "-m", "nsqpy.workers.processes.nsqd", *args])
        script = (f"mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && "
                  f"mount -t tmpfs -o size={data_size} tmpfs {shlex.quote(str(data))} && "
                  f"cd {shlex.quote(os.getcwd())} && exec {nsqd_cmd}")
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]
        n = NamespacedNsqd(argv, str(data), node_id)
        started.append(n)
        return n

    return start
