"""Everything that runs on the scanner's timers (spec 1.10): the in-flight timeout, REQ with a delay, TOUCH, and
DPUB. Each bounds from below what must not happen early, and waits with a generous deadline for what must happen.
"Before" is checked by order, not by a tight deadline: what must come first is deliverable as soon as the broker
has processed the command, what must come later only once its delay passed, so the order holds even when a loaded
machine delays both.
"""
import time

import pytest

from nsqpy.protocol import client as C
from wire import Conn, consumer, holding, producer, unique, warm_up


@pytest.fixture(scope="module")
def addr(shared_nsqd):
    warm_up(shared_nsqd.address)
    return shared_nsqd.address


def test_msg_timeout_requeues_with_same_id_and_next_attempt(addr):
    t0 = time.monotonic()
    _, c, [m] = holding(addr, b"slow", msg_timeout=1000)
    with c:
        again = c.read_message()
        assert time.monotonic() - t0 >= 0.99
        assert (again.id, again.body, again.timestamp, again.attempts) == (m.id, m.body, m.timestamp, 2)
        c.send(C.fin(again.id))
        c.send(C.pub(unique(), b"sync"))
        c.expect_response()


def test_req_with_delay_frees_the_slot_and_redelivers_no_earlier(addr):
    topic, c, [m] = holding(addr, b"first")
    with c:
        producer(addr, topic, b"second")
        c.expect_no_frame(0.2)  # RDY 1 and "first" in flight
        t0 = time.monotonic()
        c.send(C.req(m.id, 1000))
        second = c.read_message()  # before "first" is back: the deferred message no longer counts against RDY
        assert second.body == b"second"
        c.send(C.fin(second.id))
        again = c.read_message()
        assert time.monotonic() - t0 >= 1.0
        assert (again.id, again.body, again.attempts) == (m.id, b"first", 2)


def test_touch_extends_the_deadline(addr):
    _, c, [m] = holding(addr, b"touched", msg_timeout=1000)
    with c:
        for _ in range(5):  # 5 x 0.3 s: well past the 1 s timeout, but never 1 s without a TOUCH
            c.expect_no_frame(0.3)
            c.send(C.touch(m.id))
        c.send(C.fin(m.id))
        c.send(C.pub(unique(), b"sync"))
        c.expect_response()  # not E_FIN_FAILED: still in flight at this client


# ---- DPUB ---------------------------------------------------------------------------------------------------


def test_dpub_delivers_after_the_delay_and_defer_0_at_once(addr):
    topic = unique()
    with consumer(addr, topic, "ch", rdy=10) as c, Conn(addr) as p:
        t0 = time.monotonic()
        ts0 = time.time_ns()
        p.send(C.dpub(topic, 1000, b"later"), C.dpub(topic, 0, b"now"))
        p.expect_response()
        p.expect_response()
        now = c.read_message()
        assert now.body == b"now"
        later = c.read_message()
        assert time.monotonic() - t0 >= 1.0
        assert (later.body, later.attempts) == (b"later", 1)
        # keeps the publish time (that of "now", published with it), not the due time a second later
        assert ts0 <= later.timestamp < now.timestamp + 500_000_000


def test_dpub_is_deferred_per_channel(addr):
    topic = unique()
    with consumer(addr, topic, "a", rdy=1) as a, consumer(addr, topic, "b", rdy=1) as b:
        t0 = time.monotonic()
        with Conn(addr) as p:
            p.send(C.dpub(topic, 800, b"d"))
            p.expect_response()
        ma, mb = a.read_message(), b.read_message()
        assert time.monotonic() - t0 >= 0.8
        assert ma.id == mb.id and ma.body == mb.body == b"d"
