"""Channel delivery at its capacity edges, without a broker (tests/workers/fakes.py).

What must hold: a full in-flight table is back-pressure (the cursor passes only what got a slot; the rest comes
once slots free up), deferred messages wait in the deferred store, not in the table, and a round's frames stay within
MAX_ROUND_BYTES unless a single message is bigger (then it goes alone)."""
import time

from tests.workers.fakes import FakeSession, S, drain, finish_all, publish, setup  # noqa: F401 (fixture)
from nsqpy.ipc.msglog_layout import FRAME_OVERHEAD
from nsqpy.workers.domain.channel import MAX_ROUND_BYTES


def test_a_full_in_flight_table_holds_messages_back_and_loses_none(setup):
    worker, log, ch = setup(capacity=4)
    bodies = [b"m%d" % i for i in range(10)]
    publish(log, bodies)
    s = FakeSession(1, rdy=100)
    ch.add_consumer(s)
    ch.deliver()
    assert len(s.received) == 4 and ch in worker.table_blocked
    assert log.depth(ch.ch) == 6  # the six that found no slot are still the channel's
    while log.depth(ch.ch):
        finish_all(ch, s)
        ch.deliver()
    assert s.received == bodies  # each once, in order


def test_deferred_messages_take_no_in_flight_slot(setup):
    worker, log, ch = setup(capacity=4)
    publish(log, [b"d%d" % i for i in range(10)], not_before=time.time_ns() + 3600 * 10**9)
    s = FakeSession(1, rdy=100)
    ch.add_consumer(s)
    ch.deliver()
    assert s.received == [] and len(worker.inflight) == 0
    assert log.depth(ch.ch) == 0 and ch.deferred_count == 10 and ch not in worker.table_blocked


def test_requeued_rounds_stay_within_the_round_budget(setup):
    worker, log, ch = setup(capacity=256)
    bodies = [bytes([i]) * (100 << 10) for i in range(100)]
    publish(log, bodies)
    s = FakeSession(1, rdy=100)
    ch.add_consumer(s)
    drain(ch)
    assert len(s.received) == 100
    ch.remove_consumer(s)  # a consumer holding 100 x 100 KiB goes away: all of it is requeued at once
    worker.rounds.clear()
    s2 = FakeSession(2, rdy=100)
    ch.add_consumer(s2)
    drain(ch)
    assert sorted(s2.received) == sorted(bodies)
    assert max(worker.rounds) <= MAX_ROUND_BYTES and len(worker.rounds) >= 3


def test_a_message_bigger_than_a_round_goes_alone(setup):
    worker, log, ch = setup(capacity=16)
    big = b"x" * (MAX_ROUND_BYTES + (1 << 20))
    publish(log, [b"small", big, b"after"])
    s = FakeSession(1, rdy=10)
    ch.add_consumer(s)
    drain(ch)
    assert s.received == [b"small", big, b"after"]
    assert worker.rounds[1] == len(big) + FRAME_OVERHEAD  # alone in its round


def test_a_fin_asks_for_a_delivery_pass_only_when_something_waits(setup):
    """An unbuffered consumer (RDY 1) FINs every message: a FIN that leaves nothing to deliver marks what a pass
    would (the topic's low-water mark may move) without queueing an empty pass; one that leaves work queues it."""
    worker, log, ch = setup(capacity=8)
    ids = [7001, 7002]
    for body, msg_id in zip((b"a", b"b"), ids):
        log.append(body, time.time_ns(), msg_id, 0)
    s = FakeSession(1, rdy=1)
    ch.add_consumer(s)
    ch.deliver()
    assert s.received == [b"a"]
    worker.pending.clear()
    ch.finish_one(s, b"%016x" % ids[0])
    assert ch in worker.pending and s.in_flight == 0  # b waits: a pass is due
    worker.pending.clear()
    ch.deliver()
    assert s.received == [b"a", b"b"]
    worker.touched.clear()
    ch.finish_one(s, b"%016x" % ids[1])
    assert ch not in worker.pending and ch.topic in worker.touched and s.finish_count == 2
    assert len(worker.inflight) == 0


def test_a_record_read_again_while_its_message_is_in_flight_is_passed_over(setup):
    """After a worker's crash its replacement may read records again whose messages already hold in-flight slots
    (the cursor is saved less often than slots are taken): those are skipped, the rest delivered, each once."""
    worker, log, ch = setup(capacity=8)
    publish(log, [b"a", b"b", b"c"])
    start = log.cursor(ch.ch)
    s = FakeSession(1, rdy=2)
    ch.add_consumer(s)
    ch.deliver()
    assert s.received == [b"a", b"b"]
    assert log.rewind(ch.ch, start)  # as a replacement finds it: a and b in flight, the cursor before them
    s.rdy = 10
    drain(ch)
    assert s.received == [b"a", b"b", b"c"] and s.in_flight == 3 and log.depth(ch.ch) == 0
