"""Bounded channels (workers/domain/bounds.py) at their edges, without a broker: a real Topic and its Channels on a
real log (tests/workers/fakes.py ``FakeTopicHost``), with a real control block in local memory for the marks.

What must hold: reject refuses the whole publish that would take a channel over max_depth / max_bytes (exactly at
the limit is taken, one over is not, an MPUB straddling it is refused whole) naming the channel and its limit, and
appends nothing; block raises ChannelBlocked the same way (nothing appended) but an empty channel takes any
publish; a publish other workers already acknowledged is always appended; drop_oldest keeps the newest messages
in delivery order and counts every drop (log records, then requeued ones once the cursor reached them);
#ephemeral channels drop_oldest whatever their overflow; the mark other workers read says refuse (naming the
channel) or block, and clears once the channel is below its limit again, or its bound is gone. On the senders'
side (two Forwarders over real rings): a reject mark refuses PUB, MPUB and the pump's lone PUBs at once with that
reason, forwarding nothing; a block mark holds the publish back with its session held, and once cleared every
held publish is committed and answered, in order."""
import time
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from nsqpy.protocol.errors import MpubFailed, PubFailed
from nsqpy.workers.control.block import MARK_BLOCKED, MARK_CHANNEL_FULL, MARK_FULL, Control, nbytes
from nsqpy.workers.domain import bounds
from nsqpy.workers.domain.policy import Policy
from nsqpy.workers.domain.topic import ChannelBlocked, ChannelFull, Topic
from nsqpy.workers.publishing.forwarding import Refused
from tests.workers.fakes import FakeSession, FakeTopicHost, drain, finish_all
from tests.workers.worker_fakes import PublishingSession, close_links, topic_owned_by, two_workers


def bodies_of(messages):
    src = np.frombuffer(b"".join(messages), np.uint8)
    lengths = np.array([len(m) for m in messages], np.int64)
    offsets = np.zeros(len(messages), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    return src, offsets, lengths


def pub(t, *messages, acknowledged=False):
    return t.append(*bodies_of(messages), time.time_ns(), acknowledged=acknowledged)


@pytest.fixture
def bounded(tmp_path, shm_prefix):
    made = []

    def make(topic="t", channel="c", **policy):
        host = FakeTopicHost(tmp_path, shm_prefix)
        host.control = Control.create(SimpleNamespace(buf=bytearray(nbytes(1))), 1)
        t = Topic(host, topic, len(made) + 1)
        made.append(t)
        ch = t.get_channel(channel)
        ch.policy = Policy(**policy)
        t.policy_changed()
        return host, t, ch

    yield make
    for t in made:
        if not t.deleted:
            t.destroy()


def waiting(t, ch):
    """The bodies ch has yet to deliver from the log, oldest first (the cursor does not move)."""
    b = t.log.read(ch.ch, 1 << 16, 1 << 40)
    return [t.log.body(int(p)) for p in b.positions[:b.n]]


def mark(host, t):
    c = host.control
    return c.mark_kind(0, t.crc), c.refusal(0, t.crc, t.name)


def consume(t, ch, k):
    b = t.log.read(ch.ch, k, 1 << 40)
    t.log.advance(ch.ch, b.next_position)


def test_reject_takes_a_channel_exactly_to_max_depth_and_refuses_one_over_whole(bounded):
    host, t, ch = bounded(max_depth=3, overflow="reject")
    assert pub(t, b"a") and pub(t, b"b", b"c")  # exactly at the limit
    assert mark(host, t) == (MARK_CHANNEL_FULL, "channel t:c is full (max_depth 3)")
    with pytest.raises(ChannelFull, match=r"^channel t:c is full \(max_depth 3\)$"):
        pub(t, b"d")
    assert ch.depth() == 3 and t.message_count == 3 and waiting(t, ch) == [b"a", b"b", b"c"]
    consume(t, ch, 2)  # a consumer took two: one MPUB of three straddles the limit and is refused whole
    with pytest.raises(ChannelFull):
        pub(t, b"x", b"y", b"z")
    assert ch.depth() == 1 and t.message_count == 3
    assert pub(t, b"x", b"y") and ch.depth() == 3 and ch.dropped_count == 0


def test_the_mark_clears_once_the_channel_is_below_its_limit(bounded):
    host, t, ch = bounded(max_depth=2, overflow="reject")
    pub(t, b"a", b"b")
    assert t.limited is not None and host.control.topic_full(0, t.crc)
    assert t.check_limits() is not None  # still at the limit
    consume(t, ch, 1)
    assert bounds.limit_state(t) is None and t.check_limits() is None
    assert not host.control.topic_full(0, t.crc) and mark(host, t) == (None, None)


def test_a_publish_acknowledged_elsewhere_is_appended_over_the_limit(bounded):
    host, t, ch = bounded(max_depth=2, overflow="reject")
    pub(t, b"a", b"b")
    assert pub(t, b"c", acknowledged=True)  # another worker answered OK already: never lost
    assert ch.depth() == 3 and t.message_count == 3 and t.limited is not None


def test_reject_by_max_bytes_counts_record_bytes(bounded):
    body = b"x" * 100
    per = bounds.stored_bytes(np.array([len(body)], np.int64))
    assert per == 152  # 48-byte header + 100, rounded up to 8
    host, t, ch = bounded(max_bytes=3 * per, overflow="reject")
    assert pub(t, body, body) and pub(t, body)
    assert mark(host, t) == (MARK_CHANNEL_FULL, f"channel t:c is full (max_bytes {3 * per})")
    with pytest.raises(ChannelFull, match="max_bytes"):
        pub(t, b"y")
    assert bounds.channel_bytes(ch) == 3 * per and ch.depth() == 3


def test_block_refuses_nothing_it_appends_and_an_empty_channel_takes_any_publish(bounded):
    host, t, ch = bounded(max_depth=2)  # overflow block by default
    huge = [b"m%d" % i for i in range(5)]
    assert pub(t, *huge)  # bigger than the limit, but nothing waits: taken (it would wait for ever otherwise)
    assert mark(host, t) == (MARK_BLOCKED, None)  # others park their publishes, nothing is refused
    consume(t, ch, 4)
    assert t.check_limits() is None  # one waits: below the limit
    assert pub(t, b"n")
    with pytest.raises(ChannelBlocked):
        pub(t, b"o")
    assert ch.depth() == 2 and t.message_count == 6 and waiting(t, ch) == [b"m4", b"n"]
    assert mark(host, t) == (MARK_BLOCKED, None)


def test_drop_oldest_keeps_the_newest_and_counts_each_drop(bounded):
    host, t, ch = bounded(max_depth=3, overflow="drop_oldest")
    for i in range(5):
        assert pub(t, b"%d" % i)
    assert waiting(t, ch) == [b"2", b"3", b"4"] and ch.dropped_count == 2
    assert pub(t, *[b"m%d" % i for i in range(10)])  # an MPUB bigger than the limit keeps its own last three
    assert waiting(t, ch) == [b"m7", b"m8", b"m9"] and ch.dropped_count == 12
    assert t.message_count == 15 and ch.message_count == 15  # put into the channel, then dropped
    assert t.limited is None and not host.control.topic_full(0, t.crc)  # drop_oldest never marks
    assert t in host.touched  # the reclaim pass frees what was dropped


def test_drop_oldest_by_bytes(bounded):
    per = bounds.stored_bytes(np.array([8], np.int64))
    host, t, ch = bounded(max_bytes=2 * per, overflow="drop_oldest")
    pub(t, *[b"%08d" % i for i in range(5)])
    assert waiting(t, ch) == [b"00000003", b"00000004"] and ch.dropped_count == 3
    assert bounds.channel_bytes(ch) == 2 * per


def test_drop_oldest_drops_requeued_messages_only_when_the_log_holds_none_of_the_excess(bounded):
    host, t, ch = bounded(max_depth=2, overflow="drop_oldest")
    s = FakeSession(1, rdy=10)
    ch.add_consumer(s)
    pub(t, b"a", b"b")
    drain(ch)
    assert s.received == [b"a", b"b"] and ch.depth() == 0
    ch.remove_consumer(s)  # both come back: requeued, depth 2
    assert ch.depth() == 2 and len(host.inflight) == 2
    pub(t, b"c")  # the log holds only the new one: the oldest requeued one goes, its slot freed
    assert ch.depth() == 2 and ch.dropped_count == 1 and len(ch.requeued) == 1 and len(host.inflight) == 1
    s2 = FakeSession(2, rdy=10)
    ch.add_consumer(s2)
    drain(ch)
    assert s2.received == [b"b", b"c"]
    finish_all(ch, s2)


def test_an_ephemeral_channel_drops_oldest_whatever_its_overflow(bounded):
    host, t, ch = bounded(channel="c#ephemeral", max_depth=2, overflow="reject")
    for i in range(4):
        assert pub(t, b"%d" % i)
    assert waiting(t, ch) == [b"2", b"3"] and ch.dropped_count == 2 and t.limited is None


def test_the_strictest_channel_decides_and_a_removed_bound_clears_the_mark(bounded):
    host, t, c1 = bounded(max_depth=5)  # block
    c2 = t.get_channel("d")
    c2.policy = Policy(max_depth=2, overflow="reject")
    t.policy_changed()
    assert t.bounded == (c1, c2)
    pub(t, b"a", b"b")
    assert mark(host, t) == (MARK_CHANNEL_FULL, "channel t:d is full (max_depth 2)")
    with pytest.raises(ChannelFull, match="t:d"):
        pub(t, b"c")
    c2.policy = Policy.OFF
    t.policy_changed()
    assert t.bounded == (c1,) and t.limited is None and not host.control.topic_full(0, t.crc)
    assert pub(t, b"c", b"d", b"e") and t.limited == (MARK_BLOCKED, "c", 0, 5)
    t.delete_channel("c")
    assert t.bounded == () and not host.control.topic_full(0, t.crc)


def test_an_unbounded_topic_never_looks_at_its_channels(bounded):
    host, t, ch = bounded()
    assert t.bounded == () and pub(t, b"a") and t.limited is None


def test_a_full_log_mark_wins_over_a_channel_mark_and_the_channel_mark_comes_back(bounded):
    host, t, ch = bounded(max_depth=1, overflow="reject")
    pub(t, b"a")
    t.set_full(True)  # its log cannot take more: refuse as a full topic
    assert mark(host, t) == (MARK_FULL, "topic t is full")
    t.set_full(False)
    assert mark(host, t) == (MARK_CHANNEL_FULL, "channel t:c is full (max_depth 1)")


def test_control_block_marks_kinds_and_reasons():
    c = Control.create(SimpleNamespace(buf=bytearray(nbytes(2))), 2)
    assert c.mark_kind(1, 7) is None and c.refusal(1, 7, "t") is None
    c.set_topic_mark(1, 7, MARK_CHANNEL_FULL, "x" * 64, 1, 123)
    assert c.topic_full(1, 7) and not c.topic_full(0, 7)
    assert c.refusal(1, 7, "t") == f"channel t:{'x' * 64} is full (max_bytes 123)"
    c.set_topic_mark(1, 7, MARK_BLOCKED, "c")
    assert c.mark_kind(1, 7) == MARK_BLOCKED and c.refusal(1, 7, "t") is None and c.topic_full(1, 7)
    c.set_topic_full(1, 7 + 256, True)  # the same slot: the later topic wins, the other is not marked any more
    assert not c.topic_full(1, 7) and c.refusal(1, 7 + 256, "u") == "topic u is full"
    c.set_topic_full(1, 7, False)  # clearing another topic's slot leaves it alone
    assert c.topic_full(1, 7 + 256)
    c.set_topic_mark(1, 7 + 256, None)
    assert not c.topic_full(1, 7 + 256)
    c.set_topic_mark(1, 7, MARK_CHANNEL_FULL, "a", 0, 1)
    c.set_topic_mark(1, 7 + 32, MARK_CHANNEL_FULL, "b", 0, 2)  # another full slot, the same reason slot
    assert c.refusal(1, 7 + 32, "u") == "channel u:b is full (max_depth 2)"
    assert c.refusal(1, 7, "t") == "channel of topic t is full"  # still refused, the channel's name lost


# ---- the senders' side: the Forwarder with a real control block (tests/workers/worker_fakes.py rigs) ----------
@pytest.fixture
def senders(tmp_path):
    w0, w1, links = two_workers(str(tmp_path))
    control = Control.create(SimpleNamespace(buf=bytearray(nbytes(2))), 2)
    w0.forwarder.control = w1.forwarder.control = control
    yield w0, w1, control
    close_links(links)


def test_a_sender_holds_back_a_publish_while_the_owner_says_block_and_commits_it_once_cleared(senders):
    w0, w1, control = senders
    theirs = topic_owned_by(1)
    crc = zlib.crc32(theirs.encode())
    control.set_topic_mark(1, crc, MARK_BLOCKED, "c", bounds.DEPTH, 5)
    s, later = PublishingSession("s"), PublishingSession("later")
    w0.forwarder.publish(s, theirs, [b"first"], 0, "PUB")
    w0.forwarder.publish(later, theirs, [b"second"], 0, "PUB")
    assert s.held and later.held and s.oks == later.oks == 0 and not s.errors
    w0.forwarder.retry_parked()
    assert s.held and not w0.forwarder.parked_room()  # still marked: nothing to do, the worker may sleep
    assert w1.forwarder.drain_rings() == 0  # nothing was forwarded
    control.set_topic_mark(1, crc, None)  # the owner's channel drained
    assert w0.forwarder.parked_room()
    w0.forwarder.retry_parked()
    assert (s.oks, later.oks) == (1, 1) and not s.held and not later.held and w0.forwarder.parked_count == 0
    w1.forwarder.drain_rings()
    assert w1.topics.topics[theirs].bodies == [b"first", b"second"]  # in order, each once


def test_a_sender_refuses_at_once_naming_the_channel_when_the_owner_says_reject(senders):
    w0, w1, control = senders
    theirs = topic_owned_by(1)
    control.set_topic_mark(1, zlib.crc32(theirs.encode()), MARK_CHANNEL_FULL, "c", bounds.DEPTH, 5)
    with pytest.raises(PubFailed, match=rf"^E_PUB_FAILED PUB failed channel {theirs}:c is full \(max_depth 5\)$"):
        w0.forwarder.publish(PublishingSession(), theirs, [b"x"], 0, "PUB")
    cmd = SimpleNamespace(topic=theirs, buffer=b"ab", offsets=np.array([0, 1], np.int64),
                          lengths=np.array([1, 1], np.int64))
    with pytest.raises(MpubFailed, match="MPUB failed channel"):
        w0.forwarder.publish_mpub(PublishingSession(), cmd)
    staged = w0.forwarder.publish_staged(theirs, *bodies_of([b"lone"]))  # the pump's lone PUBs
    assert isinstance(staged, Refused)
    s = PublishingSession()
    staged.add(s, 1, PubFailed, "PUB")
    assert str(s.errors[0]) == f"E_PUB_FAILED PUB failed channel {theirs}:c is full (max_depth 5)"
    assert w1.forwarder.drain_rings() == 0


def test_dropped_messages_do_not_pin_the_log(bounded):
    host, t, ch = bounded(max_depth=2, overflow="drop_oldest")
    big = b"x" * (1 << 20)
    for _ in range(40):  # five 8 MiB segments' worth, of which the channel keeps two messages
        assert pub(t, big)
    assert ch.depth() == 2 and ch.dropped_count == 38
    host.refresh_low_water([t])  # the worker's reclaim pass: what no channel needs any more is freed
    assert len(t.log.segments()) <= 2, t.log.segments()


@pytest.mark.parametrize("overflow, kind", [("reject", MARK_CHANNEL_FULL), ("block", MARK_BLOCKED)])
def test_a_channel_at_its_limit_when_its_policy_comes_is_marked_and_watched_at_once(bounded, overflow, kind):
    """A new channel takes the topic's backlog, and a limit can be lowered under what a channel holds: the mark
    other workers read is set then, not only by the next append (a publish forwarded before it would be taken)."""
    host, t, ch = bounded()  # no bound yet
    pub(t, b"a", b"b")
    assert mark(host, t)[0] is None and not host.watched
    ch.policy = Policy(max_depth=2, overflow=overflow)
    t.policy_changed()
    assert mark(host, t)[0] == kind and host.watched == {t}
    consume(t, ch, 1)
    assert t.check_limits() is None and mark(host, t)[0] is None
