"""The worker's Forwarder without a broker: two workers' forwarders over one real LinkSet in this process's memory,
with fakes of what they use (tests/workers/worker_fakes.py).

* the owner-or-forward decision: a topic of ours is appended here (after what other workers committed to our
  rings), another worker's goes into the ring to its owner and is appended there when the owner drains;
* a full ring is back-pressure, never a silent drop: the publish is parked with its session held, publishes
  behind it wait in order, and once the owner drained, every one is committed and answered;
* a parked publish fails only for a real limit (the owner marked the topic full, the ring stalled);
* an owner whose topic cannot take a forwarded publish keeps it in the ring.
"""
import time
import zlib

import numpy as np
import pytest

from nsqpy.ipc.ring import C_STALLED
from nsqpy.protocol.errors import MpubFailed, PubFailed
from nsqpy.workers.publishing.forwarding import Parked
from tests.workers.worker_fakes import PublishingSession, close_links, topic_owned_by, two_workers

BODY = b"x" * 1000  # 64 KiB rings: some dozens fit


@pytest.fixture
def rigs(tmp_path):
    w0, w1, links = two_workers(str(tmp_path))
    yield w0, w1
    close_links(links)


OURS, THEIRS = topic_owned_by(0), topic_owned_by(1)


def arrays(*bodies):
    buf = np.frombuffer(b"".join(bodies), np.uint8)
    lengths = np.array([len(b) for b in bodies], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    return buf, offsets, lengths


def mpub(topic, *bodies):
    buf, offsets, lengths = arrays(*bodies)
    return type("Mpub", (), {"topic": topic, "buffer": buf.tobytes(), "offsets": offsets, "lengths": lengths})


# ---- the owner-or-forward decision ------------------------------------------------------------------------
def test_a_topic_of_ours_is_appended_here(rigs):
    w0, _ = rigs
    s = PublishingSession()
    w0.forwarder.publish(s, OURS, [b"hello"], 0, "PUB")
    assert w0.topics.topics[OURS].bodies == [b"hello"]
    assert s.oks == 1 and w0.pump.learned == [(OURS, 0)]


def test_another_workers_topic_is_forwarded_and_appended_by_its_owner(rigs):
    w0, w1 = rigs
    s = PublishingSession()
    w0.forwarder.publish_mpub(s, mpub(THEIRS, b"a", b"b"))
    assert s.oks == 1  # committed to the ring: OK at once
    assert THEIRS not in w0.topics.topics and w0.pump.learned == [(THEIRS, 1)]
    assert w1.forwarder.drain_rings() == 1
    assert w1.topics.topics[THEIRS].bodies == [b"a", b"b"]
    assert w1.topics.topics[THEIRS].acknowledged == [True, True]  # answered OK by the sender already


def test_a_publish_here_comes_after_what_other_workers_committed_to_our_rings(rigs):
    """A producer moved to the owner must not overtake its own earlier, forwarded publishes."""
    w0, w1 = rigs
    w1.forwarder.publish(PublishingSession(), OURS, [b"first"], 0, "PUB")
    w0.forwarder.publish(PublishingSession(), OURS, [b"second"], 0, "PUB")
    assert w0.topics.topics[OURS].bodies == [b"first", b"second"]


def test_lone_pubs_of_ours_hint_the_own_path_and_deliver_before_their_oks(rigs):
    w0, _ = rigs
    assert w0.forwarder.publish_staged(OURS, *arrays(b"p1", b"p2")) is True
    t = w0.topics.topics[OURS]
    assert t.bodies == [b"p1", b"p2"] and w0.own_path.hints == [t] and w0.delivered == 1


def test_lone_pubs_of_another_worker_are_forwarded_without_delivering_here(rigs):
    w0, w1 = rigs
    assert w0.forwarder.publish_staged(THEIRS, *arrays(b"p")) is True
    assert w0.own_path.hints == [] and w0.delivered == 0
    w1.forwarder.drain_rings()
    assert w1.topics.topics[THEIRS].bodies == [b"p"]


def test_a_topic_that_cannot_store_fails_with_the_verbs_error(rigs):
    w0, _ = rigs
    w0.topics.get_topic(OURS).broken = True
    with pytest.raises(PubFailed, match="PUB failed topic .*no space left"):
        w0.forwarder.publish(PublishingSession(), OURS, [b"x"], 0, "PUB")
    with pytest.raises(MpubFailed, match="MPUB failed"):
        w0.forwarder.publish_mpub(PublishingSession(), mpub(OURS, b"x"))
    assert w0.forwarder.publish_staged(OURS, *arrays(b"x")) is False  # the pump answers E_PUB_FAILED


def test_a_topic_the_owner_marked_full_is_refused_at_once(rigs):
    w0, w1 = rigs
    w0.marks.full.add((1, zlib.crc32(THEIRS.encode())))
    with pytest.raises(PubFailed, match=f"topic {THEIRS} is full"):
        w0.forwarder.publish(PublishingSession(), THEIRS, [b"x"], 0, "PUB")
    assert w1.forwarder.drain_rings() == 0  # nothing went into the ring


# ---- a full ring: back-pressure --------------------------------------------------------------------------
def fill_until_parked(w0, topic=THEIRS, limit=1000):
    """Publish BODY to ``topic`` until one is parked; -> (sessions answered OK, the held session)."""
    answered = []
    for i in range(limit):
        s = PublishingSession(f"s{i}")
        w0.forwarder.publish(s, topic, [BODY], 0, "PUB")
        if s.held:
            return answered, s
        answered.append(s)
    raise AssertionError("the ring never filled")


def test_a_full_ring_parks_the_publish_and_holds_its_session(rigs):
    w0, w1 = rigs
    answered, held = fill_until_parked(w0)
    assert all(s.oks == 1 for s in answered) and held.oks == 0 and held.errors == []
    assert w0.forwarder.parked_count == 1 and not w0.forwarder.parked_room()
    behind = PublishingSession("behind")
    w0.forwarder.publish(behind, THEIRS, [b"small"], 0, "PUB")  # fits, but must not overtake the parked one
    assert behind.held and w0.forwarder.parked_count == 2
    assert w0.loop.timers  # the safety-net poll is armed (the owner's wake-up normally retries)

    w1.forwarder.drain_rings()  # the owner releases records: room again
    assert w0.forwarder.parked_room()
    w0.forwarder.retry_parked()
    assert held.oks == 1 and behind.oks == 1 and not held.held and not behind.held
    assert w0.forwarder.parked_count == 0 and not w0.forwarder.parked
    while w1.forwarder.drain_rings():
        pass
    # nothing dropped, nothing reordered
    assert w1.topics.topics[THEIRS].bodies == [BODY] * (len(answered) + 1) + [b"small"]


def test_lone_pubs_to_a_full_ring_come_back_parked(rigs):
    w0, w1 = rigs
    fill_until_parked(w0)
    p = w0.forwarder.publish_staged(THEIRS, *arrays(b"lone"))
    assert isinstance(p, Parked)  # the pump adds the batch's sessions to it and holds them
    s = PublishingSession()
    p.add(s)
    w1.forwarder.drain_rings()
    w0.forwarder.retry_parked()
    assert s.oks == 1


def test_a_parked_publish_fails_once_the_owner_marks_its_topic_full(rigs):
    w0, _ = rigs
    _, held = fill_until_parked(w0)
    w0.marks.full.add((1, zlib.crc32(THEIRS.encode())))
    w0.forwarder.retry_parked()
    assert held.oks == 0 and len(held.errors) == 1
    assert isinstance(held.errors[0], PubFailed) and f"topic {THEIRS} is full" in str(held.errors[0])
    assert w0.forwarder.parked_count == 0


def test_a_parked_publish_fails_when_the_owner_stalled_its_ring(rigs):
    w0, _ = rigs
    _, held = fill_until_parked(w0)
    w0.forwarder.pub_out[1].ring.ctl[C_STALLED] = 1  # the owner cannot store the record at the ring's head
    w0.forwarder.retry_parked()
    assert len(held.errors) == 1 and "cannot be stored now: no space" in str(held.errors[0])


def test_a_parked_publish_of_a_closed_session_goes_nowhere(rigs):
    w0, w1 = rigs
    answered, held = fill_until_parked(w0)
    held.closed = True
    w1.forwarder.drain_rings()
    w0.forwarder.retry_parked()
    assert held.oks == 0 and held.errors == [] and w0.forwarder.parked_count == 0
    while w1.forwarder.drain_rings():
        pass
    assert len(w1.topics.topics[THEIRS].bodies) == len(answered)


def test_dropping_parked_publishes_at_a_stop_forgets_them(rigs):
    w0, _ = rigs
    fill_until_parked(w0)
    w0.forwarder.drop_parked()
    assert w0.forwarder.parked_count == 0 and not w0.forwarder.parked


# ---- the owner's side ---------------------------------------------------------------------------------------
def test_a_forwarded_publish_the_owners_topic_cannot_take_stays_in_the_ring(rigs):
    w0, w1 = rigs
    w0.forwarder.publish(PublishingSession(), THEIRS, [b"kept"], 0, "PUB")
    t = w1.topics.get_topic(THEIRS)
    t.room = 0  # its budgets are used up
    w1.forwarder.drain_rings()
    assert t.bodies == [] and w1.forwarder.pub_in[0].ring.ctl[C_STALLED] == 1  # senders fail, not wait
    assert w1.loop.timers  # a retry wakes the loop
    t.room = None
    deadline = time.monotonic() + 30
    while not t.bodies:  # the retry is time-based (FORWARD_RETRY): drain until it is due
        assert time.monotonic() < deadline
        w1.forwarder.drain_rings()
    assert t.bodies == [b"kept"] and w1.forwarder.pub_in[0].ring.ctl[C_STALLED] == 0
