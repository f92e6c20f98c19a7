"""Segments keep no file descriptor (a worker holds one control block per topic, and ``ulimit -n`` is often
1024), and closing a segment while a view of it is alive leaves the view valid until it goes."""
import gc
import os

from nsqpy.ipc.shm import Segment


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_segments_keep_no_fd(shm_prefix):
    before = open_fds()
    made = [Segment.create(f"/{shm_prefix}-{i}", 4096) for i in range(50)]
    attached = [Segment.attach(s.name) for s in made]
    assert open_fds() <= before + 2  # not one per segment
    for s in attached + made:
        s.close()
    for s in made:
        s.unlink()


def test_a_view_outlives_close(shm_prefix):
    seg = Segment.create(f"/{shm_prefix}-v", 4096)
    view = seg.buf[:16]
    view[:] = 7
    seg.close()
    seg.unlink()
    gc.collect()
    assert view.sum() == 7 * 16  # still mapped: the mapping goes with its last view
    del view
    gc.collect()
