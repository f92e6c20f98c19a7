"""The pump (workers/lane/pump.py): lone PUBs read, published and answered in compiled code, and round-trip producers
moved to their topic's owner (always, or with auto placement only slow ones, and back out when they speed up).
The compiled recogniser (nsqpy/protocol/v2_recognisers.py) with the pump's topic table is checked against the
parser, the reference for every rule, on generated input (tests/protocol/test_v2_recognisers.py holds it to the
parser's byte tables); the rest over real sockets against a real broker: OKs only after the messages are in,
per-producer order kept across a move, a full topic refused through the fast path."""
import json
import re
import struct
import threading
import time
import socket
import types
import urllib.request
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nsqpy.protocol import Limits, V2Parser
from nsqpy.protocol import client as C
from nsqpy.protocol.commands import Mpub, Pub
from nsqpy.workers.connections.handover import MOVE_IN_CAP, MOVED_PRODUCER, MOVED_SUBSCRIBER, NAP_WINDOW, Connections, OwnerNaps
from nsqpy.protocol.v2_recognisers import lone_mpub_line, lone_pub_line, short_by
from nsqpy.workers.lane.pump import (AUTO, JUDGE_WINDOWS, MOVE_AFTER, MOVED_HERE, OWNER, OWNER_BUSY, SLOWER_AFTER_MOVE,
                                     SPREAD, USUAL_GROWS_PER_S, WATCH_S, Pump, find_topic, move_decision)
from nsqpy.workers.publishing.records import owner_of
from tests.polling import wait_until
from wire import Conn, consumer, unique

LIMITS = Limits(max_msg_size=64)
KNOWN = ["t", "t.1", "topic_2", "x#ephemeral", "a" * 64]
name_bytes = st.one_of(st.sampled_from([n.encode() for n in KNOWN]),
                       st.text("abcXYZ019._-#t", min_size=0, max_size=70).map(str.encode),
                       st.binary(max_size=70).filter(lambda b: b"\n" not in b))


@st.composite
def pub_like(draw):
    """PUB lines with known and unknown names, sizes that lie, extra params, \\r, trailing or missing bytes."""
    topic = draw(name_bytes)
    body = draw(st.binary(max_size=70))
    size = draw(st.one_of(st.just(len(body)), st.integers(-3, 70), st.integers(-2**31, 2**31 - 1)))
    line = b"PUB " + topic + draw(st.sampled_from([b"", b"", b"\r", b" extra"])) + b"\n"
    return line + struct.pack(">i", size) + body + draw(st.sampled_from([b"", b"", b"NOP\n", b"P"]))


@st.composite
def mpub_like(draw):
    """MPUB lines: known and unknown names, counts and sizes that lie, empty or too big messages, short bodies,
    trailing bytes."""
    topic = draw(name_bytes)
    bodies = draw(st.lists(st.binary(max_size=70), max_size=5))
    count = draw(st.one_of(st.just(len(bodies)), st.integers(-2, 7)))
    payload = struct.pack(">i", count) + b"".join(
        struct.pack(">i", draw(st.one_of(st.just(len(b)), st.integers(-2, 72)))) + b for b in bodies)
    size = draw(st.one_of(st.just(len(payload)), st.integers(-3, 400)))
    line = b"MPUB " + topic + draw(st.sampled_from([b"", b"", b"\r", b" extra"])) + b"\n"
    return line + struct.pack(">i", size) + payload + draw(st.sampled_from([b"", b"", b"NOP\n", b"P"]))


@pytest.fixture(scope="module")
def table():
    pump = Pump(LIMITS.max_msg_size)
    for name in KNOWN:
        pump.learn_topic(name, 0)
    yield pump
    pump.close()


def classify(pump, data):
    """What the pump's read does with one read of `data`: (topic, body) when it would stage it, else None."""
    buf = np.frombuffer(data, np.uint8).copy()
    nl = lone_pub_line(buf, 0, len(buf), LIMITS.max_msg_size)
    if nl <= 0:
        return None
    t = find_topic(buf, 4, nl - 4, pump.names, pump.name_lens, pump.table)
    return None if t < 0 else (pump.topics[t], data[nl + 5:])


def classify_mpub(pump, data):
    """(topic, [bodies]) when the pump's read would stage `data` as one MPUB, else None."""
    buf = np.frombuffer(data, np.uint8).copy()
    nl, n = lone_mpub_line(buf, 0, len(buf), LIMITS.max_msg_size, LIMITS.max_body_size)
    if nl <= 0:
        return None
    t = find_topic(buf, 5, nl - 5, pump.names, pump.name_lens, pump.table)
    if t < 0:
        return None
    bodies, p = [], nl + 9
    for _ in range(n):
        size = struct.unpack_from(">i", data, p)[0]
        bodies.append(data[p + 4:p + 4 + size])
        p += 4 + size
    return pump.topics[t], bodies


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.one_of(pub_like(), st.builds(C.pub, st.sampled_from(KNOWN), st.binary(min_size=1, max_size=64)),
                 st.binary(max_size=120)))
def test_compiled_recogniser_agrees_with_the_parser(table, data):
    staged = classify(table, data)
    parser = V2Parser(LIMITS, expect_magic=False)
    if staged is not None:
        assert parser.feed(data) == [Pub(*staged)]


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.one_of(mpub_like(), st.builds(C.mpub, st.sampled_from(KNOWN),
                                        st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=5))))
def test_compiled_mpub_recogniser_agrees_with_the_parser(table, data):
    staged = classify_mpub(table, data)
    if staged is not None:
        (cmd,) = V2Parser(LIMITS, expect_magic=False).feed(data)
        assert isinstance(cmd, Mpub) and cmd.topic == staged[0]
        assert [bytes(cmd.buffer[o:o + n]) for o, n in zip(cmd.offsets, cmd.lengths)] == staged[1]


def test_compiled_mpub_recogniser_takes_one_whole_mpub_and_leaves_the_rest(table):
    assert classify_mpub(table, C.mpub("t", [b"a"])) == ("t", [b"a"])
    assert classify_mpub(table, C.mpub("t.1", [b"a", b"bc", b"d" * 64])) == ("t.1", [b"a", b"bc", b"d" * 64])
    assert classify_mpub(table, C.mpub("t", [b"a"]) + C.nop()) is None      # more than one command
    assert classify_mpub(table, C.mpub("t", [b"a"])[:-1]) is None           # incomplete
    assert classify_mpub(table, C.mpub("unknown", [b"a"])) is None          # the parser learns names first
    assert classify_mpub(table, C.mpub("t", [b"a", b""])) is None           # E_BAD_MESSAGE: the parser's
    assert classify_mpub(table, C.mpub("t", [b"x" * 65])) is None           # too big: the parser's
    assert classify_mpub(table, C.mpub("t", [])) is None                    # no messages
    assert classify(table, C.mpub("t", [b"a"])) is None                     # not a PUB


def test_compiled_recogniser_takes_the_round_trip_and_leaves_the_rest(table):
    assert classify(table, C.pub("t.1", b"hello")) == ("t.1", b"hello")
    assert classify(table, C.pub("a" * 64, b"x")) == ("a" * 64, b"x")
    assert classify(table, C.pub("t", b"x") + C.nop()) is None        # more than one command
    assert classify(table, C.pub("t", b"x")[:-1]) is None             # incomplete
    assert classify(table, C.pub("unknown", b"x")) is None            # the parser learns names first
    assert classify(table, C.pub("t", b"x" * 65)) is None             # E_BAD_MESSAGE is the parser's to send
    assert classify(table, b"PUB t\n\x00\x00\x00\x00") is None         # size 0
    assert classify(table, b"PUB t\r\n\x00\x00\x00\x01x") is None      # "t\r" is not "t"


def missing(data):
    """What the pump's read would try to receive more of after a read of exactly `data` (``short_by``)."""
    return short_by(np.frombuffer(data, np.uint8).copy(), 0, len(data))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.builds(C.pub, st.sampled_from(KNOWN), st.binary(min_size=1, max_size=300)),
                 st.builds(C.mpub, st.sampled_from(KNOWN),
                           st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=5))),
       st.data())
def test_a_partly_received_publish_names_exactly_what_it_lacks(command, data):
    """Once a read holds a PUB's or MPUB's size, the pump asks for the rest of that command and no byte more; before
    that (or when it is whole) it asks for nothing."""
    cut = data.draw(st.integers(min_value=0, max_value=len(command)))
    size_end = command.index(b"\n") + 5
    assert missing(command[:cut]) == (len(command) - cut if size_end <= cut else 0)


def test_only_a_publish_is_completed():
    assert missing(C.nop()) == 0
    assert missing(b"FIN 0123456789abcdef\n") == 0
    assert missing(b"DPUB t 10\n\x00\x00\x00\x05ab") == 0    # the parser's, as ever
    assert missing(b"PUB t\n\x00\x00\x00\x05ab") == 3
    assert missing(b"PUBX t\n\x00\x00\x00\x05ab") == 0
    assert missing(b"MPUB t\n\x00\x01\x00\x00") == 65536    # more than one recv takes: the read asks for none
    assert missing(b"PUB " + b"t" * 70 + b"\n\x00\x00\x00\x05") == 0  # no newline within a name's length


@pytest.mark.parametrize("verb", ["PUB", "MPUB"])
def test_a_full_topic_refuses_lone_pubs_and_keeps_what_it_answered(nsqd_factory, verb):
    """mem 16 MiB (two segments, the least) + disk 1 MiB (less than a segment: none): 16 KiB lone PUBs (or
    MPUBs of two: the pump stages those too) until E_PUB_FAILED / E_MPUB_FAILED (fatal). On the topic's owner
    that comes when the log is full; on the other worker as soon as the owner marked the topic full (what was
    already forwarded goes into the log's overdraft). Every message answered OK reaches the channel, nothing
    else does."""
    nsqd = nsqd_factory("--mem-queue-size=1", "--max-disk-bytes-per-topic=1048576")
    topic = unique()
    body = b"f" * 16384
    oks = 0
    with Conn(nsqd.address) as p:
        while True:
            if verb == "PUB":
                p.send(C.pub(topic, body + str(oks).encode()))
            else:
                p.send(C.mpub(topic, [body + str(oks).encode(), body + str(oks + 1).encode()]))
            kind, data = p.expect_frame()
            if data != b"OK":
                break
            oks += 1 if verb == "PUB" else 2
            assert oks < 5000, "the topic never filled up"
        assert (kind, data) == (1, f"E_{verb}_FAILED {verb} failed topic {topic} is full".encode())
        p.expect_closed()
    with consumer(nsqd.address, topic, "ch", rdy=100) as c:
        for k in range(oks):
            m = c.read_message()
            assert m.body == body + str(k).encode()
            c.send(C.fin(m.id))
        c.expect_no_frame(within=0.3)


@pytest.mark.parametrize("placement,workers", [("owner", 2), ("spread", 2), ("owner", 4), ("spread", 4)])
def test_round_trip_producers_keep_their_order_moved_or_spread(nsqd_factory, placement, workers):
    """Producers spread over the workers, each publishing lone PUBs to one topic in lockstep. With
    --producer-placement=owner those not on the topic's owner move there (log lines say so), with
    spread they stay and forward (their owner appends runs of forwarded records); either way nothing is lost,
    and each producer's messages arrive in the order it published them, across its move. 4 workers: more
    workers than this machine's cores."""
    nsqd = nsqd_factory("--log-level=debug", f"--producer-placement={placement}", workers=workers)
    topic = unique()
    producers, per = 3 * workers, 3 * MOVE_AFTER
    conns = [Conn(nsqd.address) for _ in range(producers)]
    for i, c in enumerate(conns):
        c.publish(topic, f"{i}:first".encode())  # teaches the parser (and so the pump) the topic
    barrier = threading.Barrier(producers)
    errors = []

    def run(i, c):
        try:
            barrier.wait(timeout=20)
            for k in range(per):  # odd producers send MPUBs of one, as NSQ's bench_writer --batch-size=1
                body = f"{i}:{k}".encode()
                c.send(C.mpub(topic, [body]) if i % 2 else C.pub(topic, body))
                c.expect_response(b"OK")
        except Exception as e:  # reported below; a thread cannot fail the test itself
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in conns:
        c.close()
    assert not errors, errors
    if placement == "owner":
        nsqd.wait_for_line(re.compile(r"handed producer .* to worker \d"), timeout=10)
    with consumer(nsqd.address, topic, "ch", rdy=2500) as c:
        seen = {}
        for _ in range(producers * (per + 1)):  # more than RDY 2500 with 4 workers: FIN each
            m = c.read_message()
            c.send(C.fin(m.id))
            i, k = m.body.decode().split(":")
            seen.setdefault(int(i), []).append(k)
        assert sorted(seen) == list(range(producers))
        for i, ks in seen.items():
            assert ks == ["first"] + [str(k) for k in range(per)], f"producer {i} out of order"
        c.expect_no_frame(within=0.3)
    if placement == "spread":  # every OK came before the consumer's reads: a move would have been logged
        assert "handed producer" not in nsqd.output()


def test_per_fd_state_grows_with_the_fd_numbers_and_keeps_what_it_held():
    """A broker with thousands of connections has fds past the first allocation: growing keeps every value."""
    import socket
    pump = Pump(1024)
    a, b = socket.socketpair()
    try:
        class Peer:
            fd, wbuf, pub_counts, moved_in, moved_in_took, stay_out = a.fileno(), b"", {}, False, 0.0, False
        pump.add(Peer, 12.5)
        pump.gen[7], pump.clean[7], pump.tally_topic[7] = 3, 1, 2
        size = pump.gen.size
        pump._fd_arrays(size * 4)
        assert pump.gen.size == size * 4 and pump.last_read[Peer.fd] == 12.5
        assert (pump.gen[7], pump.clean[7], pump.tally_topic[7]) == (3, 1, 2)
        assert pump.tally_topic[size * 4 - 1] == -1 and pump.streak_owner[size] == -1
        pump.remove(Peer)
        assert Peer.fd not in pump.sessions
    finally:
        pump.close()
        a.close()
        b.close()


def test_a_full_topic_does_not_hold_up_other_topics(nsqd_factory):
    """Topic A fills up (no channel, small budget) from producers on both workers; topic B, owned by the same
    worker, keeps taking publishes from both workers at once, and both keep exactly what they answered OK."""
    nsqd = nsqd_factory("--mem-queue-size=1", "--max-disk-bytes-per-topic=1048576")
    a = unique("a")
    b = next(n for n in (unique("b") for _ in range(200)) if zlib.crc32(n.encode()) % 2 == zlib.crc32(a.encode()) % 2)
    body = b"f" * 16384
    fillers = [Conn(nsqd.address) for _ in range(2)]  # the acceptor spreads them: one per worker
    oks = 0
    for p in fillers:
        with p:
            while True:
                p.send(C.pub(a, body))
                kind, data = p.expect_frame()
                if data != b"OK":
                    assert (kind, data) == (1, f"E_PUB_FAILED PUB failed topic {a} is full".encode())
                    break
                oks += 1
                assert oks < 5000, "topic a never filled up"
    others = [Conn(nsqd.address) for _ in range(2)]
    for i, p in enumerate(others):
        with p:
            t0 = time.monotonic()
            p.publish(b, *[b"%d-%d" % (i, k) for k in range(20)])
            assert time.monotonic() - t0 < 15.0  # generous: waiting for topic a to drain would be forever here
    with consumer(nsqd.address, b, "ch", rdy=100) as c:
        assert sorted(m.body for m in c.read_messages(40)) == sorted(b"%d-%d" % (i, k) for i in range(2)
                                                                      for k in range(20))
    with consumer(nsqd.address, a, "ch", rdy=100) as c:
        for _ in range(oks):
            c.send(C.fin(c.read_message().id))
        c.expect_no_frame(within=0.3)


def asks_to_move(mode, owner, times, me=0, moved_in=False, rates=(2000, 5000), busy=False, moved_here=2,
                 took_before=0.0, stay_out=False, recorded=None):
    """move_decision for one producer (fd 3) whose one-message commands went to topics of worker ``owner`` at
    ``times`` (seconds), this worker busy or not, serving ``moved_here`` producers moved in, its window before
    it moved in ``took_before`` seconds: the indices of the commands after which it asked to move. ``recorded``:
    a list that gets the took_before the decisions wrote."""
    streak, streak_owner = np.zeros(8, np.int64), np.full(8, -1, np.int64)
    streak_t0, moved, before, out = np.zeros(8), np.zeros(8, np.uint8), np.zeros(8), np.zeros(8, np.uint8)
    best, watched = np.zeros(8), np.zeros(8)
    moved[3], before[3], out[3] = moved_in, took_before, stay_out
    r = np.array((*rates, 1 if busy else 0, moved_here), np.float64)
    asked = [i for i, now in enumerate(times)
             if move_decision(3, owner, me, mode, r, now, streak, streak_owner, streak_t0, moved, before, best, out,
                              watched)]
    if recorded is not None:
        recorded.append(float(before[3]))
    return asked


SLOW = [i * 0.001 for i in range(12 * MOVE_AFTER)]    # 1,000 a second
FAST = [i * 0.0001 for i in range(12 * MOVE_AFTER)]   # 10,000 a second
EVERY_WINDOW = [k * MOVE_AFTER - 1 for k in range(1, 13)]
WATCHED = [i for i in EVERY_WINDOW if SLOW[i] >= WATCH_S]  # auto moves in once the producer was watched WATCH_S


def test_placement_decisions_by_mode_and_rate():
    """spread never moves; owner moves after every MOVE_AFTER commands to one other worker, however fast; auto
    only when they came at most at the move-in rate; a producer moved to the owner asks to move out once a window
    came faster than the move-out rate (and one that was not moved there never does)."""
    assert asks_to_move(SPREAD, 1, SLOW) == []
    assert asks_to_move(OWNER, 1, FAST) == EVERY_WINDOW
    assert asks_to_move(AUTO, 1, FAST) == []
    assert asks_to_move(AUTO, 1, SLOW) == WATCHED and 0 < len(WATCHED) < len(EVERY_WINDOW)
    assert asks_to_move(AUTO, 1, SLOW, rates=(900, 5000)) == []  # 1,000 a second is above a 900 move-in rate
    assert asks_to_move(AUTO, 0, FAST, moved_in=True) == EVERY_WINDOW  # on the owner: out again
    assert asks_to_move(AUTO, 0, SLOW, moved_in=True) == []
    assert asks_to_move(AUTO, 0, FAST) == []            # accepted here: never moved out
    assert asks_to_move(OWNER, 0, FAST, moved_in=True) == []  # owner placement keeps them


def _windows(*spacings):
    """Command times of one window of MOVE_AFTER per spacing (seconds between commands)."""
    times, now = [], 0.0
    for gap in spacings:
        for _ in range(MOVE_AFTER):
            times.append(now)
            now += gap
    return times


def test_auto_moves_in_by_the_usual_window_not_one_slow_one():
    """A fast producer with one slow window (a hiccup of the host) does not move in under auto: its usual window,
    the fastest recent one, is still fast; one that stays slow moves in once its usual window has grown past the
    move-in rate's (it grows USUAL_GROWS_PER_S of itself per second of windows), and not before several windows
    went by."""
    assert asks_to_move(AUTO, 1, _windows(1e-4, 1e-4, 1e-3, 1e-4, 1e-4)) == []
    slowed = _windows(1e-4, 1e-4, *[1e-3] * 30)
    asked = asks_to_move(AUTO, 1, slowed)
    assert asked and asked[0] > 12 * MOVE_AFTER  # 2 fast windows, then >10 slow ones before the first ask
    assert asks_to_move(OWNER, 1, slowed)[0] == MOVE_AFTER - 1  # owner placement moves at the first window


def test_a_hiccup_of_many_windows_does_not_move_a_fast_producer_in():
    """What the usual window forgets goes by time, not by windows: a round-trip producer at 33,000 a second (windows
    of ~2 ms) slowed to 10,000 a second for 64 ms (10 windows, below the 20,000 move-in rate) by the host stays
    where it is, where forgetting 10% a window had it move in (and then hold the owner's loop for both producers);
    slow for longer than a second or two, it moves in. A producer slow from its first window moves in only once it
    was watched WATCH_S (a fresh connection's first windows are no measure of its pace)."""
    rates, fast, hiccup = (20_000, 40_000), 3e-5, 1e-4
    assert asks_to_move(AUTO, 1, _windows(*[fast] * 20, *[hiccup] * 10, *[fast] * 20), rates=rates) == []
    asked = asks_to_move(AUTO, 1, _windows(*[fast] * 20, *[hiccup] * 400), rates=rates)
    slow_since = 20 * MOVE_AFTER * fast
    assert asked and 0.3 < _windows(*[fast] * 20, *[hiccup] * 400)[asked[0]] - slow_since < 2.0
    from_start = _windows(*[hiccup] * 100)
    asked = asks_to_move(AUTO, 1, from_start, rates=rates)
    assert asked and from_start[asked[0]] >= WATCH_S and from_start[asked[0]] - WATCH_S < MOVE_AFTER * hiccup


def test_a_move_in_that_made_the_round_trips_slower_is_undone_for_good():
    """Deciding to move in records the last window; on the owner, a producer whose fastest window of its first
    JUDGE_WINDOWS takes SLOWER_AFTER_MOVE times as long as that one asks to move out (two round-trip producers on
    one owner's loop: each got slower than on two cores), and keeps asking until it moves; one whose windows only
    wobble around it (a paced producer on a busy host) or that the move sped up does not. A producer that moved
    out once (stay_out) never asks to move in again under auto; owner placement ignores that."""
    took = []
    assert asks_to_move(AUTO, 1, SLOW, recorded=took) == WATCHED
    assert took == [pytest.approx(MOVE_AFTER * 0.001)]  # its window: 1,000 a second
    took = []
    assert asks_to_move(AUTO, 1, _windows(3e-4, *[1e-3] * 12), recorded=took)  # (a burst, then paced)
    assert took == [pytest.approx(MOVE_AFTER * 0.001)]  # its last window, not the usual one (the burst's, grown)
    window = MOVE_AFTER * 0.001
    slower = _windows(*[0.001 * (SLOWER_AFTER_MOVE + 0.1)] * (JUDGE_WINDOWS + 1))
    judged = [k * MOVE_AFTER - 1 for k in (JUDGE_WINDOWS, JUDGE_WINDOWS + 1)]
    assert asks_to_move(AUTO, 0, slower, moved_in=True, took_before=window) == judged
    wobbly = _windows(0.001, 0.0015, 0.0016, 0.001 * (SLOWER_AFTER_MOVE + 0.1), 0.0015, 0.0014)
    assert asks_to_move(AUTO, 0, wobbly, moved_in=True, took_before=window) == []
    assert asks_to_move(AUTO, 0, _windows(*[0.0009] * 6), moved_in=True, took_before=window) == []
    assert asks_to_move(AUTO, 0, slower, moved_in=True) == []  # nothing recorded (moved in by an older worker)
    assert asks_to_move(AUTO, 1, SLOW, stay_out=True) == []
    assert asks_to_move(OWNER, 1, SLOW, stay_out=True) == EVERY_WINDOW


def test_a_busy_owner_moves_out_the_producers_moved_in_however_slow_but_the_last():
    """While the owner uses more than its busy share of a core, each producer moved in asks to move out at
    the end of its window while others moved in are there too; the last one stays, unless it publishes fast (its
    own round trips would take a hop more, and once it left the owner was no longer busy and took it back: a
    round-trip producer moved out and in every window). A busy worker does not move producers it accepted, and
    it is Python's check that keeps others from moving in (``Connections.move_producer``)."""
    assert asks_to_move(AUTO, 0, SLOW, moved_in=True, busy=True) == EVERY_WINDOW
    assert asks_to_move(AUTO, 0, SLOW, moved_in=True, busy=True, moved_here=1) == []
    assert asks_to_move(AUTO, 0, FAST, moved_in=True, busy=True, moved_here=1) == EVERY_WINDOW
    assert asks_to_move(AUTO, 0, SLOW, busy=True) == []
    assert asks_to_move(OWNER, 0, SLOW, moved_in=True, busy=True) == []
    assert asks_to_move(AUTO, 1, SLOW, busy=True) == WATCHED  # (the owner's naps are Python's check)
    p = Pump(1 << 20, 0, AUTO)
    p.set_load(0.79, 1.0)
    assert p.rates[OWNER_BUSY] == 0
    p.set_load(0.81, 1.0)
    assert p.rates[OWNER_BUSY] == 1
    assert p.set_load(0.5, 1.0) is False
    assert p.rates[OWNER_BUSY] == 0
    p.close()


def test_the_pump_counts_the_producers_moved_in_that_it_serves():
    """rates[MOVED_HERE]: up when a session moved in joins, down when it leaves (its fd may come back as another
    session's, not moved in)."""
    p = Pump(1 << 20, 0, AUTO)
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        sessions = [types.SimpleNamespace(fd=a.fileno(), wbuf=b"", moved_in=m, moved_in_took=0.0, stay_out=False,
                                          pub_counts={})
                    for (a, _), m in zip(pairs, (True, True, False))]
        for s in sessions:
            p.add(s, 0.0)
        assert p.rates[MOVED_HERE] == 2
        p.remove(sessions[0])
        p.remove(sessions[2])
        assert p.rates[MOVED_HERE] == 1
        p.add(types.SimpleNamespace(fd=sessions[0].fd, wbuf=b"", moved_in=False, moved_in_took=0.0,
                                    stay_out=False, pub_counts={}), 0.0)
        assert p.rates[MOVED_HERE] == 1 and p.moved_in[sessions[0].fd] == 0
    finally:
        p.close()
        for a, b in pairs:
            a.close()
            b.close()


def test_a_streak_counts_one_other_worker_and_each_window_is_timed_alone():
    """Commands to a second worker's topics restart the streak; each window is timed from the end of the last, and
    a slow window after a fast one only lets the usual window grow by USUAL_GROWS_PER_S of itself per second of
    the slow window (no move yet)."""
    streak, streak_owner = np.zeros(8, np.int64), np.full(8, -1, np.int64)
    streak_t0, moved, rates = np.zeros(8), np.zeros(8, np.uint8), np.array([2000.0, 5000.0, 0.0, 0.0])
    before, best, out, watched = np.zeros(8), np.zeros(8), np.zeros(8, np.uint8), np.zeros(8)

    def decide(owner, now):
        return move_decision(3, owner, 0, AUTO, rates, now, streak, streak_owner, streak_t0, moved, before, best, out,
                             watched)
    asked = []
    for i in range(MOVE_AFTER - 1):  # slow, but then one to worker 2
        asked.append(decide(1, i * 0.001))
    asked.append(decide(2, 0.07))
    assert not any(asked) and streak[3] == 1 and streak_owner[3] == 2
    times = [0.07 + i * 0.0001 for i in range(1, MOVE_AFTER)] + [0.08 + i * 0.001 for i in range(MOVE_AFTER)]
    asked = [decide(2, now) for now in times]
    assert not any(asked)
    fast, slow = (MOVE_AFTER - 1) * 0.0001, times[-1] - times[MOVE_AFTER - 2]
    assert before[3] == pytest.approx(fast * (1 + USUAL_GROWS_PER_S * slow))  # the fast window's, grown once


def test_owner_naps_judge_each_full_window_of_forwards():
    naps = OwnerNaps(2)
    for k in range(NAP_WINDOW):
        naps.saw(1, k < NAP_WINDOW // 2)  # half of them woke it
    assert naps.idle.tolist() == [False, True]
    for k in range(NAP_WINDOW - 1):
        naps.saw(1, False)
    assert naps.idle[1]  # judged once the window is full
    naps.saw(1, True)
    assert not naps.idle[1]


class _Control:
    def __init__(self, moved_in, busy=False):
        self._moved_in = moved_in
        self._busy = busy

    def moved_in(self, w):
        return self._moved_in

    def busy(self, w):
        return self._busy

    def add_moved_in(self, w, delta):
        self._moved_in += delta

    def least_loaded(self, besides=None):
        return 2 if besides != 2 else 0


class _Mover:
    """Just what ``Connections.move_producer`` uses of a worker."""
    move_producer = Connections.move_producer
    _lost_hand_over = Connections._lost_hand_over

    def __init__(self, placement, idle=True, moved_in=0, fail=False, busy=False):
        self.index, self.placement, self.control = 0, placement, _Control(moved_in, busy)
        self.owner_naps = OwnerNaps(3)
        self.owner_naps.idle[1] = idle
        self.fail = fail
        self.handed = []
        self.extras = []
        self.pump = types.SimpleNamespace(took_before=np.full(8, 0.05))

    def _hand_over(self, s, owner, kind, extra):
        if self.fail:
            return False
        self.handed.append((owner, extra["moved_in"]))
        self.extras.append(extra)
        return True


def _producer(**state):
    fields = dict(closed=False, closing_after_flush=False, channel=None, reading=True, held=False, fd=3,
                  stay_out=False, parser=types.SimpleNamespace(idle=True, state=1))
    return types.SimpleNamespace(**{**fields, **state})


@pytest.mark.parametrize("placement,idle,moved_in,busy,handed", [
    (AUTO, True, 0, False, [(1, True)]),
    (AUTO, False, 0, False, []),                    # the owner was awake for most forwards: busy, stay
    (AUTO, True, 0, True, []),                      # asleep between forwards, but over its busy share of a core
    (AUTO, True, MOVE_IN_CAP, False, []),           # it has its share of moved producers
    (AUTO, True, MOVE_IN_CAP - 1, False, [(1, True)]),
    (OWNER, False, MOVE_IN_CAP, True, [(1, True)]),  # owner placement: always
])
def test_move_in_needs_an_idle_owner_under_its_cap(placement, idle, moved_in, busy, handed):
    w = _Mover(placement, idle, moved_in, busy=busy)
    w.move_producer(_producer(), 1)
    assert w.handed == handed


def test_one_batch_of_movers_stops_at_the_cap_and_a_failed_hand_over_gives_its_place_back():
    """The sender counts a moved producer when it hands it over (the owner takes it later), so six slow producers
    asking in one loop iteration move only up to the cap."""
    w = _Mover(AUTO)
    for _ in range(MOVE_IN_CAP + 2):
        w.move_producer(_producer(), 1)
    assert w.handed == [(1, True)] * MOVE_IN_CAP and w.control.moved_in(1) == MOVE_IN_CAP
    failing = _Mover(AUTO, fail=True)
    failing.move_producer(_producer(), 1)
    assert failing.control.moved_in(1) == 0


def test_a_moved_producer_gone_before_the_owner_takes_it_gives_its_place_back():
    """The owner cannot take a moved producer whose client already left (its socket has no peer): the place its
    sender counted under the cap is returned; a subscriber or a producer moved out counts nothing."""
    owner = _Mover(AUTO, moved_in=2)
    owner._lost_hand_over(MOVED_PRODUCER, json.dumps({"moved_in": True}).encode())
    assert owner.control.moved_in(0) == 1
    owner._lost_hand_over(MOVED_PRODUCER, json.dumps({"moved_in": False}).encode())
    owner._lost_hand_over(MOVED_SUBSCRIBER, json.dumps({"moved_in": True}).encode())
    owner._lost_hand_over(MOVED_PRODUCER, b"not json")
    assert owner.control.moved_in(0) == 1


def test_move_out_goes_to_the_least_loaded_other_worker_and_busy_sessions_stay():
    w = _Mover(AUTO)
    w.move_producer(_producer(), -1)
    assert w.handed == [(2, False)] and w.extras[0]["stay_out"]  # moved out once: it stays out (move_decision)
    w.move_producer(_producer(), 1)
    assert w.extras[1]["took_before"] == 0.05 and not w.extras[1]["stay_out"]  # the owner judges the move by it
    w.handed = w.handed[:1]
    for state in ({"held": True}, {"closed": True}, {"reading": False}, {"channel": object()}):
        w.move_producer(_producer(**state), 1)
    assert w.handed == [(2, False)]


class _Producers:
    """``n`` round-trip producers of one topic, each publishing "<i>:<k>" (k counting up) with threads, in
    phases."""

    def __init__(self, nsqd, topic, n=4):
        self.topic = topic
        self.conns = [Conn(nsqd.address) for _ in range(n)]
        for i, c in enumerate(self.conns):
            c.publish(topic, f"{i}:first".encode())  # teaches the parser (and so the pump) the topic
        self.sent = {i: 0 for i in range(n)}
        self.errors = []

    def _publish(self, i, c, count, gap):
        try:
            for _ in range(count):
                c.send(C.pub(self.topic, f"{i}:{self.sent[i]}".encode()))
                c.expect_response(b"OK")
                self.sent[i] += 1
                if gap:
                    time.sleep(gap)  # pacing: this is the slow producer being tested, not a wait for state
        except Exception as e:  # reported below; a thread cannot fail the test itself
            self.errors.append(e)

    def phase(self, count, gap):
        threads = [threading.Thread(target=self._publish, args=(i, c, count, gap)) for i, c in enumerate(self.conns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not self.errors, self.errors

    def close_and_check(self, nsqd):
        """Every message arrived once, each producer's in order."""
        for c in self.conns:
            c.close()
        with consumer(nsqd.address, self.topic, "ch", rdy=2500) as c:
            seen = {}
            for _ in range(sum(self.sent.values()) + len(self.conns)):
                m = c.read_message()
                c.send(C.fin(m.id))
                i, k = m.body.decode().split(":")
                seen.setdefault(int(i), []).append(k)
            for i, ks in seen.items():
                assert ks == ["first"] + [str(k) for k in range(self.sent[i])], f"producer {i} out of order"
            assert sorted(seen) == list(range(len(self.conns)))
            c.expect_no_frame(within=0.3)


@pytest.mark.parametrize("workers", [2, 4])  # 4 workers: more than the cores
def test_auto_placement_moves_a_slow_producer_to_the_owner_and_out_again(nsqd_factory, workers):
    """Real broker, auto placement with a low move-in rate (200/s): producers publishing lone PUBs every 10 ms
    move to the topic's owner; the owner hands them to another worker again once they publish faster than the
    move-out rate (400/s). Every message arrives once, each producer's in order, across the moves."""
    nsqd = nsqd_factory("--log-level=debug", "--producer-move-in-rate=200", "--producer-move-out-rate=400",
                        workers=workers)
    topic = unique()
    owner = owner_of(topic, workers)
    producers = _Producers(nsqd, topic)
    producers.phase(MOVE_AFTER + 1, 0.01)
    nsqd.wait_for_line(re.compile(rf"worker (?!{owner}:)\d+: handed producer .* to worker {owner}\b"), timeout=30)
    producers.phase(3 * MOVE_AFTER, 0)  # as fast as round trips go: above the move-out rate
    nsqd.wait_for_line(re.compile(rf"worker {owner}: handed producer .* to worker (?!{owner}\b)\d+"), timeout=30)
    producers.close_and_check(nsqd)


def test_auto_placement_moves_no_producer_to_a_busy_owner(nsqd_factory):
    """--producer-busy-percent=0: the owner is busy from the end of its first load period on (any CPU use is over
    0% of a core), and logs it. Slow producers then stay where they are, window after window. (Before, a busy
    owner moved each producer moved in out at the end of its window while the others moved it back in at the end
    of the next: a round-trip producer that alone kept its owner busy crossed over and back, window after window.
    That a busy owner keeps the last producer moved in is the pump's rule, tested above.) Every message arrives
    once."""
    nsqd = nsqd_factory("--log-level=debug", "--producer-move-in-rate=200", "--producer-busy-percent=0", workers=2)
    topic = unique()
    owner = owner_of(topic, 2)
    nsqd.wait_for_line(re.compile(rf"worker {owner}: busy \("), timeout=30)
    producers = _Producers(nsqd, topic)
    producers.phase(3 * MOVE_AFTER + 1, 0.01)  # three windows each, every one slow enough to move in
    producers.close_and_check(nsqd)
    assert not re.search(rf"handed producer .* to worker {owner}\b", nsqd.output())


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_pub_reaches_its_consumer_before_its_ok_goes_out(nsqd_factory, pipelined):
    """One worker holds the producer and the consumer. A lone PUB (the pump's) is delivered and flushed before
    the pump sends its OK; a PUB followed by a NOP in the same write (the parser's) has its OK queued first, and
    the worker flushes the sessions given messages before the others. Either way the OK's send, which wakes
    the producer (and could take the worker's CPU), comes after the message's. On loopback a send is in the
    peer's receive queue when it returns, so once the OK is read the message is already readable: a
    zero-timeout read finds it."""
    nsqd = nsqd_factory("--workers=1")
    topic = unique()
    with Conn(nsqd.address) as p, consumer(nsqd.address, topic, "ch", rdy=100) as c:
        p.publish(topic, b"first")  # the parser's path: it creates the topic, the pump then knows its name
        assert c.read_message().body == b"first"
        for k in range(20):
            p.send(C.pub(topic, b"m%d" % k) + (C.nop() if pipelined else b""))
            p.expect_response(b"OK")
            c.sock.setblocking(False)
            try:
                data = c.sock.recv(1 << 16)
            except BlockingIOError:
                data = b""
            finally:
                c.sock.settimeout(30)
            assert data, f"message {k}: its OK came first"
            c.frames.extend(c.decoder.feed(data))
            assert c.read_message().body == b"m%d" % k


@pytest.mark.parametrize("workers", [1, 2])
def test_round_trips_fins_and_a_failed_fin_keep_the_counts_nsqd_reports(nsqd_factory, workers):
    """One message at a time (PUB, receive, FIN) with an unbuffered RDY 1 consumer on the owner, whose FINs the
    lane takes while the topic is armed (the producer moved there, as in the test below): every message is
    delivered once, each FIN is counted once, a FIN of an ID no longer in flight still fails as nsqd's does (and
    leaves the session working), and /stats ends with nothing in flight."""
    nsqd = nsqd_factory("--producer-placement=owner", workers=workers)
    topic, n = unique(), 3 * MOVE_AFTER
    with Conn(nsqd.address) as p, consumer(nsqd.address, topic, "ch", rdy=1, output_buffer_size=-1) as c:
        last = None
        for k in range(n):
            p.publish(topic, b"rt%d" % k)
            m = c.read_message()
            assert (m.body, m.attempts) == (b"rt%d" % k, 1)
            c.send(C.fin(m.id))
            last = m.id
        c.send(C.fin(last))  # finished already
        c.expect_error("E_FIN_FAILED", f"E_FIN_FAILED FIN {last.decode()} failed ID not in flight")
        p.publish(topic, b"after")
        m = c.read_message()
        assert m.body == b"after"
        c.send(C.fin(m.id))
        c.expect_no_frame(within=0.3)  # no reply to a good FIN (its sync point comes after it)
        row = wait_until(lambda: _channel_stats(nsqd, topic, in_flight_count=0, message_count=n + 1),
                         what="every message finished")
        assert (row["depth"], row["requeue_count"], row["timeout_count"]) == (0, 0, 0)
        [client] = row["clients"]
        assert (client["finish_count"], client["message_count"], client["in_flight_count"]) == (n + 1, n + 1, 0)


def _channel_stats(n, topic, **expect):
    """The channel "ch" of topic in /stats (JSON) when each field of ``expect`` has its value, else None."""
    url = f"http://{n.http_address[0]}:{n.http_address[1]}/stats?format=json&topic={topic}&channel=ch"
    with urllib.request.urlopen(url, timeout=30) as r:
        [ch] = [c for t in json.loads(r.read())["topics"] for c in t["channels"]]
    return ch if all(ch[k] == v for k, v in expect.items()) else None


@pytest.mark.parametrize("workers", [1, 2])
def test_small_mpubs_reach_their_consumer_before_their_ok_goes_out(nsqd_factory, workers):
    """A paced producer's MPUBs of two (what fell due) take the owner's own path in the lane when it is armed
    (with two workers the producer is moved to the owner first, as --producer-placement=owner does after
    MOVE_AFTER one-message commands, and the consumer lives there; one worker owns everything): both messages
    are sent, in order, before the command's one OK (see the test above for the zero-timeout read)."""
    nsqd = nsqd_factory("--producer-placement=owner", workers=workers)
    topic = unique()
    with Conn(nsqd.address) as p, consumer(nsqd.address, topic, "ch", rdy=2500) as c:
        for k in range(2 * MOVE_AFTER):
            p.publish(topic, b"lone%d" % k)
            m = c.read_message()
            assert m.body == b"lone%d" % k
            c.send(C.fin(m.id))
        for k in range(20):
            p.send(C.mpub(topic, [b"m%da" % k, b"m%db" % k]))
            p.expect_response(b"OK")
            c.sock.setblocking(False)
            try:
                while more := c.sock.recv(1 << 16):  # what is in the socket now, without waiting
                    c.frames.extend(c.decoder.feed(more))
            except BlockingIOError:
                pass
            finally:
                c.sock.settimeout(30)
            assert len(c.frames) >= 2, f"MPUB {k}: its OK came before its messages ({len(c.frames)} frames)"
            assert [c.read_message().body for _ in range(2)] == [b"m%da" % k, b"m%db" % k]
        p.expect_no_frame(within=0.3)  # one OK per MPUB: nothing more for the producer
