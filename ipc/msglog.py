"""A topic's message log: one append-only chain of segments holding each body once, read by channel cursors.

Theory of operation
-------------------
* **One writer.** The topic's owner worker appends, moves the channel cursors, creates and releases segments.
  Other processes (HTTP stats, the scanner) only read counters through ``LogCounters`` (seqlock reads of the
  double-buffered states, see ``msglog_layout``).
* **Positions** are monotonic byte offsets; segment k holds [k*S, (k+1)*S). A record never crosses a segment end
  (a PAD record fills the gap). The segments are mapped into one fixed address window per process
  (``msglog_window``), so kernels address the whole log as one array.
* **Tiers.** A new segment goes to shared memory while the memory budget has room, else to a file (spill) while
  the disk budget has room, else the append fails with ``LogFull`` and nothing of the batch is visible. An
  ephemeral topic has no disk provider. The segment table in the control block records each segment's tier, so
  a restarted owner re-attaches every segment where it is.
* **Channels** (``DEFAULT_CHANNELS`` = 256 slots, at most 1024): a cursor, depth counters and a low-water mark.
  The first channel of a topic takes the backlog, later ones start at the head (NSQ's rule).
* **Reclaim** frees whole segments below ``min over open channels of min(cursor, low_water)``; with no channel,
  below the backlog start (what the last removed channel had left behind is dead; what came after piles up).
  The low-water mark is the broker's: the oldest position the channel still holds in flight or deferred. It starts
  at the channel's first cursor and only the broker raises it (``set_low_water``), so a broker that never calls
  it reclaims nothing and loses nothing.
* **Retry store = channel-private re-append** (``copy_forward``). A requeued (or long in-flight) message is
  appended again at the head as a record private to its channel, carrying its attempts; other channels' cursors
  skip it, its own cursor delivers it again (requeue) or skips it too (``parked=True``: the broker holds it by
  position, e.g. still in flight or deferred). The old copy then pins nothing once the low-water mark moves past
  it. Chosen over a separate per-channel retry arena because the log already has everything an arena would need
  again (commit protocol, crash recovery, spill to disk, reclaim, framing by position), the copy is one memcpy,
  and order is kept for free; the cost is that a requeued message occupies log space until every channel passes
  it, bounded by the same budget as everything else.
* **Crash recovery.** Records commit by their first word (length | flags), store-released last; a batch commits
  through one gate word (see ``msglog_kernels``). ``recover()`` drops segments below the tail, rescans the
  records committed after the published head, republishes the head and counters (idempotently, from per-record
  sequence numbers) and zeroes everything past the head, so a torn append is invisible and later overwritten.
  Segment lifecycle order keeps crashes harmless: create + map, then publish in the table; release by storing
  the tail first, then unlinking, then clearing the table entry. An object left by a crash between create and
  publish is unlinked before its number is used again (or by ``destroy``).

Resource handling: ``close()`` unmaps everything (segments stay for a re-attaching owner); ``destroy()`` unlinks
every segment of the log. The arrays of a ``read`` result are reused by the next ``read`` (likewise
``records_at``).
Error handling: kernels return status codes; this class turns them into ``LogFull``/``LogError``/``ValueError``.
"""
from __future__ import annotations

import os

import numpy as np
import posix_ipc

from ipc import msglog_kernels as K
from ipc.atomics import py_load_acquire, py_store_release
from ipc.layout import LayoutError, check_header, stamp_header, words
from ipc.msglog_layout import (BAD_POSITION, CH_ACTIVE, CH_LOW_WATER, C_CURSOR, DEFAULT_CHANNELS, EMPTY, FULL, HDR,
                               MAGIC, NEED_SEGMENT, NO_CHANNEL, NO_LOW_WATER, NO_SPACE_OUT, P_CHANNELS, P_DISK_SEGS,
                               P_MEM_SEGS, P_SEGMENT_SIZE, P_SLOTS, S_HEAD, S_HEAD_SEQ, S_LAST_ID, SEGMENT_TAG,
                               SEGMENT_TAG_VERSION, STATUS_NAMES, TAIL, TIER_DISK, TIER_MEM, TOO_BIG, VERSION,
                               channel_base, check_geometry, ctrl_nbytes, ctrl_words, table_at, window_slots)
from ipc.msglog_window import SegmentWindow
from ipc.shm import PAYLOAD_OFFSET, Segment, unlink_name

__all__ = ["MessageLog", "LogCounters", "ShmSegmentProvider", "ReadBatch", "LogError", "LogFull",
           "DEFAULT_CHANNELS", "NO_LOW_WATER", "log_ctrl_nbytes"]


class LogError(RuntimeError):
    """The log refused an operation (bad channel, bad position, corrupt record)."""


class LogFull(LogError):
    """Memory and disk budgets are used up by records some channel still needs; nothing was appended."""


# Segments a log may take past its budgets for records that were already acknowledged elsewhere (a worker that
# forwarded a publish answered OK once it was in the ring; the owner must still append it when the topic filled
# up meanwhile). The window always has room for them.
OVERDRAFT_SEGMENTS = 8


def log_ctrl_nbytes(segment_size: int, mem_bytes: int, disk_bytes: int = 0,
                    channels: int = DEFAULT_CHANNELS) -> int:
    """Size of the control block for these parameters (place it anywhere, 8-aligned)."""
    return ctrl_nbytes(channels, window_slots(mem_bytes // segment_size,
                                              disk_bytes // segment_size + OVERDRAFT_SEGMENTS))


class ShmSegmentProvider:
    """Segments ``<base>.<k>`` in /dev/shm (the memory tier), created through ``ipc.shm.Segment``."""

    tier_name = "memory"
    payload_offset = PAYLOAD_OFFSET

    def __init__(self, base: str):
        self.base = base if base.startswith("/") else "/" + base

    def name(self, k: int) -> str:
        return f"{self.base}.{k}"

    def _fd(self, k: int) -> int:
        shm = posix_ipc.SharedMemory(self.name(k))
        return shm.fd  # the caller closes it once mapped

    def create(self, k: int, size: int, tag: int, tag_version: int) -> int:
        Segment.create(self.name(k), size, tag, tag_version).close()
        return self._fd(k)

    def open(self, k: int, size: int, tag: int, tag_version: int) -> int:
        Segment.attach(self.name(k), size, tag, tag_version).close()
        return self._fd(k)

    def unlink(self, k: int) -> None:
        unlink_name(self.name(k))


class ReadBatch:
    """What ``read``/``records_at`` found: ``n`` records, their ``positions``, body ``lengths``, ``flags``,
    ``timestamps``, ``ids``, ``not_before``, ``attempts`` (stored ones: 0 for public records), and
    ``next_position`` (where ``advance`` moves the cursor to consume all of them)."""

    FIELDS = ("positions", "lengths", "flags", "timestamps", "ids", "not_before", "attempts")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._arrays = [np.zeros(capacity, dtype=np.int64) for _ in self.FIELDS]
        (self.positions, self.lengths, self.flags, self.timestamps, self.ids, self.not_before,
         self.attempts) = self._arrays
        self.n = 0
        self.next_position = 0

    def columns(self):
        return self._arrays[1:]


class LogCounters:
    """Read-only view of a log's control block, safe from any process (stats, scanner)."""

    def __init__(self, ctrl_buf, offset: int = 0):
        hdr = words(ctrl_buf, offset, 8, "message log")
        size, seg, slots, channels, mem, disk = check_header(hdr, MAGIC, VERSION, what="message log")
        check_geometry(seg, channels)
        if size != ctrl_nbytes(channels, slots) or window_slots(mem, disk + OVERDRAFT_SEGMENTS) != slots:
            raise LayoutError(f"message log: inconsistent geometry (size {size}, {slots} slots, {channels} "
                              f"channels, {mem}+{disk} segments)")
        self.ctrl = words(ctrl_buf, offset, ctrl_words(channels, slots), "message log")
        self.segment_size, self.slots, self.channels = seg, slots, channels
        self.mem_segments, self.disk_segments = mem, disk

    def _table(self):
        return self.ctrl[table_at(self.channels):table_at(self.channels) + self.slots]

    def depth(self, ch: int) -> int:
        """Messages channel ch has yet to deliver (published after its cursor, plus its requeued ones)."""
        d = K.channel_depth(self.ctrl, ch)
        if d == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")
        return int(d)

    @property
    def head(self) -> int:
        return int(K.state_snapshot(self.ctrl, S_HEAD))

    @property
    def message_count(self) -> int:
        """Public records ever appended (the topic's message count)."""
        return int(K.state_snapshot(self.ctrl, S_HEAD_SEQ))

    @property
    def last_id(self) -> int:
        return int(K.state_snapshot(self.ctrl, S_LAST_ID))

    @property
    def tail(self) -> int:
        return int(py_load_acquire(self.ctrl, TAIL))

    def cursor(self, ch: int) -> int:
        self._check_open(ch)
        return int(K.cursor_snapshot(self.ctrl, ch, C_CURSOR))

    def low_water(self, ch: int) -> int:
        self._check_open(ch)
        return int(py_load_acquire(self.ctrl, channel_base(ch) + CH_LOW_WATER))

    def open_channels(self) -> list[int]:
        return [ch for ch in range(self.channels) if py_load_acquire(self.ctrl, channel_base(ch) + CH_ACTIVE) == 1]

    def segments(self) -> list[tuple[int, int]]:
        """(segment number, tier) of every segment in the table, oldest first; tier 0 memory, 1 disk."""
        return sorted((int(e) >> 1, int(e) & 1) for e in self._table().copy() if e != EMPTY)

    def _check_open(self, ch: int) -> None:
        if not K.channel_active(self.ctrl, ch):
            raise LogError(f"channel slot {ch} is not open")


class MessageLog(LogCounters):
    """The owner's handle on a topic's log: appends, channels, reads, framing, reclaim, recovery."""

    def __init__(self, ctrl_buf, offset, memory, disk=None):
        super().__init__(ctrl_buf, offset)
        if self.disk_segments and disk is None:
            raise ValueError("this log has a disk budget: give it a disk segment provider")
        self._providers = (memory, disk)
        self.window = SegmentWindow(self.slots, self.segment_size)
        self._count = [0, 0]
        self._batches = [ReadBatch(0), ReadBatch(0)]
        self._one = [np.zeros(1, dtype=np.int64) for _ in range(5)]
        self._zeros = np.zeros(0, dtype=np.int64)
        self._no_positions = np.zeros(0, dtype=np.int64)
        for k, tier in self.segments():
            if k >= self.tail // self.segment_size:
                self._map_segment(k, tier, create=False)

    # life-cycle -------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, ctrl_buf, offset: int, *, segment_size: int, mem_bytes: int, memory, disk_bytes: int = 0,
               disk=None, channels: int = DEFAULT_CHANNELS) -> "MessageLog":
        """Initialise a control block at ctrl_buf[offset:] (size ``log_ctrl_nbytes``) and the first segment."""
        check_geometry(segment_size, channels)
        mem, dsk = mem_bytes // segment_size, (disk_bytes // segment_size if disk is not None else 0)
        if mem + dsk < 1:
            raise ValueError("the budgets must hold at least one segment")
        slots = window_slots(mem, dsk + OVERDRAFT_SEGMENTS)
        size = ctrl_nbytes(channels, slots)
        ctrl = words(ctrl_buf, offset, size // 8, "message log")
        ctrl[:] = 0
        ctrl[table_at(channels):table_at(channels) + slots] = EMPTY
        for ch in range(channels):
            ctrl[channel_base(ch) + CH_LOW_WATER] = NO_LOW_WATER
        stamp_header(ctrl, MAGIC, VERSION, size, (segment_size, slots, channels, mem, dsk))
        log = cls(ctrl_buf, offset, memory, disk)
        log._allocate(0)
        return log

    @classmethod
    def attach(cls, ctrl_buf, offset: int, memory, disk=None) -> "MessageLog":
        """Map an existing log's segments; an owner taking over after a crash then calls ``recover()``."""
        return cls(ctrl_buf, offset, memory, disk)

    def recover(self) -> int:
        """Make the shared state exact again after the previous owner died; returns the head position."""
        tail_seg = self.tail // self.segment_size
        for k, tier in self.segments():
            if k < tail_seg:
                self._release(k, tier)
        head = int(K.recover_scan(self.ctrl, self.window.data64))
        if head == BAD_POSITION:
            raise LogError("message log: a committed record is malformed (corrupt segment)")
        s = self.segment_size
        for k, _ in self.segments():
            start = max(head, k * s)
            if start < (k + 1) * s:
                K.zero_range(self.window.data64, self.ctrl, start, (k + 1) * s)
        self._count = [sum(1 for _, t in self.segments() if t == tier) for tier in (TIER_MEM, TIER_DISK)]
        return head

    def close(self) -> None:
        """Unmap everything; the segments stay for the next owner."""
        if self.window is not None:
            self.window.close()
            self.window = None

    def destroy(self) -> None:
        """Unlink every segment of the log (including one a crash may have left unpublished) and close."""
        segs = self.segments()
        after = (segs[-1][0] + 1) if segs else self.head // self.segment_size
        for k, tier in segs:
            self._release(k, tier)
        for provider in self._providers:
            if provider is not None:
                provider.unlink(after)
        self.close()

    # segments ---------------------------------------------------------------------------------------------
    def _map_segment(self, k: int, tier: int, create: bool) -> None:
        provider = self._providers[tier]
        if create:
            fd = provider.create(k, self.segment_size, SEGMENT_TAG, SEGMENT_TAG_VERSION)
        else:
            fd = provider.open(k, self.segment_size, SEGMENT_TAG, SEGMENT_TAG_VERSION)
        try:
            self.window.map(k, fd, provider.payload_offset)
        finally:
            os.close(fd)
        self._count[tier] += 1

    def has_room(self) -> bool:
        """A new segment fits in the budgets (after a reclaim, say)."""
        return sum(self._count) < self.mem_segments + self.disk_segments

    def _allocate(self, k: int, overdraft: bool = False) -> None:
        if self._count[TIER_MEM] < self.mem_segments:
            tier = TIER_MEM
        elif self._count[TIER_DISK] < self.disk_segments:
            tier = TIER_DISK
        elif overdraft and sum(self._count) < self.mem_segments + self.disk_segments + OVERDRAFT_SEGMENTS:
            tier = TIER_DISK if self._providers[TIER_DISK] is not None else TIER_MEM
        else:
            raise LogFull(f"message log full: {self.mem_segments} memory and {self.disk_segments} disk "
                          f"segments of {self.segment_size} bytes are all needed")
        slot = table_at(self.channels) + k % self.slots
        if self.ctrl[slot] != EMPTY:
            raise LogError(f"message log: slot for segment {k} is still held by segment {self.ctrl[slot] >> 1}")
        for provider in self._providers:
            if provider is not None:
                provider.unlink(k)  # an object a crash left between create and publish
        self._map_segment(k, tier, create=True)
        py_store_release(self.ctrl, slot, k << 1 | tier)

    def _release(self, k: int, tier: int) -> None:
        if self.window is not None:  # destroy() also works on a closed handle
            self.window.unmap(k)
        self._providers[tier].unlink(k)
        py_store_release(self.ctrl, table_at(self.channels) + k % self.slots, EMPTY)
        self._count[tier] = max(0, self._count[tier] - 1)

    def _ensure(self, end: int, keep: int = NO_LOW_WATER, overdraft: bool = False) -> None:
        """Create the segments [head, end) needs, reclaiming first (nothing from ``keep`` on) if the budgets
        are used up; ``overdraft``: past the budgets by up to OVERDRAFT_SEGMENTS."""
        s = self.segment_size
        for k in range(self.head // s, (end - 1) // s + 1):
            if not K.segment_present(self.ctrl, k):
                if sum(self._count) >= self.mem_segments + self.disk_segments:
                    self.reclaim(keep)
                self._allocate(k, overdraft)

    def reclaim(self, keep: int = NO_LOW_WATER) -> int:
        """Release every segment wholly below the oldest position still needed (and below ``keep``); returns
        how many."""
        s = self.segment_size
        new_tail = min(int(K.needed_from(self.ctrl)), keep) // s * s
        if new_tail <= self.tail:
            return 0
        py_store_release(self.ctrl, TAIL, new_tail)
        freed = 0
        for k, tier in self.segments():
            if k < new_tail // s:
                self._release(k, tier)
                freed += 1
        return freed

    # appending --------------------------------------------------------------------------------------------
    def _check(self, status: int, what: str) -> int:
        if status == TOO_BIG:
            raise ValueError(f"{what}: a record does not fit in a segment of {self.segment_size} bytes")
        if status < 0:
            raise LogError(f"{what}: {STATUS_NAMES.get(status, status)}")
        return status

    def append_batch(self, src, offsets, lengths, timestamps, ids, not_before=None, positions=None,
                     overdraft=False) -> int:
        """Append len(lengths) messages, bodies src[offsets[i]:offsets[i]+lengths[i]] (src uint8, the rest
        int64 arrays), all or nothing; returns the first record's position. ``positions`` (int64, optional)
        receives each record's position. Raises LogFull when the budgets (plus OVERDRAFT_SEGMENTS with
        ``overdraft``, for messages already acknowledged) cannot hold the batch."""
        n = len(lengths)
        if not_before is None:
            if self._zeros.size < n:
                self._zeros = np.zeros(max(n, 2 * self._zeros.size), dtype=np.int64)
            not_before = self._zeros
        out = self._no_positions if positions is None else positions
        w = self.window
        args = (src, offsets, lengths, timestamps, ids, not_before, n, out)
        status = K.append_batch(self.ctrl, w.data, w.data64, *args)
        if status == NEED_SEGMENT:
            self._ensure(int(K.plan_batch(self.ctrl, self.head, lengths, n)), overdraft=overdraft)
            status = K.append_batch(self.ctrl, w.data, w.data64, *args)
        return self._check(int(status), "append")

    def append(self, body, timestamp: int, msg_id: int, not_before: int = 0) -> int:
        """Append one message; returns its position (cold path and tests: the broker appends batches)."""
        src = np.frombuffer(body, dtype=np.uint8)
        off, length, ts, mid, nb = self._one
        off[0], length[0], ts[0], mid[0], nb[0] = 0, len(src), timestamp, msg_id, not_before
        return self.append_batch(src, off, length, ts, mid, nb)

    def copy_forward(self, ch: int, positions, attempts, not_before=None, parked: bool = False) -> np.ndarray:
        """Re-append the records at ``positions`` as channel ch's private records with ``attempts`` each
        (``not_before`` per record, -1 keeps the original; default keeps all). Without ``parked`` ch's cursor
        delivers them again (requeue); with it they are skipped and held by position. Returns the new
        positions. All or nothing; raises LogFull."""
        positions = np.asarray(positions, dtype=np.int64)
        n = len(positions)
        attempts = np.broadcast_to(np.asarray(attempts, dtype=np.int64), (n,)).copy()
        nb = np.full(n, -1, np.int64) if not_before is None else np.asarray(not_before, dtype=np.int64)
        out = np.zeros(n, dtype=np.int64)
        w = self.window
        args = (ch, positions, attempts, nb, parked, n, out)
        status = K.copy_forward(self.ctrl, w.data, w.data64, *args)
        if status == NEED_SEGMENT:
            lengths = self.records_at(positions).lengths[:n].copy()
            self._ensure(int(K.plan_batch(self.ctrl, self.head, lengths, n)), keep=int(positions.min()))
            status = K.copy_forward(self.ctrl, w.data, w.data64, *args)
        if status == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")
        self._check(int(status), "copy_forward")
        return out

    # channels ---------------------------------------------------------------------------------------------
    def open_channel(self) -> int:
        """Take a channel slot (first channel: the backlog; later: from the head)."""
        ch = int(K.open_channel(self.ctrl))
        if ch == FULL:
            raise LogError(f"all {self.channels} channel slots are taken")
        return ch

    def close_channel(self, ch: int) -> None:
        if K.close_channel(self.ctrl, ch) == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")

    def set_low_water(self, ch: int, position: int) -> None:
        """The oldest position channel ch still holds in flight or deferred (NO_LOW_WATER: none)."""
        self._check_open(ch)
        py_store_release(self.ctrl, channel_base(ch) + CH_LOW_WATER, position)

    # reading ----------------------------------------------------------------------------------------------
    def _batch_for(self, n: int, which: int = 0) -> ReadBatch:
        """Reusable result arrays: one set for ``read``, one for ``records_at``."""
        if self._batches[which].capacity < n:
            self._batches[which] = ReadBatch(max(n, 64))
        return self._batches[which]

    def read(self, ch: int, max_n: int, max_bytes: int) -> ReadBatch:
        """Up to max_n records for channel ch from its cursor, whose V2 frames total at most max_bytes. The
        cursor does not move until ``advance(ch, batch.next_position)``."""
        b = self._batch_for(max_n)
        n, nxt = K.read_channel(self.ctrl, self.window.data64, ch, max_n, max_bytes, *b._arrays)
        if n == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")
        b.n, b.next_position = int(n), int(nxt)
        return b

    def advance(self, ch: int, position: int) -> int:
        """Move ch's cursor to position (a record boundary after it); returns the records passed."""
        passed = int(K.advance(self.ctrl, self.window.data64, ch, position))
        if passed == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")
        if passed == BAD_POSITION:
            raise ValueError(f"position {position} is not a record boundary between the cursor and the head")
        return passed

    def records_at(self, positions) -> ReadBatch:
        """Header fields of the records at positions (held in flight or deferred by the broker)."""
        positions = np.asarray(positions, dtype=np.int64)
        b = self._batch_for(len(positions), 1)
        if K.records_at(self.ctrl, self.window.data64, positions, len(positions), *b.columns()) == BAD_POSITION:
            raise ValueError("a position is not a retained record")
        b.positions[:len(positions)] = positions
        b.n, b.next_position = len(positions), -1
        return b

    def body(self, position: int) -> bytes:
        """A copy of the body at position (cold path)."""
        length = int(self.records_at([position]).lengths[0])
        off = (position & (self.window.nbytes - 1)) + HDR
        return self.window.data[off:off + length].tobytes()

    def write_frames(self, out, out_off: int, positions, attempts, n: int | None = None) -> int:
        """NSQ V2 message frames for records at positions[:n] with attempts[:n] into out (uint8) from out_off;
        returns the end offset. ValueError if out is too small (nothing useful written)."""
        n = len(positions) if n is None else n
        w = self.window
        end = int(K.write_frames(self.ctrl, w.data, w.data64, positions, attempts, n, out, out_off))
        if end == NO_SPACE_OUT:
            raise ValueError("output buffer too small for the frames")
        return end
