"""Cross-checks with the reference Python client: nsqpy's Producer feeding pynsq's Reader, pynsq's Writer
feeding nsqpy's Consumer (pynsq 0.9.1 on tornado 6.0.4, driven by the broker suite's PynsqLoop)."""

import pytest

from nsqpy.client import Consumer, Producer
from tests.broker.test_pynsq import PynsqLoop
from tests.client.helpers import addr, unique, wait_until


@pytest.fixture
def loop(shared_nsqd):
    lp = PynsqLoop(shared_nsqd.address)
    yield lp
    lp.close()


def test_nsqpy_producer_to_pynsq_reader(shared_nsqd, loop):
    topic = unique("to_pynsq")
    got = []

    def handle(message):
        got.append((message.body, message.attempts))
        return True
    r = loop.reader(topic, "ch", handle, max_in_flight=50)
    loop.subscribed(r)
    with Producer([addr(shared_nsqd)]) as p:
        p.publish(topic, b"one")
        p.mpub(topic, [b"m%d" % i for i in range(50)])
        p.dpub(topic, 0.1, b"deferred")
    loop.run_until(lambda: len(got) == 52, what="52 messages at pynsq")
    assert sorted(b for b, _ in got) == sorted([b"one", b"deferred"] + [b"m%d" % i for i in range(50)])
    assert {a for _, a in got} == {1}
    assert loop.barrier(r) == []


def test_pynsq_writer_to_nsqpy_consumer(shared_nsqd, loop):
    topic = unique("from_pynsq")
    got = []
    c = Consumer(topic, "ch", lambda m: got.append(m.body), nsqd_tcp_addresses=[addr(shared_nsqd)],
                 max_in_flight=20).start()
    try:
        w = loop.writer()
        loop.publish(w, "pub", topic, b"single")
        loop.publish(w, "mpub", topic, [b"x%d" % i for i in range(30)])
        loop.published(2)
        wait_until(lambda: len(got) == 31, what="31 messages at nsqpy")
        assert sorted(got) == sorted([b"single"] + [b"x%d" % i for i in range(30)])
        assert c.stats["finished"] == 31 and c.stats["errors"] == 0
    finally:
        c.stop()
