"""The read deadline covers a whole command (spec 1.9, as nsqd does it): a client has two heartbeat intervals to
send a command line and its body, counted from the read that began the command, not from its latest byte.

A client trickling a command one byte at a time is dropped about two intervals after it began, long before the
trickle would end; a client whose commands each complete in time stays, also when every read it causes ends in
the middle of the next command. The trickles are paced (that is the behaviour under test); every wait is on the
socket, and windows that must pass without a close end with a command and its reply.
"""
import time

import pytest

from nsqpy.protocol import client as C
from wire import Conn, unique

INTERVAL = 1.0       # heartbeat_interval=1000 ms: the deadline is 2 s
PACE = 0.3           # seconds between two trickled pieces


@pytest.fixture(scope="module")
def addr(shared_nsqd):
    return shared_nsqd.address


def wait_on(c, seconds):
    """Pace the sender: wait ``seconds`` on the socket (frames that arrive are kept); True if the broker closed."""
    end = time.monotonic() + seconds
    while not c.eof and c._fill(end):
        pass
    return c.eof


def trickle(c, data):
    """Send data one byte every PACE seconds until the broker closes the connection; returns the bytes sent."""
    for i in range(len(data)):
        try:
            c.send(data[i:i + 1])
        except (BrokenPipeError, ConnectionResetError):
            return i
        if wait_on(c, PACE):
            return i + 1
    return len(data)


@pytest.mark.parametrize("part", ["body", "line"])
def test_a_command_trickled_byte_by_byte_is_dropped_two_intervals_after_it_began(addr, part):
    topic = unique()
    command = C.pub(topic, bytes(range(100)))
    head = command.index(b"\n") + 5 if part == "body" else 4  # the line and size at once, or just "PUB "
    with Conn(addr) as c:
        c.identify(heartbeat_interval=int(INTERVAL * 1000))
        t0 = time.monotonic()
        c.send(command[:head])
        sent = head + trickle(c, command[head:])
        elapsed = time.monotonic() - t0
        assert c.eof, f"still connected after {elapsed:.1f}s"
        frames = [f for f in c.frames if f != (0, b"_heartbeat_")]
    # every byte arrived within PACE of the one before, so a deadline counted from the last read never passes;
    # the trickle would have taken len(command) * PACE = 30+ s
    assert 2 * INTERVAL - 0.1 <= elapsed <= 2 * INTERVAL + 2.0, elapsed
    assert sent < len(command) and not frames, (sent, frames)


def test_commands_that_each_complete_in_time_keep_the_connection(addr):
    """For 3.5 intervals: NOPs, then PUBs sent in halves so that every read completes one command and begins the
    next (the parser is never idle after a read). Then a PUB on the same connection is answered OK."""
    topic = unique()
    with Conn(addr) as c:
        c.identify(heartbeat_interval=int(INTERVAL * 1000))
        c.publish(topic, b"first")
        t0 = time.monotonic()
        for _ in range(4):
            c.send(C.nop())
            assert not wait_on(c, PACE)
        pub = C.pub(topic, b"0123456789")
        half = len(pub) // 2
        pieces = 8
        stream = pub * (pieces + 1)
        cuts = [0] + [k * len(pub) + half for k in range(pieces)] + [len(stream)]
        for a, b in zip(cuts, cuts[1:-1]):
            c.send(stream[a:b])
            assert not wait_on(c, PACE), f"dropped after {time.monotonic() - t0:.1f}s"
        assert time.monotonic() - t0 > 3 * INTERVAL
        c.send(stream[cuts[-2]:])  # the sync point: every PUB answered, the connection still open
        for _ in range(pieces + 1):
            c.expect_response(b"OK")
        c.publish(topic, b"last")
