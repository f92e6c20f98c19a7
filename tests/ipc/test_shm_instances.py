"""nsqpy.ipc.shm.find_dead_instances: segments of dead broker instances are found whatever their data path and node id,
liveness is decided per instance (its supervisor's control-0), starting instances get time, and Plan.remove_stale
removes what it finds with one log line."""
import functools
import os
import time

import pytest

from _fork import fork, wait
from nsqpy.ipc.shm import (INSTANCE_GRACE, Segment, find_dead_instances, instance_prefix, list_segments, remove_segments,
                     segment_name, unlink_name)


def names(prefix, data, node, *kinds):
    return [segment_name(data, node, kind, index, prefix=prefix) for kind, index in kinds]


def create_in_child(segments):
    """Create the segments in a child process that then exits without removing them (a crash)."""
    def child():
        for name in segments:
            Segment.create(name, 4096).close()
    assert wait(fork(child), 30) == 0


def age(segments, seconds):
    then = time.time() - seconds
    for name in segments:
        os.utime("/dev/shm" + name, (then, then))


@pytest.fixture
def cleanup(shm_prefix):
    yield
    for name in list_segments("/" + shm_prefix):
        unlink_name(name)


def test_a_dead_instance_is_found_whole_and_a_live_one_is_kept(shm_prefix, cleanup):
    dead = names(shm_prefix, "/data/a", 1, ("control", 0), ("links", 0), ("topic", 5), ("log", 5))
    create_in_child(dead)
    live = names(shm_prefix, "/data/b", 2, ("control", 0), ("links", 0))
    for name in live:
        Segment.create(name, 4096).close()
    # topic logs of the live instance, made by workers that died since (and were replaced)
    replaced = names(shm_prefix, "/data/b", 2, ("topic", 7), ("log", 7))
    create_in_child(replaced)
    found = find_dead_instances(shm_prefix)
    assert found == {instance_prefix("/data/a", 1, shm_prefix): sorted(dead)}
    count, nbytes = remove_segments(found[instance_prefix("/data/a", 1, shm_prefix)])
    assert count == 4 and nbytes >= 4 * 2 * 4096  # header page + payload page each
    assert list_segments("/" + shm_prefix) == sorted(live + replaced)
    assert find_dead_instances(shm_prefix) == {}


def test_an_old_group_without_a_control_segment_is_dead_a_young_one_is_not(shm_prefix, cleanup):
    """A broker in its warm-up has segments but no control-0 yet; one that died there left them behind."""
    group = names(shm_prefix, "/data/c", 3, ("warmup", 0), ("warmup", 1))
    create_in_child(group)
    assert find_dead_instances(shm_prefix) == {}
    age(group[:1], 2 * INSTANCE_GRACE)
    assert find_dead_instances(shm_prefix) == {}  # its newest file is young
    age(group, 2 * INSTANCE_GRACE)
    assert find_dead_instances(shm_prefix) == {instance_prefix("/data/c", 3, shm_prefix): group}


def test_an_unreadable_control_segment_is_given_time(shm_prefix, cleanup):
    """control-0 exists but is not stamped yet (its supervisor is creating it, or died doing so)."""
    control, other = names(shm_prefix, "/data/d", 4, ("control", 0), ("links", 0))
    with open("/dev/shm" + control, "wb") as f:
        f.write(bytes(8192))
    create_in_child([other])
    assert find_dead_instances(shm_prefix) == {}
    age([control], 2 * INSTANCE_GRACE)
    assert find_dead_instances(shm_prefix) == {instance_prefix("/data/d", 4, shm_prefix): [control, other]}


def test_in_a_dead_instance_a_segment_of_a_live_process_is_spared(shm_prefix, cleanup):
    """An orphaned worker still using its topic log, or a new broker of the same name warming up."""
    dead = names(shm_prefix, "/data/e", 5, ("control", 0), ("topic", 1))
    create_in_child(dead)
    mine = names(shm_prefix, "/data/e", 5, ("warmup", 0))[0]
    Segment.create(mine, 4096).close()
    age(dead + [mine], 2 * INSTANCE_GRACE)
    assert find_dead_instances(shm_prefix) == {instance_prefix("/data/e", 5, shm_prefix): dead}


def test_names_of_other_programs_and_test_sessions_are_not_groups(shm_prefix, cleanup):
    stray = [f"/{shm_prefix}-notahash00-control-0", f"/{shm_prefix}-t12345-1-x", f"/{shm_prefix}x-0123456789-a-0"]
    create_in_child(stray)
    age(stray, 2 * INSTANCE_GRACE)
    assert find_dead_instances(shm_prefix) == {}


def bare_plan(monkeypatch, shm_prefix):
    """A Plan that only knows its log (a list of WARNING lines), looking for dead instances under shm_prefix."""
    from nsqpy.workers.storage import leftovers
    from nsqpy.workers.processes import plan as plan_module

    lines = []

    class Log:
        def warn(self, msg):
            lines.append(msg)

    monkeypatch.setattr(leftovers, "find_dead_instances", functools.partial(find_dead_instances, shm_prefix))
    plan = plan_module.Plan.__new__(plan_module.Plan)
    plan.log = Log()
    plan.prefix = f"/{shm_prefix}-ffffffffff-"  # its own instance (none of those found)
    return plan, lines


def test_plan_remove_stale_removes_them_with_one_log_line(shm_prefix, cleanup, monkeypatch):
    dead = names(shm_prefix, "/data/f", 6, ("control", 0), ("links", 0))
    create_in_child(dead)
    plan, lines = bare_plan(monkeypatch, shm_prefix)
    plan.remove_stale()
    assert list_segments("/" + shm_prefix) == []
    assert len(lines) == 1 and "removed " in lines[0] and "of 1 dead nsqd instance that held no messages" in lines[0]
    plan.remove_stale()
    assert len(lines) == 1  # nothing to say when nothing is dead


def test_plan_remove_stale_keeps_a_dead_instance_that_may_hold_messages(shm_prefix, cleanup, monkeypatch):
    """Another data path's crashed broker: its topic logs wait for its own next start (workers/storage/broker_crash.py)."""
    dead = names(shm_prefix, "/data/g", 6, ("control", 0), ("links", 0), ("topic", 77), ("defer1", 0))
    create_in_child(dead)
    plan, lines = bare_plan(monkeypatch, shm_prefix)
    plan.remove_stale()
    assert sorted(list_segments("/" + shm_prefix)) == sorted(dead)
    assert len(lines) == 1 and "1 dead nsqd instance left" in lines[0] and "may hold messages" in lines[0]
    assert "nsqd --leftovers" in lines[0] and len(lines[0]) < 200


def test_one_scan_reads_each_header_and_each_creator_once(shm_prefix, cleanup, monkeypatch):
    """A crashed broker with many topics leaves tens of thousands of segments that every other start scans
    (``workers/storage/leftovers.find``): each segment's header and each creator's /proc entry is read once."""
    from nsqpy.ipc import shm
    from nsqpy.workers.storage import leftovers
    dead = names(shm_prefix, "/data/g", 7, ("control", 0), ("links", 0), *(("log", i) for i in range(50)))
    create_in_child(dead)
    headers, procs = [], []
    real_creator, real_start = shm._creator, shm._start_time
    monkeypatch.setattr(shm, "_creator", lambda name: headers.append(name) or real_creator(name))
    monkeypatch.setattr(shm, "_start_time", lambda pid: procs.append(pid) or real_start(pid))
    monkeypatch.setattr(leftovers, "find_dead_instances",
                        lambda scan: find_dead_instances(shm_prefix, scan=scan))
    found, = leftovers.find()
    assert sorted(found.names) == sorted(dead)
    assert sorted(headers) == sorted(dead)  # once each, though judged by two passes
    assert len(procs) == 1  # one creator (the child that made them all)
