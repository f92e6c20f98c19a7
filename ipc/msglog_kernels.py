"""numba kernels of the message log: append, copy-forward, read, advance, frame, recover (layout: msglog_layout).

Theory of operation
-------------------
Every kernel takes ``ctrl`` (int64 view of the control block), ``data`` (uint8 view of the segment window) and
``data64`` (the same window as int64) and returns a non-negative position/count or a negative status code from
``msglog_layout``. Nothing here allocates, raises or calls the OS: segments are created, and their pages
reserved, by the Python class when a kernel answers NEED_SEGMENT, and the kernel is called again. No kernel
touches a byte at or past RESERVED (see the layout): that page may be a hole of a full tmpfs, i.e. a SIGBUS.

Appending (the owner only). A batch is planned first (positions, PAD records at segment ends); if a segment it
needs is missing, nothing is written. Then every record is written and committed in order, except the first
commit word of the batch (the *gate*), which is store-released last. Recovery scans forward from the published
head and stops at the first zero commit word, so a batch cut by SIGKILL anywhere before its gate is entirely
invisible (an MPUB is all-or-nothing even across a crash), and after the gate it is entirely there. Then the new
head is published (double-buffered state, see the layout). A batch needs its pages reserved up to its end plus
one word (``reserve_end``), so that the owner can always seal a segment it cannot grow (``seal_segment``: a PAD
from the head to the segment's end, after which the next records go to a new segment, possibly of another tier).

Reading: the channel's cursor walks records in position order, jumping over PAD, parked records (public or
private) and private records that belong to other channels; ``advance`` moves the cursor and its counters, which it takes from the
per-record ``seq`` of the last record passed (so an advance never counts: it cannot drift). A read always returns
the first deliverable record, even when its frame alone is over the byte budget: the caller then delivers it
alone, and a big message never blocks the channel.

Ordering: every store another process (or a restarted owner) may read is a store_release, every such load a
load_acquire (nsqpy.ipc.atomics; both are plain moves on x86). A stats reader uses the generation word as a seqlock:
it retries until the generation is the same before and after its loads.
"""
from __future__ import annotations

from numba import njit

from nsqpy.ipc.atomics import copy_bytes, load_acquire, store_release
from nsqpy.ipc.msglog_layout import (BAD_POSITION, CH_A, CH_ACTIVE, CH_GEN, CH_LOW_WATER, CH_PRIV_SEQ, CH_STATE_WORDS,
                               C_CURSOR, C_PRIV_DONE, C_PUB_DONE, CHANNELS_AT, EMPTY, F_PAD, F_PARKED, F_PRIVATE,
                               FRAME_OVERHEAD, FRAME_TYPE_MESSAGE, FULL, HDR, NEED_SEGMENT, NO_CHANNEL,
                               NO_LOW_WATER, NO_SPACE_OUT, P_CHANNELS, P_SEGMENT_SIZE, P_SLOTS, R_CHAN_ATT, R_ID,
                               R_LEN_FLAGS, R_NOT_BEFORE, R_SEQ, R_TS, RESERVED, S_BACKLOG, S_BACKLOG_SEQ,
                               S_HEAD, S_HEAD_SEQ, S_LAST_ID, STATE_A, STATE_GEN, STATE_WORDS, TAIL, TOO_BIG, WINDOW)
from nsqpy.ipc.layout import LINE_WORDS
from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE

KERNEL = dict(JIT, nogil=True)
KERNEL_CALLEE = dict(JIT_CALLEE, nogil=True)
LOW32 = 0xFFFFFFFF


# --- geometry ------------------------------------------------------------------------------------------------
@njit(inline="always", **KERNEL_CALLEE)
def seg_size(ctrl):
    return ctrl[P_SEGMENT_SIZE]


@njit(inline="always", **KERNEL_CALLEE)
def window_mask(ctrl):
    return ctrl[WINDOW] * ctrl[P_SEGMENT_SIZE] - 1


@njit(inline="always", **KERNEL_CALLEE)
def table_base(ctrl):
    return CHANNELS_AT + ctrl[P_CHANNELS] * LINE_WORDS


@njit(inline="always", **KERNEL_CALLEE)
def channel_at(ch):
    return CHANNELS_AT + ch * LINE_WORDS


@njit(**KERNEL)
def segment_present(ctrl, k):
    """True if segment number k is in the table (mapped by its owner)."""
    e = load_acquire(ctrl, table_base(ctrl) + (k & (ctrl[P_SLOTS] - 1)))
    return e != EMPTY and (e >> 1) == k


@njit(inline="always", **KERNEL_CALLEE)
def record_bytes(length):
    return (length + 7) & ~7


@njit(inline="always", **KERNEL)
def place(pos, size, s):
    """Where a record of ``size`` bytes goes at ``pos``: the next segment if it does not fit in this one."""
    if (pos & (s - 1)) + size > s:
        return (pos | (s - 1)) + 1
    return pos


# --- double-buffered states ----------------------------------------------------------------------------------
@njit(inline="always", **KERNEL_CALLEE)
def state_word(ctrl, field):
    """The owner's view of the global state (it is the only writer, so no retry is needed)."""
    return ctrl[STATE_A + (ctrl[STATE_GEN] & 1) * STATE_WORDS + field]


@njit(**KERNEL_CALLEE)
def publish_state(ctrl, head, head_seq, last_id, backlog, backlog_seq):
    g = ctrl[STATE_GEN]
    b = STATE_A + ((g + 1) & 1) * STATE_WORDS
    store_release(ctrl, b + S_HEAD, head)
    store_release(ctrl, b + S_HEAD_SEQ, head_seq)
    store_release(ctrl, b + S_LAST_ID, last_id)
    store_release(ctrl, b + S_BACKLOG, backlog)
    store_release(ctrl, b + S_BACKLOG_SEQ, backlog_seq)
    store_release(ctrl, STATE_GEN, g + 1)


@njit(**KERNEL_CALLEE)
def publish_head(ctrl, head, head_seq, last_id):
    publish_state(ctrl, head, head_seq, last_id, state_word(ctrl, S_BACKLOG), state_word(ctrl, S_BACKLOG_SEQ))


@njit(inline="always", **KERNEL_CALLEE)
def cursor_word(ctrl, ch, field):
    c = channel_at(ch)
    return ctrl[c + CH_A + (ctrl[c + CH_GEN] & 1) * CH_STATE_WORDS + field]


@njit(inline="always", **KERNEL_CALLEE)
def publish_cursor(ctrl, ch, cursor, pub_done, priv_done):
    c = channel_at(ch)
    g = ctrl[c + CH_GEN]
    b = c + CH_A + ((g + 1) & 1) * CH_STATE_WORDS
    store_release(ctrl, b + C_CURSOR, cursor)
    store_release(ctrl, b + C_PUB_DONE, pub_done)
    store_release(ctrl, b + C_PRIV_DONE, priv_done)
    store_release(ctrl, c + CH_GEN, g + 1)


@njit(inline="always", **KERNEL)
def snapshot(ctrl, gen_at, copy_at, width, field):
    """One field of a double-buffered state as seen by a process that is not its writer (seqlock read)."""
    while True:
        g = load_acquire(ctrl, gen_at)
        v = load_acquire(ctrl, copy_at + (g & 1) * width + field)
        if load_acquire(ctrl, gen_at) == g:
            return v


@njit(**KERNEL)
def channel_active(ctrl, ch):
    return 0 <= ch < ctrl[P_CHANNELS] and load_acquire(ctrl, channel_at(ch) + CH_ACTIVE) == 1


# --- records -------------------------------------------------------------------------------------------------
@njit(inline="always", **KERNEL_CALLEE)
def commit_word(length, flags):
    return (flags << 32) | length


@njit(**KERNEL_CALLEE)
def segments_cover(ctrl, start, end):
    """True if every segment holding a byte of [start, end) is present."""
    if end <= start:
        return True
    sh = ctrl[P_SEGMENT_SIZE]
    k = start // sh
    while k * sh < end:
        if not segment_present(ctrl, k):
            return False
        k += 1
    return True


@njit(inline="always", **KERNEL_CALLEE)
def commit_or_gate(data64, w, word, gate_word, gate_value):
    """Commit word index w, unless the batch has no gate yet: then it becomes the gate (committed last)."""
    if gate_word < 0:
        return w, word
    store_release(data64, w, word)
    return gate_word, gate_value


@njit(inline="always", **KERNEL_CALLEE)
def pad_to_fit(data64, pos, size, s, mask, gate_word, gate_value):
    """If a record of size bytes does not fit at pos, PAD to the end of the segment; returns (its position,
    gate word, gate value)."""
    if place(pos, size, s) == pos:
        return pos, gate_word, gate_value
    nxt = (pos | (s - 1)) + 1
    gate_word, gate_value = commit_or_gate(data64, (pos & mask) >> 3, commit_word(nxt - pos, F_PAD),
                                           gate_word, gate_value)
    return nxt, gate_word, gate_value


@njit(**KERNEL)
def plan_batch(ctrl, head, lengths, n):
    """End position of n records of body lengths[i] appended at head, or TOO_BIG."""
    s = seg_size(ctrl)
    pos = head
    for i in range(n):
        size = record_bytes(HDR + lengths[i])
        if size > s or lengths[i] < 0:
            return TOO_BIG
        pos = place(pos, size, s) + size
    return pos


@njit(**KERNEL)
def reserve_end(ctrl, head, end):
    """How far pages must be reserved for a batch from head to end: one word past end, for the commit word of a
    PAD that may follow (see seal_segment), unless end is its segment's end. A batch that adds nothing: 0."""
    if end <= head:
        return 0
    return min(end + 8, ((end - 1) | (seg_size(ctrl) - 1)) + 1)


@njit(inline="always", **KERNEL_CALLEE)
def writable(ctrl, head, end):
    """The pages of [head, end) are reserved (so their segments are present) and mapped."""
    return reserve_end(ctrl, head, end) <= ctrl[RESERVED] and segments_cover(ctrl, head, end)


@njit(**KERNEL)
def seal_segment(ctrl, data64):
    """PAD from the head to the end of its segment, which the owner could not grow (no space in its tier): the
    next records go to a new segment. Returns the new head, or NEED_SEGMENT (nothing written) if the PAD's
    commit word is not reserved. Appends nothing a channel sees; the counters do not move."""
    s = seg_size(ctrl)
    head = state_word(ctrl, S_HEAD)
    if head >= ctrl[RESERVED] or not segment_present(ctrl, head // s):
        return NEED_SEGMENT
    nxt = (head | (s - 1)) + 1
    store_release(data64, (head & window_mask(ctrl)) >> 3, commit_word(nxt - head, F_PAD))
    publish_head(ctrl, nxt, state_word(ctrl, S_HEAD_SEQ), state_word(ctrl, S_LAST_ID))
    # what the PAD covers past its commit word is never touched: nothing is left to reserve before nxt
    store_release(ctrl, RESERVED, max(ctrl[RESERVED], nxt))
    return nxt


@njit(inline="always", **KERNEL_CALLEE)
def write_header(data64, w, length, flags, ts, msg_id, not_before, chan_att, seq):
    """Header words 1..5 of the record at word index w (the commit word is written by the caller)."""
    data64[w + R_TS] = ts
    data64[w + R_ID] = msg_id
    data64[w + R_NOT_BEFORE] = not_before
    data64[w + R_CHAN_ATT] = chan_att
    data64[w + R_SEQ] = seq


@njit(**KERNEL)
def append_batch(ctrl, data, data64, src, offsets, lengths, timestamps, ids, not_before, flags, n, out_pos):
    """Append n public records (bodies src[offsets[i]:offsets[i]+lengths[i]]); all or nothing. ``flags`` 0, or
    F_PARKED: records every cursor passes and none counts (seq 0; the broker holds them by position for each
    channel, as DPUBs it deferred as they came). Returns the position of the first record, or TOO_BIG /
    NEED_SEGMENT (then nothing was written). out_pos (size >= n, or size 0 to skip) receives each record's
    position."""
    head = state_word(ctrl, S_HEAD)
    end = plan_batch(ctrl, head, lengths, n)
    if end < 0:
        return end
    if not writable(ctrl, head, end):
        return NEED_SEGMENT
    s = seg_size(ctrl)
    mask = window_mask(ctrl)
    seq = state_word(ctrl, S_HEAD_SEQ)
    gate_word = -1
    gate_value = 0
    pos = head
    first = -1
    for i in range(n):
        length = HDR + lengths[i]
        size = record_bytes(length)
        pos, gate_word, gate_value = pad_to_fit(data64, pos, size, s, mask, gate_word, gate_value)
        off = pos & mask
        w = off >> 3
        if flags == 0:
            seq += 1
        write_header(data64, w, length, flags, timestamps[i], ids[i], not_before[i], 0, seq if flags == 0 else 0)
        copy_bytes(data, off + HDR, src, offsets[i], lengths[i])
        gate_word, gate_value = commit_or_gate(data64, w, commit_word(length, flags), gate_word, gate_value)
        if first < 0:
            first = pos
        if out_pos.size > 0:
            out_pos[i] = pos
        pos += size
    if n == 0:
        return head
    store_release(data64, gate_word, gate_value)
    publish_head(ctrl, pos, seq, ids[n - 1])
    return first


@njit(**KERNEL)
def append_private(ctrl, data, data64, ch, src, offsets, lengths, timestamps, ids, attempts, not_before, parked, n,
                   out_pos):
    """Append n new records private to channel ch (as ``copy_forward`` makes them, but from bodies in src, with
    their own timestamps, ids and attempts): what a restart brings back from a channel's on-disk queue. All or
    nothing; returns the first position or TOO_BIG / NEED_SEGMENT / NO_CHANNEL."""
    if not channel_active(ctrl, ch):
        return NO_CHANNEL
    head = state_word(ctrl, S_HEAD)
    end = plan_batch(ctrl, head, lengths, n)
    if end < 0:
        return end
    if not writable(ctrl, head, end):
        return NEED_SEGMENT
    s = seg_size(ctrl)
    mask = window_mask(ctrl)
    flags = F_PRIVATE | (F_PARKED if parked else 0)
    priv = ctrl[channel_at(ch) + CH_PRIV_SEQ]
    gate_word = -1
    gate_value = 0
    pos = head
    for i in range(n):
        length = HDR + lengths[i]
        size = record_bytes(length)
        pos, gate_word, gate_value = pad_to_fit(data64, pos, size, s, mask, gate_word, gate_value)
        off = pos & mask
        w = off >> 3
        priv, seq = private_seq(priv, parked)
        write_header(data64, w, length, flags, timestamps[i], ids[i], not_before[i],
                     ch | ((attempts[i] & 0xFFFF) << 16), seq)
        copy_bytes(data, off + HDR, src, offsets[i], lengths[i])
        gate_word, gate_value = commit_or_gate(data64, w, commit_word(length, flags), gate_word, gate_value)
        out_pos[i] = pos
        pos += size
    if n == 0:
        return head
    publish_private(ctrl, data64, ch, gate_word, gate_value, priv, pos)
    return out_pos[0]


@njit(**KERNEL_CALLEE)
def valid_record(ctrl, data64, pos):
    """True if pos holds a committed, non-PAD record inside the retained log."""
    if pos < load_acquire(ctrl, TAIL) or pos >= state_word(ctrl, S_HEAD) or pos & 7:
        return False
    w0 = load_acquire(data64, (pos & window_mask(ctrl)) >> 3)
    length = w0 & LOW32
    return w0 != 0 and ((w0 >> 32) & F_PAD) == 0 and length >= HDR


@njit(inline="always", **KERNEL_CALLEE)
def private_seq(priv, parked):
    """(the channel's private counter, this record's seq) for its next private record: a parked one is counted
    by no cursor (seq 0)."""
    if parked:
        return priv, 0
    return priv + 1, priv + 1


@njit(inline="always", **KERNEL_CALLEE)
def publish_private(ctrl, data64, ch, gate_word, gate_value, priv, head):
    """Commit a batch of private records: the gate, then the channel's private counter, then the head."""
    store_release(data64, gate_word, gate_value)
    store_release(ctrl, channel_at(ch) + CH_PRIV_SEQ, priv)
    publish_head(ctrl, head, state_word(ctrl, S_HEAD_SEQ), state_word(ctrl, S_LAST_ID))


@njit(**KERNEL)
def copy_forward(ctrl, data, data64, ch, positions, attempts, not_before, parked, n, out_pos):
    """Re-append the records at positions[i] as private records of channel ch (parked: the cursor skips them,
    the broker holds them by position). not_before[i] < 0 keeps the original. All or nothing, like
    append_batch; returns the first new position or a status; out_pos[i] receives each new position."""
    if not channel_active(ctrl, ch):
        return NO_CHANNEL
    s = seg_size(ctrl)
    mask = window_mask(ctrl)
    head = state_word(ctrl, S_HEAD)
    pos = head
    for i in range(n):
        if not valid_record(ctrl, data64, positions[i]):
            return BAD_POSITION
        size = record_bytes(data64[(positions[i] & mask) >> 3] & LOW32)
        pos = place(pos, size, s) + size
    if not writable(ctrl, head, pos):
        return NEED_SEGMENT
    flags = F_PRIVATE | (F_PARKED if parked else 0)
    priv = ctrl[channel_at(ch) + CH_PRIV_SEQ]
    gate_word = -1
    gate_value = 0
    pos = head
    for i in range(n):
        src = positions[i] & mask
        sw = src >> 3
        length = data64[sw] & LOW32
        size = record_bytes(length)
        pos, gate_word, gate_value = pad_to_fit(data64, pos, size, s, mask, gate_word, gate_value)
        off = pos & mask
        w = off >> 3
        priv, seq = private_seq(priv, parked)
        nb = data64[sw + R_NOT_BEFORE] if not_before[i] < 0 else not_before[i]
        write_header(data64, w, length, flags, data64[sw + R_TS], data64[sw + R_ID], nb,
                     ch | ((attempts[i] & 0xFFFF) << 16), seq)
        copy_bytes(data, off + HDR, data, src + HDR, length - HDR)
        gate_word, gate_value = commit_or_gate(data64, w, commit_word(length, flags), gate_word, gate_value)
        out_pos[i] = pos
        pos += size
    if n == 0:
        return head
    publish_private(ctrl, data64, ch, gate_word, gate_value, priv, pos)
    return out_pos[0]


# --- reading -------------------------------------------------------------------------------------------------
@njit(inline="always", **KERNEL_CALLEE)
def skipped_by(data64, w, w0, ch):
    """PAD, parked (public or private), or another channel's private record: the channel's cursor passes it
    without delivering. (A PAD record may be a single word at the end of a segment: nothing after its commit word
    is read.)"""
    flags = w0 >> 32
    if (flags & (F_PAD | F_PARKED)) != 0:
        return True
    if (flags & F_PRIVATE) != 0:
        return (data64[w + R_CHAN_ATT] & 0xFFFF) != ch
    return False


@njit(inline="always", **KERNEL)
def next_position(pos, w0, s):
    if ((w0 >> 32) & F_PAD) != 0:
        return (pos | (s - 1)) + 1
    return pos + record_bytes(w0 & LOW32)


@njit(inline="always", **KERNEL_CALLEE)
def header_fields(data64, mask, pos, i, out_len, out_flags, out_ts, out_id, out_nb, out_att):
    w = (pos & mask) >> 3
    w0 = load_acquire(data64, w)
    out_len[i] = (w0 & LOW32) - HDR
    out_flags[i] = w0 >> 32
    out_ts[i] = data64[w + R_TS]
    out_id[i] = data64[w + R_ID]
    out_nb[i] = data64[w + R_NOT_BEFORE]
    out_att[i] = (data64[w + R_CHAN_ATT] >> 16) & 0xFFFF


@njit(**KERNEL)
def read_channel(ctrl, data64, ch, max_n, max_bytes, out_pos, out_len, out_flags, out_ts, out_id, out_nb,
                 out_att):
    """Up to max_n deliverable records of channel ch from its cursor whose V2 frames total at most max_bytes,
    but at least the first one (max_n > 0), however big its frame: a message over the budget goes alone. Returns
    (count, position after the last record looked at, the latest not-before time among those read) or
    (NO_CHANNEL, 0, 0). Does not move the cursor."""
    if not channel_active(ctrl, ch):
        return NO_CHANNEL, 0, 0
    s = seg_size(ctrl)
    mask = window_mask(ctrl)
    head = state_word(ctrl, S_HEAD)
    pos = cursor_word(ctrl, ch, C_CURSOR)
    n = 0
    total = 0
    latest = 0
    while pos < head and n < max_n:
        w = (pos & mask) >> 3
        w0 = load_acquire(data64, w)
        if not skipped_by(data64, w, w0, ch):
            frame = FRAME_OVERHEAD + (w0 & LOW32) - HDR
            if total + frame > max_bytes and n > 0:
                break
            total += frame
            out_pos[n] = pos
            header_fields(data64, mask, pos, n, out_len, out_flags, out_ts, out_id, out_nb, out_att)
            latest = max(latest, out_nb[n])
            n += 1
        pos = next_position(pos, w0, s)
    return n, pos, latest


@njit(**KERNEL)
def records_at(ctrl, data64, positions, n, out_len, out_flags, out_ts, out_id, out_nb, out_att):
    """Header fields of the records at positions[:n] (deferred, parked, in flight); BAD_POSITION if one is not a
    retained committed record."""
    mask = window_mask(ctrl)
    for i in range(n):
        if not valid_record(ctrl, data64, positions[i]):
            return BAD_POSITION
        header_fields(data64, mask, positions[i], i, out_len, out_flags, out_ts, out_id, out_nb, out_att)
    return n


@njit(**KERNEL)
def advance(ctrl, data64, ch, target):
    """Move channel ch's cursor to target (a position read_channel returned, or a record boundary between the
    cursor and it). Returns the number of records passed, or NO_CHANNEL / BAD_POSITION (nothing moved)."""
    if not channel_active(ctrl, ch):
        return NO_CHANNEL
    s = seg_size(ctrl)
    mask = window_mask(ctrl)
    if target > state_word(ctrl, S_HEAD):
        return BAD_POSITION
    pos = cursor_word(ctrl, ch, C_CURSOR)
    pub = cursor_word(ctrl, ch, C_PUB_DONE)
    priv = cursor_word(ctrl, ch, C_PRIV_DONE)
    passed = 0
    while pos < target:
        w = (pos & mask) >> 3
        w0 = load_acquire(data64, w)
        flags = w0 >> 32
        if (flags & (F_PRIVATE | F_PAD | F_PARKED)) == 0:
            pub = data64[w + R_SEQ]
        elif not skipped_by(data64, w, w0, ch):
            priv = data64[w + R_SEQ]
        pos = next_position(pos, w0, s)
        passed += 1
    if pos != target:
        return BAD_POSITION
    publish_cursor(ctrl, ch, pos, pub, priv)
    return passed


@njit(**KERNEL)
def rewind(ctrl, data64, ch, target):
    """Move channel ch's cursor back to target (a retained record boundary before it), so that it delivers again
    what lies after: a restart after a reboot lost the in-flight table, and the low-water mark says where the
    held messages start. Its counters follow from the first records after target. -> 1 (moved), 0 (target is
    not before the cursor), NO_CHANNEL or BAD_POSITION."""
    if not channel_active(ctrl, ch):
        return NO_CHANNEL
    if target >= cursor_word(ctrl, ch, C_CURSOR):
        return 0
    if target < load_acquire(ctrl, TAIL) or target & 7:
        return BAD_POSITION
    s = seg_size(ctrl)
    mask = window_mask(ctrl)
    head = state_word(ctrl, S_HEAD)
    pub = -1
    priv = -1
    pos = target
    while pos < head and (pub < 0 or priv < 0):
        w = (pos & mask) >> 3
        w0 = load_acquire(data64, w)
        flags = w0 >> 32
        if (flags & (F_PRIVATE | F_PAD | F_PARKED)) == 0:
            if pub < 0:
                pub = data64[w + R_SEQ] - 1
        elif not skipped_by(data64, w, w0, ch):
            if priv < 0:
                priv = data64[w + R_SEQ] - 1
        pos = next_position(pos, w0, s)
    if pub < 0:
        pub = state_word(ctrl, S_HEAD_SEQ)
    if priv < 0:
        priv = ctrl[channel_at(ch) + CH_PRIV_SEQ]
    publish_cursor(ctrl, ch, target, pub, priv)
    return 1


# --- NSQ V2 message frames -----------------------------------------------------------------------------------
@njit(inline="always", **KERNEL_CALLEE)
def put_be(out, at, value, nbytes):
    for k in range(nbytes):
        out[at + k] = (value >> (8 * (nbytes - 1 - k))) & 0xFF


@njit(**KERNEL)
def write_frames(ctrl, data, data64, positions, attempts, n, out, out_off):
    """NSQ V2 message frames for the records at positions[:n] (attempts[i] each) written into out from out_off:
    [i32 size][i32 type=2][i64 ts][u16 attempts][16 lowercase hex id][body], big-endian. Returns the end
    offset, or NO_SPACE_OUT (nothing meaningful written) if out is too small."""
    mask = window_mask(ctrl)
    need = out_off
    for i in range(n):
        need += FRAME_OVERHEAD + (data64[(positions[i] & mask) >> 3] & LOW32) - HDR
    if need > out.size:
        return NO_SPACE_OUT
    at = out_off
    for i in range(n):
        off = positions[i] & mask
        w = off >> 3
        body = (data64[w] & LOW32) - HDR
        put_be(out, at, FRAME_OVERHEAD - 4 + body, 4)
        put_be(out, at + 4, FRAME_TYPE_MESSAGE, 4)
        put_be(out, at + 8, data64[w + R_TS], 8)
        put_be(out, at + 16, attempts[i], 2)
        msg_id = data64[w + R_ID]
        for k in range(16):
            nib = (msg_id >> (4 * (15 - k))) & 0xF
            out[at + 18 + k] = nib + 48 if nib < 10 else nib + 87
        copy_bytes(out, at + FRAME_OVERHEAD, data, off + HDR, body)
        at += FRAME_OVERHEAD + body
    return at


# --- channels, depth, reclaim, recovery ----------------------------------------------------------------------
@njit(**KERNEL_CALLEE)
def active_channels(ctrl):
    count = 0
    for ch in range(ctrl[P_CHANNELS]):
        count += load_acquire(ctrl, channel_at(ch) + CH_ACTIVE) == 1
    return count


@njit(**KERNEL)
def open_slots(ctrl, out):
    """The open channel slots, in order, into out (at least P_CHANNELS long); returns how many."""
    n = 0
    for ch in range(ctrl[P_CHANNELS]):
        if load_acquire(ctrl, channel_at(ch) + CH_ACTIVE) == 1:
            out[n] = ch
            n += 1
    return n


@njit(**KERNEL)
def open_channel(ctrl):
    """Take a free channel slot: the topic's first channel starts at the backlog, a later one at the head
    (NSQ's rule). Returns the slot or FULL."""
    first = active_channels(ctrl) == 0
    for ch in range(ctrl[P_CHANNELS]):
        c = channel_at(ch)
        if ctrl[c + CH_ACTIVE] == 0:
            if first:
                start, seq = state_word(ctrl, S_BACKLOG), state_word(ctrl, S_BACKLOG_SEQ)
            else:
                start, seq = state_word(ctrl, S_HEAD), state_word(ctrl, S_HEAD_SEQ)
            store_release(ctrl, c + CH_PRIV_SEQ, 0)
            store_release(ctrl, c + CH_LOW_WATER, start)
            publish_cursor(ctrl, ch, start, seq, 0)
            store_release(ctrl, c + CH_ACTIVE, 1)
            return ch
    return FULL


@njit(**KERNEL)
def close_channel(ctrl, ch, give_back):
    """Free a channel slot. When the last channel goes, what is published from now on piles up for the next
    first channel: the backlog starts at the head (published before the slot is freed, so a crash in between
    leaves the channel open, never a stale backlog). ``give_back`` (1): the backlog starts at this channel's
    cursor instead, so what it had not delivered waits for the next first channel (a slot a crashed worker
    opened but never recorded took the backlog and delivered nothing); only for a channel with no requeued
    (private) records after its cursor, which the slot's next channel would deliver but not count."""
    if not channel_active(ctrl, ch):
        return NO_CHANNEL
    if active_channels(ctrl) == 1:
        head, seq = state_word(ctrl, S_HEAD), state_word(ctrl, S_HEAD_SEQ)
        start, start_seq = head, seq
        if give_back:
            start, start_seq = cursor_word(ctrl, ch, C_CURSOR), cursor_word(ctrl, ch, C_PUB_DONE)
        publish_state(ctrl, head, seq, state_word(ctrl, S_LAST_ID), start, start_seq)
    store_release(ctrl, channel_at(ch) + CH_ACTIVE, 0)
    return 0


@njit(**KERNEL)
def drop_backlog(ctrl):
    """A topic with no channel forgets what piled up for its first channel (NSQ's topic empty): the backlog
    starts at the head. Returns 0, or FULL when a channel is open (its queue is its own)."""
    if active_channels(ctrl) != 0:
        return FULL
    head, seq = state_word(ctrl, S_HEAD), state_word(ctrl, S_HEAD_SEQ)
    publish_state(ctrl, head, seq, state_word(ctrl, S_LAST_ID), head, seq)
    return 0


@njit(**KERNEL)
def channel_depth(ctrl, ch):
    """Records channel ch has still to deliver (public after its cursor + its own requeued ones); safe from
    any process. The channel's counters are read before the head's, so the result is never negative."""
    if not channel_active(ctrl, ch):
        return NO_CHANNEL
    c = channel_at(ch)
    pub = snapshot(ctrl, c + CH_GEN, c + CH_A, CH_STATE_WORDS, C_PUB_DONE)
    priv = snapshot(ctrl, c + CH_GEN, c + CH_A, CH_STATE_WORDS, C_PRIV_DONE)
    depth = snapshot(ctrl, STATE_GEN, STATE_A, STATE_WORDS, S_HEAD_SEQ) - pub
    return depth + max(load_acquire(ctrl, c + CH_PRIV_SEQ) - priv, 0)


@njit(inline="always", **KERNEL)
def state_snapshot(ctrl, field):
    return snapshot(ctrl, STATE_GEN, STATE_A, STATE_WORDS, field)


@njit(inline="always", **KERNEL)
def cursor_snapshot(ctrl, ch, field):
    c = channel_at(ch)
    return snapshot(ctrl, c + CH_GEN, c + CH_A, CH_STATE_WORDS, field)


@njit(**KERNEL)
def needed_from(ctrl):
    """The oldest position still needed: min over open channels of (cursor, low-water); the backlog start if
    the topic has no channel."""
    low = NO_LOW_WATER
    any_open = False
    for ch in range(ctrl[P_CHANNELS]):
        c = channel_at(ch)
        if ctrl[c + CH_ACTIVE] == 1:
            any_open = True
            low = min(low, cursor_word(ctrl, ch, C_CURSOR), ctrl[c + CH_LOW_WATER])
    if not any_open:
        low = state_word(ctrl, S_BACKLOG)
    return min(low, state_word(ctrl, S_HEAD))


@njit(**KERNEL)
def recover_scan(ctrl, data64):
    """After the owner died: walk the records committed past the published head, fold their seqs into the
    counters (max, so a second recovery changes nothing) and publish the new head. Returns it, or BAD_POSITION
    if a committed word is not a record (corruption). Reads nothing at or past RESERVED: nothing was written
    there, and its pages may be holes."""
    s = seg_size(ctrl)
    mask = window_mask(ctrl)
    head = state_word(ctrl, S_HEAD)
    head_seq = state_word(ctrl, S_HEAD_SEQ)
    last_id = state_word(ctrl, S_LAST_ID)
    reserved = ctrl[RESERVED]
    pos = head
    while pos < reserved and segment_present(ctrl, pos // s):
        w = (pos & mask) >> 3
        w0 = load_acquire(data64, w)
        if w0 == 0:
            break
        flags = w0 >> 32
        length = w0 & LOW32
        if (flags & F_PAD) == 0:
            size = record_bytes(length)
            if length < HDR or (pos & (s - 1)) + size > s or pos + size > reserved:
                return BAD_POSITION
            if (flags & F_PRIVATE) == 0:
                head_seq = max(head_seq, data64[w + R_SEQ])
                last_id = data64[w + R_ID]
            elif (flags & F_PARKED) == 0:
                c = channel_at(data64[w + R_CHAN_ATT] & 0xFFFF)
                store_release(ctrl, c + CH_PRIV_SEQ, max(ctrl[c + CH_PRIV_SEQ], data64[w + R_SEQ]))
        pos = next_position(pos, w0, s)
    if pos != head:
        publish_head(ctrl, pos, head_seq, last_id)
    return pos


@njit(**KERNEL)
def zero_range(data64, ctrl, start, end):
    """Zero [start, end) of the window (8-aligned positions inside one segment)."""
    mask = window_mask(ctrl)
    for w in range((start & mask) >> 3, (((end - 1) & mask) >> 3) + 1):
        data64[w] = 0
