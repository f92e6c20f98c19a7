"""Consumers of one channel share its messages fairly, whatever the traffic (issue 46, item 5).

A real nsqd (two workers) and real consumers (``max_in_flight=100``, one connection each), as an application runs
them: nsqpy's, and pynsq 0.9.1's readers for the batch shapes. Each traffic shape publishes 10,000 messages (bursts
40,000) to a fresh topic whose channel has two, then four consumers; once every message was handled, each consumer's
share must lie within 35-65% (two) or 15-35% (four). The shapes: lone PUBs (a few in flight at a time), paced MPUBs of
50 (the issue's case: whoever a pass began with took every batch when a FIN's empty pass moved the turn on), bursts of
1,000 and slow handlers.

Every run waits for the counts themselves (all messages handled), never for time; the bounds are the issue's.
"""
import threading
import time

import pytest

from nsqpy.client import Consumer
from nsqpy.protocol import client as C
from tests.broker.test_pynsq import PynsqLoop
from tests.polling import wait_until
from wire import Conn, unique, warm_up

N = 10_000
# bursts: with a backlog waiting, a consumer takes a whole window of max_in_flight at a time (its FINs come back
# together), so 10,000 messages are only 100 turns and one turn's luck is 1% of the share; 40,000 give 400 turns,
# where the skew of a loaded machine's scheduling between the consumers' threads does not decide the bounds
MESSAGES = {"bursts": 40_000}
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


class Tally:
    """What each consumer of a run handled (handlers may run in several threads)."""

    def __init__(self, consumers, delay=0.0):
        self.counts = [0] * consumers
        self.seen = set()
        self.delay = delay
        self.lock = threading.Lock()

    def handler(self, k):
        def handle(message):
            if self.delay:
                time.sleep(self.delay)  # the handler's work
            with self.lock:
                self.counts[k] += 1
                self.seen.add(message.body)
            return True
        return handle

    def reset(self):
        with self.lock:
            self.counts[:] = [0] * len(self.counts)
            self.seen.clear()

    def shares(self):
        total = sum(self.counts)
        return [c / total for c in self.counts]


def first_message(addr):
    """A topic with one message: it and then its channel exist before the run counts anything."""
    topic = unique("fair")
    with Conn(addr) as p:
        p.send(C.pub(topic, b"start"))
        p.expect_response()
    return topic


def count(shape):
    return MESSAGES.get(shape, N)


def produce(addr, shape, topic):
    with Conn(addr) as p:
        PRODUCE[shape](p, topic, [b"%d" % i for i in range(count(shape))])


def shares(addr, shape, consumers):
    """Run one shape with that many nsqpy consumers; -> each consumer's share of the shape's messages."""
    topic = first_message(addr)
    tally = Tally(consumers, 0.0002 if shape == "slow_handlers" else 0.0)
    group = []
    try:
        for k in range(consumers):
            group.append(Consumer(topic, "group", tally.handler(k), nsqd_tcp_addresses=[f"{addr[0]}:{addr[1]}"],
                                  max_in_flight=100).start())
        wait_until(lambda: len(tally.seen) >= 1, 60, "the message before the run delivered")
        tally.reset()
        produce(addr, shape, topic)
        n = count(shape)
        wait_until(lambda: len(tally.seen) >= n, 120, f"{n} messages handled ({shape}, {consumers} consumers)")
    finally:
        for c in group:
            c.stop()
    return tally.shares()


def pynsq_shares(addr, shape, consumers):
    """The same with pynsq 0.9.1 readers on one tornado loop, the producer in a thread beside it."""
    lp = PynsqLoop(addr)
    try:
        topic = first_message(addr)
        tally = Tally(consumers)
        readers = [lp.reader(topic, "group", tally.handler(k), max_in_flight=100) for k in range(consumers)]
        lp.subscribed(*readers)
        lp.run_until(lambda: len(tally.seen) >= 1, what="the message before the run delivered")
        tally.reset()
        failed = []
        producer = threading.Thread(target=lambda: _catching(failed, produce, addr, shape, topic))
        producer.start()
        n = count(shape)
        lp.run_until(lambda: len(tally.seen) >= n or failed, 120, f"{n} messages handled ({shape}, pynsq)")
        producer.join()
        assert not failed, failed
    finally:
        lp.close()
    return tally.shares()


def _catching(failed, fn, *args):
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 (reported by the test's thread)
        failed.append(e)


def _check(kind, shape, consumers, got):
    low, high = BOUNDS[consumers]
    print(f"{kind} {shape} {consumers} consumers: " + " ".join(f"{s:.1%}" for s in got))
    assert all(low <= s <= high for s in got), (kind, shape, consumers, [round(s, 3) for s in got])


@pytest.mark.parametrize("consumers", [2, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_each_consumer_of_a_group_gets_a_fair_share(addr, shape, consumers):
    _check("nsqpy", shape, consumers, shares(addr, shape, consumers))


@pytest.mark.parametrize("consumers", [2, 4])
@pytest.mark.parametrize("shape", ["mpub_50", "bursts"])
def test_each_pynsq_reader_of_a_group_gets_a_fair_share(addr, shape, consumers):
    _check("pynsq", shape, consumers, pynsq_shares(addr, shape, consumers))
