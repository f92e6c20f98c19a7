"""Consumers of one channel share its messages fairly, whatever the traffic (issue 46, item 5).

A real nsqd (two workers) and real nsqpy consumers (``max_in_flight=100``, one connection each), as an
application runs them. Each traffic shape publishes 10,000 messages to a fresh topic whose channel has two, then
four consumers; once every message was handled, each consumer's share must lie within 35-65% (two) or 15-35%
(four). The shapes: lone PUBs (a few in flight at a time), paced MPUBs of 50 (the issue's case: whoever a pass
began with took every batch when a FIN's empty pass moved the turn on), bursts of 1,000 and slow handlers.

Every run waits for the counts themselves (all messages handled), never for time; the bounds are the issue's.
"""
import threading
import time

import pytest

from nsqpy.client import Consumer
from nsqpy.protocol import client as C
from tests.polling import wait_until
from wire import Conn, unique, warm_up

N = 10_000
BOUNDS = {2: (0.35, 0.65), 4: (0.15, 0.35)}
SHAPES = ["lone_pubs", "mpub_50", "bursts", "slow_handlers"]


@pytest.fixture(scope="module")
def addr(shared_nsqd):
    warm_up(shared_nsqd.address)
    return shared_nsqd.address


def _lone_pubs(p, topic, bodies):
    """One PUB per message, four waiting for their OK at a time."""
    for i in range(0, len(bodies), 4):
        chunk = bodies[i:i + 4]
        p.send(*[C.pub(topic, b) for b in chunk])
        for _ in chunk:
            p.expect_response()


def _mpubs(p, topic, bodies, size, pause):
    for i in range(0, len(bodies), size):
        p.send(C.mpub(topic, bodies[i:i + size]))
        p.expect_response()
        if pause:
            time.sleep(pause)  # pacing the producer (a rate), not synchronisation


PRODUCE = {
    "lone_pubs": _lone_pubs,
    "mpub_50": lambda p, topic, bodies: _mpubs(p, topic, bodies, 50, 0.01),   # ~5,000 msg/s
    "bursts": lambda p, topic, bodies: _mpubs(p, topic, bodies, 1000, 0),
    "slow_handlers": lambda p, topic, bodies: _mpubs(p, topic, bodies, 50, 0),
}


def shares(addr, shape, consumers):
    """Run one shape with that many consumers; -> each consumer's share of the N messages."""
    topic = unique("fair")
    counts = [0] * consumers
    seen = set()
    lock = threading.Lock()
    delay = 0.0002 if shape == "slow_handlers" else 0.0

    def handler(k):
        def handle(message):
            if delay:
                time.sleep(delay)  # the handler's work
            with lock:
                counts[k] += 1
                seen.add(message.body)
        return handle

    with Conn(addr) as p:
        p.send(C.pub(topic, b"start"))  # the topic and then its channel exist before any consumer counts
        p.expect_response()
    group = []
    try:
        for k in range(consumers):
            group.append(Consumer(topic, "group", handler(k), nsqd_tcp_addresses=[f"{addr[0]}:{addr[1]}"],
                                  max_in_flight=100).start())
        wait_until(lambda: sum(counts) >= 1, 60, "the message before the run delivered")
        with lock:
            counts[:] = [0] * consumers
            seen.clear()
        bodies = [b"%d" % i for i in range(N)]
        with Conn(addr) as p:
            PRODUCE[shape](p, topic, bodies)
        wait_until(lambda: len(seen) >= N, 120, f"{N} messages handled ({shape}, {consumers} consumers)")
    finally:
        for c in group:
            c.stop()
    total = sum(counts)
    return [c / total for c in counts]


@pytest.mark.parametrize("consumers", [2, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_each_consumer_of_a_group_gets_a_fair_share(addr, shape, consumers):
    got = shares(addr, shape, consumers)
    low, high = BOUNDS[consumers]
    print(f"{shape} {consumers} consumers: " + " ".join(f"{s:.1%}" for s in got))
    assert all(low <= s <= high for s in got), (shape, consumers, [round(s, 3) for s in got])
