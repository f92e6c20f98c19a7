"""Shared layout of a topic's message log: the control block, the record header and the segment window.

Control block (int64 words, in any buffer: a shm segment in production, an anonymous shared mmap in tests)
---------------------------------------------------------------------------------------------------------

    line 0   | magic 'NSQMSLOG' | version | size | segment size | window slots W | channel slots C | mem segs | disk segs
    line 1   | STATE GEN | state A: head, head_seq, last_id, backlog_start, backlog_seq | state B: the same five
    line 2   | TAIL (oldest retained position, a segment boundary) | RESERVED (pages reserved up to here) | WINDOW
    line 3   | channel 0: ACTIVE | GEN | A: cursor, pub_done, priv_done | B: the same three | PRIV_SEQ | LOW_WATER
    ...      | one LINE (128 B) per channel, so a stats reader never shares a line with another channel's writer
    line 3+C | segment table: W words, slot s = segment k with k % W == s: (k << 1 | tier) or -1 (empty)

Every word has one writer, the topic's owner worker. Fields that must change together (the head and its counters;
a channel's cursor and its counters) are double-buffered behind a generation word: the writer fills the inactive
copy and then store-releases gen + 1, so a reader (stats, or a restarted owner after SIGKILL) always sees one
whole state, old or new, never half of each. The active copy is ``gen & 1``.

RESERVED: segments are sparse files (``nsqpy.ipc.shm``); the owner reserves their pages (posix_fallocate) only as the
log reaches them, because touching an unreserved page of a full tmpfs or disk is a SIGBUS, where fallocate fails
cleanly. Invariant: every byte of a present segment in [head, RESERVED) is reserved, and so is every byte of a
record below the head (a PAD record's commit word included; what a PAD covers past it may not be). RESERVED is
store-released only after the pages are reserved, and no kernel writes or reads at or past it: appends answer
NEED_SEGMENT instead, recovery scans and zeroes only below it.

WINDOW: the slots of the owner's segment window now (a power of two <= W). The table must hold every segment the
budgets allow, but the window only the segments retained now, so it starts at INITIAL_WINDOW slots and the owner
doubles it (remapping the retained segments) when they no longer fit. An idle topic then costs 4 segments of
address space instead of W (with the default 16 GiB disk budget W is 4096: 32 GiB per topic, and a 47-bit
address space would hold only ~4,000 topics per process). Kernels take the position mask from it.

Record (8-byte aligned, never crossing a segment boundary; positions are monotonic byte offsets)
------------------------------------------------------------------------------------------------

     0  u32 length (header + body, unpadded; 0 = not committed) | u32 flags      <- commit word, store-release
     8  i64 timestamp (ns)
    16  u64 message id
    24  i64 not-before (ns, 0 = deliver now)
    32  u16 channel (private records) | u16 attempts (private records) | u32 reserved
    40  i64 seq: public record = number of public records up to and including it (topic-wide);
                 private record = the channel's count of private records up to and including it;
                 parked record (flag PARKED, public or private: every cursor passes it, the broker holds it by
                 position) = 0, counted by nothing
    48  body

A PAD record (flags PAD, only the commit word is written) fills the end of a segment that the next record does not
fit in. The per-record ``seq`` makes crash recovery idempotent: counters are recomputed as the maximum of what was
published and what the committed records say, never by adding.

Segment window
--------------
Segment k is mapped (MAP_FIXED) at slot ``k % W`` of one reserved range of W * segment_size bytes (W a power of
two), so every kernel sees the whole retained log as one uint8 array and a position's offset is ``pos & mask``.
"""
from __future__ import annotations

import numpy as np

from nsqpy.ipc.layout import HEADER_WORDS, LINE_WORDS, LayoutError, is_power_of_two, magic

MAGIC = magic("NSQMSLOG")
VERSION = 2  # 2: RESERVED (lazily reserved segments)
SEGMENT_TAG = magic("NSQMSSEG")  # tag of a segment's own shm/file header
SEGMENT_TAG_VERSION = 1

# header parameters (words H_PARAMS.. of line 0)
P_SEGMENT_SIZE, P_SLOTS, P_CHANNELS, P_MEM_SEGS, P_DISK_SEGS = 3, 4, 5, 6, 7

# line 1: the double-buffered global state
STATE_GEN = LINE_WORDS
STATE_A = STATE_GEN + 1
S_HEAD, S_HEAD_SEQ, S_LAST_ID, S_BACKLOG, S_BACKLOG_SEQ = range(5)
STATE_WORDS = 5

# line 2
TAIL = 2 * LINE_WORDS
RESERVED = TAIL + 1
WINDOW = TAIL + 2
INITIAL_WINDOW = 4

# channel lines
CHANNELS_AT = 3 * LINE_WORDS
CH_ACTIVE, CH_GEN, CH_A = 0, 1, 2
C_CURSOR, C_PUB_DONE, C_PRIV_DONE = range(3)
CH_STATE_WORDS = 3
CH_PRIV_SEQ = CH_A + 2 * CH_STATE_WORDS
CH_LOW_WATER = CH_PRIV_SEQ + 1
assert CH_LOW_WATER < LINE_WORDS and STATE_A + 2 * STATE_WORDS <= 2 * LINE_WORDS

# record header
HDR = 48
R_LEN_FLAGS, R_TS, R_ID, R_NOT_BEFORE, R_CHAN_ATT, R_SEQ = range(6)  # word indices in the header
F_PAD, F_PRIVATE, F_PARKED = 1, 2, 4

MAX_CHANNELS = 1024  # a u16 would allow more; this bounds the control block (128 B a channel)
# A record's length is a u32 and an NSQ frame's size an i32: a segment (which bounds a record) stays well below both
MAX_SEGMENT_SIZE = 1 << 30
DEFAULT_CHANNELS = 256
NO_LOW_WATER = np.iinfo(np.int64).max
TIER_MEM, TIER_DISK = 0, 1
EMPTY = -1

# kernel status codes (all negative; a non-negative result is a position or a count)
FULL = -1
TOO_BIG = -2
NEED_SEGMENT = -3  # a segment the batch needs is missing, or its pages are not reserved yet
BAD_POSITION = -4
NO_CHANNEL = -5
NO_SPACE_OUT = -6
STATUS_NAMES = {FULL: "FULL", TOO_BIG: "TOO_BIG", NEED_SEGMENT: "NEED_SEGMENT", BAD_POSITION: "BAD_POSITION",
                NO_CHANNEL: "NO_CHANNEL", NO_SPACE_OUT: "NO_SPACE_OUT"}

# NSQ V2 message frame: [i32 size][i32 type=2][i64 ts][u16 attempts][16 hex id][body]; size counts from type on
FRAME_OVERHEAD = 4 + 4 + 8 + 2 + 16
FRAME_TYPE_MESSAGE = 2


def channel_base(ch: int) -> int:
    return CHANNELS_AT + ch * LINE_WORDS


def table_at(channels: int) -> int:
    return CHANNELS_AT + channels * LINE_WORDS


def ctrl_words(channels: int, slots: int) -> int:
    return table_at(channels) + ((slots + LINE_WORDS - 1) // LINE_WORDS) * LINE_WORDS


def ctrl_nbytes(channels: int = DEFAULT_CHANNELS, slots: int = 1) -> int:
    """Bytes of the control block for ``channels`` channel slots and a window of ``slots`` segment slots."""
    return 8 * ctrl_words(channels, slots)


def window_slots(mem_segments: int, disk_segments: int) -> int:
    """W: the smallest power of two that holds every segment the budgets allow at once."""
    need = max(1, mem_segments + disk_segments)
    return 1 << (need - 1).bit_length()


def record_size(body_len):
    """Bytes a record takes in the log (header + body, rounded up to 8); works on ints and numpy arrays."""
    return (HDR + body_len + 7) & ~7


def check_geometry(segment_size: int, channels: int) -> None:
    if not is_power_of_two(segment_size) or not 4096 <= segment_size <= MAX_SEGMENT_SIZE:
        raise LayoutError(f"segment size must be a power of two in 4096..{MAX_SEGMENT_SIZE}, got {segment_size}")
    if not 1 <= channels <= MAX_CHANNELS:
        raise LayoutError(f"channel slots must be in 1..{MAX_CHANNELS}, got {channels}")


assert HEADER_WORDS <= LINE_WORDS
