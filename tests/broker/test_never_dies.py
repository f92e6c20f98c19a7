"""A requeue of more than one 8 MiB segment's worth of messages in one round must not kill the broker.

A consumer (RDY = the batch) holds every message of a batch bigger than 8 MiB (100 x 100 KiB, or 9 x 1 MiB) in
flight, and then all of them come back to the channel in one go, in each of the four ways a message can be
requeued: the consumer (a) disconnects, (b) REQs them all with timeout 0, (c) lets them time out (it IDENTIFYs
with msg_timeout 1000 ms, then lowers its RDY to 1: its next delivery, a redelivery, says that all have timed
out), or (d) its worker is SIGKILLed (every worker is, so the topic's owner is among them). Only then does a
second consumer (RDY = the batch) subscribe, so the channel hands it everything in one round. It must receive
every message with its body intact; the broker still answers a PUB with OK, and it never logged "giving up"
(the supervisor's last words before it stops on a restart storm). No process of the broker may die, but the
workers the test kills.
"""
from __future__ import annotations

import os
import re
import zlib

import pytest

from namespaces import kill_workers, log_on_failure
from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_MESSAGE, FRAME_RESPONSE
from wire import Conn, consumer, unique

KIB, MIB = 1 << 10, 1 << 20
WAIT = 45.0   # generous (a requeue after a kill includes a worker's recovery), and under the broker's 60 s read
              # timeout, so that a missing message fails as such, not as a connection closed for being idle


def make_bodies(n, size):
    """n distinct bodies of ``size`` bytes: an index and a checksum of the random rest at the front."""
    out = []
    for i in range(n):
        rest = os.urandom(size - 12)
        out.append(i.to_bytes(8, "little") + zlib.crc32(rest).to_bytes(4, "little") + rest)
    return out


def publish(address, topic, bodies):
    """MPUBs of at most 4 MiB (the default --max-body-size is 5 MiB), each answered OK."""
    with Conn(address) as p:
        p.sock.settimeout(WAIT)
        batch, size = [], 0
        for b in bodies:
            if batch and size + len(b) > 4 * MIB:
                p.send(C.mpub(topic, batch))
                p.expect_response(b"OK", timeout=WAIT)
                batch, size = [], 0
            batch.append(b)
            size += len(b)
        p.send(C.mpub(topic, batch))
        p.expect_response(b"OK", timeout=WAIT)


def receive_all(c, bodies, timeout=WAIT):
    """Read messages until every one of ``bodies`` arrived, FINning each; every body must be one of them, byte
    for byte. Then a sync point: a PUB on the same connection is answered OK (any FIN that had failed would have
    been answered with an error before it)."""
    want = {b[:8]: b for b in bodies}
    got = set()
    while len(got) < len(want):
        m = c.read_message(timeout=timeout)
        assert want.get(m.body[:8]) == m.body, f"a body arrived altered ({len(m.body)} bytes, {m.body[:16]!r})"
        got.add(m.body[:8])
        c.send(C.fin(m.id))
    c.send(C.pub(unique("sync"), b"sync"))
    while True:
        frame = c.expect_frame(timeout)
        if frame[0] == FRAME_MESSAGE:  # a redelivery we do not need (at least once): finish it too
            c.send(C.fin(C.decode_message(frame[1]).id))
            continue
        assert frame == (FRAME_RESPONSE, b"OK"), f"expected OK to the sync PUB, got {frame!r:.300}"
        return


def check_alive(nsqd, mark, killed=()):
    """The broker runs, never gave up, and no process of it died but the ones the test SIGKILLed."""
    out = "\n".join(nsqd.lines[mark:])
    assert nsqd.proc.poll() is None, f"nsqd exited with {nsqd.proc.returncode}:\n{nsqd.output()[-20000:]}"
    assert "giving up" not in nsqd.output(), nsqd.output()[-20000:]
    died = [line for line in re.findall(r".*\(pid (\d+)\) died \((.*)\).*", out)
            if not (int(line[0]) in killed and line[1] == "signal 9")]
    assert not died, f"a process of the broker died during the requeue (pid, how): {died}\n{out[-20000:]}"
    with Conn(nsqd.address) as p:  # a fresh connection is served: PUB -> OK
        p.publish(unique("after"), b"still serving")


def requeue_in_one_round(nsqd, how, n, size):
    addr = nsqd.address
    topic = unique(f"big{how}")
    bodies = make_bodies(n, size)
    publish(addr, topic, bodies)
    mark = len(nsqd.lines)
    identify = {"msg_timeout": 1000} if how == "timeout" else {}
    first = consumer(addr, topic, "ch", rdy=n, **identify)
    held = [first.read_message(timeout=WAIT) for _ in range(n)]
    if how == "timeout":  # on a slow machine the first ones may time out (and come back) before the last arrive
        assert all(m.body in bodies for m in held)
    else:
        assert sorted(m.body for m in held) == sorted(bodies)
    if how == "disconnect":
        first.close()
    elif how == "req":
        first.send(C.rdy(0), *[C.req(m.id, 0) for m in held])
        first.send(C.pub(unique("sync"), b"sync"))  # sync: every REQ before it was taken (errors come first)
        first.expect_response(b"OK", timeout=WAIT)
    elif how == "timeout":
        # RDY 1 with n in flight: the next delivery to this consumer can only come once all n have timed out,
        # so its arrival says that the channel holds every message requeued (not a sleep)
        first.send(C.rdy(1))
        again = first.read_message(timeout=WAIT)
        assert again.attempts >= 2 and again.body in bodies
        first.close()  # that one is requeued at once too
    killed = ()
    if how == "kill":
        killed = kill_workers(nsqd)
        assert first.next_frame(timeout=WAIT) is None, "the consumer's connection outlived its worker"
        first.close()
    with consumer(addr, topic, "ch", rdy=n) as second:
        receive_all(second, bodies)
    first.close()
    check_alive(nsqd, mark, killed)


@pytest.mark.parametrize("how", ["disconnect", "req", "timeout", "kill"])
def test_requeue_of_100_messages_of_100_kib(nsqd_factory, how):
    """10 MiB in flight on one connection (RDY 100) comes back to the channel in one round."""
    nsqd = nsqd_factory()
    with log_on_failure(nsqd):
        requeue_in_one_round(nsqd, how, 100, 100 * KIB)


@pytest.mark.parametrize("how", ["req", "timeout"])
def test_requeue_of_9_messages_of_1_mib(nsqd_factory, how):
    """9 messages at the default --max-msg-size (1 MiB each) held with RDY 9 and requeued together."""
    nsqd = nsqd_factory()
    with log_on_failure(nsqd):
        requeue_in_one_round(nsqd, how, 9, MIB)
