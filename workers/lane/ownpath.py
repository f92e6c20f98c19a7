"""The owner's lone PUBs in the lane: a PUB (or a small MPUB) to a topic of this worker appended, delivered and
answered in one call.

Theory of operation
-------------------
A round-trip producer on its topic's owner (where auto placement moves slow producers) cost the owner a whole
loop iteration in Python per message: wake, read, the idle step's commit, ``Topic.append``, a delivery pass
whose round is compiled, the flush and the OK. On a worker that sleeps between messages every one of those steps
runs with cold caches, and together they were most of the time from a PUB's arrival to its message's send
(ARCHITECTURE.md, "Single PUB: cost model").

So, before the loop blocks in the forward lane (``workers/lane/fastlane.py``), ``OwnPath.arm`` prepares the one
topic most likely to be published next (the last one whose lone PUB the Python path published here) in
``words``: its ID generator's state and, for each of its channels with a consumer that can take a message now,
a row (log slot, channel key, the consumer's connection, socket, free RDY and message timeout). When the lane's
read is PUBs or MPUBs to that topic only (at most MAX_N messages in all: a paced producer's MPUBs of two or three
are common), ``own_publish`` (compiled, in the lane) appends them to the topic's log, runs each row's delivery
round (``kernels.deliver_round``: in-flight slots, cursor, frames, their send), and the lane sends the OKs (one
per command) after the messages, as the Python path does. Python's share comes after the sends, in
``done``: counters, the rounds' timers, the rest of a frame the socket did not take, and a delivery pass for
every channel a row did not cover.

Arming is all or nothing, and Python decides it with everything in view, at the one moment nothing else runs: the
loop is about to block, so nothing changes between ``arm`` and the lane's read. A topic is not armed (the Python
path takes it, as before) when any of these holds: it is durable (``--mem-queue-size=0``: its OKs wait for
``--sync-every``), marked full, deleted, or storage is failing; any channel has a bound (``Policy.bounded``:
workers/domain/policy.py; checked on the publish side in Python; a TTL channel is armed, its row carrying the TTL
for the round's cutoff); a channel with consumers has anything waiting (messages ahead of its cursor, requeued or
due ones) or is in careful rounds (``workers/storage/poison.py``); the consumer whose turn it is samples, has output
queued or is closing; there are more than MAX_ROWS such channels; compiled rounds are off (``--crash-on-body``);
publishes forwarded by other workers wait in our rings and the lane may not take them (below). The kernel gives up
without writing anything (the Python path then publishes the same staged messages) when more than MAX_N are staged
or the log needs a new segment (its budgets are Python's). A channel whose round it could not finish (a round
``deliver_round`` leaves to the general path, or fewer free RDY than messages) gets the usual delivery pass from
Python, and so does every channel after a row whose frames the socket did not all take (the round buffer holds those
until Python queues them; that consumer's socket is marked busy first, so that no OK can overtake them).

A round-trip consumer's FIN comes between its producer's PUBs, and cost the owner a second trip through Python
per message (its read, ``Channel.finish_one``, the idle step, arming again). So a row also names the consumer
whose turn it is when none has free RDY (its free RDY, 0 or less, kept in the row), and, when that consumer's
FINs may take a fast path (``Session.fin_fast_path``: subscribed, parser idle, not held or closing, TLS not
pending, no end-to-end latency window), a read that is exactly one ``FIN <id>\\n`` from it is the lane's
(``own_fin``): the in-flight table frees the message (a FIN that fails is left to Python, which answers it), the
row gains the RDY, and (row, slot) waits in ``words`` for ``fins_done``, which the lane's caller runs first
whatever the lane returned: the round's timer, the session's counts, the channel's pass or change mark. Its
timers leave before ``done`` starts the next round's, since that round may reuse the freed slot.

A forward to the armed topic from a producer on another worker woke the owner for a whole pass of the loop too
(the eventfd, ``Forwarder.drain_rings``, ``Topic.append``, arming again), and while forwards waited in the rings
the own path was not armed, so the owner's own producer went through Python as well: at 2 connections spread over
2 workers, most of the owner's CPU. So when this worker's eventfd is what wakes the armed lane, ``own_drain``
looks at the input rings itself: if every committed record is a plain forward (``records.plain_forward``: no
defer, bodies that fill it) to the armed topic, at most MAX_N messages in all, and neither the scanner's ring nor
a sender's flags (waiting for room, stalled) want Python, it appends them with their records' timestamps and
IDs of the topic's generator, delivers them to the rows as ``own_publish`` does, releases the records and wakes a
sender that waits for room; the lane returns R_DRAINED and ``done`` is Python's share. Otherwise every record is
offered again as it was and the eventfd written back, so the loop's usual drain takes them. After a drain the
worker is awake (its wake-up flag cleared), so forwards that come while Python works cost their senders no
eventfd write: the lane goes on only once the flag is armed again with the rings still empty (``FastLane``'s
``sleep``), and otherwise the loop's drain takes them, in one batch. The order of
the records is kept (one append per drain, rings in slot order); between producers there is none to keep, and a
producer that moves here is handed over through the loop, whose drain takes its earlier forwards first
(``Forwarder.catch_up``). With the lane allowed to drain (``Forwarder.lane_may_drain``: no record-by-record
drain after a crash, no refused append waiting for its retry, no fault injection), forwards waiting in the rings
no longer keep the topic from being armed: the eventfd they wrote is the lane's first event. A crash in the
middle leaves the records unreleased: the next drain appends them again (at worst a duplicate, as the loop's).
"""
import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT_CALLEE
from nsqpy.ipc import sysio as S
from nsqpy.ipc.inflight import inflight_finish_batch
from nsqpy.ipc.msglog_kernels import append_batch
from nsqpy.ipc.ring import C_READ, C_STALLED, CONTROL_WORDS, ring_read_batch, ring_readable, ring_release_read
from nsqpy.ipc.wake import wake_check, wake_disarm
from nsqpy.protocol.kernels import hex_value, snowflake_fill
from nsqpy.workers.domain.channel import MAX_ROUND_BYTES, ROUND
from nsqpy.workers.lane.kernels import deliver_round
from nsqpy.workers.lane.words import (A_IDS, A_NB, A_POS, A_TS, CN_OTHER, DATA, FN_FREED, FN_ID, FN_ROW, FN_SLOT,
                                      FN_STATUS, MAX_FINS, MAX_N, MAX_ROWS, OUT_FD, OUT_KIND, OUT_LEN, OUT_OFF,
                                      OW_ARMED, OW_FINS, OW_NODE, OW_ROWS, OW_SEQ, OW_T, OW_TICK, OW_TOPIC_INDEX,
                                      OW_WBASE, OW_WORDS, READ_AT, ROW, ROWS_AT, RW_CH, RW_CONN, RW_DEADLINE, RW_END,
                                      RW_FD, RW_FINS, RW_FREE, RW_GOT, RW_KEY, RW_SENT, RW_TIMEOUT, SLOTS_AT, ST_LEN,
                                      ST_OFF, RD_AT, RD_BUDGET, RD_CH, RD_CONN, RD_DEADLINE, RD_FD, RD_KEY,
                                      RD_MAX_BYTES, RD_NOW, RD_TOPIC, RD_TTL_CUTOFF, RD_WBASE, ROUND_WORDS, RW_TTL,
                                      RD_MAX_ATTEMPTS, DR_LEN, DR_OFF, LN_EVENTFD, LN_SCAN_CTL, RI_CAPACITY,
                                      RI_CTL_AT, RI_DATA_AT, RI_PROC, RI_WAKE_FD)
from nsqpy.workers.publishing.records import FORWARD, FWD_HEAD_SIZE, _le64, plain_forward, want_room
from nsqpy.workers.domain.session import FIN_LINE  # the one form of FIN the lane takes, as Session.on_data

WORDS = OW_WORDS  # the own path's words (words.py: OW_*, RW_*, A_*, FN_*)
ANY_BYTES = 1 << 62  # ``own_drain`` reads records by count (MAX_N at most), whatever their size


@njit(**JIT_CALLEE)
def own_publish(st, n, buf, busy, ow, ctrl, data, data64, table_ctl, table_slots, table_index, out, words):
    """Append the n staged messages of lone PUBs and MPUBs (bodies in buf, rows of st as the pump staged them) to
    the armed topic's log (ctrl, data, data64) and run each armed row's delivery round (module docstring). -> False,
    having written nothing, when more than MAX_N are staged or the log needs a new segment."""
    if n > MAX_N:
        return False
    now = S.realtime_ns()
    ow[A_TS:A_TS + n] = now
    return _append_deliver(buf, st[ST_OFF, :n], st[ST_LEN, :n], n, now, busy, ow, ctrl, data, data64, table_ctl,
                           table_slots, table_index, out, words)


@njit(**JIT_CALLEE)
def _append_deliver(src, offs, lens, n, now, busy, ow, ctrl, data, data64, table_ctl, table_slots, table_index, out,
                    words):
    """Append n messages (bodies src[offs[i]:+lens[i]], publish timestamps at A_TS) to the armed topic's log with
    IDs from its generator's state, then run each armed row's delivery round: ``own_publish``'s and
    ``own_drain``'s shared part. -> False, having written nothing, when the log needs a new segment."""
    ts, ids, nb = ow[A_TS:A_TS + n], ow[A_IDS:A_IDS + n], ow[A_NB:A_NB + n]
    nb[:] = 0
    tick, seq = snowflake_fill(ids.view(np.uint64), now >> 20, ow[OW_TICK], ow[OW_SEQ], ow[OW_NODE])
    first = append_batch(ctrl, data, data64, src, offs, lens, ts, ids, nb, np.int64(0), n, ow[A_POS:A_POS])
    if first < 0:
        return False
    ow[OW_TICK] = tick
    ow[OW_SEQ] = seq
    rows = ow[OW_ROWS]
    r = 0
    while r < rows:
        b = ROWS_AT + r * ROW
        budget = min(ow[b + RW_FREE], ROUND, n)
        if budget <= 0:  # a row armed for its FINs only: no free RDY (yet)
            ow[b + RW_GOT] = 0
            r += 1
            continue
        deadline = now + ow[b + RW_TIMEOUT]
        slots = ow[SLOTS_AT + r * MAX_N:SLOTS_AT + (r + 1) * MAX_N]
        rd = ow[RD_AT:RD_AT + ROUND_WORDS]
        rd[RD_CH], rd[RD_BUDGET], rd[RD_MAX_BYTES], rd[RD_NOW], rd[RD_DEADLINE] = \
            ow[b + RW_CH], budget, MAX_ROUND_BYTES, now, deadline
        rd[RD_TOPIC], rd[RD_KEY], rd[RD_CONN], rd[RD_WBASE], rd[RD_FD] = \
            ow[OW_TOPIC_INDEX], ow[b + RW_KEY], ow[b + RW_CONN], ow[OW_WBASE], ow[b + RW_FD]
        ttl = ow[b + RW_TTL]  # (a TTL channel's round stops at an expired record, as Channel._deliver_round's)
        rd[RD_TTL_CUTOFF] = now - ttl if ttl > 0 else 0
        rd[RD_MAX_ATTEMPTS] = 0  # (an armed channel has nothing waiting: only what was just appended)
        got, end, sent = deliver_round(ctrl, data, data64, table_ctl, table_slots, table_index, rd,
                                       ow[READ_AT:READ_AT + 7 * MAX_N].reshape((7, MAX_N)), slots, out, words)
        ow[b + RW_GOT] = got
        ow[b + RW_END] = end
        ow[b + RW_SENT] = sent
        ow[b + RW_DEADLINE] = deadline
        r += 1
        if got > 0 and sent < end:
            busy[ow[b + RW_FD]] = 1  # the rest of its frames is queued by Python, before any OK to that socket
            break
    while r < rows:  # after a partial send the round buffer holds its frames: these rows are Python's
        ow[ROWS_AT + r * ROW + RW_GOT] = 0
        r += 1
    return True


@njit(**JIT_CALLEE)
def _undo_reads(seg_words, rin, was):
    """Offer again what ``own_drain`` read (its READ words back to where they were)."""
    for i in range(rin.shape[1]):
        if was[i] >= 0:
            seg_words[rin[RI_CTL_AT, i] + C_READ] = was[i]


@njit(**JIT_CALLEE)
def _collect(seg_words, seg_bytes, rin, was, name, name_len, ow):
    """Read the input rings' records into DR_OFF / DR_LEN / A_TS while every one is a plain forward to the armed
    topic (``records.plain_forward``, named ``name``) and they hold at most MAX_N messages in all: -> how many, or
    -1 when a record, a ring's flags or the count is for Python (``was`` then says what to undo)."""
    n = 0
    roff, rlen, rtype = np.empty(MAX_N, np.int64), np.empty(MAX_N, np.int64), np.empty(MAX_N, np.int64)
    for i in range(rin.shape[1]):
        c = rin[RI_CTL_AT, i]
        ctl = seg_words[c:c + CONTROL_WORDS]
        if ring_readable(ctl) == 0:
            continue
        if ctl[C_STALLED] != 0 or want_room(ctl) or n == MAX_N:
            return -1  # its sender waits for the owner (Forwarder._drain_from's bookkeeping), or too many
        was[i] = ctl[C_READ]
        d = rin[RI_DATA_AT, i]
        k = ring_read_batch(ctl, seg_bytes[d:d + rin[RI_CAPACITY, i]], roff, rlen, rtype, np.int64(MAX_N - n),
                            np.int64(ANY_BYTES))
        if k < 0:
            return -1
        for j in range(k):
            o = d + roff[j]
            cnt, ts, tl = 0, 0, 0
            if rtype[j] == FORWARD:
                cnt, ts, tl = plain_forward(seg_bytes, o, rlen[j])
            if cnt == 0 or tl != name_len or n + cnt > MAX_N:
                return -1
            p = o + FWD_HEAD_SIZE
            for b in range(tl):
                if seg_bytes[p + b] != name[b]:
                    return -1
            p += tl
            body = p + 8 * cnt
            for m in range(cnt):
                ln = _le64(seg_bytes, p + 8 * m)
                ow[DR_OFF + n], ow[DR_LEN + n], ow[A_TS + n] = body, ln, ts
                body += ln
                n += 1
    return n


@njit(**JIT_CALLEE)
def own_drain(lane, rin, seg_words, seg_bytes, wake_flags, me, name, name_len, busy, ow, ctrl, data, data64, table_ctl,
              table_slots, table_index, out, words):
    """This worker's eventfd woke the lane: if what its input rings hold is plain forwards to the armed topic
    (``rin``: words.py's RI_* rows; at most MAX_N messages), append and deliver them as ``own_publish`` does (each
    message keeps its record's timestamp), release the records and wake a sender that waits for room. -> the
    messages taken, their lengths at DR_LEN; 0, with every record offered again and the eventfd written back
    for the loop, when anything there is Python's (module docstring)."""
    efd = lane[LN_EVENTFD]
    S.eventfd_clear(efd)  # first: a commit after this writes it again (the writer that woke us cleared the flag)
    was = np.full(rin.shape[1], -1, np.int64)
    c = lane[LN_SCAN_CTL]
    n = -1
    if ring_readable(seg_words[c:c + CONTROL_WORDS]) == 0:
        n = _collect(seg_words, seg_bytes, rin, was, name, name_len, ow)
    if n <= 0 or not _append_deliver(seg_bytes, ow[DR_OFF:DR_OFF + n], ow[DR_LEN:DR_LEN + n], n, S.realtime_ns(),
                                     busy, ow, ctrl, data, data64, table_ctl, table_slots, table_index, out, words):
        _undo_reads(seg_words, rin, was)
        S.eventfd_signal(efd)
        return 0
    for i in range(rin.shape[1]):
        if was[i] >= 0:
            ctl = seg_words[rin[RI_CTL_AT, i]:rin[RI_CTL_AT, i] + CONTROL_WORDS]
            ring_release_read(ctl)
            if want_room(ctl) and wake_check(wake_flags, rin[RI_PROC, i]):
                S.eventfd_signal(rin[RI_WAKE_FD, i])
    # awake: what senders commit while Python does its share costs them no eventfd write; the lane goes on only
    # after the flag is armed again and the rings checked once more (FastLane._serve, ipc/wake.py's reader side)
    wake_disarm(wake_flags, me)
    return n


@njit(**JIT_CALLEE)
def own_fin(counts, out, buf, ow, table_ctl, table_slots, table_index):
    """A read that is one whole FIN (``FIN <16 lowercase hex digits>\\n``, nothing else) from the consumer of a row
    that takes FINs: the message freed in the in-flight table, one more free RDY in the row, (row, slot) staged
    for Python (``OwnPath.fins_done``), the read taken (``counts[CN_OTHER]`` 0). -> False, having changed nothing,
    otherwise: a FIN that fails (not in flight, not this consumer's) is Python's, which answers it."""
    if counts[CN_OTHER] != 1 or out[OUT_KIND, 0] != DATA or out[OUT_LEN, 0] != FIN_LINE or ow[OW_FINS] >= MAX_FINS:
        return False
    fd, at = out[OUT_FD, 0], out[OUT_OFF, 0]
    rows = ow[OW_ROWS]
    r = 0
    while r < rows and ow[ROWS_AT + r * ROW + RW_FD] != fd:
        r += 1
    b = ROWS_AT + r * ROW
    if r == rows or ow[b + RW_FINS] == 0:
        return False
    if buf[at] != 70 or buf[at + 1] != 73 or buf[at + 2] != 78 or buf[at + 3] != 32 or buf[at + FIN_LINE - 1] != 10:
        return False  # not "FIN ... \n"
    v = np.uint64(0)
    for k in range(16):
        d = hex_value(buf[at + 4 + k])
        if d < 0:
            return False  # not an ID nsqd could have given (Python answers E_FIN_FAILED)
        v = (v << np.uint64(4)) | np.uint64(d)
    ids = ow[FN_ID:FN_ID + 1]
    ids.view(np.uint64)[0] = v
    if inflight_finish_batch(table_ctl, table_slots, table_index, ow[b + RW_KEY], ids, ow[b + RW_CONN],
                             ow[FN_STATUS:FN_STATUS + 1], ow[FN_FREED:FN_FREED + 1]) != 1:
        return False
    k = ow[OW_FINS]
    ow[FN_ROW + k] = r
    ow[FN_SLOT + k] = ow[FN_FREED]
    ow[OW_FINS] = k + 1
    ow[b + RW_FREE] += 1
    counts[CN_OTHER] = 0
    return True


def idle_args(words):
    """The lane's own arguments while nothing is armed: ``words`` (OW_ARMED 0) and stand-ins of the armed
    arrays' types (so the lane has one compiled signature)."""
    i64, u8 = np.zeros(8, np.int64), np.zeros(8, np.uint8)
    return words, i64, u8, i64, i64, i64, i64, u8, i64


class OwnPath:
    """The Python side (module docstring). ``worker`` needs: ``topics`` (name -> Topic), ``pump``, ``inflight``,
    ``round_buffer``, ``suspect``, ``direct_fd(session)``, ``send_frames(session, buffer, end, sent)``,
    ``channel_changed(channel)``, ``pending`` (a set of channels), ``stats.changed``, ``storage_failing`` and
    ``pub_pending`` (``any()``). ``hint(topic)`` names the topic to arm next (the worker's publish of a lone PUB
    to a topic of its own calls it)."""

    def __init__(self, worker):
        self.worker = worker
        self.words = np.zeros(WORDS, np.int64)
        self.topic = None       # the hint
        self.armed = None       # the topic armed for the lane's current call, and its rows' (channel, session)
        self.rows = []
        self.published = 0      # messages the kernel published (statistics, tests)
        self.fins = 0           # FINs the lane took (statistics, tests)
        self.drained = 0        # forwarded messages the lane took from the input rings (statistics, tests)
        self._idle = idle_args(self.words)

    def hint(self, topic):
        self.topic = topic

    def arm(self, drains=False):
        """-> the lane's own arguments (``serve``'s ``own`` and the arrays after it): ``words``, the armed topic's
        log (ctrl, data, data64), the in-flight table (ctl, slots, index), the round buffer and the suspect
        words; or ``words`` and stand-ins when nothing is armed. ``drains``: the lane may take forwards from the
        input rings (``own_drain``), so forwards waiting there do not keep the topic from being armed."""
        ow = self.words
        ow[OW_ARMED] = 0
        self.armed = None
        t = self.topic
        if t is None:
            return self._idle
        rows = self._rows(t)
        if rows is None:
            return self._idle
        w = self.worker
        pump_id = w.pump.topic_ids.get(t.name)
        if pump_id is None or not drains and w.pub_pending.any():
            return self._idle
        ow[OW_T] = pump_id
        ow[OW_NODE], ow[OW_TICK], ow[OW_SEQ] = t.ids.node_id, t.ids.last_tick, t.ids.sequence
        ow[OW_ROWS] = len(rows)
        ow[OW_TOPIC_INDEX] = t.index
        ow[OW_WBASE] = w.suspect.base
        for r, (ch, s, free) in enumerate(rows):
            b = ROWS_AT + r * ROW
            ow[b + RW_CH], ow[b + RW_KEY], ow[b + RW_CONN], ow[b + RW_FD] = ch.ch, ch.key, s.conn_id, s.fd
            ow[b + RW_FREE], ow[b + RW_TIMEOUT] = free, s.settings.msg_timeout_ms * 1_000_000
            ow[b + RW_FINS] = s.fin_fast_path(ch)
            ow[b + RW_TTL] = ch.policy.message_ttl_ns
        ow[OW_FINS] = 0
        ow[OW_ARMED] = 1
        self.armed = t
        self.rows = [(ch, s) for ch, s, _ in rows]
        win, table = t.log.window, w.inflight
        return ow, t.log.ctrl, win.data, win.data64, table.ctl, table.slots, table.index, w.round_buffer, w.suspect.w

    def _rows(self, t):
        """[(channel, consumer, free RDY)] to arm topic t with, or None when t may not be armed (module
        docstring): a row per channel whose turn-taking consumer can take a message, then (up to MAX_ROWS in all)
        one per channel where none can, for the FINs of the consumer whose turn it is (free RDY 0 or less)."""
        w = self.worker
        if t.deleted or t.durable or t.full or w.topics.get(t.name) is not t or w.storage_failing or \
                w.round_buffer is None:
            return None
        rows, fins_only = [], []
        for ch in t.channels.values():
            if ch.policy.bounded:
                return None  # a bound is checked per publish in Python (workers/domain/policy.py)
            if not ch.delivering():
                continue  # nothing to deliver to now: the message waits in the log, as after Topic.append
            if ch.has_messages() or w.suspect.careful_rounds(ch.key):
                return None
            n = len(ch.consumers)
            start = ch.turn()
            for i in range(n):
                s = ch.consumers[(start + i) % n]
                free = s.rdy - s.in_flight
                if free <= 0 or not s.ready_for_more():
                    continue
                if s.settings.sample_rate > 0 or w.direct_fd(s) < 0:
                    return None
                rows.append((ch, s, free))
                break
            else:
                # no consumer can take a message now: the one whose turn it is, for its FINs (each frees RDY)
                s = ch.consumers[start]
                if s.fin_fast_path(ch) and s.settings.sample_rate == 0 and w.direct_fd(s) >= 0:
                    fins_only.append((ch, s, s.rdy - s.in_flight))
        if len(rows) > MAX_ROWS:
            return None
        return rows + fins_only[:MAX_ROWS - len(rows)]

    def fins_done(self):
        """Python's share of the FINs the lane took (``own_fin``), before anything else looks at the sessions:
        what ``Channel.finish_one`` does after the release (``Channel.finished_one``). Their timers leave first:
        a freed slot may be in the round the lane's publish just delivered."""
        ow = self.words
        k = int(ow[OW_FINS])
        if not k:
            return
        ow[OW_FINS] = 0
        for r, slot in zip(ow[FN_ROW:FN_ROW + k].tolist(), ow[FN_SLOT:FN_SLOT + k].tolist()):
            ch, s = self.rows[r]
            ch.finished_one(s, slot)
        self.fins += k

    def done(self, n, forwarded=False):
        """The lane's kernel published the n staged messages to the armed topic (``forwarded``: n messages it
        drained from the input rings, ``own_drain``): Python's share (module docstring). The pump's OKs are
        settled after this."""
        t, ow, w = self.armed, self.words, self.worker
        self.armed = None
        if forwarded:
            self.drained += n
        else:
            self.published += n
        t.ids.last_tick, t.ids.sequence = int(ow[OW_TICK]), int(ow[OW_SEQ])
        lengths = ow[DR_LEN:DR_LEN + n] if forwarded else w.pump.st[ST_LEN, :n]
        t.count_appended(n, lengths)  # (it asks a delivery pass of each channel: see below)
        for r, (ch, s) in enumerate(self.rows):
            b = ROWS_AT + r * ROW
            got = int(ow[b + RW_GOT])
            if got <= 0:
                continue
            ch.served(s)
            w.send_frames(s, w.round_buffer, int(ow[b + RW_END]), int(ow[b + RW_SENT]))
            ch._started(s, ow[SLOTS_AT + r * MAX_N:SLOTS_AT + r * MAX_N + got], int(ow[b + RW_DEADLINE]))
            # its round took them all: what a delivery pass would mark, without the pass (pending held nothing
            # before: the lane runs only when the loop's idle step left no channel pending)
            if got == n:
                w.pending.discard(ch)
                w.channel_changed(ch)
        self.rows = []
