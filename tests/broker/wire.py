"""A blocking raw-socket V2 client for the broker tests, built on the codec's client role.

Every wait has a deadline and waits on the socket itself (a frame arriving, or the peer closing), never on a
sleep. ``_heartbeat_`` frames may arrive at any time, so the readers skip them (and count them) unless asked.
Asserting that something does *not* arrive (``expect_no_frame``) necessarily waits for a window; tests first
send a command whose reply orders the stream where they can, and use the window only for what must stay absent.
Every window ends with a sync point (``sync``): a PUB whose OK must be the next frame, so a frame the broker
owed before it cannot slip past a window that a slow (loaded) broker let pass before it got to work.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
import socket
import time

from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT

# Waits for what must arrive return as soon as it does, so this bound costs nothing when the broker is right; it
# is generous because a broker whose numba cache is cold compiles kernels on first use, which takes seconds.
DEADLINE = 20.0
FATAL_CODES = {"E_BAD_PROTOCOL", "E_INVALID", "E_BAD_BODY", "E_BAD_TOPIC", "E_BAD_CHANNEL", "E_BAD_MESSAGE",
               "E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED", "E_SUB_FAILED", "E_TOO_MANY_CHANNEL_CONSUMERS", "E_IDENTIFY_FAILED",
               "E_AUTH_DISABLED", "E_AUTH_FAILED", "E_AUTH_FIRST", "E_UNAUTHORIZED", "E_AUTH_ERROR"}
NON_FATAL_CODES = {"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"}
_names = itertools.count()
SYNC_TOPIC = f"sync{os.getpid()}"  # sync points publish here; no test subscribes to it


def unique(prefix="t"):
    """A topic or channel name no other test (or earlier run against the same broker) uses."""
    return f"{prefix}{os.getpid()}-{next(_names)}"


class Conn:
    """One TCP connection to the broker: send raw bytes, read frames with deadlines."""

    def __init__(self, address, magic=True, rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # before connect, so that the window is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(DEADLINE)
        self.sock.connect(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = C.FrameDecoder()
        self.frames = []
        self.heartbeats = 0
        self.eof = False
        self.reset = False  # the broker closed with a reset (RST), which may have destroyed unread data
        if magic:
            self.send(C.magic())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.sock.close()

    def send(self, *parts):
        self.sock.sendall(b"".join(parts))

    def half_close(self):
        """No more bytes from us: the broker reads EOF and closes its side once it has answered."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            if e.errno != errno.ENOTCONN:  # the broker has already reset the connection
                raise

    def send_until_reset(self, chunks):
        """Send chunk after chunk, stopping quietly if the broker closed the connection (it may, after a fatal
        error, and then resets it because some of what we sent was never read)."""
        for chunk in chunks:
            try:
                self.sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return

    # ---- reading -----------------------------------------------------------------------------------
    def _fill(self, deadline):
        """Read once; False when the deadline passed first. Sets eof when the peer closed (or reset)."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            return False
        except ConnectionResetError:
            self.reset = True
            data = b""
        if not data:
            self.eof = True
            return True
        self.frames.extend(self.decoder.feed(data))
        return True

    def next_frame(self, timeout=DEADLINE, heartbeats=False):
        """The next frame as (type, data), or None if the connection closed first; fails at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            while self.frames:
                frame = self.frames.pop(0)
                if not heartbeats and frame == (FRAME_RESPONSE, HEARTBEAT):
                    self.heartbeats += 1
                    continue
                return frame
            if self.eof:
                return None
            if not self._fill(deadline):
                raise AssertionError(f"no frame within {timeout}s")

    def expect_frame(self, timeout=DEADLINE):
        frame = self.next_frame(timeout)
        assert frame is not None, "connection closed, expected a frame"
        return frame

    def expect_response(self, data=b"OK", timeout=DEADLINE):
        frame = self.expect_frame(timeout)
        assert frame == (FRAME_RESPONSE, data), f"expected response {data!r}, got {frame!r:.300}"
        return frame[1]

    def expect_error(self, code, text=None, timeout=DEADLINE):
        """The next frame is an error frame with this code (and, if given, exactly this full text)."""
        frame = self.expect_frame(timeout)
        assert frame[0] == FRAME_ERROR, f"expected error {code}, got {frame!r:.300}"
        data = frame[1].decode("utf-8", "replace")
        assert data.split(" ", 1)[0] == code, f"expected {code}, got {data!r}"
        if text is not None:
            assert data == text, f"expected error {text!r}, got {data!r}"
        return data

    def expect_fatal(self, code, text=None, timeout=DEADLINE):
        """Error frame, then the broker closes the connection with nothing after it."""
        data = self.expect_error(code, text, timeout)
        self.expect_closed(timeout)
        return data

    def expect_closed(self, timeout=DEADLINE):
        frame = self.next_frame(timeout)
        assert frame is None, f"expected the connection to be closed, got {frame!r:.300}"

    def sync(self, timeout=DEADLINE):
        """A sync point: a PUB (answered in every state) whose OK must be the next frame, heartbeats aside. The
        broker answers a connection's commands in order, so everything it had sent before it processed the PUB
        has arrived, and was nothing."""
        self.send(C.pub(SYNC_TOPIC, b"sync"))
        self.expect_response(b"OK", timeout)

    def frames_before_sync(self, timeout=DEADLINE):
        """Send a sync point's PUB; return the frames (heartbeats skipped) that came before its OK."""
        self.send(C.pub(SYNC_TOPIC, b"sync"))
        out = []
        while (frame := self.expect_frame(timeout)) != (FRAME_RESPONSE, b"OK"):
            out.append(frame)
        return out

    def read_until_settled(self, timeout=DEADLINE):
        """Every frame (heartbeats skipped) until two sync points in a row found nothing new. A reply may go out
        ahead of the deliveries of the loop iteration that processed its command, so one empty round trip proves
        little; the second covers at least one whole iteration, deliveries included, that had nothing more for
        this connection. No sleeping: a slow broker only makes it take longer."""
        out, empty = [], 0
        while empty < 2:
            more = self.frames_before_sync(timeout)
            out += more
            empty = 0 if more else empty + 1
        return out

    def expect_no_frame(self, within=0.3):
        """Nothing but heartbeats arrives within the window, nor before the sync point that ends it, and the
        connection stays open."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.frames:
                frame = self.frames[0]
                if frame == (FRAME_RESPONSE, HEARTBEAT):
                    self.frames.pop(0)
                    self.heartbeats += 1
                    continue
                raise AssertionError(f"expected nothing, got {frame!r:.300}")
            assert not self.eof, "expected the connection to stay open"
            self._fill(deadline)
        assert not self.frames and not self.eof, f"expected nothing, got {self.frames[:3]!r:.300} eof={self.eof}"
        self.sync()

    def read_until_closed(self, timeout=DEADLINE):
        """Every frame (heartbeats included) until the broker closes the connection."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            if not self._fill(deadline):
                raise AssertionError(f"not closed within {timeout}s; {len(self.frames)} frames so far, the last "
                                     f"ones {[(t, d[:60]) for t, d in self.frames[-3:]]}")
        frames, self.frames = self.frames, []
        return frames

    def read_until_quiet(self, quiet=0.5, timeout=10.0):
        """Every frame (heartbeats skipped) until none came for ``quiet`` seconds; fails if still busy at the
        deadline or if the connection closed."""
        deadline = time.monotonic() + timeout
        out = []
        while True:
            try:
                frame = self.next_frame(timeout=quiet)
            except AssertionError:
                return out
            assert frame is not None, "connection closed"
            out.append(frame)
            assert time.monotonic() < deadline, f"still receiving after {timeout}s"

    def read_message(self, timeout=DEADLINE):
        frame = self.expect_frame(timeout)
        assert frame[0] == FRAME_MESSAGE, f"expected a message, got {frame!r:.300}"
        return C.decode_message(frame[1])

    def read_messages(self, n, timeout=DEADLINE):
        return [self.read_message(timeout) for _ in range(n)]

    # ---- conveniences ------------------------------------------------------------------------------
    def identify(self, **fields):
        """IDENTIFY; returns the decoded JSON reply with feature_negotiation, else b"OK"."""
        self.send(C.identify(fields))
        frame = self.expect_frame()
        assert frame[0] == FRAME_RESPONSE, f"IDENTIFY failed: {frame!r}"
        return json.loads(frame[1]) if fields.get("feature_negotiation") else frame[1]

    def publish(self, topic, *bodies):
        for body in bodies:
            self.send(C.pub(topic, body))
        for _ in bodies:
            self.expect_response(b"OK")

    def subscribe(self, topic, channel, rdy=None):
        self.send(C.sub(topic, channel))
        self.expect_response(b"OK")
        if rdy is not None:
            self.send(C.rdy(rdy))


def producer(address, topic, *bodies):
    """Publish bodies on a fresh connection (each answered OK) and close it."""
    with Conn(address) as p:
        p.publish(topic, *bodies)


def consumer(address, topic, channel, rdy=None, **identify):
    c = Conn(address)
    if identify:
        c.identify(**identify)
    c.subscribe(topic, channel, rdy)
    return c


def holding(address, *bodies, channel="ch", **identify):
    """A fresh topic with ``bodies`` published and a consumer (RDY len(bodies)) holding them all in flight.
    Returns (topic, consumer, messages)."""
    topic = unique()
    producer(address, topic, *bodies)
    c = consumer(address, topic, channel, rdy=len(bodies), **identify)
    return topic, c, c.read_messages(len(bodies))


def warm_up(address, topics=4):
    """Run the delivery paths once on a few topics (so on every worker, whichever owns them): tests that bound
    a delay from above then measure the broker, not numba compiling a kernel on first use."""
    for _ in range(topics):
        topic, c, [a, b, d] = holding(address, b"a", b"b", b"c")
        with c:
            c.send(C.touch(a.id), C.req(a.id, 0), C.req(b.id, 0), C.fin(d.id))
            for m in c.read_messages(2, timeout=60):
                c.send(C.fin(m.id))
            with Conn(address) as p:
                p.send(C.mpub(topic, [b"x", b"y"]), C.dpub(topic, 0, b"z"), C.pub(topic, b"w"))
                for _ in range(3):
                    p.expect_response(timeout=60)
            for m in c.read_messages(3, timeout=60):
                c.send(C.fin(m.id))
            c.read_messages(1, timeout=60)
