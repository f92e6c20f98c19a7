"""Issue 49's delivery policies across a whole-broker SIGKILL, on a real nsqd (2 workers) with the suite's raw V2
connections (tests/broker/wire.py).

Every process of the broker is killed at once (``Nsqd.kill_all``: supervisor and children), then a new nsqd on the
same data path recovers what the dead instance left in shared memory (workers/storage/broker_crash.py: one child
per old worker rebuilds it as a restarted worker and saves it to disk, then the new instance loads it). The
policies (max attempts with the dead-letter topic, TTL, bounded channels with reject and drop_oldest) must hold
across it: nothing acknowledged is lost that the policy did not drop, and a dead letter is never delivered to its
channel again. The worker-SIGKILL and clean-restart halves are in test_dead_letter.py, test_bounded_channels.py
and tests/http/test_policy_config.py, whose helpers are reused here.

The policy counters (``dead_lettered_count``, ``expired_count``, ``dropped_count``) are a channel's counters in
its owner's memory (``Channel``), as NSQ's ``message_count``: the new instance starts them at 0, so the tests
assert what was counted before the crash and what the new instance counts after it, each on its own.

Each "nothing more arrives" window ends with a sync point: a fresh PUB to the same topic and its delivery.
"""
from __future__ import annotations

import time
import zlib

import pytest

from nsqpy.client import decode_dead_letter
from nsqpy.protocol import client as C
from namespaces import log_on_failure
from test_bounded_channels import bodies, channel_stats, make_channel, producers, topic_depth
from test_dead_letter import _serve, _wait_past, topic_apart
from wire import Conn, consumer, producer, unique

WAIT = 60.0
RECOVERED = "recovered the crashed instance's messages"
LIMIT = 5
DEFER_MS = 10_000  # test_max_attempts_...: keeps a third of the messages mid-way until after the crash


def crash_and_restart(nsqd_factory, nsqd, *flags):
    """SIGKILL every process of nsqd at once; -> a new nsqd with the same flags on its data path, once it logged
    that it recovered the dead instance's messages."""
    nsqd.kill_all()
    again = nsqd_factory(*flags, data=nsqd.data_path, workers=2)
    again.wait_for_line(RECOVERED, WAIT)
    return again


def _serve_reconnecting(connect, until, deadline):
    """``_serve`` fresh connections from ``connect()`` (closing those the broker closed, e.g. during its start)
    until ``until()`` holds; -> the live connections."""
    while True:
        conns = connect()
        if _serve(conns, until, deadline):
            return conns
        for c in conns:
            c.close()


def test_max_attempts_dead_letters_survive_a_whole_broker_sigkill(nsqd_factory):
    """Messages i % 3 == 0 are FINed at their first delivery, the others REQ'd at every delivery (dead-lettered at
    their 3rd), those i % 3 == 2 deferred by DEFER_MS at their first; the broker is SIGKILLed once some are
    dead-lettered, while the deferred ones are mid-way (without the deferral a loaded machine's dead-letter consumer
    could lag until every message had had its 3rd delivery, and the crash met none mid-way). After the restart every
    acknowledged message is FINed or on the dead-letter topic (its header naming the original id and >= 3
    attempts), none is lost, and none already on the dead-letter topic is delivered to the channel again.
    Duplicates on the dead-letter topic are allowed (a crash between the dead letter's commit and the release of
    its slot: the same header id twice), loss is not."""
    flags = ("--max-attempts=3",)
    nsqd = nsqd_factory(*flags, workers=2)
    topic = topic_apart(2)
    n = 120
    sent = bodies(n)
    ids, attempts, fined, dead, again, answered = {}, {}, set(), set(), [], [0]
    letters = []  # every dead letter received: (header, body), duplicates included

    def on_message(msg):
        answered[0] += 1
        again.extend([msg.body] if msg.body in dead else [])
        if msg.body != b"sync":
            assert ids.setdefault(msg.body, msg.id) == msg.id  # the same message (its id kept across the crash)
            attempts[msg.body] = max(attempts.get(msg.body, 0), msg.attempts)
            kind = int(msg.body[1:]) % 3
            if kind:
                return C.req(msg.id, DEFER_MS if kind == 2 and msg.attempts == 1 else 0)
        fined.add(msg.body)
        return C.fin(msg.id)

    def on_dead(msg):
        header, body = decode_dead_letter(msg.body)
        letters.append((header, body))
        dead.add(body)
        return C.fin(msg.id)

    def connect(address):
        return {consumer(address, topic, "c", rdy=10): on_message,
                consumer(address, topic + ".dead", "dlq", rdy=50): on_dead}

    def close(conns):
        for c in conns:
            c.close()

    deadline = time.monotonic() + 3 * WAIT
    with log_on_failure(nsqd):
        conns = connect(nsqd.address)
        producer(nsqd.address, topic, *sent)  # each answered OK: acknowledged
        _serve(conns, lambda: answered[0] >= n + n // 2 and len(dead) >= 5, deadline)
    before = set(dead)
    mid_way = {b for b, a in attempts.items() if a < 3 and b not in fined}
    print(f"at the crash: {len(fined)} FINed, {len(before)} dead-lettered, {len(mid_way)} mid-way")
    assert before and mid_way  # the crash meets both
    at_crash = dict(attempts)
    again_n = crash_and_restart(nsqd_factory, nsqd, *flags)
    close(conns)
    with log_on_failure(again_n):
        try:
            conns = _serve_reconnecting(lambda: connect(again_n.address), lambda: fined | dead >= set(sent), deadline)
        except AssertionError:
            lost = sorted(set(sent) - fined - dead)
            raise AssertionError(f"{len(lost)} acknowledged messages neither FINed nor dead-lettered: "
                                 f"{[(b, at_crash.get(b)) for b in lost]} (body, most attempts seen before the crash)")
        producer(again_n.address, topic, b"sync")  # the sync point: what the channel still held comes before it
        assert _serve(conns, lambda: b"sync" in fined, deadline)
        close(conns)
    assert again == []  # nothing on the dead-letter topic came back to the channel
    assert dead == {b for i, b in enumerate(sent) if i % 3 != 0}  # FINed ones never dead-lettered; none lost
    assert fined - {b"sync"} == {b for i, b in enumerate(sent) if i % 3 == 0}
    for header, body in letters:
        assert header["topic"] == topic and header["channel"] == "c" and header["reason"] == "max_attempts"
        assert header["attempts"] >= 3, header
        if body in ids:  # (a message in flight at the crash may be dead-lettered by the recovery, unseen since)
            assert header["id"] == ids[body].decode(), (header, body)
    fourth = sorted(b for b, a in attempts.items() if a > 3)  # (held at their 3rd attempt at the crash: see below)
    print(f"{len(letters)} dead letters for {len(dead)} messages ({len(letters) - len(dead)} duplicates); "
          f"{len(fourth)} delivered a 4th time after the restart")


def test_a_message_in_flight_at_its_last_attempt_is_not_delivered_again_after_a_whole_broker_sigkill(nsqd_factory):
    """Delivered 3 times (REQ'd twice), held in flight at the 3rd when the broker is SIGKILLed: its consumer went
    away, as at a disconnect (``Channel.requeue_conn``), so it is dead, and the new instance sends it to the
    dead-letter topic instead of delivering it a 4th time."""
    flags = ("--max-attempts=3",)
    nsqd = nsqd_factory(*flags, workers=2)
    topic = topic_apart(2)
    with log_on_failure(nsqd):
        c = consumer(nsqd.address, topic, "c", rdy=1)
        producer(nsqd.address, topic, b"last")
        for attempt in (1, 2, 3):
            msg = c.read_message(WAIT)
            assert (msg.body, msg.attempts) == (b"last", attempt)
            if attempt < 3:
                c.send(C.req(msg.id, 0))
        c.sync()  # the 3rd delivery is held in flight
    again = crash_and_restart(nsqd_factory, nsqd, *flags)
    c.close()
    with log_on_failure(again):
        dlq = consumer(again.address, topic + ".dead", "dlq", rdy=10)
        c = consumer(again.address, topic, "c", rdy=10)
        producer(again.address, topic, b"sync")  # the sync point: anything the channel still held comes first
        first = c.read_message(WAIT)
        assert (first.body, first.attempts) == (b"sync", 1), (first.body, first.attempts)
        header, body = decode_dead_letter(dlq.read_message(WAIT).body)
        assert body == b"last" and header["attempts"] == 3 and header["id"] == msg.id.decode()
        c.close()
        dlq.close()


@pytest.mark.parametrize("dead_letter", [False, True], ids=["dropped", "dead_lettered"])
def test_ttl_expires_across_a_whole_broker_sigkill(nsqd_factory, dead_letter):
    """Messages published, the broker SIGKILLed before they expire, the new one started once the clock passed their
    TTL: none is delivered; each is counted in expired_count (and, with a dead-letter topic, is on it)."""
    ttl_ms = 3000
    flags = (f"--message-ttl={ttl_ms}ms", *(["--max-attempts=5"] if dead_letter else []))
    nsqd = nsqd_factory(*flags, workers=2)
    topic = topic_apart(2, "ttl")
    old = [b"old%02d" % i for i in range(20)]
    with log_on_failure(nsqd):
        make_channel(nsqd, topic)
        start = time.time_ns()  # before every publish timestamp
        producer(nsqd.address, topic, *old)
        published = time.time_ns()  # after every publish timestamp
        st = channel_stats(nsqd, topic)
        assert st["depth"] == len(old) and st.get("expired_count", 0) == 0, st
    nsqd.kill_all()
    assert time.time_ns() < start + ttl_ms * 10**6, "the machine was too slow: killed after the TTL"
    _wait_past(published + ttl_ms * 10**6)  # the condition: every one of them has expired
    again = nsqd_factory(*flags, data=nsqd.data_path, workers=2)
    again.wait_for_line(RECOVERED, WAIT)
    with log_on_failure(again):
        dlq = consumer(again.address, topic + ".dead", "dlq", rdy=50) if dead_letter else None
        c = consumer(again.address, topic, "c", rdy=50)
        producer(again.address, topic, b"fresh")  # the sync point: delivered, and nothing before it
        msg = c.read_message(WAIT)
        assert (msg.body, msg.attempts) == (b"fresh", 1)
        if dead_letter:
            got = [decode_dead_letter(m.body) for m in dlq.read_messages(len(old), WAIT)]
            assert sorted(b for _, b in got) == old
            assert all(h["reason"] == "ttl" and h["channel"] == "c" and start <= h["timestamp"] <= published
                       for h, _ in got), got
            dlq.close()
        st = channel_stats(again, topic)
        assert st.get("expired_count") == len(old), st
        assert st.get("dead_lettered_count", 0) == (len(old) if dead_letter else 0), st
        assert st["depth"] == 0 and st["in_flight_count"] == 1, st
        c.send(C.fin(msg.id))
        assert c.read_until_settled() == []
        c.close()


def _refused_everywhere(nsqd, topic, owner_first=True):
    """One more PUB from a producer on each worker is refused, the owner's first by default (its refusal marks the
    topic for the other workers, if it was not marked yet: the test below)."""
    why = f"channel {topic}:c is full (max_depth {LIMIT})"
    conns = producers(nsqd)
    mine = f"worker {zlib.crc32(topic.encode()) % 2}"
    for name in sorted(conns, key=lambda name: (name == mine) != owner_first):
        c = conns[name]
        c.send(C.pub(topic, b"over"))
        c.expect_fatal("E_PUB_FAILED", f"E_PUB_FAILED PUB failed {why}")
        c.close()


@pytest.mark.parametrize("overflow", ["reject", "drop_oldest"])
def test_bounded_channels_hold_across_a_whole_broker_sigkill(nsqd_factory, overflow):
    """A channel of max_depth LIMIT filled to its limit (reject) or past it (drop_oldest), from producers on both
    workers, then the broker SIGKILLed: the new one holds exactly what was acknowledged and kept (drop_oldest: the
    newest LIMIT), and the policy still applies (one more publish is refused / drops the oldest). dropped_count
    is the dead instance's until the crash; the new instance counts from 0 (a channel's counters live in its
    owner's memory, not in what the recovery saves)."""
    flags = (f"--max-channel-depth={LIMIT}", f"--channel-overflow={overflow}")
    nsqd = nsqd_factory(*flags, workers=2)
    topic = unique("bc")
    acked = []
    with log_on_failure(nsqd):
        make_channel(nsqd, topic)
        conns = list(producers(nsqd).values())
        per = LIMIT + 1 if overflow == "drop_oldest" else None
        for i, p in enumerate(conns):  # in turn, each answered before the next: one order for the topic
            batch = bodies(per or (LIMIT // len(conns) + (i < LIMIT % len(conns))), f"p{i}-")
            p.publish(topic, *batch)
            acked += batch
            p.close()
        kept = acked[-LIMIT:]
        st = channel_stats(nsqd, topic)
        assert st["depth"] == LIMIT and st["dropped_count"] == len(acked) - LIMIT, st
        if overflow == "reject":
            assert len(acked) == LIMIT
            _refused_everywhere(nsqd, topic)
    again = crash_and_restart(nsqd_factory, nsqd, *flags)
    with log_on_failure(again):
        deadline = time.monotonic() + WAIT
        while (depth := topic_depth(again, topic)) != LIMIT:  # the workers publish their stats rows
            assert time.monotonic() < deadline, f"depth {depth} after the restart, {LIMIT} kept"
        assert channel_stats(again, topic).get("dropped_count", 0) == 0  # counted anew by the new instance
        if overflow == "reject":
            _refused_everywhere(again, topic)
        else:
            with Conn(again.address) as p:
                p.publish(topic, b"newest")
            kept = kept[1:] + [b"newest"]
            st = channel_stats(again, topic)
            assert st["depth"] == LIMIT and st["dropped_count"] == 1, st
        c = consumer(again.address, topic, "c", rdy=100)
        got = c.read_messages(LIMIT, WAIT)
        assert [m.body for m in got] == kept
        for m in got:
            c.send(C.fin(m.id))
        # the FINs come on another connection than the sync's PUB: until the owner took them the channel is still
        # full, and a reject channel refuses the PUB (seen in CI)
        while (st := channel_stats(again, topic))["depth"] + st["in_flight_count"]:
            assert time.monotonic() < deadline, f"the FINs not taken: {st}"
        producer(again.address, topic, b"sync")  # the sync point: nothing else the channel held comes before it
        assert c.read_message(WAIT).body == b"sync"
        c.close()


def test_another_workers_publish_is_refused_first_after_a_whole_broker_sigkill(nsqd_factory):
    flags = (f"--max-channel-depth={LIMIT}", "--channel-overflow=reject")
    nsqd = nsqd_factory(*flags, workers=2)
    topic = unique("bx")
    with log_on_failure(nsqd):
        make_channel(nsqd, topic)
        producer(nsqd.address, topic, *bodies(LIMIT))
        assert channel_stats(nsqd, topic)["depth"] == LIMIT
    again = crash_and_restart(nsqd_factory, nsqd, *flags)
    with log_on_failure(again):
        deadline = time.monotonic() + WAIT
        while (depth := topic_depth(again, topic)) != LIMIT:
            assert time.monotonic() < deadline, f"depth {depth} after the restart"
        _refused_everywhere(again, topic, owner_first=False)
