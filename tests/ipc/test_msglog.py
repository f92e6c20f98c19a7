"""MessageLog against a pure-Python model of the log (positions, tiers, channels, reclaim, FULL), plus focused
tests of framing, torn appends and the layout checks."""
import itertools
import mmap
import os
import select
import signal
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from nsqpy.ipc import msglog
from nsqpy.ipc.filesegment import FileSegment, FileSegmentProvider
from nsqpy.ipc.layout import LayoutError
from nsqpy.ipc.msglog import (LogError, LogFull, MessageLog, NO_LOW_WATER, ShmSegmentProvider, log_ctrl_nbytes)
from nsqpy.ipc.msglog_layout import F_PARKED, F_PRIVATE, FRAME_OVERHEAD, HDR, record_size

S = 4096
MEM, DISK, CHANNELS = 1, 3, 3  # one memory segment: the second one spills
_examples = itertools.count()


class Full(Exception):
    pass


class Model:
    """What the log should hold: records by position (PAD records are implicit), segments by tier, channels."""

    def __init__(self, disk_segments, segment_size=S):
        self.disk = disk_segments
        self.s = segment_size
        self.recs = {}  # pos -> (flags, body, id, ts, not_before, channel, attempts)
        self.order = []  # retained positions, ascending
        self.head = self.tail = self.backlog = 0
        self.segs = {}  # the first segment comes with the first append
        self.chans = {}  # ch -> [cursor, low_water]
        self.spilled = False
        self.freed = 0

    # placement and segments, as the theory of operation states them
    def _plan(self, sizes):
        pos, out = self.head, []
        for size in sizes:
            if pos % self.s + size > self.s:
                pos = (pos // self.s + 1) * self.s
            out.append(pos)
            pos += size
        return out, pos

    def reclaim(self, keep=NO_LOW_WATER):
        if self.chans:
            needed = min(min(c, lw) for c, lw in self.chans.values())
        else:
            needed = self.backlog
        new_tail = min(needed, self.head, keep) // self.s * self.s
        if new_tail <= self.tail:
            return 0
        self.tail = new_tail
        gone = [k for k in self.segs if k < new_tail // self.s]
        for k in gone:
            del self.segs[k]
        self.freed += len(gone)
        while self.order and self.order[0] < new_tail:
            del self.recs[self.order.pop(0)]
        return len(gone)

    def _ensure(self, end, keep):
        for k in range(self.head // self.s, (end - 1) // self.s + 1):
            if k in self.segs:
                continue
            if len(self.segs) >= MEM + self.disk:
                self.reclaim(keep)
            tiers = list(self.segs.values())
            if tiers.count(0) < MEM:
                self.segs[k] = 0
            elif tiers.count(1) < self.disk:
                self.segs[k] = 1
                self.spilled = True
            else:
                raise Full

    def _put(self, records, keep=NO_LOW_WATER):
        positions, end = self._plan([record_size(len(r[1])) for r in records])
        self._ensure(end, keep)
        for pos, rec in zip(positions, records):
            self.recs[pos] = rec
            self.order.append(pos)
        self.head = end
        return positions

    def append(self, bodies, ids):
        return self._put([(0, b, i, i * 7, 0, 0, 0) for b, i in zip(bodies, ids)])

    def copy_forward(self, ch, pos, attempts, parked):
        flags, body, mid, ts, nb, _, _ = self.recs[pos]
        return self._put([(F_PRIVATE | (F_PARKED if parked else 0), body, mid, ts, nb, ch, attempts)], keep=pos)

    def delivers(self, ch, pos):
        flags, _, _, _, _, owner, _ = self.recs[pos]
        return not flags & F_PRIVATE or (owner == ch and not flags & F_PARKED)

    def read(self, ch, max_n, max_bytes):
        out, total = [], 0
        for pos in self.order:
            if pos < self.chans[ch][0] or not self.delivers(ch, pos):
                continue
            frame = FRAME_OVERHEAD + len(self.recs[pos][1])
            if total + frame > max_bytes and out:  # the first record goes however big it is
                return out, pos
            total += frame
            out.append(pos)
            if len(out) == max_n:
                return out, pos + record_size(len(self.recs[pos][1]))
        return out, self.head

    def depth(self, ch):
        return sum(1 for pos in self.order if pos >= self.chans[ch][0] and self.delivers(ch, pos))

    def open_channel(self):
        ch = min(set(range(CHANNELS)) - set(self.chans))
        start = self.head if self.chans else self.backlog
        self.chans[ch] = [start, start]
        return ch

    def private_ahead(self, ch):
        return any(self.recs[pos][0] & F_PRIVATE for pos in self.order if pos >= self.chans[ch][0])

    def close_channel(self, ch, give_back=False):
        if len(self.chans) == 1:
            self.backlog = self.chans[ch][0] if give_back else self.head
        del self.chans[ch]


# mostly large bodies (cheap to generate), so that a few dozen operations fill, spill and reclaim segments
BODY = st.one_of(st.binary(max_size=16), st.tuples(st.integers(100, 1500), st.integers(0, 255)).map(
    lambda t: bytes([t[1]]) * t[0] + t[0].to_bytes(2, "big")))
APPEND = st.tuples(st.just("append"), st.lists(BODY, min_size=1, max_size=8))
OPS = st.one_of(
    APPEND, APPEND, APPEND,
    st.tuples(st.just("open")),
    st.tuples(st.just("close"), st.integers(0, CHANNELS - 1), st.booleans()),
    st.tuples(st.just("read"), st.integers(0, CHANNELS - 1), st.integers(1, 6), st.integers(0, 3000),
              st.integers(0, 7), st.booleans()),
    st.tuples(st.just("copy"), st.integers(0, CHANNELS - 1), st.integers(0, 10**6), st.integers(1, 9),
              st.booleans()),
    st.tuples(st.just("low"), st.integers(0, CHANNELS - 1), st.integers(0, 10**6)),
    st.tuples(st.just("reclaim")),
    st.tuples(st.just("reattach")),
)


def frames_of(model, positions, attempts):
    out = b""
    for pos, att in zip(positions, attempts):
        _, body, mid, ts, _, _, _ = model.recs[pos]
        out += struct.pack(">iiqH", FRAME_OVERHEAD - 4 + len(body), 2, ts, att) + b"%016x" % mid + body
    return out


def open_log(prefix, tmp_path, disk_segments, create=True, ctrl=None, s=S):
    memory = ShmSegmentProvider(prefix)
    disk = FileSegmentProvider(str(tmp_path), "log") if disk_segments else None
    if not create:
        return MessageLog.attach(ctrl, 64, memory, disk)
    ctrl = mmap.mmap(-1, 64 + log_ctrl_nbytes(s, MEM * s, disk_segments * s, CHANNELS))
    log = MessageLog.create(ctrl, 64, segment_size=s, mem_bytes=MEM * s, memory=memory,
                            disk_bytes=disk_segments * s, disk=disk, channels=CHANNELS)
    return log, ctrl


def check_reserved(log, prefix, tmp_path):
    """No page at or past RESERVED was touched: a segment holds at most its header and its reserved part."""
    s = log.segment_size
    assert log.head <= log.reserved
    for k, tier in log.segments():
        path = f"/dev/shm/{prefix}.{k}" if tier == 0 else FileSegmentProvider(str(tmp_path), "log").name(k)
        held = os.stat(path).st_blocks * 512 - mmap.PAGESIZE
        assert held <= min(max(log.reserved - k * s, 0), s)


def check(log, model, prefix, tmp_path):
    assert log.head == model.head and log.tail == model.tail
    check_reserved(log, prefix, tmp_path)
    assert log.segments() == sorted(model.segs.items())
    assert sorted(log.open_channels()) == sorted(model.chans)
    for ch, (cursor, low) in model.chans.items():
        assert log.cursor(ch) == cursor and log.low_water(ch) == low
        assert log.depth(ch) == model.depth(ch)
    # no leak: exactly the segments in the table exist, in /dev/shm and on disk
    shm = sorted(e for e in os.listdir("/dev/shm") if e.startswith(prefix + "."))
    assert shm == sorted(f"{prefix}.{k}" for k, t in model.segs.items() if t == 0)
    files = sorted(os.listdir(tmp_path))
    assert files == sorted(os.path.basename(FileSegmentProvider(str(tmp_path), "log").name(k))
                           for k, t in model.segs.items() if t == 1)


def apply(log, model, op):
    name = op[0]
    if name == "append":
        ids = [next(_examples) for _ in op[1]]
        lengths = np.array([len(b) for b in op[1]], dtype=np.int64)
        src = np.frombuffer(b"".join(op[1]) or b"\0", dtype=np.uint8)
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        got = np.zeros(len(ids), dtype=np.int64)
        try:
            want = model.append(op[1], ids)
        except Full:
            event("append FULL")
            with pytest.raises(LogFull):
                log.append_batch(src, offsets, lengths, np.array(ids) * 7, np.array(ids, dtype=np.int64))
            return
        log.append_batch(src, offsets, lengths, np.array(ids) * 7, np.array(ids, dtype=np.int64), positions=got)
        assert list(got) == want
    elif name == "open":
        if len(model.chans) == CHANNELS:
            with pytest.raises(LogError):
                log.open_channel()
        else:
            assert log.open_channel() == model.open_channel()
    elif name == "close":
        if op[1] not in model.chans:
            with pytest.raises(LogError):
                log.close_channel(op[1])
        else:
            # give_back is for a channel with no requeued records ahead of its cursor (a first channel that
            # delivered nothing: every closed slot's records lie behind the backlog it started at)
            give_back = op[2] and not model.private_ahead(op[1])
            log.close_channel(op[1], give_back=give_back)
            model.close_channel(op[1], give_back=give_back)
    elif name == "read" and op[1] in model.chans:
        _, ch, max_n, max_bytes, consume, fin = op
        want, nxt = model.read(ch, max_n, max_bytes)
        b = log.read(ch, max_n, max_bytes)
        assert list(b.positions[:b.n]) == want and b.next_position == nxt
        assert [model.recs[p][1] for p in want] == [log.body(int(p)) for p in want]
        attempts = np.arange(1, b.n + 1, dtype=np.int64)
        out = np.zeros(max(max_bytes, 2000) + 16, dtype=np.uint8)
        end = log.write_frames(out, 5, b.positions, attempts, b.n)
        assert out[5:end].tobytes() == frames_of(model, want, attempts)
        target = nxt if consume >= len(want) else want[consume]  # a partial advance stops before a record
        passed = log.advance(ch, target)
        assert passed >= sum(1 for p in model.order if model.chans[ch][0] <= p < target)  # + PAD records
        model.chans[ch][0] = target
        if fin:  # as a broker does once everything before the cursor is finished
            log.set_low_water(ch, target)
            model.chans[ch][1] = target
    elif name == "copy" and op[1] in model.chans and model.order:
        _, ch, pick, attempts, parked = op
        src = model.order[pick % len(model.order)]
        try:
            want = model.copy_forward(ch, src, attempts, parked)
        except Full:
            with pytest.raises(LogFull):
                log.copy_forward(ch, [src], attempts, parked=parked)
            return
        assert list(log.copy_forward(ch, [src], attempts, parked=parked)) == want
        got = log.records_at(want)
        assert got.attempts[0] == attempts and got.flags[0] == model.recs[want[0]][0]
    elif name == "low" and op[1] in model.chans:
        ch = op[1]
        choices = model.order + [NO_LOW_WATER, model.chans[ch][0]]
        pos = choices[op[2] % len(choices)]
        log.set_low_water(ch, pos)
        model.chans[ch][1] = pos
    elif name == "reclaim":
        freed = model.reclaim()
        assert log.reclaim() == freed
        event(f"reclaim freed {min(freed, 2)}")
    return None


@pytest.mark.parametrize("segment_size", [S, 4 * S])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=20, max_size=100), ephemeral=st.booleans())
def test_log_matches_model(segment_size, ops, ephemeral, shm_prefix, tmp_path_factory, monkeypatch):
    """With one-page segments, and with four-page segments whose reservation grows a page at a time."""
    monkeypatch.setattr(msglog, "RESERVE_STEP", mmap.PAGESIZE)
    prefix = f"{shm_prefix}-{next(_examples)}"
    tmp_path = tmp_path_factory.mktemp("segs")
    disk_segments = 0 if ephemeral else DISK
    log, ctrl = open_log(prefix, tmp_path, disk_segments, s=segment_size)
    model = Model(disk_segments, segment_size)
    try:
        for op in ops:
            if op[0] == "reattach":  # the owner died and a new one takes over
                log.close()
                log = open_log(prefix, tmp_path, disk_segments, create=False, ctrl=ctrl)
                log.recover()
            else:
                apply(log, model, op)
            check(log, model, prefix, tmp_path)
        event(f"spilled to disk: {model.spilled}")
        event(f"segments reclaimed: {min(model.freed, 3)}")
        event(f"segments used: {min(max(model.segs, default=0), 8)}")
        for pos in model.order:  # nothing a channel may still need was reclaimed or overwritten
            assert log.body(pos) == model.recs[pos][1]
            assert log.records_at([pos]).ids[0] == model.recs[pos][2]
    finally:
        log.destroy()
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(prefix + ".")] and not os.listdir(tmp_path)


@pytest.fixture
def small_log(shm_prefix, tmp_path):
    log, ctrl = open_log(shm_prefix, tmp_path, DISK)
    yield log, ctrl, shm_prefix, tmp_path
    log.destroy()


def test_frame_bytes_exact(small_log):
    log, *_ = small_log
    pos = log.append(b"hello", 0x0102030405060708, 0xABCDEF0123456789 - (1 << 64))
    out = np.zeros(64, dtype=np.uint8)
    end = log.write_frames(out, 3, np.array([pos]), np.array([2]))
    assert out[3:end].tobytes() == (b"\x00\x00\x00\x23" b"\x00\x00\x00\x02" b"\x01\x02\x03\x04\x05\x06\x07\x08"
                                    b"\x00\x02" b"abcdef0123456789" b"hello")
    with pytest.raises(ValueError):
        log.write_frames(out, 40, np.array([pos]), np.array([2]))


def test_a_first_channel_closed_with_give_back_leaves_the_backlog_for_the_next(small_log):
    """A slot a crashed worker opened but never recorded (a SUB that never got its OK) took the backlog as the
    topic's first channel: closed with give_back, the next first channel still gets all of it, and the depth
    counts it; a plain close (a deleted channel) starts the backlog at the head, as NSQ's topic does."""
    log, *_ = small_log
    for i in range(5):
        log.append(b"m%d" % i, i, i + 1)
    assert log.waiting() == 5
    ch = log.open_channel()
    log.close_channel(ch, give_back=True)
    assert log.waiting() == 5
    ch = log.open_channel()
    assert log.depth(ch) == 5
    b = log.read(ch, 2, 1000)
    log.advance(ch, b.next_position)
    log.close_channel(ch, give_back=True)  # what it had not read goes back
    assert log.waiting() == 3
    ch = log.open_channel()
    assert log.depth(ch) == 3 and log.read(ch, 10, 1000).n == 3
    log.close_channel(ch)
    assert log.waiting() == 0 and log.depth(log.open_channel()) == 0


def test_read_reports_latest_not_before(small_log):
    """A delivery round tests its records' not-before times only when the latest of those it read is ahead."""
    log, *_ = small_log
    ch = log.open_channel()
    bodies = np.frombuffer(b"abc", np.uint8)
    ones = np.ones(3, np.int64)
    log.append_batch(bodies, np.arange(3, dtype=np.int64), ones, ones, np.arange(1, 4, dtype=np.int64),
                     not_before=np.array([0, 500, 200], np.int64))
    assert log.read(ch, 1, 1000).latest_not_before == 0
    b = log.read(ch, 10, 1000)
    assert b.n == 3 and b.latest_not_before == 500
    log.advance(ch, b.next_position)
    assert log.read(ch, 10, 1000).latest_not_before == 0  # nothing read


def test_parked_public_records_are_passed_by_every_cursor_and_counted_by_none(small_log):
    """A deferred publish the broker holds for every channel (its deferred-store entries): no cursor delivers it,
    no depth or message count includes it, advancing and rewinding over it keep the counts, and its body and id
    stay readable by position (the entries frame it when it comes due)."""
    log, *_ = small_log
    a, b = log.open_channel(), log.open_channel()
    one = np.ones(1, np.int64)
    log.append(b"x", 1, 11)
    parked = np.zeros(1, np.int64)
    log.append_batch(np.frombuffer(b"d", np.uint8), np.zeros(1, np.int64), one, one, np.array([12], np.int64),
                     not_before=np.array([10**18], np.int64), positions=parked, parked=True)
    log.append(b"y", 1, 13)
    assert (log.depth(a), log.depth(b), log.message_count, log.last_id) == (2, 2, 2, 13)
    r = log.read(a, 10, 1 << 20)
    assert r.n == 2 and r.ids[:2].tolist() == [11, 13]
    log.advance(a, int(r.positions[1]))  # to "y", past the parked record
    assert log.depth(a) == 1
    log.advance(a, r.next_position)
    assert log.depth(a) == 0
    assert log.rewind(a, int(parked[0])) and log.depth(a) == 1  # only "y" is after it
    assert log.body(int(parked[0])) == b"d" and log.records_at(parked).ids[0] == 12


def test_torn_batch_is_invisible_and_overwritten(small_log):
    """An owner killed inside append_batch leaves bodies and commit words after the gate; recovery drops them."""
    log, ctrl, prefix, tmp_path = small_log
    ch = log.open_channel()
    log.append(b"kept", 1, 1)
    head = log.head
    data64 = log.window.data64
    data64[head // 8 + 1: head // 8 + 200] = 0x5A5A5A5A  # headers and bodies of a torn batch
    data64[head // 8 + 6] = 0x30  # a later record of it committed, its gate (at head) not
    log.close()
    log = open_log(prefix, tmp_path, DISK, create=False, ctrl=ctrl)
    assert log.recover() == head and log.depth(ch) == 1
    assert not log.window.data64[head // 8: head // 8 + 200].any()
    log.append(b"next", 2, 2)
    log.close()
    log = open_log(prefix, tmp_path, DISK, create=False, ctrl=ctrl)
    log.recover()
    b = log.read(ch, 10, 1000)
    assert [log.body(int(p)) for p in b.positions[:b.n]] == [b"kept", b"next"] and log.last_id == 2
    log.close()


def test_too_big_and_layout_checks(small_log, tmp_path):
    log, ctrl, prefix, _ = small_log
    with pytest.raises(ValueError):
        log.append(b"x" * S, 0, 0)
    with pytest.raises(LayoutError):
        MessageLog.attach(bytearray(len(ctrl)), 64, ShmSegmentProvider(prefix))
    path = str(tmp_path / "f.seg")
    seg = FileSegment.create(path, 8192, tag=7, tag_version=1)
    seg.buf[:4] = 9
    seg.close()
    with pytest.raises(LayoutError):
        FileSegment.attach(path, 8192, tag=8)
    with FileSegment.attach(path, 8192, tag=7, tag_version=1) as again:
        assert again.buf[3] == 9 and again.tag == (7, 1)
    FileSegment.attach(path).unlink()
    assert not os.path.exists(path)


def test_counters_from_another_process(small_log):
    """A stats reader in another process sees consistent depth while the owner appends and consumes."""
    log, ctrl, *_ = small_log
    ch = log.open_channel()
    total = 3000
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = 0
        try:
            from nsqpy.ipc.msglog import LogCounters
            view = LogCounters(ctrl, 64)
            os.write(wfd, b"r")
            while True:
                depth, count = view.depth(ch), view.message_count
                if not 0 <= depth <= count:
                    break
                if count == total:
                    ok = 1
                    break
        finally:
            os.write(wfd, bytes([ok]))
            os._exit(0)
    os.close(wfd)
    try:
        assert os.read(rfd, 1) == b"r"
        for i in range(total):
            log.append(b"m", i, i + 1)
            if i % 7 == 0:
                log.advance(ch, log.read(ch, 10, 1000).next_position)
                log.set_low_water(ch, log.cursor(ch))
        ready, _, _ = select.select([rfd], [], [], 60)
        assert ready and os.read(rfd, 1) == b"\x01"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(rfd)
