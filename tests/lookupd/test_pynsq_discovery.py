"""The real pynsq Reader (0.9.1, tornado 6.0.4) given only ``lookupd_http_addresses`` finds every nsqd that
registered the topic with nsqlookupd, consumes from all of them, and picks up a node that joins later on its
next lookupd poll. Runs the loop the way tests/broker/test_pynsq.py does (a fresh asyncio loop per test, stopped
by a condition with a deadline)."""
from __future__ import annotations

import nsq
import pytest

from lookupd_wire import eventually
from tests.broker.test_pynsq import PynsqLoop
from tests.broker.wire import producer, unique

RUN_DEADLINE = 60.0


class Loop(PynsqLoop):
    """The broker suite's pynsq loop, for readers that find their nsqd nodes through lookupd only."""

    def __init__(self):
        super().__init__(("", 0))

    def run_until(self, cond, timeout=RUN_DEADLINE, what="condition"):
        super().run_until(cond, timeout, what)  # lookupd polls add seconds: a longer deadline than the broker's


@pytest.fixture
def loop():
    lp = Loop()
    yield lp
    lp.close()


def test_reader_with_only_lookupd_consumes_from_every_node_and_finds_a_new_one(loop, lookupd_factory,
                                                                               registered_nsqd):
    lk = lookupd_factory()
    n1 = registered_nsqd(lk, http_port=14151)
    n2 = registered_nsqd(lk, http_port=24151, node_id=8)
    topic = unique("py")
    producer(n1.address, topic, b"from-1a", b"from-1b")
    producer(n2.address, topic, b"from-2")
    eventually(lambda: lk.producer_ports(topic) == sorted([n1.port, n2.port]), what="both nodes registered")
    got = []

    def handle(message):
        got.append(message.body)
        return True

    reader = nsq.Reader(topic=topic, channel="ch", message_handler=handle,
                        lookupd_http_addresses=[f"http://{lk.http}"], lookupd_poll_interval=1, max_in_flight=10)
    loop.readers.append(reader)
    loop.run_until(lambda: sorted(got) == [b"from-1a", b"from-1b", b"from-2"], what="messages of both nodes")
    assert len(reader.conns) == 2
    eventually(lambda: lk.get_json(f"/channels?topic={topic}") == {"channels": ["ch"]}, what="channel registered")

    n3 = registered_nsqd(lk, http_port=34151, node_id=9)
    producer(n3.address, topic, b"from-3")
    loop.run_until(lambda: b"from-3" in got, what="the node that joined later picked up on the next poll")
    assert len(reader.conns) == 3
    assert sorted(got) == [b"from-1a", b"from-1b", b"from-2", b"from-3"]
