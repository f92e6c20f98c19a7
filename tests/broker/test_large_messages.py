"""Messages up to --max-msg-size, with the flag raised well past the log's 8 MiB segments (spec 1.11: the limits
are the operator's; a message the limits allow is stored and delivered like any other).

One broker for the module with --max-msg-size=20971520 (20 MiB) and --max-body-size=67108864 (an MPUB of three
9 MiB messages); the 64 MiB message gets a broker of its own (--max-msg-size=67108864). Each test publishes from
a connection on each worker (``namespaces.connections_on_every_worker``), so one large message is appended by the
topic's owner itself and the other forwarded to it through a ring. Each large message is answered OK, arrives
byte for byte (attempts 1), and a small message published after it arrives too; REQ'd, it comes again; DPUB'd
with a 500 ms deferral it arrives, not before. Every test ends with a sync point (a PUB on the consumer's
connection answered OK after its FINs: a failed FIN would have been answered first).
"""
from __future__ import annotations

import os
import time

import pytest

from namespaces import connections_on_every_worker, log_on_failure
from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_RESPONSE
from wire import Conn, consumer, unique

MIB = 1 << 20
WAIT = 45.0   # a large message is copied a few times on a loaded machine; waits return as soon as it arrives
              # (and under the broker's 60 s read timeout, so a missing reply fails as such)
FLAGS = ["--max-msg-size=20971520", "--max-body-size=67108864"]
SIZES = [pytest.param(5 * MIB, id="5MiB"), pytest.param(int(7.9 * MIB), id="7.9MiB"),
         pytest.param(8 * MIB, id="8MiB"), pytest.param(9 * MIB, id="9MiB"), pytest.param(16 * MIB, id="16MiB")]


@pytest.fixture(scope="module")
def big(module_nsqd_factory):
    return module_nsqd_factory(*FLAGS)


def body_of(size, tag=b""):
    """A body of ``size`` bytes that no other test's body equals."""
    head = tag + unique("b").encode() + b":"
    return head + os.urandom(size - len(head))


def send_big(conn, data):
    conn.sock.settimeout(WAIT)  # sendall's timeout covers the whole send
    conn.send(data)


def subscribed(nsqd, topic, rdy, max_frame=64 << 20):
    c = consumer(nsqd.address, topic, "ch", rdy=rdy)
    c.decoder = C.FrameDecoder(max_frame)
    return c


def expect_bodies(c, bodies, attempts=1):
    """The next messages are exactly ``bodies`` (any order), intact, with these attempts; returns them."""
    got = [c.read_message(timeout=WAIT) for _ in bodies]
    assert sorted(len(m.body) for m in got) == sorted(len(b) for b in bodies)
    assert sorted(m.body for m in got) == sorted(bodies), "a body arrived altered"
    assert all(m.attempts == attempts for m in got), [m.attempts for m in got]
    return got


def finish(c, messages):
    c.send(*[C.fin(m.id) for m in messages], C.pub(unique("sync"), b"sync"))
    assert c.expect_frame(WAIT) == (FRAME_RESPONSE, b"OK")


def producers(nsqd):
    """A producer connection on every worker: one publishes on the topic's owner, the other is forwarded to it
    through a ring, whichever worker owns the topic."""
    def connect():
        c = Conn(nsqd.address)
        c.identify(client_id="large-producer")
        c.sock.settimeout(WAIT)
        return c
    return list(connections_on_every_worker(nsqd, connect).values())


def publish_each(conns, make_command, bodies):
    """Producer i sends make_command(bodies[i]); each is answered OK."""
    for p, b in zip(conns, bodies):
        send_big(p, make_command(b))
        p.expect_response(b"OK", timeout=WAIT)


def close_all(conns):
    for c in conns:
        c.close()


def pub_large_then_small(nsqd, size):
    topic = unique()
    ps = producers(nsqd)
    large = [body_of(size, b"%d" % i) for i in range(len(ps))]
    small = [b"small after %d" % i for i in range(len(ps))]
    try:
        with subscribed(nsqd, topic, rdy=2 * len(ps), max_frame=size + (1 << 20)) as c:
            publish_each(ps, lambda b: C.pub(topic, b), large)
            publish_each(ps, lambda b: C.pub(topic, b), small)
            finish(c, expect_bodies(c, large + small))
    finally:
        close_all(ps)
    with Conn(nsqd.address) as p:  # and the broker serves on
        p.publish(unique(), b"still here")


@pytest.mark.parametrize("size", SIZES)
def test_pub_large_message_is_delivered(big, size):
    with log_on_failure(big):
        pub_large_then_small(big, size)


@pytest.mark.parametrize("size", SIZES)
def test_large_message_published_before_the_channel_is_delivered(big, size):
    """The backlog path: stored while the topic has no channel, read by the first channel's consumer."""
    with log_on_failure(big):
        topic = unique()
        ps = producers(big)
        large = [body_of(size, b"%d" % i) for i in range(len(ps))]
        try:
            publish_each(ps, lambda b: C.pub(topic, b), large)
            ps[0].publish(topic, b"small after")
        finally:
            close_all(ps)
        with subscribed(big, topic, rdy=len(large) + 1) as c:
            finish(c, expect_bodies(c, large + [b"small after"]))


@pytest.mark.parametrize("size", [pytest.param(9 * MIB, id="9MiB"), pytest.param(16 * MIB, id="16MiB")])
def test_large_message_reqd_is_delivered_again(big, size):
    with log_on_failure(big):
        topic = unique()
        ps = producers(big)
        large = [body_of(size, b"%d" % i) for i in range(len(ps))]
        try:
            with subscribed(big, topic, rdy=len(large) + 1) as c:  # + 1: room for the small one at the end
                publish_each(ps, lambda b: C.pub(topic, b), large)
                first = expect_bodies(c, large)
                c.send(*[C.req(m.id, 0) for m in first])
                again = expect_bodies(c, large, attempts=2)
                assert sorted(m.id for m in again) == sorted(m.id for m in first)
                c.send(*[C.req(m.id, 100) for m in again])  # and with a delay
                third = expect_bodies(c, large, attempts=3)
                ps[0].publish(topic, b"small after")
                finish(c, third + expect_bodies(c, [b"small after"]))
        finally:
            close_all(ps)


@pytest.mark.parametrize("size", [pytest.param(9 * MIB, id="9MiB"), pytest.param(16 * MIB, id="16MiB")])
def test_large_message_dpub_arrives_after_its_deferral(big, size):
    with log_on_failure(big):
        topic = unique()
        ps = producers(big)
        large = [body_of(size, b"%d" % i) for i in range(len(ps))]
        try:
            with subscribed(big, topic, rdy=len(large) + 1) as c:
                t0 = time.monotonic()
                publish_each(ps, lambda b: C.dpub(topic, 500, b), large)
                got = expect_bodies(c, large)
                assert time.monotonic() - t0 >= 0.45  # deferred, not delivered at once (bound from below only)
                ps[0].publish(topic, b"small after")
                finish(c, got + expect_bodies(c, [b"small after"]))
        finally:
            close_all(ps)


def test_mpub_of_three_9_mib_messages(big):
    with log_on_failure(big):
        topic = unique()
        ps = producers(big)
        batches = [[body_of(9 * MIB, b"%d-%d" % (i, j)) for j in range(3)] for i in range(len(ps))]
        try:
            with subscribed(big, topic, rdy=10) as c:
                publish_each(ps, lambda bodies: C.mpub(topic, bodies), batches)
                ps[0].publish(topic, b"small after")
                finish(c, expect_bodies(c, [b for batch in batches for b in batch] + [b"small after"]))
        finally:
            close_all(ps)


def test_64_mib_message(nsqd_factory):
    """At a 64 MiB --max-msg-size: the frame is 64 MiB + 30 bytes, so the test's decoder allows more than its
    default 64 MiB frame."""
    nsqd = nsqd_factory("--max-msg-size=67108864", "--max-body-size=134217728")
    with log_on_failure(nsqd):
        pub_large_then_small(nsqd, 64 * MIB)
