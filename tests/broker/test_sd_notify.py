"""nsqd under systemd's Type=notify (a test NOTIFY_SOCKET): STATUS while it starts, READY=1 only once its ports
serve (the status names them: the test uses no log line), watchdog pings at half of WATCHDOG_USEC, STOPPING=1
at SIGTERM."""
from __future__ import annotations

import http.client
import re
import signal
import statistics

from nsqpy.protocol import client as C
from tests.broker.wire import Conn, unique
from tests.notify_socket import NotifySocket

WATCHDOG_S = 1.0
SERVING_RE = re.compile(r"TCP on ([0-9.]+):(\d+), HTTP on ([0-9.]+):(\d+)")


def test_ready_after_the_ports_serve_then_watchdog_pings_then_stopping(nsqd_factory, tmp_path, monkeypatch):
    notify = NotifySocket(tmp_path / "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", notify.path)
    monkeypatch.setenv("WATCHDOG_USEC", str(int(WATCHDOG_S * 1e6)))
    try:
        n = nsqd_factory()
        first = notify.next(30)
        assert "READY" not in first and first["STATUS"].startswith("starting"), first
        ready = notify.wait_for("READY", 60)
        m = SERVING_RE.search(ready["STATUS"])
        assert m, ready
        with Conn((m.group(1), int(m.group(2)))) as p:  # served once READY=1 is sent
            p.send(C.pub(unique(), b"x"))
            p.expect_response(b"OK")
        web = http.client.HTTPConnection(m.group(3), int(m.group(4)), timeout=30)
        web.request("GET", "/ping")
        assert web.getresponse().status == 200
        web.close()
        assert int(ready["MAINPID"]) == n.proc.pid
        notify.drain()
        pings = [notify.wait_for("WATCHDOG", 30) and notify.received[-1][0] for _ in range(4)]
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        assert min(gaps) >= WATCHDOG_S / 2 * 0.9, gaps   # at half of the timeout, not faster
        assert statistics.median(gaps) < WATCHDOG_S, gaps  # within systemd's timeout
        n.proc.send_signal(signal.SIGTERM)
        stopping = notify.wait_for("STOPPING", 60)
        assert stopping["STOPPING"] == "1"
        assert n.stop() == 0
    finally:
        notify.close()
