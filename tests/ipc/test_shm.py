"""nsqpy.ipc.shm: naming, create/attach checks, sharing across fork, stale detection and recovery, hygiene."""
import os
import select
import signal

import numpy as np
import pytest

from _fork import fork, wait
from nsqpy.ipc.layout import LayoutError, magic
from nsqpy.ipc.shm import (Segment, SegmentError, find_stale, instance_prefix, list_segments, segment_name,
                     unlink_name)

RINGS = magic("NSQRINGS")


@pytest.fixture
def seg(shm_prefix):
    s = Segment.create(segment_name("/data", 0, "ring", 0, prefix=shm_prefix), 10_000, tag=RINGS, tag_version=2)
    yield s
    s.close()
    s.unlink()


def test_names_are_stable_and_distinguish_instances():
    a = segment_name("/var/lib/nsq", 1, "ring", 3)
    assert a == segment_name("/var/lib/nsq/", 1, "ring", 3)  # same real path
    assert a.startswith(instance_prefix("/var/lib/nsq", 1)) and a.endswith("-ring-3")
    assert a.startswith("/nsqpy-")
    assert len({a, segment_name("/var/lib/nsq", 2, "ring", 3), segment_name("/var/lib/other", 1, "ring", 3),
                segment_name("/var/lib/nsq", 1, "log", 3), segment_name("/var/lib/nsq", 1, "ring", 4)}) == 5
    with pytest.raises(ValueError):
        segment_name("/d", 0, "bad/kind")


def test_create_attach_share_bytes_and_check_the_layout(seg):
    assert seg.size == 10_000 and seg.buf.shape == (10_000,) and seg.owner and not seg.clean
    assert seg.creator_pid == os.getpid() and seg.creator_alive() and seg.tag == (RINGS, 2)
    seg.buf[:4] = [1, 2, 3, 4]
    with Segment.attach(seg.name, size=10_000, tag=RINGS, tag_version=2) as other:
        assert other.buf[:4].tolist() == [1, 2, 3, 4] and not other.owner
        other.buf[-1] = 9
    assert seg.buf[-1] == 9
    for kwargs, field in [({"size": 4096}, "size"), ({"tag": magic("NSQHEAPS")}, "tag"),
                          ({"tag_version": 3}, "tag version")]:
        with pytest.raises(LayoutError, match=field):
            Segment.attach(seg.name, **kwargs)


def test_create_refuses_an_existing_name_and_attach_a_missing_one(seg):
    with pytest.raises(SegmentError, match="already exists"):
        Segment.create(seg.name, 100)
    with pytest.raises(SegmentError, match="no shared-memory segment"):
        Segment.attach(seg.name + "-missing")


def test_attach_refuses_a_foreign_file(shm_prefix):
    name = f"/{shm_prefix}-foreign"
    with open(f"/dev/shm{name}", "wb") as f:
        f.write(b"x" * 8192)
    try:
        with pytest.raises(LayoutError, match="magic"):
            Segment.attach(name)
    finally:
        unlink_name(name)


def test_a_full_dev_shm_fails_at_creation_not_with_sigbus(shm_prefix):
    free = os.statvfs("/dev/shm")
    too_big = free.f_bavail * free.f_frsize + (1 << 30)
    with pytest.raises(SegmentError, match="cannot reserve"):
        Segment.create(f"/{shm_prefix}-huge", too_big)
    assert list_segments("/" + shm_prefix) == []  # the half-made segment was removed


def test_writes_of_a_child_are_seen_by_the_parent_and_survive_its_exit(seg):
    def child():
        with Segment.attach(seg.name) as mine:
            mine.buf[100:108] = np.frombuffer(b"childwas", np.uint8)

    assert wait(fork(child), 30) == 0
    assert bytes(seg.buf[100:108]) == b"childwas"
    assert list_segments(seg.name) == [seg.name]  # an attaching process never unlinks


def test_stale_segments_are_found_recovered_and_adopted(shm_prefix):
    name = f"/{shm_prefix}-stale"
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()

    def creator():
        s = Segment.create(name, 4096)
        s.buf[:5] = np.frombuffer(b"saved", np.uint8)
        os.write(ready_w, b"1")
        os.read(hold_r, 1)  # never answered: the parent SIGKILLs this process

    pid = fork(creator)
    try:
        assert select.select([ready_r], [], [], 30)[0], "creator never reported ready"
        assert os.read(ready_r, 1) == b"1"
        assert find_stale("/" + shm_prefix) == []  # creator alive
    finally:
        os.kill(pid, signal.SIGKILL)
        wait(pid, 30)
    try:
        assert find_stale("/" + shm_prefix) == [name]
        with Segment.attach(name) as recovered:
            assert bytes(recovered.buf[:5]) == b"saved" and not recovered.clean
            recovered.adopt()
            assert recovered.owner and recovered.creator_alive()
            assert find_stale("/" + shm_prefix) == []
            recovered.mark_clean()
            assert recovered.clean
    finally:
        for fd in (ready_r, ready_w, hold_r, hold_w):
            os.close(fd)
        unlink_name(name)


def test_close_is_safe_while_views_are_alive_and_unlink_is_idempotent(shm_prefix):
    s = Segment.create(f"/{shm_prefix}-views", 4096)
    view = s.buf[:10]
    s.close()
    s.close()
    view[:] = 1  # the mapping lives as long as the view
    assert view.sum() == 10
    s.unlink()
    assert not unlink_name(s.name)
