"""Numba kernels of the worker that read its in-flight table in bulk (the table's own kernels are per slot), and
``deliver_round``, a whole delivery round in one call.

They read the slot words directly, with the layout constants of ``nsqpy.ipc.inflight``; the worker is the table's only
writer and these run in the worker, so plain loads are enough.
"""
import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, warm_up_step
from nsqpy.ipc.inflight import (C_N_LIVE, DEFERRED, F_ATTEMPTS, FREE, HALF_WORDS, REQUEUED, S_CHANNEL, S_HALF0,
                          S_LOG_POS, S_TAG, SLOT_WORDS, inflight_start_batch)
from nsqpy.ipc.msglog_kernels import advance, read_channel, write_frames
from nsqpy.ipc.msglog_layout import FRAME_OVERHEAD
from nsqpy.ipc import sysio as S
from nsqpy.workers.storage.poison import COUNT, DELIVERY, KEY, KIND, POS, TOPIC
from nsqpy.workers.lane.words import (RD_BUDGET, RD_CH, RD_CONN, RD_DEADLINE, RD_FD, RD_KEY, RD_MAX_BYTES, RD_NOW,
                                      RD_TOPIC, RD_TTL_CUTOFF, RD_WBASE, ROUND_WORDS,
                                      RD_MAX_ATTEMPTS)

GENERAL = -1   # deliver_round did nothing: the round needs the general path (Channel._deliver_to)


@njit(nogil=True, **JIT)
def low_water(slots, out):
    """out[channel key] = the lowest log position a live slot of that channel holds (out preset to 'none').
    Channel keys are unique within a worker, so one pass serves every topic."""
    for s in range(slots.shape[0] // SLOT_WORDS):
        b = s * SLOT_WORDS
        if slots[b + S_TAG] & 3 != FREE:
            key = slots[b + S_CHANNEL]
            if 0 <= key < out.shape[0] and slots[b + S_LOG_POS] < out[key]:
                out[key] = slots[b + S_LOG_POS]


@njit(nogil=True, **JIT)
def slots_of_channel(slots, key, out):
    """Live slots of channel `key` into out; -> how many (may exceed out's length)."""
    n = 0
    for s in range(slots.shape[0] // SLOT_WORDS):
        b = s * SLOT_WORDS
        if slots[b + S_TAG] & 3 != FREE and slots[b + S_CHANNEL] == key:
            if n < out.shape[0]:
                out[n] = s
            n += 1
    return n


@njit(nogil=True, **JIT)
def slot_fields(slots, which, out_gen, out_pos, out_attempts):
    """Generation, log position and attempts of the given slots."""
    for i in range(which.shape[0]):
        b = which[i] * SLOT_WORDS
        tag = slots[b + S_TAG]
        out_gen[i] = tag >> 3
        out_pos[i] = slots[b + S_LOG_POS]
        out_attempts[i] = slots[b + S_HALF0 + ((tag >> 2) & 1) * HALF_WORDS + F_ATTEMPTS]


@njit(nogil=True, **JIT)
def waiting_positions(slots, which, out_pos):
    """Log position of each given slot that is REQUEUED or DEFERRED (waiting to be delivered again), else -1
    (a slot that changed state since it was queued: redelivering it will fail, and its position may be gone)."""
    for i in range(which.shape[0]):
        b = which[i] * SLOT_WORDS
        state = slots[b + S_TAG] & 3
        out_pos[i] = slots[b + S_LOG_POS] if state == REQUEUED or state == DEFERRED else -1


def round_words(ch, budget, max_bytes, now, deadline, topic, key, conn, wbase, fd, ttl_cutoff=0, rd=None,
                max_attempts=0):
    """``deliver_round``'s round words (words.py: RD_*), into ``rd`` when given (a caller's own block);
    ``ttl_cutoff``: the publish timestamp (ns) before which a record has expired, 0 for a channel without a TTL;
    ``max_attempts``: the channel's (0: none)."""
    if rd is None:
        rd = np.empty(ROUND_WORDS, np.int64)
    rd[RD_CH], rd[RD_BUDGET], rd[RD_MAX_BYTES], rd[RD_NOW], rd[RD_DEADLINE] = ch, budget, max_bytes, now, deadline
    rd[RD_TOPIC], rd[RD_KEY], rd[RD_CONN], rd[RD_WBASE], rd[RD_FD] = topic, key, conn, wbase, fd
    rd[RD_TTL_CUTOFF] = ttl_cutoff
    rd[RD_MAX_ATTEMPTS] = max_attempts
    return rd


def generations(table, which):
    n = len(which)
    gen, pos, att = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    slot_fields(table.slots, which, gen, pos, att)
    return gen, pos, att


@njit(nogil=True, **JIT)
def deliver_round(ctrl, data, data64, table_ctl, table_slots, table_index, rd, cols, slots, out, words):
    """One delivery round from channel RD_CH's cursor in one call (``rd``: the round words, words.py's RD_*;
    ``cols``: the log read's result columns as rows, ``ReadBatch.FIELDS``' order): the log read (``read_channel``,
    at most RD_BUDGET records and RD_MAX_BYTES of frames), their in-flight slots for RD_CONN (deadline
    RD_DEADLINE) into ``slots``, the cursor moved past them, the suspect words (at RD_WBASE) naming the round
    while it is framed into ``out``, then, with RD_FD >= 0 (the consumer's socket, nothing queued for it), as
    much of the frames sent as the socket takes. -> (records delivered, end of their frames in out, bytes of them sent); (0, 0, 0) when
    there was nothing to read. A send that fails counts as none sent: the caller queues the frames, and the
    session's flush meets the error.

    It does all of it or nothing: (GENERAL, 0, 0) when a record read is deferred (its not-before lies after
    ``now``), the table has fewer free slots than records read (the general path grows it or stops the cursor
    at the first without one), or the frames do not fit ``out``, and (NO_CHANNEL, 0, 0) for a channel not open.
    The general path then reads again and takes the case. With a TTL (RD_TTL_CUTOFF > 0) a record published
    before the cutoff has expired: the round stops before the first such record (those before it are delivered,
    the cursor stops at it), or is GENERAL when it is the first, so that the general path expires it (drops it or
    moves it to the dead-letter topic: ``Channel._deliver_read``); the records after it wait for the next round.
    RD_MAX_ATTEMPTS > 0 does the same for a record whose stored attempts reached it (dead-lettered there).
    A record whose message already has a slot (re-read after a crash) is passed over, as the general path does. The attempts row receives each delivered record's
    attempts (stored + 1) next to its position in the positions row."""
    ch, budget, max_bytes, now, deadline = rd[RD_CH], rd[RD_BUDGET], rd[RD_MAX_BYTES], rd[RD_NOW], rd[RD_DEADLINE]
    topic, key, conn, wbase, fd = rd[RD_TOPIC], rd[RD_KEY], rd[RD_CONN], rd[RD_WBASE], rd[RD_FD]
    pos, lens, flags, ts, ids, nb, att = cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6]
    # read_channel keeps the frames within the byte budget, but for a lone record bigger than it: only that one
    # can outgrow out
    n, nxt, latest = read_channel(ctrl, data64, ch, budget, min(max_bytes, out.shape[0]), pos, lens, flags, ts,
                                  ids, nb, att)
    if n <= 0:
        return n, 0, 0
    cutoff, spent = rd[RD_TTL_CUTOFF], rd[RD_MAX_ATTEMPTS]
    if cutoff > 0 or spent > 0:
        for i in range(n):
            if (cutoff > 0 and ts[i] < cutoff) or (spent > 0 and att[i] >= spent):
                # expired, or delivered max_attempts times already: the general path's, the cursor stops at it
                if i == 0:
                    return GENERAL, 0, 0
                n, nxt = i, pos[i]
                break
    if latest > now or table_slots.shape[0] // SLOT_WORDS - table_ctl[C_N_LIVE] < n or \
            FRAME_OVERHEAD + lens[0] > out.shape[0]:
        return GENERAL, 0, 0
    for i in range(n):
        att[i] += 1
    started = inflight_start_batch(table_ctl, table_slots, table_index, topic, key, conn, now, deadline, ids[:n],
                                   pos[:n], att[:n], slots[:n])
    if started != n:  # duplicates: deliver those that got a slot
        k = 0
        for i in range(n):
            if slots[i] >= 0:
                pos[k], att[k], slots[k] = pos[i], att[i], slots[i]
                k += 1
        n = k
    advance(ctrl, data64, ch, nxt)  # before framing: a worker that dies framing finds the messages in their slots
    if n == 0:
        return 0, 0, 0
    words[wbase + TOPIC], words[wbase + KEY], words[wbase + POS], words[wbase + COUNT] = topic, key, pos[0], n
    words[wbase + KIND] = DELIVERY
    start = np.int64(0)
    end = write_frames(ctrl, data, data64, pos, att, n, out, start)
    words[wbase + KIND] = 0
    sent = start
    if fd >= 0:
        sent = max(S.send_from(fd, out, start, end), start)
    return n, end, sent


@warm_up_step(shm=True)
def warm_up(prefix):
    """A compiled delivery round as ``Channel._deliver_round`` calls it, and the bulk reads of the in-flight table
    (workers/lane/warmup.py schedules this before fork)."""
    import time
    from nsqpy.ipc.inflight import InFlightTable, inflight_nbytes
    from nsqpy.ipc.msglog import throwaway_log
    with throwaway_log(f"{prefix}-warmup-round") as (log, _, _):
        ch = log.open_channel()
        log.append(b"hello", time.time_ns(), 1)
        table = InFlightTable.create(bytearray(inflight_nbytes(64)), 0, 64)
        win, words = log.window, np.zeros(16, np.int64)
        now = time.time_ns()
        rd = round_words(ch, 8, 1 << 20, now, now + 10**9, 1, 1, 5, 0, -1, now - 10**9)
        deliver_round(log.ctrl, win.data, win.data64, table.ctl, table.slots, table.index, rd, log.read_block(8),
                      np.empty(8, np.int64), np.empty(1024, np.uint8), words)
    table = InFlightTable.create(bytearray(inflight_nbytes(64)), 0, 64)
    ids = np.array([11, 12, 13], np.uint64).view(np.int64)
    slots = np.empty(3, np.int64)
    table.start_batch(1, 1, 5, 0, 10, ids, np.array([0, 8, 16], np.int64), np.ones(3, np.int64), slots)
    generations(table, slots[1:])
    low_water(table.slots, np.full(4, 1 << 62, np.int64))
    slots_of_channel(table.slots, 1, np.empty(4, np.int64))
    waiting_positions(table.slots, slots[1:], np.empty(2, np.int64))
