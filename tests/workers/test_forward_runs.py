"""The owner drains forwarded publishes in runs: consecutive FORWARD records for one topic become one append
(workers/publishing/records.py plan_forward_runs), anything else stays a record of its own, and a run the owner cannot take
now is offered again, with everything after it, in order (workers/publishing/links.py Link.drain_runs)."""
import numpy as np
import pytest

from nsqpy.ipc.ring import Ring
from nsqpy.workers.publishing import records as R
from nsqpy.workers.publishing.links import Link


def _ring(capacity=1 << 14):
    return Ring.create(bytearray(Ring.size_for(capacity)), 0, capacity)


def _forward(ring, topic, bodies, ts, defer_ms=0):
    src = np.frombuffer(b"".join(bodies), np.uint8)
    lens = np.array([len(b) for b in bodies], np.int64)
    offs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    out = np.empty(R.forward_size(topic.encode(), lens), np.uint8)
    assert ring.write(R.pack_forward(out, topic.encode(), src, offs, lens, ts, defer_ms).tobytes(), R.FORWARD)


def _plan(ring, msgs=64):
    offs, lens, types = ring.read_batch(64)
    runs = np.zeros((64, R.RUN_WORDS), np.int64)
    arrays = tuple(np.zeros(msgs, np.int64) for _ in range(3))
    r, m = R.plan_forward_runs(ring.data, offs, lens, types, runs, *arrays)
    return r, m, runs[:r], arrays


def _fill(ring):
    _forward(ring, "a", [b"x1", b"x22"], 10)
    _forward(ring, "a", [b"y"], 11)
    _forward(ring, "b", [b"z"], 12)
    assert ring.write(b"a command", R.COMMAND)
    _forward(ring, "b", [b"w"], 13)
    _forward(ring, "b", [b"d"], 14, defer_ms=5)  # deferred: its own record, not part of a run
    _forward(ring, "b", [b"e"], 15)


def test_consecutive_forwards_to_one_topic_make_one_run_and_the_rest_stay_single():
    ring = _ring()
    _fill(ring)
    r, m, runs, (offs, lens, ts) = _plan(ring)
    assert (r, m) == (6, 6)
    data = ring.data
    names = [bytes(data[x[R.RUN_NAME]:x[R.RUN_NAME] + x[R.RUN_NAME_LEN]]) for x in runs]
    assert runs[:, [R.RUN_FIRST, R.RUN_RECORDS, R.RUN_APPEND, R.RUN_MSGS]].tolist() == [
        [0, 2, 1, 3], [2, 1, 1, 1], [3, 1, 0, 0], [4, 1, 1, 1], [5, 1, 0, 0], [6, 1, 1, 1]]
    assert [n for n, x in zip(names, runs) if x[R.RUN_APPEND]] == [b"a", b"b", b"b", b"b"]
    bodies = [bytes(data[o:o + n]) for o, n in zip(offs[:m], lens[:m])]
    assert bodies == [b"x1", b"x22", b"y", b"z", b"w", b"e"]
    assert ts[:m].tolist() == [10, 10, 11, 12, 13, 15]  # each message keeps its own record's timestamp


def test_too_small_message_arrays_ask_for_the_size_needed():
    ring = _ring()
    _fill(ring)
    r, m, _, _ = _plan(ring, msgs=2)
    assert (r, m) == (-1, 7)  # the deferred one counts too


def test_a_malformed_forward_is_left_to_the_one_record_path():
    ring = _ring()
    payload = R.FWD_HEAD.pack(2, 1, 0, 1) + b"t" + (5).to_bytes(8, "little") + (5).to_bytes(8, "little") + b"short"
    assert ring.write(payload, R.FORWARD)
    _forward(ring, "t", [b"ok"], 2)
    r, m, runs, _ = _plan(ring)
    assert runs[:, [R.RUN_FIRST, R.RUN_APPEND, R.RUN_MSGS]].tolist() == [[0, 0, 0], [1, 1, 1]]


class _Links:
    pass


def _records(link):
    got = []
    link.drain(lambda rtype, payload: got.append((rtype, bytes(payload))))
    return got


def _filled_link():
    """-> (every record _fill writes, as a drain sees them; a Link over a ring freshly filled the same way)."""
    reference = _ring()
    _fill(reference)
    everything = _records(Link(reference, _Links(), 0))
    ring = _ring()
    _fill(ring)
    return everything, Link(ring, _Links(), 0)


def _one_record_runs(data, offs, lens, types):
    return [(k, 1) for k in range(len(offs))]  # one record per run: every release position is checked


@pytest.mark.parametrize("refuse_at", [0, 1, 3, 6])
def test_a_refused_run_is_offered_again_with_everything_after_it(refuse_at):
    everything, link = _filled_link()
    handled = []

    def handle(j, first, count):
        if j == refuse_at:
            return False
        handled.append(first)
        return True

    assert link.drain_runs(_one_record_runs, handle) == refuse_at
    assert handled == list(range(refuse_at))
    assert _records(link) == everything[refuse_at:]  # offered again, in order, and nothing else
    assert link.ring.is_empty()


@pytest.mark.parametrize("runs", [False, True])
@pytest.mark.parametrize("raise_at", [0, 2])
def test_a_handler_that_raises_leaves_the_rest_to_be_offered_again(runs, raise_at):
    """A bug in a handler (an exception, caught by the worker's loop) must not skip records: before, the batch
    stayed read but unreleased, so the ring looked empty and what followed waited for the worker's restart."""
    everything, link = _filled_link()
    seen = []

    def handle(k):
        if k == raise_at:
            raise RuntimeError("a bug")
        seen.append(k)

    with pytest.raises(RuntimeError):
        if runs:
            link.drain_runs(_one_record_runs, lambda j, first, count: handle(first))
        else:
            k = iter(range(len(everything)))
            link.drain(lambda rtype, payload: handle(next(k)))
    assert seen == list(range(raise_at))
    assert _records(link) == everything[raise_at:]  # the one that raised and all after it, in order
    assert link.ring.is_empty()


def test_runs_of_several_records_release_together():
    ring = _ring()
    _fill(ring)
    link = Link(ring, _Links(), 0)
    calls = []
    assert link.drain_runs(lambda *batch: [(0, 2), (2, 5)],
                           lambda j, first, count: calls.append((first, count)) or j == 0) == 2
    assert calls == [(0, 2), (2, 5)]
    assert len(_records(link)) == 5


def test_pack_bodies_writes_lengths_then_bodies_and_refuses_what_does_not_fit():
    src = np.frombuffer(b"abcdefg", np.uint8)
    offs, lens = np.array([0, 3], np.int64), np.array([3, 4], np.int64)
    out = np.zeros(2 + 16 + 7, np.uint8)
    assert R.pack_bodies(src, offs, lens, out, 2) == out.size
    assert np.frombuffer(out[2:18].tobytes(), "<i8").tolist() == [3, 4]
    assert out[18:].tobytes() == b"abcdefg"
    before = out.copy()
    with pytest.raises(IndexError):
        R.pack_bodies(src, offs, lens, out, 3)  # one byte short: nothing written
    with pytest.raises(IndexError):
        R.pack_bodies(src, np.array([0, 4], np.int64), lens, out, 2)  # the second body runs past src
    assert np.array_equal(out, before)
