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
  the disk budget has room, else the append fails with ``LogFull`` and nothing of the batch is visible. A log
  made with ``mem_messages`` (nsqd's ``--mem-queue-size``, a count of messages as NSQ's) also sends a new segment
  to disk while its slowest channel has that many messages or more still to deliver: memory then holds at most
  that many waiting messages plus one segment's worth, the decision being per segment. An ephemeral topic has no
  disk provider (past its count it gets ``LogFull``). The segment table in the control block records each
  segment's tier, so a restarted owner re-attaches every segment where it is.
* **Space, not only budgets.** Segments are sparse (``nsqpy.ipc.shm``): a segment's pages are reserved (fallocate) as
  the log reaches them, up to RESERVED in the control block (see ``msglog_layout``), so what a topic costs grows
  with what it holds: nothing until its first append (the first segment is created then), a page for one small
  message. A segment's first reservation is what the batch needs; later ones double it (by ``RESERVE_STEP`` ..
  ``RESERVE_STEP_MAX``), so an append pays the reopen + fallocate + close only a few times per segment. The memory
  tier also leaves /dev/shm's safety reserve free (``nsqpy.ipc.shm.check_shm_room``). When a new segment finds no
  space in shared memory it goes to disk like a spill; when the segment at the head cannot grow, it is sealed
  (a PAD to its end) if another tier can take the next segment. When no tier has the space, the append raises
  ``LogNoSpace`` (which tier, which file, why), distinct from ``LogFull`` (budgets): nothing is appended, and
  the same call succeeds once space is back. Nothing but LogFull/LogNoSpace/LogError leaves an append.
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
  it, bounded by the same budget as everything else. A public record can be parked as well
  (``append_batch(parked=True)``): a deferred publish that the broker holds by position for every channel at once
  (their deferred-store entries); every cursor passes it, and no depth nor the log's message count includes it.
* **Crash recovery.** Records commit by their first word (length | flags), store-released last; a batch commits
  through one gate word (see ``msglog_kernels``). ``recover()`` drops segments below the tail, rescans the
  records committed after the published head, republishes the head and counters (idempotently, from per-record
  sequence numbers) and zeroes what is reserved past the head, so a torn append is invisible and later
  overwritten (nothing was written past RESERVED, and its pages may be holes: they are not touched).
  Segment lifecycle order keeps crashes harmless: create + reserve + map, then publish in the table, then move
  RESERVED; release by storing the tail first, then unlinking, then clearing the table entry. An object left by
  a crash between create and publish is unlinked before its number is used again (or by ``destroy``).

Resource handling: ``close()`` unmaps everything (segments stay for a re-attaching owner); ``destroy()`` unlinks
every segment of the log. The arrays of a ``read`` result are reused by the next ``read`` (likewise
``records_at``).
Error handling: kernels return status codes; this class turns them into ``LogFull``/``LogNoSpace``/``LogError``/
``ValueError``, and OS errors of its segments into ``LogNoSpace`` (no space) or ``LogError``.
"""
from __future__ import annotations

import contextlib
import errno
import mmap
import os

import numpy as np
import posix_ipc

from nsqpy.ipc import msglog_kernels as K
from nsqpy.ipc.atomics import py_load_acquire, py_store_release
from nsqpy.ipc.layout import LayoutError, align_up, check_header, read_only, stamp_header, words
from nsqpy.ipc.msglog_layout import (BAD_POSITION, CH_LOW_WATER, C_CURSOR, DEFAULT_CHANNELS, EMPTY, F_PARKED, FULL,
                               HDR, MAGIC, NEED_SEGMENT, NO_CHANNEL, NO_LOW_WATER, NO_SPACE_OUT, RESERVED, S_HEAD,
                               S_BACKLOG_SEQ, S_HEAD_SEQ, S_LAST_ID, SEGMENT_TAG, SEGMENT_TAG_VERSION, STATUS_NAMES,
                               TAIL, TIER_DISK, TIER_MEM, TOO_BIG, VERSION, INITIAL_WINDOW, WINDOW, channel_base,
                               check_geometry, ctrl_nbytes, ctrl_words, table_at, window_slots)
from nsqpy.ipc.msglog_window import SegmentWindow
from nsqpy.ipc.numba_cache import warm_up_step
from nsqpy.ipc.shm import Segment, SegmentError, SegmentProvider, check_shm_room, open_segment_fd, unlink_name

__all__ = ["MessageLog", "LogCounters", "ShmSegmentProvider", "ReadBatch", "LogError", "LogFull", "LogNoSpace",
           "DEFAULT_CHANNELS", "NO_LOW_WATER", "RESERVE_STEP", "RESERVE_STEP_MAX", "log_ctrl_nbytes"]


class LogError(RuntimeError):
    """The log refused an operation (bad channel, bad position, corrupt record, a segment it cannot make)."""


class LogFull(LogError):
    """Memory and disk budgets are used up by records some channel still needs; nothing was appended."""


class LogNoSpace(LogError):
    """No tier had the space (in /dev/shm, or on disk) for the batch: nothing was appended, the log stays usable
    and the same call succeeds once space is back. ``causes``: (tier, segment name or path, reason) of each
    refusal, also spelled out in the message."""

    def __init__(self, what: str, causes):
        self.causes = list(causes)
        super().__init__(f"{what}: " + "; ".join(f"{tier} tier, {name}: {why}" for tier, name, why in self.causes))


class _GrowthRefused(LogNoSpace):
    """Segment ``segment`` (of tier ``tier``) could not reserve the pages the batch needs."""

    def __init__(self, what: str, causes, segment: int, tier: int):
        super().__init__(what, causes)
        self.segment, self.tier = segment, tier


# Past its first reservation (what the first batch needs), a segment's reserved pages grow by what it already
# holds, at least RESERVE_STEP and at most RESERVE_STEP_MAX: each growth costs a reopen, a fallocate and a close, so
# a busy segment pays them O(log) times (a few more in a big segment), an idle topic holds a page or two, and a
# 64 MiB message costs 64 MiB and a step, not the 128 MiB that doubling would reserve after it.
RESERVE_STEP = 64 << 10
RESERVE_STEP_MAX = 8 << 20
PAGE = mmap.PAGESIZE
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _refusal(provider, k: int, exc: OSError) -> tuple[str, str, str]:
    return provider.tier_name, provider.name(k), exc.strerror or str(exc)


# Segments a log may take past its budgets for records that were already acknowledged elsewhere (a worker that
# forwarded a publish answered OK once it was in the ring; the owner must still append it when the topic filled
# up meanwhile). The window always has room for them.
OVERDRAFT_SEGMENTS = 8


def log_ctrl_nbytes(segment_size: int, mem_bytes: int, disk_bytes: int = 0,
                    channels: int = DEFAULT_CHANNELS) -> int:
    """Size of the control block for these parameters (place it anywhere, 8-aligned)."""
    return ctrl_nbytes(channels, window_slots(mem_bytes // segment_size,
                                              disk_bytes // segment_size + OVERDRAFT_SEGMENTS))


class ShmSegmentProvider(SegmentProvider):
    """Segments ``<base>.<k>`` in /dev/shm (the memory tier), created through ``nsqpy.ipc.shm.Segment``; reserving in
    them leaves /dev/shm's safety reserve free."""

    tier_name = "memory"
    segment_class = Segment
    hint = "is /dev/shm full?"

    def __init__(self, base: str):
        self.base = base if base.startswith("/") else "/" + base

    def name(self, k: int) -> str:
        return f"{self.base}.{k}"

    def _fd(self, k: int) -> int:
        return open_segment_fd(self.name(k))  # the caller closes it

    use_reserve = False  # set by the log while it appends an overdraft batch (messages already acknowledged)

    def _check_room(self, nbytes: int, k: int) -> None:
        if not self.use_reserve:
            check_shm_room(nbytes, f"segment {self.name(k)}")

    def unlink(self, k: int) -> None:
        unlink_name(self.name(k))


class ReadBatch:
    """What ``read``/``records_at`` found: ``n`` records, their ``positions``, body ``lengths``, ``flags``,
    ``timestamps``, ``ids``, ``not_before``, ``attempts`` (stored ones: 0 for public records),
    ``next_position`` (where ``advance`` moves the cursor to consume all of them) and, after ``read``,
    ``latest_not_before`` (the largest of not_before[:n]: a delivery round that finds it past skips the
    per-record test)."""

    FIELDS = ("positions", "lengths", "flags", "timestamps", "ids", "not_before", "attempts")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.block = np.zeros((len(self.FIELDS), capacity), np.int64)  # one row per field (read_block)
        self._arrays = list(self.block)
        (self.positions, self.lengths, self.flags, self.timestamps, self.ids, self.not_before,
         self.attempts) = self._arrays
        self.n = 0
        self.next_position = 0
        self.latest_not_before = 0

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
        """Public records ever appended but parked ones (the topic's message count, less deferred publishes)."""
        return int(K.state_snapshot(self.ctrl, S_HEAD_SEQ))

    @property
    def last_id(self) -> int:
        return int(K.state_snapshot(self.ctrl, S_LAST_ID))

    @property
    def tail(self) -> int:
        return int(py_load_acquire(self.ctrl, TAIL))

    @property
    def reserved(self) -> int:
        """Position up to which the segments' pages are reserved (see msglog_layout)."""
        return int(py_load_acquire(self.ctrl, RESERVED))

    def cursor(self, ch: int) -> int:
        self._check_open(ch)
        return int(K.cursor_snapshot(self.ctrl, ch, C_CURSOR))

    def low_water(self, ch: int) -> int:
        self._check_open(ch)
        return int(py_load_acquire(self.ctrl, channel_base(ch) + CH_LOW_WATER))

    def open_channels(self) -> list[int]:
        out = np.empty(self.channels, np.int64)
        return out[:K.open_slots(self.ctrl, out)].tolist()

    def waiting(self) -> int:
        """Messages the slowest open channel has yet to deliver; with no channel, the backlog the first one
        will take."""
        chans = self.open_channels()
        if chans:
            return max(self.depth(ch) for ch in chans)
        return max(0, int(K.state_snapshot(self.ctrl, S_HEAD_SEQ)) - int(K.state_snapshot(self.ctrl, S_BACKLOG_SEQ)))

    def segments(self) -> list[tuple[int, int]]:
        """(segment number, tier) of every segment in the table, oldest first; tier 0 memory, 1 disk."""
        return sorted((int(e) >> 1, int(e) & 1) for e in self._table().copy() if e != EMPTY)

    def _check_open(self, ch: int) -> None:
        if not K.channel_active(self.ctrl, ch):
            raise LogError(f"channel slot {ch} is not open")


class MessageLog(LogCounters):
    """The owner's handle on a topic's log: appends, channels, reads, framing, reclaim, recovery."""

    def __init__(self, ctrl_buf, offset, memory, disk=None, mem_messages=None):
        super().__init__(ctrl_buf, offset)
        self.mem_messages = mem_messages  # None: the memory tier is limited by its segment budget only
        if self.disk_segments and disk is None:
            raise ValueError("this log has a disk budget: give it a disk segment provider")
        self._providers = (memory, disk)
        self.window = SegmentWindow(int(self.ctrl[WINDOW]) or self.slots, self.segment_size)
        self._count = [0, 0]
        self._batches = [ReadBatch(0), ReadBatch(0)]
        self._one = [np.zeros(1, dtype=np.int64) for _ in range(5)]
        self._zeros = np.zeros(0, dtype=np.int64)
        self._no_positions = np.zeros(0, dtype=np.int64)
        for k, tier in self.segments():
            if k >= self.tail // self.segment_size:
                self._map_segment(k, tier)

    # life-cycle -------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, ctrl_buf, offset: int, *, segment_size: int, mem_bytes: int, memory, disk_bytes: int = 0,
               disk=None, channels: int = DEFAULT_CHANNELS, mem_messages: int | None = None) -> "MessageLog":
        """Initialise a control block at ctrl_buf[offset:] (size ``log_ctrl_nbytes``). The first segment comes
        with the first append: an idle topic costs its control block only. ``mem_messages``: see Tiers."""
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
        ctrl[WINDOW] = min(slots, INITIAL_WINDOW)
        stamp_header(ctrl, MAGIC, VERSION, size, (segment_size, slots, channels, mem, dsk))
        return cls(ctrl_buf, offset, memory, disk, mem_messages)

    @classmethod
    def attach(cls, ctrl_buf, offset: int, memory, disk=None, mem_messages: int | None = None) -> "MessageLog":
        """Map an existing log's segments; an owner taking over after a crash then calls ``recover()``."""
        return cls(ctrl_buf, offset, memory, disk, mem_messages)

    def recover(self) -> int:
        """Make the shared state exact again after the previous owner died; returns the head position."""
        tail_seg = self.tail // self.segment_size
        for k, tier in self.segments():
            if k < tail_seg:
                self._release(k, tier)
        head = int(K.recover_scan(self.ctrl, self.window.data64))
        if head == BAD_POSITION:
            raise LogError("message log: a committed record is malformed (corrupt segment)")
        # a segment sealed just before the crash: the head passed its PAD, RESERVED was not moved yet
        reserved = max(self.reserved, head)
        py_store_release(self.ctrl, RESERVED, reserved)
        s = self.segment_size
        for k, _ in self.segments():
            start, end = max(head, k * s), min(reserved, (k + 1) * s)
            if start < end:
                K.zero_range(self.window.data64, self.ctrl, start, end)
        self._count = [sum(1 for _, t in self.segments() if t == tier) for tier in (TIER_MEM, TIER_DISK)]
        return head

    def sync(self, since_segment: int) -> int:
        """fdatasync the disk-tier segments from ``since_segment`` to the head's (what was appended since the
        last sync lies there); -> the head's segment, for the next call. Memory-tier segments need nothing."""
        head_seg = self.head // self.segment_size
        disk = self._providers[TIER_DISK]
        if disk is not None:
            for k, tier in self.segments():
                if tier == TIER_DISK and since_segment <= k <= head_seg:
                    disk.sync(k)
        return head_seg

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
    def _map_segment(self, k: int, tier: int, reserve: int | None = None) -> None:
        """Map segment k of tier into the window: attach it, or with ``reserve`` create it with that many payload
        bytes reserved (a created segment that cannot be mapped is removed again)."""
        provider = self._providers[tier]
        self._fit(k)
        if reserve is None:
            fd = provider.open(k, self.segment_size, SEGMENT_TAG, SEGMENT_TAG_VERSION)
        else:
            fd = provider.create(k, self.segment_size, SEGMENT_TAG, SEGMENT_TAG_VERSION, reserve)
        try:
            writing = reserve is not None or k == self.head // self.segment_size  # new, or the head's (a restart)
            self.window.map(k, fd, provider.payload_offset, writing=writing and tier == TIER_DISK)
        except BaseException:
            if reserve is not None:
                provider.unlink(k)
            raise
        finally:
            os.close(fd)
        self._count[tier] += 1

    def _fit(self, k: int) -> None:
        """Make the window hold segment k beside every segment mapped now: double it (up to the table's W slots)
        and map the retained segments again at their new slots. Amortised: a topic that fills its budgets grows
        its window log2(W / INITIAL_WINDOW) times; an idle one never does."""
        w = self.window
        mapped = [m for m in w.mapped if m >= 0]
        span = max(mapped + [k]) - min(mapped + [k]) + 1
        if span <= w.slots:
            return
        slots = min(self.slots, 1 << (span - 1).bit_length())
        if span > slots:
            raise LogError(f"message log: {span} segments retained, the table holds {self.slots}")
        bigger = SegmentWindow(slots, self.segment_size)
        try:
            tiers = dict(self.segments())
            for m in sorted(mapped):
                provider = self._providers[tiers[m]]
                fd = provider.open(m, self.segment_size, SEGMENT_TAG, SEGMENT_TAG_VERSION)
                try:
                    bigger.map(m, fd, provider.payload_offset, writing=m == w.writing)
                finally:
                    os.close(fd)
        except BaseException:
            bigger.close()
            raise
        py_store_release(self.ctrl, WINDOW, slots)  # kernels take the mask from here: the new window from now on
        self.window = bigger
        w.close()

    def has_room(self) -> bool:
        """A new segment fits in the budgets (after a reclaim, say)."""
        return sum(self._count) < self.mem_segments + self.disk_segments

    def _tiers(self, overdraft: bool) -> list[int]:
        """The tiers whose budget takes a new segment, in order of preference."""
        tiers = [tier for tier, used, budget in zip((TIER_MEM, TIER_DISK), self._count,
                                                    (self.mem_segments, self.disk_segments)) if used < budget]
        if tiers and tiers[0] == TIER_MEM and self.mem_messages is not None and self.waiting() >= self.mem_messages:
            tiers = tiers[1:]
        if not tiers and overdraft and sum(self._count) < self.mem_segments + self.disk_segments + OVERDRAFT_SEGMENTS:
            tiers = [tier for tier in (TIER_DISK, TIER_MEM) if self._providers[tier] is not None]
        return tiers

    def _allocate(self, k: int, reserve: int, overdraft: bool = False) -> None:
        """Create segment k with ``reserve`` payload bytes reserved, in the first tier whose budget and space
        take it (a tier short of space passes it on: spill). LogFull / LogNoSpace when none does."""
        tiers = self._tiers(overdraft)
        if not tiers:
            counted = "" if self.mem_messages is None else f" (memory: or {self.mem_messages} or more messages wait)"
            raise LogFull(f"message log full: {self.mem_segments} memory and {self.disk_segments} disk "
                          f"segments of {self.segment_size} bytes are all needed{counted}")
        slot = table_at(self.channels) + k % self.slots
        if self.ctrl[slot] != EMPTY:
            raise LogError(f"message log: slot for segment {k} is still held by segment {self.ctrl[slot] >> 1}")
        for provider in self._providers:
            if provider is not None:
                provider.unlink(k)  # an object a crash left between create and publish
        refusals = []
        for tier in tiers:
            try:
                self._map_segment(k, tier, reserve)
            except SegmentError as e:
                if e.errno not in _SPACE_ERRNOS:
                    raise
                refusals.append(_refusal(self._providers[tier], k, e))
                continue
            py_store_release(self.ctrl, slot, k << 1 | tier)
            return
        raise LogNoSpace(f"message log: no space for segment {k} ({reserve} bytes)", refusals)

    def _release(self, k: int, tier: int) -> None:
        if self.window is not None:  # destroy() also works on a closed handle
            self.window.unmap(k)
        self._providers[tier].unlink(k)
        py_store_release(self.ctrl, table_at(self.channels) + k % self.slots, EMPTY)
        self._count[tier] = max(0, self._count[tier] - 1)

    def _grow(self, k: int, start: int, end: int, least: int) -> int:
        """Reserve payload bytes [start, end) of present segment k, or at least [start, least) when its tier is
        short of space; returns where the reservation ends."""
        tier = int(self.ctrl[table_at(self.channels) + k % self.slots]) & 1
        provider = self._providers[tier]
        for upto in (end, least) if least < end else (end,):
            try:
                provider.reserve(k, start, upto)
                return upto
            except SegmentError as e:
                if e.errno not in _SPACE_ERRNOS:
                    raise
                refusal = _refusal(provider, k, e)
        raise _GrowthRefused(f"message log: no space to grow segment {k} to {least} bytes", [refusal], k, tier)

    def _reserve_to(self, end: int, keep: int, overdraft: bool) -> None:
        """Create the segments and reserve the pages that a batch from the head to ``end`` needs (see
        RESERVE_STEP for how much more a segment reserves), publishing RESERVED as each segment is done."""
        s = self.segment_size
        reserved = self.reserved
        need = int(K.reserve_end(self.ctrl, self.head, end))
        if need <= reserved:
            return
        last = (need - 1) // s
        held = max(reserved - last * s, 0)
        least = align_up(need - last * s, PAGE)
        step = min(max(RESERVE_STEP, held), RESERVE_STEP_MAX)
        grown = least if held == 0 else min(s, max(least, align_up(held + step, PAGE)))
        for k in range(reserved // s, last + 1):
            start = max(reserved - k * s, 0)
            upto, at_least = (grown, least) if k == last else (s, s)
            if K.segment_present(self.ctrl, k):
                upto = self._grow(k, start, upto, at_least)
            else:
                if sum(self._count) >= self.mem_segments + self.disk_segments:
                    self.reclaim(keep)
                self._allocate(k, at_least, overdraft)  # a new segment reserves what the batch needs in it
                upto = at_least
            py_store_release(self.ctrl, RESERVED, k * s + upto)

    def _ensure(self, end_at, keep: int = NO_LOW_WATER, overdraft: bool = False) -> None:
        """Make a batch writable; ``end_at(head)`` is where it ends when appended at head. Creates the segments
        it needs (reclaiming first, nothing from ``keep`` on, if the budgets are used up; ``overdraft``: past
        them by up to OVERDRAFT_SEGMENTS) and reserves their pages. If the head's segment cannot grow for lack
        of space but another tier could take a new segment, the head's segment is sealed and the batch starts
        in a new one. Raises LogFull, LogNoSpace or LogError, never an OSError."""
        try:
            try:
                self._reserve_to(end_at(self.head), keep, overdraft)
            except _GrowthRefused as refused:
                if not (refused.segment == self.head // self.segment_size and self.head < self.reserved
                        and any(t != refused.tier for t in self._tiers(overdraft))):
                    raise
                K.seal_segment(self.ctrl, self.window.data64)
                self._reserve_to(end_at(self.head), keep, overdraft)
        except LogError:
            raise
        except (OSError, posix_ipc.Error) as e:
            raise LogError(f"message log: cannot make room for the batch: {e}") from e

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
                     overdraft=False, parked=False) -> int:
        """Append len(lengths) messages, bodies src[offsets[i]:offsets[i]+lengths[i]] (src uint8, the rest
        int64 arrays), all or nothing; returns the first record's position. ``positions`` (int64, optional)
        receives each record's position. ``parked``: every cursor passes them and no depth counts them (the
        broker holds them by position, e.g. in the deferred store for each channel). Raises LogFull when the
        budgets (plus OVERDRAFT_SEGMENTS with
        ``overdraft``, for messages already acknowledged) cannot hold the batch, LogNoSpace when /dev/shm and the
        disk cannot, ValueError for a message bigger than a segment."""
        n = len(lengths)
        if not_before is None:
            if self._zeros.size < n:
                self._zeros = np.zeros(max(n, 2 * self._zeros.size), dtype=np.int64)
            not_before = self._zeros
        out = self._no_positions if positions is None else positions
        w = self.window
        args = (read_only(src), offsets, lengths, timestamps, ids, not_before, F_PARKED if parked else 0, n, out)
        status = K.append_batch(self.ctrl, w.data, w.data64, *args)
        if status == NEED_SEGMENT:
            memory = self._providers[TIER_MEM]
            memory.use_reserve = overdraft  # acknowledged elsewhere: /dev/shm's safety reserve may take them
            try:
                self._ensure(lambda head: int(K.plan_batch(self.ctrl, head, lengths, n)), overdraft=overdraft)
            finally:
                memory.use_reserve = False
            w = self.window  # _ensure may have grown the window
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
        positions. All or nothing; raises LogFull or LogNoSpace as append_batch does."""
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
            self._ensure(lambda head: int(K.plan_batch(self.ctrl, head, lengths, n)), keep=int(positions.min()))
            w = self.window  # _ensure may have grown the window
            status = K.copy_forward(self.ctrl, w.data, w.data64, *args)
        if status == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")
        self._check(int(status), "copy_forward")
        return out

    def append_private(self, ch: int, src, offsets, lengths, timestamps, ids, attempts, not_before,
                       parked: bool = False) -> np.ndarray:
        """Append new records private to channel ch (bodies src[offsets[i]:offsets[i]+lengths[i]], each with its
        own timestamp, id, attempts and not_before; int64 arrays): messages only that channel still needs, as a
        restart reads them from its on-disk queue. Returns their positions; all or nothing; raises LogFull or
        LogNoSpace as append_batch does."""
        n = len(lengths)
        out = np.zeros(n, dtype=np.int64)
        args = (ch, read_only(src), offsets, lengths, timestamps, ids, attempts, not_before, parked, n, out)
        w = self.window
        status = K.append_private(self.ctrl, w.data, w.data64, *args)
        if status == NEED_SEGMENT:
            self._ensure(lambda head: int(K.plan_batch(self.ctrl, head, lengths, n)))
            w = self.window
            status = K.append_private(self.ctrl, w.data, w.data64, *args)
        if status == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")
        self._check(int(status), "append_private")
        return out

    # channels ---------------------------------------------------------------------------------------------
    def open_channel(self) -> int:
        """Take a channel slot (first channel: the backlog; later: from the head)."""
        ch = int(K.open_channel(self.ctrl))
        if ch == FULL:
            raise LogError(f"all {self.channels} channel slots are taken")
        return ch

    def close_channel(self, ch: int, give_back: bool = False) -> None:
        """Free slot ch. The last channel's going starts the backlog at the head (NSQ: a topic keeps for its next
        first channel what is published from then on), or with ``give_back`` at ch's cursor: what ch had not
        delivered goes back to the backlog (a slot opened but never recorded, found by a replacement worker)."""
        if K.close_channel(self.ctrl, ch, int(give_back)) == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")

    def drop_backlog(self) -> bool:
        """With no channel open, forget the messages kept for the first channel (reclaimed by the next
        ``reclaim``); -> False (nothing done) when a channel is open."""
        return int(K.drop_backlog(self.ctrl)) == 0

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
        n, nxt, latest = K.read_channel(self.ctrl, self.window.data64, ch, max_n, max_bytes, *b._arrays)
        if n == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")
        b.n, b.next_position, b.latest_not_before = int(n), int(nxt), int(latest)
        return b

    def read_block(self, n: int) -> np.ndarray:
        """The result arrays ``read`` would fill for up to n records as the rows of one (fields, capacity) block
        (``ReadBatch.FIELDS`` names them), for a kernel that reads the log and goes on in compiled code
        (``nsqpy.workers.lane.kernels.deliver_round``)."""
        return self._batch_for(n).block

    def advance(self, ch: int, position: int) -> int:
        """Move ch's cursor to position (a record boundary after it); returns the records passed."""
        passed = int(K.advance(self.ctrl, self.window.data64, ch, position))
        if passed == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")
        if passed == BAD_POSITION:
            raise ValueError(f"position {position} is not a record boundary between the cursor and the head")
        return passed

    def rewind(self, ch: int, position: int) -> bool:
        """Move ch's cursor back to position (a retained record boundary): what lies after is delivered again.
        -> False when position is not before the cursor."""
        done = int(K.rewind(self.ctrl, self.window.data64, ch, position))
        if done == NO_CHANNEL:
            raise LogError(f"channel slot {ch} is not open")
        if done == BAD_POSITION:
            raise ValueError(f"position {position} is not a retained record boundary")
        return done == 1

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


# ---- warm-up (nsqpy.ipc.numba_cache.warm_up_step; workers/lane/warmup.py schedules it) ------------------------------
@contextlib.contextmanager
def throwaway_log(name):
    """A message log of one segment in shared memory (-> (log, ctrl buffer, provider)), destroyed after: what the
    warm-up steps of the log's kernels and of their callers run on."""
    size = 1 << 20
    ctrl = Segment.create(f"{name}-ctrl", log_ctrl_nbytes(size, size))
    memory = ShmSegmentProvider(f"{name}-log")
    log = MessageLog.create(ctrl.buf, 0, segment_size=size, mem_bytes=size, memory=memory)
    try:
        yield log, ctrl.buf, memory
    finally:
        log.destroy()
        ctrl.close()
        ctrl.unlink()
        unlink_name(f"{name}-ctrl")


@warm_up_step(shm=True)
def warm_up(prefix):
    """The log's kernels as a worker calls them: append, read, frame, advance, copy-forward, depth, reclaim,
    attach and recover, a channel opened and closed."""
    with throwaway_log(f"{prefix}-warmup") as (log, ctrl_buf, memory):
        ch = log.open_channel()
        log.waiting()  # a log with a message budget asks at each new segment (open_channels, depth)
        log.append_batch(np.frombuffer(b"hello world", np.uint8).copy(),  # MessageLog passes any source read-only
                         np.array([0, 6], np.int64), np.array([5, 5], np.int64), np.zeros(2, np.int64),
                         np.array([1, 2], np.int64), None)
        b = log.read(ch, 8, 1 << 20)
        log.records_at(b.positions[:1])
        log.cursor(ch)
        log.write_frames(np.empty(1024, np.uint8), 0, b.positions[:b.n], b.attempts[:b.n] + 1)
        log.advance(ch, b.next_position)
        log.copy_forward(ch, b.positions[:1], 1)
        log.copy_forward(ch, b.positions[1:2], 1, parked=True)
        log.depth(ch)
        log.set_low_water(ch, int(b.positions[0]))
        log.reclaim()
        MessageLog.attach(ctrl_buf, 0, memory).recover()
        log.close_channel(ch)  # a deleted channel, or one a restarted worker finds half made


@warm_up_step(shm=True, deferred="rare")
def warm_up_rare(prefix):
    """The log's kernels of rare paths, none needed to listen: a channel's saved queue loaded at a worker's start,
    a crashed worker's channel rewound (salvage), a topic emptied without channels, the head's segment sealed when
    its tier cannot grow."""
    with throwaway_log(f"{prefix}-warmup-rare") as (log, _, _):
        ch = log.open_channel()
        one = np.ones(1, np.int64)
        at = log.append_private(ch, np.frombuffer(b"queued", np.uint8), one * 0, one * 6, one, one, one, one * 0)
        log.rewind(ch, int(at[0]))
        log.close_channel(ch)
        log.drop_backlog()
        K.seal_segment(log.ctrl, log.window.data64)  # a direct call: a tier without room is hard to stage
