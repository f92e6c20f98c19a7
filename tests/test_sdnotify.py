"""nsqpy.sdnotify against a real datagram socket: the environment it honours, the datagrams it sends."""
import os
import socket

from nsqpy.sdnotify import Notifier
from tests.notify_socket import NotifySocket


def test_without_notify_socket_nothing_is_sent():
    n = Notifier.from_environ({})
    assert not n.enabled and not n.ready("x") and n.watchdog_s is None


def test_ready_status_stopping(tmp_path):
    sock = NotifySocket(tmp_path / "n")
    try:
        n = Notifier.from_environ({"NOTIFY_SOCKET": sock.path})
        assert n.status("warming up")
        assert n.ready("serving")
        assert n.stopping("saving")
        assert sock.next(5) == {"STATUS": "warming up"}
        assert sock.next(5) == {"READY": "1", "STATUS": "serving", "MAINPID": str(os.getpid())}
        assert sock.next(5) == {"STOPPING": "1", "STATUS": "saving"}
    finally:
        sock.close()


def test_abstract_address_and_watchdog_of_this_process_only():
    name = f"nsqpy-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        n = Notifier.from_environ({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "2000000"})
        assert n.watchdog_s == 2.0
        n.keepalive()  # due at once before READY
        s.settimeout(5)
        assert s.recv(100) == b"WATCHDOG=1"
        assert 0.9 < n.keepalive_wait(5.0) <= 1.0  # the next one at half the timeout
    other = Notifier.from_environ({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_s is None
