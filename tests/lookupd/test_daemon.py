"""nsqlookupd as a daemon: killed alone (SIGKILL of its supervisor), its children die with it and free the ports at
once; a terminal's ^C and SIGTERM are clean stops (exit 0, no warning); under systemd's Type=notify it says when
it is ready and stopping, and pings the watchdog."""
from __future__ import annotations

import os
import signal
import socket

import pytest

from lookupd_wire import DEADLINE, HTTP_RE, TCP_RE
from tests.logged_process import group_pids, running
from tests.notify_socket import NotifySocket
from tests.polling import wait_until
from tests.terminal import TerminalProcess


def test_sigkill_of_the_supervisor_alone_takes_every_child_and_frees_the_ports(lookupd_factory):
    old = lookupd_factory()
    # a client in the middle of a request: an HTTP worker stopping gracefully would wait for it
    slow = socket.create_connection(old.http_address)
    slow.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n")
    status, _, _ = old.request("GET", "/ping")  # the sync point: the other worker serves, the slow one is busy
    assert status == 200
    children = [pid for pid in group_pids(old.proc.pid) if pid != old.proc.pid]
    assert len(children) >= 3, children  # the registry, gunicorn's arbiter and its workers
    os.kill(old.proc.pid, signal.SIGKILL)
    old.proc.wait()
    old.stop()  # reaps its output; exit code -9 is this test's doing
    old.proc.returncode = 0  # (the fixture requires 0 at teardown)
    wait_until(lambda: not any(map(running, children)), timeout=1.0, what="every child of nsqlookupd gone")
    slow.close()
    new = lookupd_factory(f"--tcp-address={old.tcp}", f"--http-address={old.http}")
    assert (new.tcp, new.http) == (old.tcp, old.http)
    assert new.request("GET", "/ping")[0] == 200


@pytest.mark.parametrize("how", ["terminal ^C", "SIGTERM"])
def test_a_stop_is_clean(how):
    proc = TerminalProcess("nsqpy.http_api.lookupd.main", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"])
    try:
        with proc.starting():
            proc.wait_for_line(TCP_RE, DEADLINE)
            http = proc.wait_for_line(HTTP_RE, DEADLINE)
        with socket.create_connection((http.group(1), int(http.group(2)))) as conn:  # served: the sync point
            conn.sendall(b"GET /ping HTTP/1.0\r\n\r\n")
            assert conn.recv(100).startswith(b"HTTP/1.")
        if how == "SIGTERM":
            proc.proc.send_signal(signal.SIGTERM)
        else:
            proc.interrupt()
        code = proc.proc.wait(DEADLINE)
        proc._reader.join(5)
    finally:
        if proc.proc.poll() is None:
            os.killpg(proc.proc.pid, signal.SIGKILL)
    out = proc.output()
    assert code == 0, out
    stop = out[out.index("signal received"):]
    assert "WARNING" not in stop and "ERROR" not in stop, stop
    wait_until(lambda: not [pid for pid in group_pids(proc.proc.pid) if running(pid)], timeout=10,
               what="no child of nsqlookupd left")  # (zombies are its reaper's to collect)


def test_notifies_systemd(lookupd_factory, tmp_path, monkeypatch):
    notify = NotifySocket(tmp_path / "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", notify.path)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    try:
        lk = lookupd_factory()
        ready = notify.wait_for("READY", DEADLINE)
        assert ready["STATUS"] == f"serving TCP on {lk.tcp}, HTTP on {lk.http}", ready
        assert lk.request("GET", "/ping")[0] == 200
        notify.wait_for("WATCHDOG", DEADLINE)
        lk.proc.send_signal(signal.SIGTERM)
        assert notify.wait_for("STOPPING", DEADLINE)["STOPPING"] == "1"
    finally:
        notify.close()
