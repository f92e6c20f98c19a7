"""A channel with a message TTL on the compiled delivery round (issue 49 follow-up), on a real nsqd with the
suite's raw V2 client (tests/broker/wire.py): expired messages at the head of the channel are left by the round
to the general path, which drops them (counted); the fresh ones after them are delivered in order, in small
rounds (RDY 5, a FIN for each), and a TTL that expires nothing delivers everything as without one."""
import time

import pytest

from nsqpy.protocol import client as C
from namespaces import log_on_failure
from test_dead_letter import _wait_past, channel_stats
from wire import consumer, producer, unique

WAIT = 60.0


def read_in_order(c, n):
    """n messages, each FINed as it arrives -> their bodies."""
    bodies = []
    for _ in range(n):
        msg = c.read_message(WAIT)
        assert msg.attempts == 1
        bodies.append(msg.body)
        c.send(C.fin(msg.id))
    return bodies


@pytest.mark.parametrize("ttl_ms, old, rdy", [(400, 30, 5), (3_600_000, 0, 50)], ids=["expiring", "1h"])
def test_expired_messages_ahead_of_fresh_ones_are_dropped_and_the_fresh_delivered_in_order(nsqd_factory, ttl_ms,
                                                                                           old, rdy):
    """`old` messages published a TTL ago, then fresh ones; a TTL of an hour expires nothing."""
    nsqd = nsqd_factory(f"--message-ttl={ttl_ms}ms", workers=2)
    topic = unique("ttlround")
    with log_on_failure(nsqd):
        c = consumer(nsqd.address, topic, "c", rdy=0)
        if old:
            producer(nsqd.address, topic, *[b"old%02d" % i for i in range(old)])
            _wait_past(time.time_ns() + ttl_ms * 10**6)
        fresh = [b"fresh%03d" % i for i in range(200)]
        producer(nsqd.address, topic, *fresh)
        c.send(C.rdy(rdy))
        assert read_in_order(c, len(fresh)) == fresh
        producer(nsqd.address, topic, b"sync")
        assert read_in_order(c, 1) == [b"sync"]  # the sync point: nothing else came before it
        ch = channel_stats(nsqd, topic, "c")
        assert ch.get("expired_count", 0) == old and ch["depth"] == 0, ch
        c.close()
