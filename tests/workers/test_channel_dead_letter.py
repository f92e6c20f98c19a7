"""A channel's max attempts, dead-letter topic and message TTL (issue 49), without a broker (tests/workers/fakes.py:
a real log, in-flight table and deferred store; the host records the dead letters it is asked to publish).

What must hold: a message delivered max_attempts times and then REQ'd (any delay), timed out or left in flight by a
consumer that went away is moved once to the dead-letter topic (header: topic, channel, original id, attempts,
publish timestamp, reason; then the body unchanged) and its slot freed only once the publish is committed; a
message older than the TTL is never delivered (from the log, requeued or due), moved when a dead-letter topic is in
effect and dropped otherwise, counted either way, holding no slot and no cursor back; a refused or parked
dead-letter publish loses nothing; a crash while a dead letter is under way sends it again and never delivers it
again; a channel with no policy behaves as NSQ's."""
import time

import pytest

from tests.workers.fakes import FakeSession, drain, finish_all, publish, setup  # noqa: F401 (fixture)
from nsqpy.ipc import inflight as IF
from nsqpy.protocol.ids import id_to_hex
from nsqpy.workers.domain import dead_letter as DL
from nsqpy.workers.domain.channel import Channel
from nsqpy.workers.domain.policy import Policy

_ids = iter(range(5000, 10**9))
DEAD = "t.dead"
SECOND = 10**9


def publish_at(log, bodies, timestamp, not_before=0):
    """Messages published at `timestamp` ns -> their ids."""
    ids = []
    for b in bodies:
        ids.append(next(_ids))
        log.append(b, timestamp, ids[-1], not_before)
    return ids


def held(worker, s):
    """(slot, hex id) of each message in flight at s."""
    t = worker.inflight
    return [(x, id_to_hex(t.slot(x).msg_id)) for x in t.iter_conn(s.conn_id).tolist()]


def req_all(ch, s, timeout_ms=0, then_pass=True):
    """REQ every message in flight at s, then the channel's pass the worker runs after a read's commands (the
    REQs asked for one): dead letters of the REQs go out there, as one publish."""
    for _, msg_id in held(ch.worker, s):
        ch.requeue(s, msg_id, timeout_ms)
    if then_pass:
        ch.deliver()


def letters(worker):
    """Every dead letter committed so far: [(topic, header, body)]."""
    return [(topic, *DL.decode(body)) for topic, bodies in worker.dead_letters for body in bodies]


def consumer(ch, rdy=10, conn=1):
    s = FakeSession(conn, rdy)
    ch.add_consumer(s)
    return s


# ---- the format -------------------------------------------------------------------------------------------------
def test_a_dead_letter_is_one_json_header_line_then_the_body_unchanged():
    body = b"\x00line one\nline two\xff"
    raw = DL.encode("orders", "billing", 0xABCDEF0123456789, 3, 1_700_000_000_123_456_789, DL.MAX_ATTEMPTS, body)
    line, rest = raw.split(b"\n", 1)
    assert line == (b'{"topic":"orders","channel":"billing","id":"abcdef0123456789","attempts":3,'
                    b'"timestamp":1700000000123456789,"reason":"max_attempts"}')
    assert rest == body
    from nsqpy.client import decode_dead_letter  # what a consumer of the dead-letter topic imports
    header, original = decode_dead_letter(raw)
    assert original == body and header["id"] == "abcdef0123456789" and header["attempts"] == 3
    for bad in (b"no header line", b"[1,2]\nbody", b'{"topic":"t"}\nbody', b"{not json\nbody"):
        with pytest.raises(ValueError):
            DL.decode(bad)


# ---- max attempts -----------------------------------------------------------------------------------------------
def test_the_nth_delivery_requeued_is_dead_lettered_once_and_its_slot_freed(setup):
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(max_attempts=3, dead_letter_topic=DEAD)
    ts = time.time_ns()
    [msg_id] = publish_at(log, [b"poison"], ts)
    s = consumer(ch)
    for attempt in (1, 2):  # N-1 requeues: delivered again, as NSQ
        drain(ch)
        assert s.attempts[-1] == attempt
        req_all(ch, s)
        assert worker.dead_letters == [] and ch.requeue_count == attempt
    drain(ch)
    assert s.attempts == [1, 2, 3] and s.received == [b"poison"] * 3
    req_all(ch, s)  # the 3rd delivery REQ'd: dead
    [(topic, header, body)] = letters(worker)
    assert topic == DEAD and body == b"poison"
    assert header == {"topic": "t", "channel": "c", "id": f"{msg_id:016x}", "attempts": 3, "timestamp": ts,
                      "reason": "max_attempts"}
    assert len(worker.inflight) == 0 and s.in_flight == 0 and s.requeue_count == 3
    assert ch.dead_lettered_count == 1 and ch.requeue_count == 2 and ch.expired_count == 0
    drain(ch)
    assert s.attempts == [1, 2, 3] and ch.depth() == 0  # nothing comes back


def test_the_reqs_of_one_read_make_one_dead_letter_publish(setup):
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(max_attempts=1, dead_letter_topic=DEAD)
    publish(log, [b"m%d" % i for i in range(5)])
    s = consumer(ch)
    drain(ch)
    req_all(ch, s)
    assert len(worker.dead_letters) == 1 and sorted(b for _, _, b in letters(worker)) == [b"m%d" % i for i in range(5)]
    assert ch.dead_lettered_count == 5 and len(worker.inflight) == 0


def test_a_deferred_req_at_max_attempts_is_dead_lettered_too(setup):
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(max_attempts=2, dead_letter_topic=DEAD)
    publish(log, [b"later"])
    s = consumer(ch)
    drain(ch)
    req_all(ch, s, timeout_ms=60_000)  # attempt 1, deferred: waits in the store, no slot
    assert ch.deferred_count == 1 and len(worker.inflight) == 0
    worker.come_due(time.time_ns() + 120 * SECOND)
    drain(ch)
    assert s.attempts == [1, 2]
    req_all(ch, s, timeout_ms=60_000)  # attempt 2 with a delay: dead all the same
    [(_, header, body)] = letters(worker)
    assert header["attempts"] == 2 and body == b"later"
    assert ch.deferred_count == 0 and len(worker.inflight) == 0 and ch.dead_lettered_count == 1


def test_a_timeout_at_max_attempts_is_dead_lettered(setup):
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(max_attempts=1, dead_letter_topic=DEAD)
    publish(log, [b"slow"])
    s = consumer(ch)
    drain(ch)
    [(slot, _)] = held(worker, s)
    ch.on_expired(slot, worker.inflight.slot(slot), s)  # what the scanner's EXPIRED does
    ch.deliver()  # the pass it asked for
    [(_, header, body)] = letters(worker)
    assert header["attempts"] == 1 and body == b"slow"
    assert ch.timeout_count == 1 and s.in_flight == 0 and len(worker.inflight) == 0
    drain(ch)
    assert s.received == [b"slow"]


def test_a_consumer_gone_with_messages_in_flight_dead_letters_those_at_max_attempts(setup):
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(max_attempts=2, dead_letter_topic=DEAD)
    publish(log, [b"twice", b"once"])
    s = consumer(ch, rdy=1)
    drain(ch)
    req_all(ch, s)
    s.rdy = 2
    drain(ch)  # "once" (attempt 1), then "twice" again (attempt 2: a requeued message waits behind the log's)
    assert s.received == [b"twice", b"once", b"twice"] and s.attempts == [1, 1, 2] and s.in_flight == 2
    ch.remove_consumer(s)
    ch.deliver()  # the pass it asked for
    [(_, header, body)] = letters(worker)
    assert body == b"twice" and header["attempts"] == 2
    s2 = consumer(ch, conn=2)
    drain(ch)
    assert s2.received == [b"once"] and s2.attempts == [2]  # requeued as NSQ would (it had one attempt)


def test_no_policy_means_nsq_behaviour_requeued_for_ever(setup):
    worker, log, ch = setup(capacity=16)
    publish(log, [b"m"])
    s = consumer(ch)
    drain(ch)
    for _ in range(6):
        req_all(ch, s)  # (and delivered again)
    assert worker.dead_letters == [] and s.attempts == [1, 2, 3, 4, 5, 6, 7]
    assert ch.dead_lettered_count == ch.expired_count == 0 and ch.requeue_count == 6


# ---- TTL --------------------------------------------------------------------------------------------------------
def test_expired_messages_of_the_log_are_dropped_counted_and_never_delivered(setup):
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(message_ttl_ms=1000)
    publish_at(log, [b"old%d" % i for i in range(5)], time.time_ns() - 10 * SECOND)
    publish(log, [b"fresh"])
    s = consumer(ch)
    drain(ch)
    assert s.received == [b"fresh"]
    assert ch.expired_count == 5 and ch.dead_lettered_count == 0 and worker.dead_letters == []
    finish_all(ch, s)
    assert log.depth(ch.ch) == 0 and len(worker.inflight) == 0  # the cursor passed them, no slot kept


def test_expired_messages_go_to_the_dead_letter_topic_when_one_is_set(setup):
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(message_ttl_ms=1000, dead_letter_topic=DEAD)
    ts = time.time_ns() - 10 * SECOND
    ids = publish_at(log, [b"a", b"b", b"c"], ts)
    publish(log, [b"fresh"])
    s = consumer(ch)
    drain(ch)
    assert s.received == [b"fresh"] and s.in_flight == 1
    got = letters(worker)
    assert [body for _, _, body in got] == [b"a", b"b", b"c"] and len(worker.dead_letters) == 1  # one publish
    assert [h["id"] for _, h, _ in got] == [f"{i:016x}" for i in ids]
    assert all(h["reason"] == "ttl" and h["attempts"] == 0 and h["timestamp"] == ts for _, h, _ in got)
    assert ch.expired_count == 3 and ch.dead_lettered_count == 3
    assert len(worker.inflight) == 1 and log.depth(ch.ch) == 0  # only fresh's slot


def test_a_requeued_message_past_its_ttl_is_not_delivered_again(setup):
    worker, log, ch = setup(capacity=16)
    publish_at(log, [b"m"], time.time_ns() - 10 * SECOND)
    s = consumer(ch)
    drain(ch)  # no policy yet: delivered
    req_all(ch, s, then_pass=False)
    ch.policy = Policy(message_ttl_ms=1000, dead_letter_topic=DEAD)  # (its config changed meanwhile)
    drain(ch)
    assert s.attempts == [1]
    [(_, header, body)] = letters(worker)
    assert header["reason"] == "ttl" and header["attempts"] == 1 and body == b"m"
    assert len(worker.inflight) == 0 and ch.depth() == 0


def test_due_deferred_messages_past_their_ttl_are_dropped(setup):
    worker, log, ch = setup(capacity=16)
    ts = time.time_ns() - 10 * SECOND
    publish_at(log, [b"dpub"], ts, not_before=time.time_ns() + 60 * SECOND)
    publish_at(log, [b"req"], ts)
    s = consumer(ch)
    drain(ch)  # dpub parked in the deferred store, req delivered
    req_all(ch, s, timeout_ms=60_000)
    assert ch.deferred_count == 2 and s.received == [b"req"]
    ch.policy = Policy(message_ttl_ms=1000)
    worker.come_due(time.time_ns() + 120 * SECOND)
    drain(ch)
    assert s.received == [b"req"] and ch.expired_count == 2
    assert ch.deferred_count == 0 and ch.depth() == 0 and len(worker.inflight) == 0


def test_due_messages_past_their_ttl_are_dead_lettered_and_fresh_ones_delivered(setup):
    worker, log, ch = setup(capacity=16)
    publish_at(log, [b"old"], time.time_ns() - 10 * SECOND, not_before=time.time_ns() + 60 * SECOND)
    publish(log, [b"young"], not_before=time.time_ns() + 60 * SECOND)
    s = consumer(ch)
    drain(ch)
    ch.policy = Policy(message_ttl_ms=5000, dead_letter_topic=DEAD)
    worker.come_due(time.time_ns() + 120 * SECOND)
    drain(ch)
    assert s.received == [b"young"] and s.attempts == [1]
    [(_, header, body)] = letters(worker)
    assert body == b"old" and header["attempts"] == 0
    assert len(worker.inflight) == 1 and ch.deferred_count == 0


# ---- refused and parked dead-letter publishes -------------------------------------------------------------------
def _at_max(setup, answer):
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(max_attempts=1, dead_letter_topic=DEAD)
    publish(log, [b"m"])
    s = consumer(ch)
    drain(ch)
    worker.dead_letter_answer = answer
    req_all(ch, s)
    return worker, ch, s


def test_a_parked_dead_letter_publish_frees_the_slot_once_committed(setup):
    worker, ch, s = _at_max(setup, "park")
    assert len(worker.inflight) == 1 and worker.dead_letters == [] and ch.dead_lettered_count == 0
    assert s.in_flight == 0  # the REQ was answered: the consumer's credit is back
    drain(ch)
    assert s.attempts == [1]  # held, not delivered meanwhile
    worker.answer_dead_parked(committed=True)
    assert len(worker.inflight) == 0 and ch.dead_lettered_count == 1 and len(letters(worker)) == 1


def test_a_parked_dead_letter_publish_refused_puts_the_message_back(setup):
    worker, ch, s = _at_max(setup, "park")
    worker.answer_dead_parked(committed=False)
    assert ch.dead_lettered_count == 0 and worker.dead_letters == []
    drain(ch)
    assert s.attempts == [1, 2]  # delivered again, not lost; dead-lettered at its next REQ
    worker.dead_letter_answer = True
    req_all(ch, s)
    assert len(letters(worker)) == 1 and len(worker.inflight) == 0


def test_a_refused_dead_letter_publish_delivers_the_message_again_and_logs_once(setup):
    worker, ch, s = _at_max(setup, False)
    drain(ch)
    req_all(ch, s)
    drain(ch)
    assert s.attempts == [1, 2, 3] and ch.dead_lettered_count == 0
    assert len([line for line in worker.log.lines if "refused" in line[1]]) == 1  # once per cause and second


def test_expired_messages_refused_by_the_dead_letter_topic_wait_and_go_later(setup):
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(message_ttl_ms=1000, dead_letter_topic=DEAD)
    worker.dead_letter_answer = False
    publish_at(log, [b"x", b"y"], time.time_ns() - 10 * SECOND)
    s = consumer(ch)
    drain(ch)
    assert s.received == [] and worker.retries == [ch] and len(worker.inflight) == 2  # held, never delivered
    drain(ch)
    assert s.received == []
    worker.dead_letter_answer = True
    ch._doomed_at = 0.0  # what the retry's wait does
    drain(ch)
    assert [body for _, _, body in letters(worker)] == [b"x", b"y"] and len(worker.inflight) == 0
    assert s.received == [] and ch.expired_count == ch.dead_lettered_count == 2


# ---- a crash while a dead letter is under way -------------------------------------------------------------------
def _recovered_channel(worker, log, ch):
    """The channel as a restarted worker rebuilds it (same log channel and key, empty queues), its slots
    recovered as workers/storage/worker_restart.py does."""
    again = Channel(ch.topic, ch.name, ch.ch, ch.key)
    again.policy = ch.policy
    worker.channels = {again.key: again}
    table = worker.inflight
    for slot in table.recover().tolist():
        info = table.slot(slot)
        if not again.recover_held(slot):
            if info.state == IF.IN_FLIGHT:
                table.requeue(slot, 0)
            again.requeued.append((slot, 0))
    return again


def test_a_crash_during_the_dead_letter_publish_sends_it_again_and_never_delivers_it(setup):
    worker, ch, s = _at_max(setup, "park")  # marked, its publish parked: the worker dies now
    worker.dead_parked.clear()
    worker.dead_letter_answer = True
    again = _recovered_channel(worker, ch.topic.log, ch)
    s2 = consumer(again, conn=2)
    drain(again)
    assert s2.received == [] and len(letters(worker)) == 1 and len(worker.inflight) == 0
    assert letters(worker)[0][1]["attempts"] == 1


def test_a_stale_mark_on_a_reused_slot_means_nothing(setup):
    worker, log, ch = setup(capacity=1)
    ch.policy = Policy(max_attempts=1, dead_letter_topic=DEAD)
    publish(log, [b"first", b"second"])
    s = consumer(ch)
    drain(ch)
    req_all(ch, s)  # first dead-lettered; its slot (the only one) carries a mark of an older generation
    drain(ch)
    assert s.received == [b"first", b"second"]
    again = _recovered_channel(worker, log, ch)
    s2 = consumer(again, conn=2)
    drain(again)
    assert s2.received == [b"second"] and len(letters(worker)) == 1


def test_an_invalid_dead_letter_topic_name_means_none(setup):
    """An ephemeral topic's name + the suffix is no valid topic name: its messages behave as without one."""
    worker, log, ch = setup(capacity=16)
    ch.policy = Policy(max_attempts=1, dead_letter_topic="t#ephemeral.dead")
    publish(log, [b"m"])
    s = consumer(ch)
    drain(ch)
    req_all(ch, s)
    assert worker.dead_letters == [] and s.attempts == [1, 2]  # delivered again, as NSQ would
    assert [line for line in worker.log.lines if "not a valid topic name" in line[1]]

