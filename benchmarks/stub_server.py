"""The scaffolding of the stand-in servers (`sink_server`, `source_server`): just enough of nsqd's V2 side to
measure what a load generator can do on its own.

Theory of operation
-------------------
The parent binds the listening socket (port 0 gives a free port, read back at once), then forks `processes`
children that all accept on it, each running a selectors loop over its own connections. Because the socket
is listening before any child exists, a client may connect as soon as the address is known: there is nothing
to wait for. Each connection is a `Session` that feeds the codec's server parser (`V2Parser`), so a malformed
command from a tool gets nsqd's own error frame; subclasses decide what PUB/MPUB and SUB/RDY/FIN do.

Output is a queue of byte chunks sent with one `sendmsg` (scatter-gather, so pre-framed data is never copied);
a session wants write events only while that queue is not empty.

Counters live in an anonymous shared mapping, one row per child and one writer per row; the parent sums them
after the children exited. A child leaves on SIGTERM (seen through `signal.set_wakeup_fd`, so the loop blocks
in select with no polling).

Error handling: a protocol error sends its error frame and closes that connection; a reset connection is
just closed. Neither touches the other connections.
"""

from __future__ import annotations

import collections
import mmap
import multiprocessing
import os
import selectors
import signal
import socket

import numpy as np

from nsqpy.log import Logger
from nsqpy.protocol import client, commands as cmd
from nsqpy.protocol.errors import AuthDisabled, ProtocolError
from nsqpy.protocol.frames import CLOSE_WAIT_FRAME, OK_FRAME, response_frame
from nsqpy.protocol.identify import ServerSettings, negotiate_identify
from nsqpy.protocol.v2_parser import V2Parser

# One int64 counter row per serving process.
COUNTERS = ("connections", "commands", "msgs_in", "bytes_in", "msgs_out", "fins", "errors", "dropped")
_COL = {name: i for i, name in enumerate(COUNTERS)}
RECV_SIZE = 1 << 18
_SENDMSG_MAX = 512           # chunks per sendmsg call (IOV_MAX is 1024 on Linux)
# No compression or TLS: a load generator must never be granted a feature the stand-in cannot speak.
SETTINGS = ServerSettings(snappy_enabled=False, deflate_enabled=False)


def warm_up() -> None:
    """Run the parser's batch kernels once (MPUB split, FIN run) before the children fork, so none of them
    compiles or loads them from numba's cache in the middle of a measurement."""
    parser = V2Parser()
    parser.feed(client.magic() + client.mpub("warm", [b"x", b"y"]) + client.sub("warm", "up") + b"RDY 1\nRDY 2\n"
                + client.fin(b"0" * 16) + client.fin(b"1" * 16))


class Session:
    """One client connection: parse, dispatch by command type, queue replies, flush."""

    def __init__(self, sock: socket.socket, server: "ServingProcess"):
        self.sock = sock
        self.server = server
        self.parser = V2Parser()
        self.out: collections.deque = collections.deque()
        self.closed = False
        self.rdy = 0
        self.in_flight = 0
        self.subscribed = False
        self.settings = None
        self.interest = selectors.EVENT_READ
        self._dispatch = {
            cmd.Identify: self.on_identify, cmd.Auth: self.on_auth, cmd.Sub: self.on_sub,
            cmd.Pub: self.on_publish, cmd.Mpub: self.on_publish, cmd.Dpub: self.on_publish,
            cmd.Rdy: self.on_rdy, cmd.Fin: self.on_finish, cmd.FinBatch: self.on_finish, cmd.Req: self.on_finish,
            cmd.Touch: _ignore, cmd.Nop: _ignore, cmd.Cls: self.on_cls,
        }

    # -- input --------------------------------------------------------------------------------------------
    def on_readable(self) -> None:
        try:
            data = self.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        for item in self.parser.feed(data):
            if isinstance(item, ProtocolError):
                self.server.count("errors")
                self.out.append(item.frame())
                self.flush()
                self.close()
                return
            self.server.count("commands")
            self._dispatch[type(item)](item)
        self.pump()

    def on_identify(self, command) -> None:
        try:
            self.settings, reply = negotiate_identify(command.body, SETTINGS, self.settings)
        except ProtocolError as err:
            self.out.append(err.frame())
            self.closed_after_flush()
            return
        self.out.append(response_frame(reply))

    def on_auth(self, command) -> None:
        self.out.append(AuthDisabled("AUTH disabled").frame())
        self.closed_after_flush()

    def on_sub(self, command) -> None:
        self.subscribed = True
        self.out.append(OK_FRAME)

    def on_publish(self, command) -> None:
        if isinstance(command, cmd.Mpub):
            self.server.count("msgs_in", len(command))
            self.server.count("bytes_in", int(command.lengths.sum()))
        else:
            self.server.count("msgs_in")
            self.server.count("bytes_in", len(command.body))
        self.published(command)
        self.out.append(OK_FRAME)

    def published(self, command) -> None:
        """Subclass hook: a PUB/MPUB/DPUB was accepted (the OK is queued after it)."""

    def on_rdy(self, command) -> None:
        self.rdy = command.count

    def on_finish(self, command) -> None:
        n = len(command) if isinstance(command, cmd.FinBatch) else 1
        self.in_flight = max(self.in_flight - n, 0)
        self.server.count("fins", n)

    def on_cls(self, command) -> None:
        self.rdy = 0
        self.out.append(CLOSE_WAIT_FRAME)

    # -- output -------------------------------------------------------------------------------------------
    def fill(self) -> None:
        """Subclass hook: queue messages while RDY allows."""

    def pump(self) -> None:
        """Fill and flush until the socket is full or there is nothing left to send."""
        while not self.closed:
            self.fill()
            if not self.out or not self.flush():
                break
        self.server.touched.add(self)

    def flush(self) -> bool:
        """Send queued chunks; True when the queue is empty."""
        out = self.out
        while out:
            try:
                sent = self.sock.sendmsg(list(_first(out, _SENDMSG_MAX)))
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                self.close()
                return False
            while sent:
                head = out[0]
                if sent >= len(head):
                    sent -= len(head)
                    out.popleft()
                else:
                    out[0] = memoryview(head)[sent:]
                    sent = 0
        return True

    def closed_after_flush(self) -> None:
        self.flush()
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.out.clear()
            self.server.forget(self)


def _ignore(command) -> None:
    pass


def _first(items, n: int):
    for i, item in enumerate(items):
        if i == n:
            return
        yield item


class ServingProcess:
    """A child's selectors loop over the shared listening socket and its own sessions."""

    def __init__(self, listener: socket.socket, session_class, counters: np.ndarray, config):
        self.listener = listener
        self.session_class = session_class
        self.counters = counters
        self.config = config
        self.sel = selectors.DefaultSelector()
        self.sessions: dict[int, Session] = {}
        self.touched: set[Session] = set()
        self.running = True

    def count(self, name: str, n: int = 1) -> None:
        self.counters[_COL[name]] += n

    def serve(self) -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})  # see serve_main
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.sel.register(wake_r, selectors.EVENT_READ, None)
        self.sel.register(self.listener, selectors.EVENT_READ, self.listener)
        while self.running:
            for key, events in self.sel.select():
                target = key.data
                if target is None:
                    os.read(wake_r, 64)
                elif target is self.listener:
                    self._accept()
                else:
                    if events & selectors.EVENT_READ:
                        target.on_readable()
                    if events & selectors.EVENT_WRITE and not target.closed:
                        target.pump()
            self._update_interest()

    def _stop(self, signum, frame) -> None:
        self.running = False

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return  # another child took it
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = self.session_class(sock, self)
        self.sessions[sock.fileno()] = session
        self.sel.register(sock, selectors.EVENT_READ, session)
        self.count("connections")

    def _update_interest(self) -> None:
        for session in self.touched:
            if session.closed:
                continue
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if session.out else 0)
            if want != session.interest:
                self.sel.modify(session.sock, want, session)
                session.interest = want
        self.touched.clear()

    def forget(self, session: Session) -> None:
        self.sessions.pop(session.sock.fileno(), None)
        try:
            self.sel.unregister(session.sock)
        except (KeyError, ValueError):
            pass
        session.sock.close()


class StubServer:
    """Bind now, fork `processes` serving children on `start()`, and sum their counters on `stop()`."""

    def __init__(self, session_class, address: tuple[str, int] = ("127.0.0.1", 0), processes: int = 1,
                 config=None):
        self.session_class = session_class
        self.config = config
        self.processes = processes
        self.listener = socket.create_server(address, backlog=1024)
        self.listener.setblocking(False)
        self.address = self.listener.getsockname()[:2]
        self._shared = mmap.mmap(-1, 8 * len(COUNTERS) * processes)
        self.counters = np.frombuffer(self._shared, dtype=np.int64).reshape(processes, len(COUNTERS))
        self._children: list = []

    def start(self) -> "StubServer":
        if self._children:
            return self
        warm_up()
        ctx = multiprocessing.get_context("fork")
        for row in range(self.processes):
            child = ctx.Process(target=self._child, args=(row,), daemon=True)
            child.start()
            self._children.append(child)
        return self

    def _child(self, row: int) -> None:
        ServingProcess(self.listener, self.session_class, self.counters[row], self.config).serve()

    def stop(self) -> dict:
        for child in self._children:
            if child.is_alive():
                child.terminate()
        for child in self._children:
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
                child.join()
        self.listener.close()
        totals = self.counters.sum(axis=0)
        return {name: int(totals[i]) for i, name in enumerate(COUNTERS)}

    def __enter__(self) -> "StubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_main(name: str, server: StubServer) -> dict:
    """Script entry: start, log NSQ's listening line (tests and compare.py wait on it), run until SIGTERM or
    SIGINT, then return the summed counters."""
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # children unblock theirs in ServingProcess.serve
    server.start()
    host, port = server.address
    Logger(prefix=f"[{name}] ").info(f"TCP: listening on {host}:{port}")
    signal.sigwait(signals)
    return server.stop()
