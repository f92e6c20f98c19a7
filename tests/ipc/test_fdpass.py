"""fd hand-over across real processes: a live TCP connection, bursts, dead peers, malformed messages, and no
fd leaks (every test counts /proc/self/fd before and after)."""
import os
import socket

import pytest

from _fork import fork, wait
from nsqpy.ipc.fdpass import MAX_BLOB, FdChannel, FdPassError, PeerGone, channel_pair

NEW_CONNECTION = 1


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def no_fd_leak():
    before = open_fds()
    yield
    assert open_fds() == before


def test_tcp_connection_moves_to_another_process():
    """The parent accepts a TCP connection, reads part of a request, hands the socket and the bytes read so far
    to a child and closes its copy; the child finishes the request and answers over the same connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server_side, _ = listener.accept()
    listener.close()
    ours, theirs = channel_pair()

    def child():
        ours.close(), client.close(), server_side.close()  # inherited copies: the connection must arrive by fd
        msg = theirs.recv(timeout=30)
        assert (msg.kind, msg.conn_id) == (NEW_CONNECTION, 42)
        conn = socket.socket(fileno=msg.fd)
        rest = b""
        while not rest.endswith(b"\n"):
            rest += conn.recv(100)
        conn.sendall(b"served by " + str(os.getpid()).encode() + b": " + msg.blob + rest)
        conn.close()

    pid = fork(child)
    theirs.close()
    try:
        client.sendall(b"PUB top")
        head = server_side.recv(3)  # the worker already consumed "PUB"; the rest stays in the socket
        ours.send(NEW_CONNECTION, 42, blob=head, fd=server_side.fileno(), timeout=30)
        server_side.close()
        client.sendall(b"ic\n")
        reply = b""
        while chunk := client.recv(100):
            reply += chunk
        assert reply == b"served by %d: PUB topic\n" % pid
        assert wait(pid, 30) == 0
    finally:
        client.close()
        ours.close()


def test_burst_of_fds_fills_and_drains():
    """Non-blocking: send until the socket is full (EAGAIN -> False), drain (None when empty), repeat; every fd
    arrives, in order, as a working copy of the one sent."""
    a, b = channel_pair()
    pipes = [os.pipe() for _ in range(300)]
    try:
        sent = received = 0
        full_seen = False
        while received < len(pipes):
            while sent < len(pipes) and a.try_send(7, sent, blob=b"x" * 1000, fd=pipes[sent][0]):
                sent += 1
            full_seen |= sent < len(pipes)
            while (msg := b.try_recv()) is not None:
                assert msg.conn_id == received and msg.blob == b"x" * 1000
                os.write(pipes[received][1], b"!")
                assert os.read(msg.fd, 1) == b"!"  # the received fd reads the pipe that was sent
                os.close(msg.fd)
                received += 1
        assert full_seen
        assert b.try_recv() is None
    finally:
        for r, w in pipes:
            os.close(r), os.close(w)
        a.close(), b.close()


def test_burst_across_processes_blocking():
    """A child sends 500 hand-overs (fds of its own sockets) as fast as it can; the parent receives them all."""
    ours, theirs = channel_pair()

    def child():
        ours.close()
        for i in range(500):
            x, y = socket.socketpair()
            y.sendall(b"%d" % i)
            theirs.send(NEW_CONNECTION, i, blob=b"%d" % i, fd=x.fileno(), timeout=30)
            x.close(), y.close()

    pid = fork(child)
    theirs.close()
    try:
        for i in range(500):
            msg = ours.recv(timeout=30)
            with socket.socket(fileno=msg.fd) as conn:
                assert msg.conn_id == i and conn.recv(10) == msg.blob == b"%d" % i
        with pytest.raises(PeerGone):  # the child exited: end-of-file after its last message
            ours.recv(timeout=30)
        assert wait(pid, 30) == 0
    finally:
        ours.close()


def test_receiver_dies_mid_stream():
    """The receiving child takes two hand-overs and dies with more queued: the sender then gets PeerGone, and
    the fds still queued were closed by the kernel (their pipes have no reader left)."""
    ours, theirs = channel_pair()
    pipes = [os.pipe() for _ in range(5)]

    def child():
        ours.close()
        for _ in range(2):
            os.close(theirs.recv(timeout=30).fd)
        os._exit(0)

    pid = fork(child)
    theirs.close()
    try:
        for i, (r, _) in enumerate(pipes):
            ours.send(NEW_CONNECTION, i, fd=r, timeout=30)
            os.close(r)
        assert wait(pid, 30) == 0
        with pytest.raises(PeerGone):
            ours.send(NEW_CONNECTION, 99, timeout=30)
        for _, w in pipes:
            with pytest.raises(BrokenPipeError):
                os.write(w, b"?")
    finally:
        for _, w in pipes:
            os.close(w)
        ours.close()


def test_sender_killed_mid_stream():
    """A child killed while sending leaves whole messages only: everything received parses, then PeerGone."""
    ours, theirs = channel_pair()

    def child():
        ours.close()
        i = 0
        while True:
            x, y = socket.socketpair()
            theirs.send(NEW_CONNECTION, i, blob=bytes(i % 200), fd=x.fileno())
            x.close(), y.close()
            i += 1

    pid = fork(child)
    theirs.close()
    try:
        for i in range(50):
            msg = ours.recv(timeout=30)
            assert msg.conn_id == i
            os.close(msg.fd)
        os.kill(pid, 9)
        assert wait(pid, 30) == 9
        n = 50
        with pytest.raises(PeerGone):
            while True:
                msg = ours.recv(timeout=30)
                assert msg.conn_id == n and msg.blob == bytes(n % 200)
                os.close(msg.fd)
                n += 1
    finally:
        ours.close()


def test_malformed_messages_close_their_fds():
    raw_a, raw_b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b = FdChannel(raw_b)
    r, w = os.pipe()
    try:
        socket.send_fds(raw_a, [b"not a hand-over header"], [r])
        socket.send_fds(raw_a, [b"short"], [])
        for _ in range(2):
            with pytest.raises(FdPassError):
                b.try_recv()
        os.close(r)
        with pytest.raises(BrokenPipeError):  # the fd received with the bad message was closed
            os.write(w, b"?")
    finally:
        os.close(w)
        raw_a.close(), b.close()


def test_limits_and_timeouts():
    a, b = channel_pair()
    try:
        a.send(3, 2**64 - 1, blob=b"z" * MAX_BLOB)
        msg = b.recv(timeout=5)
        assert (msg.kind, msg.conn_id, len(msg.blob), msg.fd) == (3, 2**64 - 1, MAX_BLOB, -1)
        with pytest.raises(ValueError):
            a.try_send(3, 1, blob=bytes(MAX_BLOB + 1))
        with pytest.raises(TimeoutError):
            b.recv(timeout=0.05)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stream, pytest.raises(ValueError):
            FdChannel(stream)
    finally:
        a.close(), b.close()
