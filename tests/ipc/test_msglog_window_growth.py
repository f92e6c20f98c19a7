"""The segment window starts small and doubles as the retained log grows: an idle topic costs INITIAL_WINDOW
segments of address space whatever its disk budget, and growing keeps every record readable, also for an owner
that attaches afterwards."""
import mmap

from nsqpy.ipc.filesegment import FileSegmentProvider
from nsqpy.ipc.msglog import MessageLog, ShmSegmentProvider, log_ctrl_nbytes
from nsqpy.ipc.msglog_layout import INITIAL_WINDOW

S = 64 << 10


def make(prefix, tmp_path, disk_segments=1024):
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(S, 2 * S, disk_segments * S))
    memory, disk = ShmSegmentProvider(prefix), FileSegmentProvider(str(tmp_path), "w")
    log = MessageLog.create(ctrl, 0, segment_size=S, mem_bytes=2 * S, memory=memory, disk_bytes=disk_segments * S,
                            disk=disk)
    return log, ctrl, memory, disk


def test_an_idle_log_reserves_a_small_window_whatever_its_budget(shm_prefix, tmp_path):
    log, *_ = make(shm_prefix, tmp_path)
    try:
        assert log.slots >= 1024 and log.window.slots == INITIAL_WINDOW
        assert log.window.nbytes == INITIAL_WINDOW * S
    finally:
        log.destroy()


def test_the_window_doubles_and_every_record_stays_readable(shm_prefix, tmp_path):
    log, ctrl, memory, disk = make(shm_prefix, tmp_path)
    try:
        ch = log.open_channel()
        bodies = [bytes([i % 251]) * (9000 + i) for i in range(100)]  # ~1 MB: 15+ segments of 64 KiB
        for i, b in enumerate(bodies):
            log.append(b, i, i + 1)
        assert log.window.slots >= 16 and len(log.segments()) > INITIAL_WINDOW
        got = log.read(ch, 1000, 1 << 30)
        assert [log.body(int(p)) for p in got.positions[:got.n]] == bodies
        log.close()
        again = MessageLog.attach(ctrl, 0, memory, disk)  # a new owner maps the grown window at once
        log = again
        again.recover()
        got = again.read(ch, 1000, 1 << 30)
        assert [again.body(int(p)) for p in got.positions[:got.n]] == bodies
    finally:
        log.destroy()
