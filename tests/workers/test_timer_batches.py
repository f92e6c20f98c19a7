"""TimerBatches on its own: one timer per delivery round, REMOVEd once its last slot left."""
import numpy as np

from nsqpy.workers.timing.timer_batches import TimerBatches


def slots(*values):
    return np.array(values, np.int64)


def test_batch_reported_empty_once_its_last_slot_leaves():
    tb = TimerBatches(16)
    b = tb.add(slots(1, 2, 3))
    assert tb.leave(slots(1)) == []
    assert list(tb.leave(slots(2, 3))) == [b]
    assert list(tb.slot_batch[[1, 2, 3]]) == [-1, -1, -1]
    assert list(tb.leave(slots(2, 3))) == []  # no longer in a batch: nothing to report again


def test_leave_one_is_leave_of_one_slot():
    tb = TimerBatches(16)
    b = tb.add(slots(1, 2))
    tb.hold(b, 100)
    assert list(tb.leave_one(1)) == []
    assert list(tb.leave_one(2)) == []  # held: dropped, never reported
    assert tb.take_held() == [] and list(tb.leave_one(2)) == []
    c = tb.add(slots(3))
    assert list(tb.leave_one(3)) == [c] and tb.slot_batch[3] == -1 and tb.live[c] == 0
    assert list(tb.leave_one(3)) == []  # no longer in a batch: nothing to report again


def test_leave_across_batches_reports_each_emptied_batch_once():
    tb = TimerBatches(16)
    a = tb.add(slots(0, 1))
    b = tb.add(slots(2, 3, 4))
    c = tb.add(slots(5, 6))
    empty = tb.leave(slots(0, 1, 2, 5, 6))
    assert sorted(empty) == sorted([a, c])
    assert tb.live[b] == 2
    assert list(tb.leave(slots(4, 3))) == [b]


def test_many_slots_of_two_rounds():
    tb = TimerBatches(4096)
    a = tb.add(np.arange(0, 2000))
    b = tb.add(np.arange(2000, 4000))
    first = np.concatenate((np.arange(0, 2000), np.arange(2000, 3000)))[::-1]  # all of a, half of b
    assert list(tb.leave(first)) == [a]
    assert tb.live[b] == 1000
    assert list(tb.leave(np.arange(3999, 2999, -1))) == [b]
    assert len(tb._free) == 4096 and len(set(tb._free)) == 4096  # each handle freed exactly once


def test_expire_returns_only_slots_still_in_the_batch():
    tb = TimerBatches(8)
    b = tb.add(slots(1, 2, 3))
    gen = int(tb.gen[b])
    tb.leave(slots(2))
    assert list(tb.expire(b, gen)) == [1, 3]
    assert len(tb.expire(b, gen)) == 0  # freed: a repeated report is stale


def test_a_reused_handle_ignores_the_old_use():
    tb = TimerBatches(1)
    b = tb.add(slots(0))
    old_gen = int(tb.gen[b])
    assert list(tb.leave(slots(0))) == [b]
    b2 = tb.add(slots(0))
    assert b2 == b and tb.gen[b] != old_gen
    assert len(tb.expire(b, old_gen)) == 0
    assert list(tb.expire(b, int(tb.gen[b]))) == [0]


def test_a_held_batch_that_empties_is_never_posted_nor_removed():
    tb = TimerBatches(8)
    b = tb.add(slots(1, 2))
    tb.hold(b, 5_000)
    assert tb.leave(slots(1, 2)) == []  # no REMOVE: the scanner never heard of it
    assert tb.take_held() == []


def test_take_held_gives_live_held_batches_once_in_order():
    tb = TimerBatches(8)
    a = tb.add(slots(1))
    tb.hold(a, 100)
    b = tb.add(slots(2, 3))
    tb.hold(b, 200)
    tb.leave(slots(2))  # b still has slot 3
    assert tb.take_held() == [(a, int(tb.gen[a]), 100), (b, int(tb.gen[b]), 200)]
    assert tb.take_held() == [] and tb.held() == 0
    assert list(tb.leave(slots(1))) == [a]  # posted now: emptying it is a REMOVE


def test_a_handle_freed_while_held_and_reused_is_posted_with_its_new_use_only():
    tb = TimerBatches(1)
    b = tb.add(slots(0))
    tb.hold(b, 100)
    tb.leave(slots(0))
    b2 = tb.add(slots(0))
    tb.hold(b2, 300)
    assert b2 == b
    assert tb.take_held() == [(b, int(tb.gen[b]), 300)]


def test_a_handle_freed_while_held_and_reused_unheld_is_not_posted_again():
    tb = TimerBatches(1)
    b = tb.add(slots(0))
    tb.hold(b, 100)
    tb.leave(slots(0))
    assert tb.add(slots(0)) == b  # posted at once by its user (timer_start_each)
    assert tb.take_held() == []
    assert list(tb.leave(slots(0))) == [b]


def test_clear_drops_held_timers():
    tb = TimerBatches(4)
    b = tb.add(slots(0))
    tb.hold(b, 100)
    tb.clear()
    assert tb.take_held() == [] and not tb.unposted.any()


def test_leave_skips_the_freed_slots_of_fins_that_failed():
    tb = TimerBatches(8)
    b = tb.add(slots(1, 2))
    c = tb.add(slots(7))  # the last slot: a -1 read as an index would take it out of its batch
    assert tb.leave(slots(-1, 1, -1)) == [] and tb.live[b] == 1  # -1: a FIN that freed no slot
    assert tb.leave(slots(2, -1)) == [b]
    assert tb.slot_batch[7] == c and tb.live[c] == 1


def test_a_fin_batch_spanning_many_rounds_reports_each_emptied_round_once():
    tb = TimerBatches(4096)
    rounds = [tb.add(np.arange(k * 256, (k + 1) * 256)) for k in range(12)]
    fins = np.arange(0, 12 * 256 - 100)  # every round but the last one whole
    assert tb.leave(fins) == rounds[:-1]
    assert tb.live[rounds[-1]] == 100 and len(tb._free) == 4096 - 1
    assert tb.leave(np.arange(12 * 256 - 100, 12 * 256)) == [rounds[-1]] and len(tb._free) == 4096
