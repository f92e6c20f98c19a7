"""A file segment being written for the first time is mapped without readahead (MADV_RANDOM: the kernel's "rr" flag
on its mapping), and the one written before it gets normal readahead back (ipc/msglog_window.py): a fresh file's
first write fault would otherwise zero-fill up to the disk's read_ahead_kb of page cache in one go, a stall of
milliseconds in the owner's loop for every segment a spilling topic starts."""
import mmap

from nsqpy.ipc.filesegment import FileSegmentProvider
from nsqpy.ipc.msglog import MessageLog, ShmSegmentProvider, log_ctrl_nbytes
from nsqpy.ipc.msglog_layout import TIER_DISK

S = 64 << 10


def _vm_flags(addr):
    """The VmFlags of this process's mapping that holds ``addr`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def _slot_flags(log, k):
    w = log.window
    return _vm_flags(w.data.ctypes.data + (k % w.slots) * w.segment_size)


def test_only_the_disk_segment_being_written_is_mapped_without_readahead(shm_prefix, tmp_path):
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(S, 2 * S, 64 * S))
    memory, disk = ShmSegmentProvider(shm_prefix), FileSegmentProvider(str(tmp_path), "w")
    log = MessageLog.create(ctrl, 0, segment_size=S, mem_bytes=2 * S, memory=memory, disk_bytes=64 * S, disk=disk)
    try:
        for i in range(60):  # ~6 segments: 2 in memory, then on disk
            log.append(bytes([i]) * 6000, i, i + 1)
        tiers = dict(log.segments())
        on_disk = sorted(k for k, tier in tiers.items() if tier == TIER_DISK)
        assert len(on_disk) >= 3 and on_disk[-1] == log.head // S  # the head's segment is a file
        assert [("rr" in _slot_flags(log, k)) for k in on_disk] == [False] * (len(on_disk) - 1) + [True]
        assert all("rr" not in _slot_flags(log, k) for k, tier in tiers.items() if tier != TIER_DISK)
        ch = log.open_channel()
        got = log.read(ch, 100, 1 << 30)  # every record reads back, the earlier segments with readahead on
        assert [log.body(int(p)) for p in got.positions[:got.n]] == [bytes([i]) * 6000 for i in range(60)]
    finally:
        log.destroy()


def test_a_restarted_owner_maps_the_head_disk_segment_without_readahead(shm_prefix, tmp_path):
    """The owner that attaches the log after a restart writes on into the head's segment: its first write fault
    there would read ahead as in a fresh segment."""
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(S, 2 * S, 64 * S))
    memory, disk = ShmSegmentProvider(shm_prefix), FileSegmentProvider(str(tmp_path), "w")
    log = MessageLog.create(ctrl, 0, segment_size=S, mem_bytes=2 * S, memory=memory, disk_bytes=64 * S, disk=disk)
    try:
        for i in range(40):
            log.append(bytes([i]) * 6000, i, i + 1)
        log.close()
        log = MessageLog.attach(ctrl, 0, memory, disk)
        tiers = dict(log.segments())
        on_disk = sorted(k for k, tier in tiers.items() if tier == TIER_DISK)
        assert len(on_disk) >= 2 and on_disk[-1] == log.head // S
        assert [("rr" in _slot_flags(log, k)) for k in on_disk] == [False] * (len(on_disk) - 1) + [True]
        log.append(b"after", 40, 41)
        ch = log.open_channel()
        got = log.read(ch, 100, 1 << 30)
        assert [log.body(int(p)) for p in got.positions[:got.n]] == [bytes([i]) * 6000 for i in range(40)] + [b"after"]
    finally:
        log.destroy()
