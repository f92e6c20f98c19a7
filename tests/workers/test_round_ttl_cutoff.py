"""A channel with a message TTL on the compiled delivery round (issue 49 follow-up): ``kernels.deliver_round``'s
RD_TTL_CUTOFF word (a publish timestamp, ns; 0 = no TTL) stops the round before the first record published before
it, delivering what came before it (the cursor stops at it), or leaves the round to the general path (GENERAL,
nothing changed) when it is the first; ``Channel._deliver_to`` then expires it in Python (dropped, or moved to
the dead-letter topic). The own path (``ownpath``) arms a TTL channel, its row carrying the TTL. Without a broker:
a real log, in-flight table and deferred store (tests/workers/fakes.py), and the own path's rig
(tests/workers/test_ownpath.py)."""
import time

import numpy as np

from tests.workers.fakes import FakeSession, FakeWorker, drain, setup  # noqa: F401 (fixture)
from test_ownpath import Channel as OwnChannel, own  # noqa: F401 (fixture)
from nsqpy.ipc import inflight as IF
from nsqpy.ipc.inflight import C_N_LIVE
from nsqpy.protocol import client as C
from nsqpy.workers.domain import dead_letter as DL
from nsqpy.workers.domain.policy import Policy
from nsqpy.workers.lane.kernels import GENERAL, deliver_round, round_words
from nsqpy.workers.lane.words import RD_AT, RD_TTL_CUTOFF, ROWS_AT, RW_TTL

SECOND = 10**9
HOUR_MS = 3600 * 1000
_ids = iter(range(70_000, 10**9))


def publish_at(log, bodies, timestamp):
    for b in bodies:
        log.append(b, timestamp, next(_ids))


def old_and_fresh(log, layout):
    """Append one record per letter of layout ("f": fresh, "o": published 10 s ago) -> their bodies."""
    now = time.time_ns()
    bodies = []
    for i, kind in enumerate(layout):
        bodies.append(b"%s%d" % (kind.encode(), i))
        publish_at(log, bodies[-1:], now - 10 * SECOND if kind == "o" else now)
    return bodies


# ---- the kernel alone ---------------------------------------------------------------------------------------------
def run_round(worker, log, ch, cutoff, budget=16):
    """One compiled round of channel slot ch for connection 1 with the given cutoff -> (n, end, sent)."""
    now = time.time_ns()
    table, win = worker.inflight, log.window
    rd = round_words(ch, budget, 1 << 20, now, now + 60 * SECOND, 1, 1, 1, 0, -1, cutoff)
    return deliver_round(log.ctrl, win.data, win.data64, table.ctl, table.slots, table.index, rd,
                         log.read_block(budget), np.empty(budget, np.int64), np.empty(1 << 20, np.uint8),
                         worker.suspect.w)


def test_a_round_whose_first_record_is_expired_is_left_to_the_general_path_untouched(setup):
    worker, log, ch = setup(capacity=16)
    old_and_fresh(log, "ooff")
    cursor = log.cursor(ch.ch)
    assert run_round(worker, log, ch.ch, time.time_ns() - SECOND) == (GENERAL, 0, 0)
    assert log.cursor(ch.ch) == cursor and worker.inflight.ctl[C_N_LIVE] == 0 and log.depth(ch.ch) == 4


def test_a_round_stops_before_an_expired_record_in_the_middle(setup):
    worker, log, ch = setup(capacity=16)
    old_and_fresh(log, "ffofo")
    expired_at = int(log.read(ch.ch, 8, 1 << 20).positions[2])
    n, end, _ = run_round(worker, log, ch.ch, time.time_ns() - SECOND)
    assert n == 2 and end > 0
    assert worker.inflight.ctl[C_N_LIVE] == 2 and log.cursor(ch.ch) == expired_at and log.depth(ch.ch) == 3
    # the next round starts at the expired record: the general path's
    assert run_round(worker, log, ch.ch, time.time_ns() - SECOND) == (GENERAL, 0, 0)
    assert log.cursor(ch.ch) == expired_at


def test_a_round_with_no_expired_record_or_no_cutoff_delivers_all(setup):
    worker, log, ch = setup(capacity=16)
    old_and_fresh(log, "fff")
    assert run_round(worker, log, ch.ch, time.time_ns() - SECOND)[0] == 3
    old_and_fresh(log, "oo")
    assert run_round(worker, log, ch.ch, 0)[0] == 2  # cutoff 0: no TTL, however old
    assert worker.inflight.ctl[C_N_LIVE] == 5 and log.depth(ch.ch) == 0


# ---- a channel with a TTL --------------------------------------------------------------------------------------
class CountingWorker(FakeWorker):
    """FakeWorker telling its two frame paths apart: send_frames is the compiled round's, write_frames the
    general path's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.compiled_frames = self.general_frames = 0

    def send_frames(self, s, out, end, sent=0):
        before = len(s.received)
        super().send_frames(s, out, end, sent)
        self.compiled_frames += len(s.received) - before

    def write_frames(self, s, log, positions, attempts):
        self.general_frames += len(positions)
        super().write_frames(s, log, positions, attempts)


def ttl_channel(setup, policy, capacity=32):
    worker, log, ch = setup(capacity=capacity)
    counting = CountingWorker(capacity, compiled=worker.round_buffer is not None)
    ch.worker = counting
    counting.channels = {ch.key: ch}
    ch.policy = policy
    return counting, log, ch


def consumer(ch, rdy=100):
    s = FakeSession(1, rdy)
    ch.add_consumer(s)
    return s


def test_a_ttl_that_expires_nothing_keeps_the_compiled_round(setup):
    worker, log, ch = ttl_channel(setup, Policy(message_ttl_ms=HOUR_MS))
    bodies = old_and_fresh(log, "fffoo")  # (10 s old is well within an hour)
    s = consumer(ch)
    drain(ch)
    assert s.received == bodies and ch.expired_count == 0
    if worker.round_buffer is not None:
        assert worker.compiled_frames == 5 and worker.general_frames == 0


def test_expired_records_in_the_middle_are_dropped_and_the_rest_delivered_in_order(setup):
    worker, log, ch = ttl_channel(setup, Policy(message_ttl_ms=1000))
    bodies = old_and_fresh(log, "ffooff")
    s = consumer(ch)
    drain(ch)
    assert s.received == [b for b in bodies if b.startswith(b"f")]
    assert ch.expired_count == 2 and ch.dead_lettered_count == 0 and worker.dead_letters == []
    assert log.depth(ch.ch) == 0 and len(worker.inflight) == 4  # the expired ones hold no slot
    if worker.round_buffer is not None:
        assert worker.compiled_frames >= 2  # the round before the expired ones was compiled


def test_expired_first_records_go_to_the_dead_letter_topic_then_fresh_ones_are_delivered(setup):
    worker, log, ch = ttl_channel(setup, Policy(message_ttl_ms=1000, dead_letter_topic="t.dead"))
    bodies = old_and_fresh(log, "ooofof")
    s = consumer(ch)
    drain(ch)
    assert s.received == [b for b in bodies if b.startswith(b"f")]
    got = [(topic, *DL.decode(body)) for topic, bs in worker.dead_letters for body in bs]
    assert [body for _, _, body in got] == [b for b in bodies if b.startswith(b"o")]
    assert all(topic == "t.dead" and h["reason"] == "ttl" for topic, h, _ in got)
    assert ch.expired_count == ch.dead_lettered_count == 4
    assert log.depth(ch.ch) == 0 and len(worker.inflight) == 2
    assert all(worker.inflight.slot(x).state == IF.IN_FLIGHT for x in worker.inflight.iter_conn(1).tolist())


def test_a_bounded_channel_keeps_the_compiled_round(setup):
    """A bound is checked at publish (workers/domain/bounds.py), never at delivery."""
    worker, log, ch = ttl_channel(setup, Policy(max_depth=1000))
    bodies = old_and_fresh(log, "fff")
    s = consumer(ch)
    drain(ch)
    assert s.received == bodies
    if worker.round_buffer is not None:
        assert worker.compiled_frames == 3 and worker.general_frames == 0


# ---- the own path ------------------------------------------------------------------------------------------------
def own_pub(own, policy):
    """A channel of the armed topic with this policy and a consumer with room; one PUB through the lane -> (the
    channel, its consumer, time.time_ns() before the PUB)."""
    ch = OwnChannel(own.topic, "ch", key=5)
    ch.policy = policy
    c = own.consumer(ch, conn_id=9, rdy=10)
    there, before = own.producer(), time.time_ns()
    there.sendall(C.pub("ours", b"mine"))
    assert own.lane.poll(30.0) == []
    return ch, c, before


def test_the_own_path_arms_a_ttl_channel_with_its_cutoff(own):
    ch, c, before = own_pub(own, Policy(message_ttl_ms=HOUR_MS))
    assert own.path.published == 1 and own.rig.pump.staged == 0
    assert c.message()[2] == b"mine" and own.log.depth(ch.ch) == 0
    ow, ttl = own.path.words, HOUR_MS * 1_000_000
    assert ow[ROWS_AT + RW_TTL] == ttl and before - ttl <= ow[RD_AT + RD_TTL_CUTOFF] <= time.time_ns() - ttl


def test_the_own_path_leaves_a_bounded_channel_to_python(own):
    ch, _, _ = own_pub(own, Policy(message_ttl_ms=HOUR_MS, max_depth=100))
    assert own.path.published == 0 and own.rig.pump.staged == 1 and own.log.depth(ch.ch) == 0
