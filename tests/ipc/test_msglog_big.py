"""Big messages: segments up to 256 MiB (lazily reserved), a 64 MiB body appended, read, framed and requeued, and
a read that always makes progress however small its byte budget."""
import mmap
import os
import struct

import numpy as np
import pytest

from nsqpy.ipc.filesegment import FileSegmentProvider
from nsqpy.ipc.msglog import RESERVE_STEP_MAX, MessageLog, ShmSegmentProvider, log_ctrl_nbytes
from nsqpy.ipc.msglog_layout import FRAME_OVERHEAD, HDR, window_slots
from nsqpy.ipc.shm import PAYLOAD_OFFSET

BIG = 64 << 20


def frame(body_len, ts, attempts, msg_id):
    return struct.pack(">iiqH", FRAME_OVERHEAD - 4 + body_len, 2, ts, attempts) + b"%016x" % msg_id


@pytest.mark.parametrize("segment_size", [128 << 20, 256 << 20])
def test_a_64_mib_message_in_big_segments(segment_size, shm_prefix, tmp_path):
    """As a topic with --max-msg-size=64 MiB gets them: budgets of a few segments in memory and 16 GiB on disk,
    so the window reserves its full address range but nothing is spilled."""
    mem, disk = 2 * segment_size, 16 << 30
    assert window_slots(mem // segment_size, disk // segment_size + 8) * segment_size >= 16 << 30
    memory = ShmSegmentProvider(shm_prefix)
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(segment_size, mem, disk))
    log = MessageLog.create(ctrl, 0, segment_size=segment_size, mem_bytes=mem, memory=memory, disk_bytes=disk,
                            disk=FileSegmentProvider(str(tmp_path), "big"))
    try:
        ch = log.open_channel()
        body = np.arange(BIG, dtype=np.uint32).view(np.uint8)[:BIG].copy()
        log.append(b"small", 1, 1)
        pos = log.append(body, 2, 2)
        log.append(b"after", 3, 3)
        # reserved as far as reached (and a step), not the whole segment
        held = os.stat("/dev/shm" + memory.name(0)).st_blocks * 512
        assert BIG < held - PAYLOAD_OFFSET <= BIG + RESERVE_STEP_MAX + (1 << 20)

        b = log.read(ch, 10, 4 << 20)  # the small one fits the budget, the big one waits for the next round
        assert b.n == 1 and b.ids[0] == 1
        log.advance(ch, b.next_position)
        b = log.read(ch, 10, 4 << 20)  # over budget on its own: delivered alone
        assert b.n == 1 and b.positions[0] == pos and b.lengths[0] == BIG
        out = np.zeros(BIG + 2 * FRAME_OVERHEAD, np.uint8)
        end = log.write_frames(out, 7, b.positions, np.array([1]), 1)
        assert end == 7 + FRAME_OVERHEAD + BIG
        assert out[7:7 + FRAME_OVERHEAD].tobytes() == frame(BIG, 2, 1, 2)
        assert np.array_equal(out[7 + FRAME_OVERHEAD:end], body)

        new = log.copy_forward(ch, b.positions[:1], 2)  # requeue: a second 64 MiB record at the head
        log.advance(ch, b.next_position)
        b = log.read(ch, 10, 1 << 30)
        assert [int(i) for i in b.ids[:b.n]] == [3, 2] and b.positions[1] == new[0] and b.attempts[1] == 2
        end = log.write_frames(out, 0, b.positions[1:2], b.attempts[1:2], 1)
        assert out[:FRAME_OVERHEAD].tobytes() == frame(BIG, 2, 2, 2)
        assert np.array_equal(out[FRAME_OVERHEAD:end], body)
        assert log.body(int(new[0])) == body.tobytes()
        # in a 128 MiB segment the copy does not fit behind the original: it starts the next segment
        assert log.segments() == [(k, 0) for k in range(new[0] // segment_size + 1)]
        assert new[0] // segment_size == (1 if segment_size < 2 * BIG + 2 * HDR else 0)
    finally:
        log.destroy()


def test_a_read_returns_the_first_record_whatever_its_size(shm_prefix):
    S = 1 << 20
    ctrl = mmap.mmap(-1, log_ctrl_nbytes(S, 2 * S))
    log = MessageLog.create(ctrl, 0, segment_size=S, mem_bytes=2 * S, memory=ShmSegmentProvider(shm_prefix))
    try:
        ch = log.open_channel()
        log.append(b"x" * 5000, 1, 1)
        log.append(b"y" * 10, 2, 2)
        log.append(b"z" * 10, 3, 3)
        for budget in (0, 100, FRAME_OVERHEAD + 4999):
            b = log.read(ch, 10, budget)
            assert b.n == 1 and b.ids[0] == 1 and b.lengths[0] == 5000
        log.advance(ch, b.next_position)
        b = log.read(ch, 10, FRAME_OVERHEAD + 10)  # the budget still bounds what follows the first record
        assert b.n == 1 and b.ids[0] == 2
        b = log.read(ch, 10, 2 * (FRAME_OVERHEAD + 10))
        assert [int(i) for i in b.ids[:b.n]] == [2, 3]
        assert log.read(ch, 0, 1 << 20).n == 0
    finally:
        log.destroy()
