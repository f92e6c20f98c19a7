"""The broker's life cycle as an operator sees it: a stop requested while nsqd is still starting (systemd's
stop right after start, a test harness giving up) must end in a clean exit, with no child left running and no
shared memory left behind."""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from nsqpy.ipc.shm import instance_prefix
from nsqpy.protocol import client as C
from tests.broker.conftest import HTTP_LISTEN_RE, LISTEN_RE, START_DEADLINE
from tests.broker.wire import Conn, consumer, unique
from tests.logged_process import group_pids, running
from tests.polling import wait_until
from tests.terminal import TerminalProcess

SHUTDOWN_DEADLINE = 90.0


@pytest.mark.parametrize("moment", ["importing", "warming up", "starting its children"])
def test_sigterm_during_start_up_exits_cleanly(tmp_path, moment):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0",
                             "--http-address=127.0.0.1:0", f"--data-path={tmp_path}", "--node-id=9", "--workers=2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        if moment == "importing":
            time.sleep(0.3)  # the stimulus's moment, not a synchronisation: imports (or later) at any load
        else:  # the version line: nsqd is now warming up, nothing forked yet; then the HTTP child's start
            want = "nsqd v1.3.0-nsqpy" if moment == "warming up" else "http: started"
            while want not in (line := proc.stdout.readline().decode()):
                assert line, f"nsqd ended before {want!r}"
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert "ERROR" not in out and "FATAL" not in out, out
    deadline = time.monotonic() + 10
    while True:  # the children are gone with it: nobody is left in its process group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a child of nsqd outlived it"
        time.sleep(0.05)  # polling for processes to disappear; there is no event to wait on
    prefix = instance_prefix(str(tmp_path), 9).lstrip("/")
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(prefix)]


# ---- the supervisor killed alone, a terminal's ^C, SIGTERM ---------------------------------------------------

N = 300
LOSS_WORDS = ("did not stop cleanly", "could not be saved", "lost", "recovering the messages a crashed")


def _backlog(address, topic):
    """N messages acknowledged: queued, and 20 of them in flight on a consumer that stays connected."""
    bodies = [b"m%04d" % i for i in range(N)]
    with Conn(address) as p:
        p.send(C.mpub(topic, bodies))
        p.expect_response(b"OK")
    holder = consumer(address, topic, "ch", rdy=20)
    holder.read_messages(20)
    return bodies, holder


def _drain_all(address, topic, bodies):
    with consumer(address, topic, "ch", rdy=len(bodies)) as c:
        got = []
        for _ in bodies:
            m = c.read_message()
            got.append(m.body)
            c.send(C.fin(m.id))
        c.sync()
    assert sorted(got) == bodies


def test_sigkill_of_the_supervisor_alone_takes_every_child_and_frees_the_ports(nsqd_factory):
    old = nsqd_factory()
    (_, port), (_, http_port) = old.address, old.http_address
    topic = unique()
    bodies, holder = _backlog(old.address, topic)
    children = [pid for pid in group_pids(old.proc.pid) if pid != old.proc.pid]
    assert len(children) >= 5, children  # acceptor, 2 workers, scanner, http (and its gunicorn workers)
    os.kill(old.proc.pid, signal.SIGKILL)
    old.proc.wait()
    old.expected_code = -signal.SIGKILL
    wait_until(lambda: not any(map(running, children)), timeout=1.0, what="every child of nsqd gone")
    holder.expect_closed()
    new = nsqd_factory(f"--tcp-address=127.0.0.1:{port}", f"--http-address=127.0.0.1:{http_port}",
                       data=old.data_path)
    assert new.address[1] == port and new.http_address[1] == http_port
    _drain_all(new.address, topic, bodies)


def _terminal_nsqd(data):
    proc = TerminalProcess("nsqpy.workers.processes.nsqd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                            f"--data-path={data}", "--workers=2", "--node-id=7"])
    with proc.starting():
        m = proc.wait_for_line(LISTEN_RE, START_DEADLINE)
        proc.wait_for_line(HTTP_LISTEN_RE, START_DEADLINE)
    return proc, (m.group(1), int(m.group(2)))


@pytest.mark.parametrize("how", ["terminal ^C", "SIGTERM"])
def test_a_stop_is_clean_and_the_next_start_loads_everything(nsqd_factory, tmp_path, how):
    data = tmp_path / "data"
    data.mkdir()
    proc, address = _terminal_nsqd(data)
    try:
        topic = unique()
        bodies, holder = _backlog(address, topic)
        if how == "SIGTERM":
            proc.proc.send_signal(signal.SIGTERM)
        else:
            proc.interrupt()
        code = proc.proc.wait(SHUTDOWN_DEADLINE)
        proc._reader.join(5)
    finally:
        if proc.proc.poll() is None:
            os.killpg(proc.proc.pid, signal.SIGKILL)
    holder.close()
    out = proc.output()
    stop = out[out.index("signal received, shutting down"):]
    assert code == 0, out
    assert "WARNING" not in stop and "ERROR" not in stop, stop
    wait_until(lambda: not [pid for pid in group_pids(proc.proc.pid) if running(pid)], timeout=10,
               what="no child of nsqd left")  # (zombies are its reaper's to collect)
    again = nsqd_factory(data=data)
    said = again.output()
    assert not [w for w in LOSS_WORDS if w in said], said
    _drain_all(again.address, topic, bodies)


# ---- a warm start listens before its kernels load; a stop says where its time went ----------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connect(port):
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=60)
    except ConnectionRefusedError:
        return None


def test_a_connection_made_before_the_listening_line_is_served_and_the_stop_says_where_its_time_went(tmp_path):
    """A warm nsqd listens as soon as it knows its kernels are cached, before they load: a client that connects
    then is queued by the kernel, not refused, and its PUB is answered once the workers are up. NSQ's listening
    line still comes only once TCP is served. The stop ends with one line naming each step's time."""
    port = _free_port()
    log = tmp_path / "nsqd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "nsqpy.workers.processes.nsqd", f"--tcp-address=127.0.0.1:{port}",
                                 "--http-address=127.0.0.1:0", f"--data-path={tmp_path}", "--workers=2"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        sock = wait_until(lambda: _connect(port), timeout=START_DEADLINE, what="a connection to nsqd",
                          interval=0.005)
        with sock:
            early = "TCP: listening on" not in log.read_text()  # (a cold cache listens after its compile)
            sock.sendall(C.MAGIC_V2 + C.pub(unique(), b"x"))
            reply = b""
            while len(reply) < 10:
                chunk = sock.recv(64)
                assert chunk, reply
                reply += chunk
            assert reply[8:10] == b"OK", reply
        # its line follows once the supervisor has every broker child's ready byte: the workers may answer the
        # queued PUB a moment before it reads the scanner's
        wait_until(lambda: "TCP: listening on" in log.read_text(), timeout=START_DEADLINE, what="TCP's line")
        said = log.read_text()
        if "compiling" not in said:
            assert early, said
        wait_until(lambda: "HTTP: listening on" in log.read_text(), timeout=START_DEADLINE, what="HTTP served")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(SHUTDOWN_DEADLINE) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stopped = [line for line in log.read_text().splitlines() if "stopped in" in line]
    assert len(stopped) == 1, log.read_text()
    assert re.search(r"stopped in [0-9.]+s: acceptor\+http [0-9.]+s, worker 0\+worker 1 [0-9.]+s, "
                     r"scanner [0-9.]+s, cleanups [0-9.]+s$", stopped[0]), stopped
