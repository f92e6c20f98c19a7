"""The message log's use of space: lazily reserved segments, the /dev/shm safety reserve, spilling and sealing when
a tier has no space, and LogNoSpace (nothing appended, the log still usable, a retry works once space is back).

Space failures are made by wrapping the real providers (``Refusing``: create/reserve fail with ENOSPC on demand),
and for real at the end: in a private mount namespace with an 8 MiB tmpfs over /dev/shm and another as the data
directory (root only)."""
import errno
import mmap
import os
import textwrap

import numpy as np
import pytest

from tests.private_tmpfs import run_with_tmpfs

import nsqpy.ipc.shm
from nsqpy.ipc import msglog_kernels as K
from nsqpy.ipc.filesegment import FileSegmentProvider
from nsqpy.ipc.msglog import (RESERVE_STEP, LogError, LogFull, LogNoSpace, MessageLog, ShmSegmentProvider,
                        log_ctrl_nbytes)
from nsqpy.ipc.msglog_layout import HDR, RESERVED, record_size
from nsqpy.ipc.shm import PAYLOAD_OFFSET, SegmentError

S = 1 << 20
PAGE = mmap.PAGESIZE


class Refusing:
    """A provider that refuses ``create`` and/or ``reserve`` (names in ``refuse``) with ``errno_`` while asked
    to, and counts what it was asked."""

    def __init__(self, inner):
        self.inner = inner
        self.refuse = set()
        self.errno_ = errno.ENOSPC
        self.calls = {"create": 0, "reserve": 0}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _maybe_refuse(self, op, k):
        self.calls[op] += 1
        if op in self.refuse:
            raise SegmentError(self.errno_, f"{self.inner.name(k)}: {os.strerror(self.errno_)} (test)")

    def create(self, k, size, tag, tag_version, reserve=None):
        self._maybe_refuse("create", k)
        return self.inner.create(k, size, tag, tag_version, reserve)

    def reserve(self, k, start, end):
        self._maybe_refuse("reserve", k)
        self.inner.reserve(k, start, end)


def make_log(shm_prefix, tmp_path, mem=2, disk=2, segment_size=S, mem_messages=None):
    memory = Refusing(ShmSegmentProvider(shm_prefix))
    files = Refusing(FileSegmentProvider(str(tmp_path), "log")) if disk else None
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(segment_size, mem * segment_size, disk * segment_size))
    log = MessageLog.create(ctrl, 0, segment_size=segment_size, mem_bytes=mem * segment_size, memory=memory,
                            disk_bytes=disk * segment_size, disk=files, mem_messages=mem_messages)
    return log, ctrl, memory, files


def held(provider, k):
    """Bytes segment k occupies in its filesystem (allocated blocks, not its size)."""
    path = provider.name(k)
    return os.stat("/dev/shm" + path if provider.tier_name == "memory" else path).st_blocks * 512


def append_n(log, n, size=100, first_id=1):
    body = np.arange(n * size, dtype=np.uint8)
    lengths = np.full(n, size, np.int64)
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    return log.append_batch(body, np.arange(n, dtype=np.int64) * size, lengths, ids, ids)


def read_all(log, ch):
    ids = []
    while True:
        b = log.read(ch, 1000, 1 << 30)
        if b.n == 0:
            return ids
        ids += [int(x) for x in b.ids[:b.n]]
        log.advance(ch, b.next_position)


@pytest.fixture
def space_log(shm_prefix, tmp_path):
    log, ctrl, memory, files = make_log(shm_prefix, tmp_path)
    yield log, ctrl, memory, files
    log.destroy()


def test_an_idle_topic_holds_no_segment_and_one_message_a_page(space_log, shm_prefix):
    log, _, memory, _ = space_log
    assert log.segments() == [] and log.reserved == 0
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(shm_prefix)]
    log.append(b"hello", 1, 1)
    assert log.segments() == [(0, 0)] and log.reserved == PAGE
    assert held(memory, 0) == PAYLOAD_OFFSET + PAGE  # the header page and one page of records
    assert os.stat("/dev/shm" + memory.name(0)).st_size == PAYLOAD_OFFSET + S  # sparse, mapped whole


def test_reservation_grows_geometrically_and_matches_what_is_held(space_log):
    log, _, memory, _ = space_log
    steps = []
    for i in range(6000):  # ~900 KiB of 100-byte messages: most of a 1 MiB segment
        log.append(b"m" * 100, i, i + 1)
        if not steps or steps[-1] != log.reserved:
            steps.append(log.reserved)
        assert log.head < log.reserved  # room for a PAD's commit word, always
    assert steps[:4] == [PAGE, PAGE + RESERVE_STEP, 2 * (PAGE + RESERVE_STEP), 4 * (PAGE + RESERVE_STEP)]
    assert memory.calls["reserve"] == len(steps) - 1 <= 6  # the first came with the segment
    assert held(memory, 0) == PAYLOAD_OFFSET + log.reserved


def test_recovery_zeroes_nothing_past_the_reservation(space_log):
    """A torn batch up to the reservation is dropped and zeroed; a committed-looking word at RESERVED (which no
    append could have written) is not zeroed."""
    log, ctrl, memory, files = space_log
    ch = log.open_channel()
    log.append(b"kept", 1, 1)
    head, reserved = log.head, log.reserved
    data64 = log.window.data64
    data64[head // 8 + 1: reserved // 8] = 0x5A5A5A5A  # bodies of a torn batch, up to the reservation
    data64[head // 8 + 6] = 0x30  # a later record of it committed, its gate (at head) not
    data64[reserved // 8] = record_size(8) | 0  # beyond: must stay as it is
    held_before = held(memory, 0)
    log.close()
    log = MessageLog.attach(ctrl, 0, memory, files)
    assert log.recover() == head and log.depth(ch) == 1
    assert not log.window.data64[head // 8: reserved // 8].any()
    assert log.window.data64[reserved // 8] == record_size(8)
    assert held(memory, 0) == held_before
    log.window.data64[reserved // 8] = 0
    assert read_all(log, ch) == [1]


def test_recovery_scans_no_record_past_the_reservation(space_log):
    """Records committed past the head are recovered up to RESERVED; one at RESERVED is not looked at."""
    log, ctrl, memory, files = space_log
    ch = log.open_channel()
    log.append(b"kept", 1, 1)
    head, reserved = log.head, log.reserved
    data64 = log.window.data64
    w = head // 8
    data64[w + 2], data64[w + 5] = 2, 2  # id, seq of a committed record that ends exactly at RESERVED
    data64[w] = reserved - head
    w = reserved // 8
    data64[w + 2], data64[w + 5] = 3, 3
    data64[w] = HDR + 8
    log.close()
    log = MessageLog.attach(ctrl, 0, memory, files)
    assert log.recover() == reserved
    assert (log.message_count, log.last_id, log.depth(ch)) == (2, 2, 2)
    log.window.data64[w: w + 6] = 0
    log.append(b"next", 4, 4)
    assert read_all(log, ch) == [1, 2, 4]


def test_a_new_segment_without_room_in_dev_shm_spills_to_disk(space_log, monkeypatch):
    log, _, memory, files = space_log
    monkeypatch.setattr(nsqpy.ipc.shm, "SHM_KEEP_FREE_MIN", 1 << 62)  # the safety reserve refuses everything
    ch = log.open_channel()
    append_n(log, 10)
    assert log.segments() == [(0, 1)] and files.calls["create"] == 1
    assert held(files, 0) == PAYLOAD_OFFSET + PAGE  # a file segment is sparse too
    monkeypatch.setattr(nsqpy.ipc.shm, "SHM_KEEP_FREE_MIN", 0)
    append_n(log, 150, size=10_000, first_id=11)  # the next segment has room again in shared memory
    assert log.segments() == [(0, 1), (1, 0)]
    assert read_all(log, ch) == list(range(1, 161))


def test_the_safety_reserve_names_dev_shm_when_nothing_else_can_hold_a_segment(shm_prefix, tmp_path, monkeypatch):
    log, _, memory, _ = make_log(shm_prefix, tmp_path, disk=0)
    try:
        monkeypatch.setattr(nsqpy.ipc.shm, "SHM_KEEP_FREE_MIN", 1 << 62)
        with pytest.raises(LogNoSpace, match="kept for control blocks") as info:
            log.append(b"x", 1, 1)
        assert info.value.causes[0][:2] == ("memory", memory.name(0))
        assert log.head == 0 and log.message_count == 0
        monkeypatch.setattr(nsqpy.ipc.shm, "SHM_KEEP_FREE_MIN", 0)
        log.append(b"x", 1, 1)
        assert log.message_count == 1
    finally:
        log.destroy()


def test_a_segment_that_cannot_grow_fails_the_batch_and_a_retry_succeeds(shm_prefix, tmp_path):
    log, _, memory, _ = make_log(shm_prefix, tmp_path, disk=0)
    try:
        ch = log.open_channel()
        append_n(log, 5)
        head, reserved = log.head, log.reserved
        memory.refuse = {"reserve", "create"}
        with pytest.raises(LogNoSpace) as info:
            append_n(log, 100, size=1000, first_id=6)
        assert "memory tier" in str(info.value) and "No space left on device" in str(info.value)
        assert (log.head, log.reserved, log.message_count, log.depth(ch)) == (head, reserved, 5, 5)
        memory.refuse = set()
        append_n(log, 100, size=1000, first_id=6)
        assert read_all(log, ch) == list(range(1, 106))
    finally:
        log.destroy()


def test_a_full_memory_segment_is_sealed_and_the_batch_spills(space_log, shm_prefix, tmp_path):
    """The head's shared-memory segment cannot grow: it is sealed with a PAD and the batch goes to a new segment
    on disk; readers, a restarted owner and reclaim see a plain log."""
    log, ctrl, memory, files = space_log
    ch = log.open_channel()
    append_n(log, 5)
    memory.refuse = {"reserve", "create"}
    append_n(log, 100, size=1000, first_id=6)
    assert log.segments() == [(0, 0), (1, 1)] and log.head > S
    memory.refuse = set()
    log.close()
    log = MessageLog.attach(ctrl, 0, memory, files)
    log.recover()
    assert log.message_count == 105 and log.depth(ch) == 105
    assert read_all(log, ch) == list(range(1, 106))
    log.set_low_water(ch, log.cursor(ch))
    assert log.reclaim() == 1 and log.segments() == [(1, 1)]
    log.destroy()


def test_no_space_anywhere_leaves_the_log_usable(space_log):
    log, _, memory, files = space_log
    ch = log.open_channel()
    append_n(log, 5)
    memory.refuse = files.refuse = {"reserve", "create"}
    for _ in range(3):  # the first attempt seals the memory segment; no attempt appends anything
        with pytest.raises(LogNoSpace) as info:
            append_n(log, 100, size=1000, first_id=6)
        assert [c[0] for c in info.value.causes] == ["memory", "disk"]
        assert log.message_count == 5 and log.depth(ch) == 5
    with pytest.raises(LogNoSpace):
        log.copy_forward(ch, log.read(ch, 1, 1000).positions[:1], 2)
    files.refuse = set()
    append_n(log, 100, size=1000, first_id=6)
    new = log.copy_forward(ch, log.read(ch, 1, 1000).positions[:1], 2)
    assert log.records_at(new).attempts[0] == 2
    assert read_all(log, ch) == list(range(1, 106)) + [1]


def test_other_os_errors_become_log_errors(space_log):
    log, _, memory, files = space_log
    memory.refuse = {"create"}
    memory.errno_ = errno.EMFILE
    with pytest.raises(LogError) as info:
        log.append(b"x", 1, 1)
    assert not isinstance(info.value, (LogNoSpace, LogFull)) and "Too many open files" in str(info.value)
    assert log.head == 0 and files.calls["create"] == 0  # a tier that fails otherwise is not a reason to spill
    memory.refuse = set()
    log.append(b"x", 1, 1)
    assert log.segments() == [(0, 0)]


def fill_segment(log, first_id, size=10_000):
    """Messages until the head is in a new segment; -> the next id."""
    seg = log.head // S
    while log.head // S == seg:
        append_n(log, 1, size=size, first_id=first_id)
        first_id += 1
    return first_id


def keep_up_to_next_segment(log, ch, first_id, size=10_000):
    """Append one message at a time, channel ch reading each, until the head is in a new segment."""
    seg = log.head // S
    while log.head // S == seg:
        append_n(log, 1, size=size, first_id=first_id)
        assert read_all(log, ch) == [first_id]
        first_id += 1


@pytest.mark.parametrize("with_channel", [True, False])
def test_mem_messages_sends_new_segments_to_disk_while_that_many_wait(shm_prefix, tmp_path, with_channel):
    """--mem-queue-size counts messages: a new segment goes to memory only while fewer than mem_messages wait
    (for the slowest channel, or in the backlog without one), whatever room the memory budget has left."""
    log, _, _, _ = make_log(shm_prefix, tmp_path, mem=8, disk=8, mem_messages=50)
    try:
        ch = log.open_channel() if with_channel else None
        nxt = fill_segment(log, 1)                    # ~100 messages of 10 KB per 1 MiB segment
        assert log.segments() == [(0, 0), (1, 1)]     # the first went to memory; ~100 waiting: the next to disk
        assert log.waiting() == nxt - 1
        nxt = fill_segment(log, nxt)
        assert [t for _, t in log.segments()] == [0, 1, 1]
        if ch is None:
            ch = log.open_channel()                   # the first channel takes the backlog
        assert read_all(log, ch) == list(range(1, nxt)) and log.waiting() == 0
        keep_up_to_next_segment(log, ch, nxt)
        assert log.segments()[-1][1] == 0             # nothing waited: the next segment is in memory again
    finally:
        log.destroy()


def test_an_ephemeral_log_is_full_past_mem_messages_until_its_channel_reads(shm_prefix, tmp_path):
    """No disk tier (#ephemeral): past mem_messages waiting, a new segment is refused (NSQ drops there)."""
    log, _, _, _ = make_log(shm_prefix, tmp_path, mem=8, disk=0, mem_messages=50)
    try:
        ch = log.open_channel()
        with pytest.raises(LogFull, match="50 or more messages wait"):   # ~100 wait when the first is full
            fill_segment(log, 1)
        assert log.segments() == [(0, 0)]
        nxt = len(read_all(log, ch)) + 1
        keep_up_to_next_segment(log, ch, nxt)
        assert log.segments() == [(0, 0), (1, 0)]
    finally:
        log.destroy()


def test_budgets_still_fail_as_log_full(space_log):
    log, _, memory, files = space_log
    log.open_channel()  # holds everything
    with pytest.raises(LogFull):
        for i in range(100):
            append_n(log, 1, size=S // 3, first_id=i + 1)
    assert len(log.segments()) == 4


def test_a_crash_between_seal_and_its_reservation_update_recovers(space_log):
    """seal_segment publishes the head past its PAD before it moves RESERVED: recovery settles RESERVED."""
    log, ctrl, memory, files = space_log
    ch = log.open_channel()
    append_n(log, 5)
    reserved = log.reserved
    assert K.seal_segment(log.ctrl, log.window.data64) == S
    log.ctrl[RESERVED] = reserved  # as if killed before that store
    log.close()
    log = MessageLog.attach(ctrl, 0, memory, files)
    assert log.recover() == S and log.reserved == S
    append_n(log, 3, first_id=6)
    assert log.segments() == [(0, 0), (1, 0)]
    assert read_all(log, ch) == list(range(1, 9))
    log.destroy()


# --- for real: ENOSPC from a tiny tmpfs ----------------------------------------------------------------------
NAMESPACE_SCRIPT = textwrap.dedent("""
    import json, mmap, sys
    import numpy as np
    import nsqpy.ipc.msglog
    from nsqpy.ipc.filesegment import FileSegmentProvider
    from nsqpy.ipc.msglog import LogNoSpace, MessageLog, ShmSegmentProvider, log_ctrl_nbytes

    # no safety reserve, no check before fallocate at all: the tmpfs itself must refuse
    nsqpy.ipc.msglog.check_shm_room = lambda nbytes, what: None
    S, BODY = 1 << 20, 100_000
    data = sys.argv[1]
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(S, 64 * S, 64 * S))
    log = MessageLog.create(ctrl, 0, segment_size=S, mem_bytes=64 * S, memory=ShmSegmentProvider("/nsqpy-ns"),
                            disk_bytes=64 * S, disk=FileSegmentProvider(data, "log"))
    ch = log.open_channel()
    n, error = 0, None
    while error is None:
        try:
            log.append(bytes([n % 251]) * BODY, n, n + 1)
            n += 1
        except LogNoSpace as e:
            error = e
    count, tiers = log.message_count, log.segments()
    for _ in range(2):
        try:
            log.append(bytes(BODY), 0, 0)
        except LogNoSpace:
            pass
    unchanged = log.message_count == count
    seen = []
    while True:
        b = log.read(ch, 100, 1 << 30)
        if b.n == 0:
            break
        seen += [log.body(int(p)) == bytes([int(i - 1) % 251]) * BODY for p, i in zip(b.positions[:b.n], b.ids)]
        log.advance(ch, b.next_position)
    log.set_low_water(ch, log.cursor(ch))
    freed = log.reclaim()
    log.append(b"after", 0, n + 1)
    print(json.dumps({"appended": n, "count": count, "tiers": tiers, "error": str(error),
                      "causes": [c[0] for c in error.causes], "unchanged": unchanged,
                      "intact": len(seen) == n and all(seen), "freed": freed, "final": log.message_count}))
    log.destroy()
""")


def test_real_enospc_in_a_tiny_dev_shm_and_data_directory(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    proc, got = run_with_tmpfs(tmp_path, NAMESPACE_SCRIPT, {"/dev/shm": "8m", data: "8m"}, [data])
    assert proc.returncode == 0, proc.stderr
    tiers = [t for _, t in got["tiers"]]
    # both 8 MiB filesystems filled (less the headers and what sealed segments left unused)
    assert tiers.count(0) >= 5 and tiers.count(1) >= 5, got
    assert got["appended"] >= 90 and got["count"] == got["appended"], got
    assert got["causes"] == ["memory", "disk"] and got["error"].count("No space left on device") == 2, got
    assert got["unchanged"] and got["intact"], {k: got[k] for k in ("unchanged", "intact", "tiers")}
    assert got["freed"] >= 10 and got["final"] == got["appended"] + 1, got
