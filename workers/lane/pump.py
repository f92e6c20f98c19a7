"""The pump: a worker's socket reads, and the OKs of its lone PUBs, in compiled code.

Theory of operation
-------------------
A round-trip producer sends one PUB and waits for its OK. At that rate every Python bytecode on the way shows
(a worker spent ~8 us of interpreter time per PUB on top of ~8 us of kernel time), so the common case runs in
numba, with libc called directly (``nsqpy.ipc.sysio``):

* Every session's socket sits in the pump's own epoll set, which is itself one fd in the worker's loop. When
  it is readable, ``read`` makes one compiled call: ``epoll_wait`` (no wait), then ``recv`` for every ready
  socket into one big buffer. A read that is exactly one complete, valid PUB for a topic name the pump already
  knows, on a session whose parser holds nothing (``clean``), is *staged*: fd, body position, topic id. Every
  other read comes back as *data* for the session's parser (``Session.on_data``), and an end of stream or a
  socket error as *closed*. Python looks only at data and closed results. A read that is the start of a PUB or
  MPUB, its size included, first gets one more ``recv`` for exactly the rest (``short_by``): epoll may wake
  us while a big command is still arriving, and by then the rest often has (a batch producer writes its MPUB
  in one call), which spares that command the parser's Python path. Whatever that recv brings, the read is
  then judged as a whole, as before. The recognisers of a lone PUB or MPUB and ``short_by`` are V2 codec
  kernels (``nsqpy/protocol/v2_recognisers.py``), held there to the parser's byte tables.
* ``commit`` (the worker's idle step, once per loop iteration, before the buffer is reused) publishes each
  topic's staged bodies as one batch, straight from the buffer, and then ``_settle_and_send`` sends every OK in one
  compiled loop. A session with output already queued (``busy``), or whose OK did not fit in the socket, gets
  it through its write buffer instead, so replies never overtake each other. A batch the worker had to park (its
  ring to the owner is full: it keeps a copy) gets no OK now: its sessions are held until the worker commits it
  and answers them.
* Topic names enter the table only after the Python path validated them (a first PUB of a topic always goes
  through the parser), so the compiled check is a lookup, never a reimplementation of NSQ's name rules. The
  table holds MAX_TOPICS names; past that, further topics simply keep using the parser.
* Placement (--producer-placement): a one-message PUB/MPUB for a topic owned by another worker crosses a ring
  (the owner appends runs of such records with one call). ``spread`` keeps producers where the acceptor put
  them, so every worker shares the socket calls of a hot topic. ``owner`` hands a producer whose last MOVE_AFTER
  one-message commands all went to one other worker there (``Worker.move_producer``, the SUB hand-over).
  ``auto`` (the default) hands it there only when its windows of MOVE_AFTER come slowly (its usual window, the
  fastest of its recent ones, forgetting by time, at most ``move_in_rate`` a second: it adds little to the owner,
  and saves each message a process hop; a slow spell of a fast producer lasting tens of milliseconds is a hiccup,
  not a reason, and nor are the first WATCH_S of its streak); Python then also checks
  that the owner was asleep for most forwards, is not busy and is under its cap of moved producers. On the owner, a
  producer moved in whose MOVE_AFTER one-message commands to the owner's topics came faster than
  ``move_out_rate`` a second is listed to move out again (to the least loaded other worker): busy producers
  spread. So is every producer moved in but the last, at the end of its window, while the owner is busy
  (``set_load``: it used more than ``busy_share`` of a core over the last period; the worker publishes that in
  the control block, and no producer moves in while it holds). Without both rules, a round-trip producer that
  alone kept its owner over the busy share was moved out and back in, window after window. A third rule judges
  a move by its effect: a producer moved in whose fastest of its first JUDGE_WINDOWS windows on the owner takes
  SLOWER_AFTER_MOVE times as long as its last window before the move moves out too (its round trips got slower:
  the owner's loop serves it in turn with the owner's own producers, where before two cores did). A producer
  moved out once never moves in again, so no producer goes back and forth. A paced producer (its rate set by
  itself) keeps its pace in its fastest window and stays.
  Cost model in ARCHITECTURE.md.

Per-fd state lives in numpy arrays indexed by fd (grown on demand): ``gen`` (bumped whenever an fd joins or
leaves, so an OK staged for a connection that closed, maybe with its fd reused, is never sent), ``clean``,
``busy``, ``last_read`` (time.monotonic() of the last read: the read deadline between commands; the session
keeps when a partly received command began, see ``workers/domain/session.py``), the publish tally (count and topic of
the session's current run of lone PUBs, folded into ``Session.pub_counts`` when the topic changes or someone asks),
the move streak (its length, worker and when its current window of MOVE_AFTER began) and ``moved_in`` (the
producer was moved here because this worker owns its topics).

Resource handling: the epoll fd is the pump's; sockets stay owned by their sessions, which call ``remove``
before closing or handing one away.
"""
import select
import time

import numpy as np
from numba import int64, njit

from nsqpy.ipc.layout import read_only
from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE, warm_up_step
from nsqpy.ipc import sysio as S
from nsqpy.protocol.errors import MpubFailed, PubFailed
from nsqpy.protocol.frames import OK_FRAME
from nsqpy.protocol.names import MAX_NAME_LENGTH
from nsqpy.protocol.v2_recognisers import lone_mpub_line, lone_pub_line, short_by
from nsqpy.workers.lane.words import (CLOSED, CN_OTHER, CN_STAGED, CN_TOPICS, DATA, FD_BEST_SINCE, FD_BUSY, FD_CLEAN,
                                      FD_FLAG_ROWS, FD_GEN, FD_INT_ROWS, FD_LAST_READ, FD_MOVED_IN, FD_STAY_OUT,
                                      FD_STREAK, FD_STREAK_OWNER, FD_STREAK_T0, FD_TALLY, FD_TALLY_TOPIC, FD_TIME_ROWS,
                                      FD_TOOK_BEFORE, FD_WATCHED, MAX_EVENTS, MAX_STAGED, OUT_FD, OUT_KIND, OUT_LEN,
                                      OUT_OFF, OUT_ROWS, PUMP_WORDS, PW_EPFD, PW_MAX_BODY, PW_MAX_MSG, PW_ME, PW_MODE,
                                      ST_FD, ST_GEN, ST_LAST, ST_LEN, ST_N, ST_OFF, ST_ROWS, ST_SENT, ST_TOPIC,
                                      SW_COUNT, SW_FD, SW_MOVER, SW_ROWS, SW_TOPIC, TP_FAILED, TP_NAME_LEN, TP_OWNER,
                                      TP_ROWS, TP_FULL_AT, TP_FULL_VAL)

READ_SIZE = 64 * 1024       # one recv (glibc mmaps a Python bytes of >= 128 KiB: keep data copies below that)
BUFFER_SIZE = 8 << 20       # one read call's recvs; it stops taking sockets when less than READ_SIZE is left
MOVE_AFTER = 64             # one-message commands in a row to another worker's topics: the producer moves there
SLOWER_AFTER_MOVE = 1.25    # auto: a producer moved in whose window of MOVE_AFTER takes this much longer than its
                            # last one before the move (its round trips got slower) moves out again, for good
JUDGE_WINDOWS = 4           # auto: ... its window there being the fastest of its first this many on the owner
USUAL_GROWS_PER_S = 1.0     # auto: a producer's usual window is its fastest recent one, which grows by this share of
                            # itself per second of windows since (compounded: e-fold a second), so a producer that
                            # really slows down is seen as slow within a second or two, while a hiccup of the host
                            # (tens of ms: hundreds of windows of a fast producer) is not; per window, as before,
                            # a fast producer forgot its pace in a few milliseconds and moved in on any hiccup
WATCH_S = 0.5               # auto: a producer moves in only once its streak to the owner's topics is this old (its
                            # first windows, on a fresh connection or broker, are no measure of its pace)
SPREAD, OWNER, AUTO = 0, 1, 2  # --producer-placement
PLACEMENTS = {"spread": SPREAD, "owner": OWNER, "auto": AUTO}
RATE_IN, RATE_OUT, OWNER_BUSY, MOVED_HERE = 0, 1, 2, 3  # auto: a producer moves to its topics' owner at most
                            # rates[RATE_IN] one-message commands a second, and out again faster than
                            # rates[RATE_OUT], or at any rate while rates[OWNER_BUSY] is 1 (the owner used over
                            # busy_share of a core) and it is not the last of the rates[MOVED_HERE] producers
                            # moved in that this worker serves
MAX_TOPICS = 4096
TABLE_SLOTS = 8192          # open addressing, at most half full
FAILED, PARKED = 1, 2       # a staged topic's outcome in ``failed``: refused (topic full), or waiting for room
OK_SIZE = len(OK_FRAME)
PUB_VERB, MPUB_VERB = (PubFailed, "PUB"), (MpubFailed, "MPUB")  # a staged command's error class and verb


@njit(inline="always", **JIT_CALLEE)
def _name_hash(buf, start, n):
    h = np.uint64(1469598103934665603)
    for i in range(n):
        h = (h ^ np.uint64(buf[start + i])) * np.uint64(1099511628211)
    return np.int64(h & np.uint64(TABLE_SLOTS - 1))


@njit(**JIT)
def find_topic(buf, start, n, names, name_lens, table):
    """The id of the topic named buf[start:start+n], or -1."""
    slot = _name_hash(buf, start, n)
    while True:
        t = table[slot]
        if t < 0:
            return -1
        if name_lens[t] == n:
            same = True
            for i in range(n):
                if names[t, i] != buf[start + i]:
                    same = False
                    break
            if same:
                return t
        slot = (slot + 1) & (TABLE_SLOTS - 1)


@njit(**JIT)
def _insert_topic(name, names, name_lens, table, t):
    n = name.size
    slot = _name_hash(name, 0, n)
    while table[slot] >= 0:
        slot = (slot + 1) & (TABLE_SLOTS - 1)
    for i in range(n):  # not names[t, :n] = name: a slice assignment compiles numba's broadcasting
        names[t, i] = name[i]
    name_lens[t] = n
    table[slot] = t


@njit(inline="always", **JIT_CALLEE)
def _stage(st, k, fd, fd_gen, t, off, length, n, last):
    st[ST_FD, k] = fd
    st[ST_GEN, k] = fd_gen
    st[ST_TOPIC, k] = t
    st[ST_OFF, k] = off
    st[ST_LEN, k] = length
    st[ST_N, k] = n
    st[ST_LAST, k] = last


@njit(locals={"cur": int64}, **JIT)  # cur = 0 would first compile lone_*_line for Literal[int](0)
def _read(counts, events, buf, fd_int, fd_flags, fd_times, names, topics, table, st, out):
    """One pass over the ready sockets (module docstring): stage lone PUBs and MPUBs in ``st``, list the rest in
    ``out``, totals in ``counts`` (the blocks are words.py's)."""
    counts[CN_STAGED] = 0
    counts[CN_OTHER] = 0
    counts[CN_TOPICS] = 0
    n = S.epoll_wait(counts[PW_EPFD], events.ctypes.data, MAX_EVENTS, 0)
    if n <= 0:
        return
    max_msg, max_body = counts[PW_MAX_MSG], counts[PW_MAX_BODY]
    clean, last_read, gen, name_lens = fd_flags[FD_CLEAN], fd_times[FD_LAST_READ], fd_int[FD_GEN], topics[TP_NAME_LEN]
    now = S.monotonic()
    cur = 0
    staged = 0
    other = 0
    for i in range(n):
        if cur + READ_SIZE > buf.size:
            break  # level-triggered: the rest are reported again next time
        fd = S.event_data(events, i)
        got = S.recv_into(fd, buf, cur, READ_SIZE)
        if got == -1:
            continue  # nothing there after all
        if got <= 0:
            out[OUT_FD, other] = fd
            out[OUT_KIND, other] = CLOSED
            other += 1
            continue
        last_read[fd] = now
        if clean[fd] and staged < MAX_STAGED:
            short = short_by(buf, cur, got)
            if 0 < short <= READ_SIZE - got:
                # the rest of a PUB/MPUB the kernel had only partly received when epoll woke us: by now it has
                # often arrived (the sender wrote it in one call), and one recv spares the parser's Python path
                more = S.recv_into(fd, buf, cur + got, short)
                if more > 0:
                    got += more
            nl = lone_pub_line(buf, cur, got, max_msg)
            if nl > 0:
                t = find_topic(buf, cur + 4, nl - 4, names, name_lens, table)
                if t >= 0:
                    if staged and t != st[ST_TOPIC, 0]:
                        counts[CN_TOPICS] = 1  # more than one topic: commit groups them
                    _stage(st, staged, fd, gen[fd], t, cur + nl + 5, got - nl - 5, 1, 1)
                    staged += 1
                    cur += got
                    continue
            else:
                nl, n = lone_mpub_line(buf, cur, got, max_msg, max_body)
                if nl > 0 and staged + n <= MAX_STAGED:
                    t = find_topic(buf, cur + 5, nl - 5, names, name_lens, table)
                    if t >= 0:
                        if staged and t != st[ST_TOPIC, 0]:
                            counts[CN_TOPICS] = 1
                        p = cur + nl + 9
                        for k in range(n):
                            size = S.be32(buf, p)
                            _stage(st, staged, fd, gen[fd], t, p + 4, size, n, 1 if k == n - 1 else 0)
                            staged += 1
                            p += 4 + size
                        cur += got
                        continue
        out[OUT_FD, other] = fd
        out[OUT_KIND, other] = DATA
        out[OUT_OFF, other] = cur
        out[OUT_LEN, other] = got
        other += 1
        cur += got
    counts[CN_STAGED] = staged
    counts[CN_OTHER] = other


@njit(**JIT_CALLEE)
def _streak(fd, worker, now, streak, streak_owner, streak_t0):
    """Count one more one-message command of fd's to topics of ``worker``; -> the seconds its last MOVE_AFTER
    took when this one completes a window of MOVE_AFTER (the next window starts now), else -1."""
    if streak_owner[fd] != worker:
        streak_owner[fd] = worker
        streak[fd] = 0
    if streak[fd] == 0:
        streak_t0[fd] = now
    streak[fd] += 1
    if streak[fd] % MOVE_AFTER:
        return -1.0
    took = now - streak_t0[fd]
    streak_t0[fd] = now
    return took


@njit(**JIT)
def move_decision(fd, owner, me, mode, rates, now, streak, streak_owner, streak_t0, moved_in, took_before, best_since,
                  stay_out, watched):
    """After a one-message command of fd's to a topic of worker ``owner``: should the producer move (to the
    owner, or out of it: Python tells which by ``streak_owner[fd] == me``)? Called again every MOVE_AFTER, so a
    move that was put off is asked for again. Under auto, ``took_before`` holds the producer's usual window
    where it is not on the owner, and its last window once it asks to move in (the hand-over takes that along, to
    judge the move by: ``best_since`` keeps the fastest window on the owner); a producer that moved out once
    (``stay_out``) never moves in again."""
    if owner == me:
        if mode != AUTO or not moved_in[fd]:
            streak[fd] = 0
            return False
        took = _streak(fd, me, now, streak, streak_owner, streak_t0)
        if took < 0:
            return False
        # faster than that, or this worker is busy and has others moved in: spread again (the last one stays: moving
        # it out would make its own round trips a hop longer, and the owner's load falls and takes it back)
        if (rates[OWNER_BUSY] > 0 and rates[MOVED_HERE] > 1) or took * rates[RATE_OUT] < MOVE_AFTER:
            return True
        if took_before[fd] <= 0:
            return False
        # or its round trips got slower here than where it came from (the owner serialises it with its own
        # producers): the move did not pay, go back. Judged by the fastest of its first JUDGE_WINDOWS windows
        # here, as a paced producer's windows wobble with the host but its fastest stays at its pace
        if best_since[fd] <= 0 or took < best_since[fd]:
            best_since[fd] = took
        return streak[fd] >= JUDGE_WINDOWS * MOVE_AFTER and best_since[fd] > took_before[fd] * SLOWER_AFTER_MOVE
    if mode == SPREAD or (mode == AUTO and stay_out[fd]):
        return False
    took = _streak(fd, owner, now, streak, streak_owner, streak_t0)
    if took < 0:
        return False
    if mode == OWNER:
        return True
    if streak[fd] == MOVE_AFTER:  # the streak's first window: it is watched from where that began
        watched[fd] = now - took
    # auto: only a producer slow in its usual window moves in (the fastest recent one, forgetting a little with
    # each second of windows: a hiccup of the host, however many windows of a fast producer it slows, does not
    # move it), and only once it was watched WATCH_S
    usual = took_before[fd] * (1.0 + USUAL_GROWS_PER_S * took)
    if usual <= 0 or took < usual:
        usual = took
    if usual * rates[RATE_IN] < MOVE_AFTER or now - watched[fd] < WATCH_S:
        took_before[fd] = usual
        return False
    took_before[fd] = took  # the hand-over carries its last window (not the usual, its fastest): the owner judges
    return True             # the move by it


@njit(**JIT)
def _settle_and_send(st, n, counts, fd_int, fd_flags, fd_times, topics, frame, sw, rates, now):
    """After the staged messages were published: count each in its session's tally and, at the last message of
    each command (ST_LAST), send its OK, unless its connection is gone (FD_GEN changed: ST_SENT -2), its topic
    failed (TP_FAILED FAILED: -3) or waits for room in the ring to its owner (PARKED: -4, the OK comes once it is
    committed), or output is queued (FD_BUSY) or the socket took less than the frame (-1 / bytes sent: Python
    queues the rest). Messages that are not the last of their command need nothing (ST_SENT = the frame's size).
    A session that switched topics has its old tally reported in sw (SW_FD, SW_TOPIC, SW_COUNT) for Python to
    fold. A producer that should move (``move_decision``) is listed in sw's SW_MOVER row. Returns (tallies
    reported, OKs needing Python, movers)."""
    gen, tally, tally_topic = fd_int[FD_GEN], fd_int[FD_TALLY], fd_int[FD_TALLY_TOPIC]
    streak, streak_owner = fd_int[FD_STREAK], fd_int[FD_STREAK_OWNER]
    busy, moved_in, streak_t0 = fd_flags[FD_BUSY], fd_flags[FD_MOVED_IN], fd_times[FD_STREAK_T0]
    took_before, best_since, stay_out = fd_times[FD_TOOK_BEFORE], fd_times[FD_BEST_SINCE], fd_flags[FD_STAY_OUT]
    watched = fd_times[FD_WATCHED]
    failed, topic_owner, sent, movers = topics[TP_FAILED], topics[TP_OWNER], st[ST_SENT], sw[SW_MOVER]
    me, mode = counts[PW_ME], counts[PW_MODE]
    k = 0
    attention = 0
    m = 0
    for i in range(n):
        fd = st[ST_FD, i]
        t = st[ST_TOPIC, i]
        last = st[ST_LAST, i] == 1
        sent[i] = frame.size
        if gen[fd] != st[ST_GEN, i]:
            if last:
                sent[i] = -2
        elif failed[t]:
            if last:
                sent[i] = -3 if failed[t] == FAILED else -4
        else:
            if tally_topic[fd] != t:
                if tally[fd] > 0:
                    sw[SW_FD, k] = fd
                    sw[SW_TOPIC, k] = tally_topic[fd]
                    sw[SW_COUNT, k] = tally[fd]
                    k += 1
                tally_topic[fd] = t
                tally[fd] = 0
            tally[fd] += 1
            if not last:
                continue
            # a round trip of one message may move the producer (batches are split by forwarding)
            if (st[ST_N, i] == 1 and move_decision(fd, topic_owner[t], me, mode, rates, now, streak, streak_owner,
                                                  streak_t0, moved_in, took_before, best_since, stay_out, watched)
                    and m < movers.size):
                movers[m] = fd
                m += 1
            if busy[fd]:
                sent[i] = -1
            else:
                sent[i] = S.send_from(fd, frame, 0, frame.size)
        if sent[i] != frame.size:
            attention += 1
    return k, attention, m


class PumpPeer:
    """Just enough of a Session for the pump (what it reads and writes of one): warm-up's stand-in, in the
    supervisor's warm-up (workers/lane/warmup.py) and the lane's (workers/lane/fastlane.py)."""

    def __init__(self, fd):
        self.fd = fd
        self.wbuf = b""
        self.pub_counts = {}
        self.moved_in = False
        self.moved_in_took = 0.0
        self.stay_out = False
        self.data = []

    def on_data(self, data):
        self.data.append(data)


class Pump:
    def __init__(self, max_msg_size, me=0, mode=OWNER, max_body_size=5 << 20, rates=(20_000, 40_000),
                 busy_share=0.8):
        self.max_msg = max_msg_size
        self.max_body = max_body_size
        self.me = me
        self.mode = mode  # --producer-placement: SPREAD, OWNER or AUTO
        self.rates = np.array((*rates, 0, 0), np.float64)  # AUTO's move-in and move-out rates, OWNER_BUSY, MOVED_HERE
        self.busy_share = busy_share
        self.ep = select.epoll()
        self.epfd = self.ep.fileno()
        self.buf = np.empty(BUFFER_SIZE, np.uint8)
        self.bodies = read_only(self.buf)  # what publish gets: the kernels it calls take sources read-only
        self.ok_frame = np.frombuffer(OK_FRAME, np.uint8).copy()
        self.events = S.events_buffer(MAX_EVENTS)
        self.sessions = {}   # fd -> Session
        self._fd_arrays(1024)
        self.names = np.zeros((MAX_TOPICS, MAX_NAME_LENGTH), np.uint8)
        self.topic_words = np.zeros((TP_ROWS, MAX_TOPICS), np.int64)  # words.py: rows TP_*
        self.topic_words[TP_FULL_VAL] = -1
        self.name_lens, self.topic_owner = self.topic_words[TP_NAME_LEN], self.topic_words[TP_OWNER]
        self.failed = self.topic_words[TP_FAILED]
        self.table = np.full(TABLE_SLOTS, -1, np.int64)
        self.topics = []     # id -> name
        self.topic_ids = {}  # name -> id
        self.st = np.zeros((ST_ROWS, MAX_STAGED), np.int64)  # the staged messages (words.py: rows ST_*)
        self.sent = self.st[ST_SENT]
        self.sw = np.zeros((SW_ROWS, MAX_EVENTS), np.int64)  # words.py: rows SW_*
        self.movers = self.sw[SW_MOVER]
        self.out = np.zeros((OUT_ROWS, MAX_EVENTS), np.int64)  # the reads for Python (words.py: rows OUT_*)
        self.counts = np.zeros(PUMP_WORDS, np.int64)  # words.py: CN_* (a read's totals), PW_* (these settings)
        self.counts[PW_EPFD], self.counts[PW_ME], self.counts[PW_MODE] = self.epfd, me, mode
        self.counts[PW_MAX_MSG], self.counts[PW_MAX_BODY] = max_msg_size, max_body_size
        self.staged = 0

    # the per-fd state (words.py: FD_*): (block, row, attribute of that row's view, fill)
    _FD_ARRAYS = (("fd_int", FD_GEN, "gen", 0), ("fd_flags", FD_CLEAN, "clean", 0),
                  ("fd_flags", FD_BUSY, "busy", 0), ("fd_times", FD_LAST_READ, "last_read", 0),
                  ("fd_int", FD_TALLY, "tally", 0), ("fd_int", FD_TALLY_TOPIC, "tally_topic", -1),
                  ("fd_int", FD_STREAK, "streak", 0), ("fd_int", FD_STREAK_OWNER, "streak_owner", -1),
                  ("fd_times", FD_STREAK_T0, "streak_t0", 0), ("fd_flags", FD_MOVED_IN, "moved_in", 0),
                  ("fd_times", FD_TOOK_BEFORE, "took_before", 0), ("fd_times", FD_BEST_SINCE, "best_since", 0),
                  ("fd_flags", FD_STAY_OUT, "stay_out", 0), ("fd_times", FD_WATCHED, "watched", 0))
    _FD_BLOCKS = (("fd_int", FD_INT_ROWS, np.int64), ("fd_flags", FD_FLAG_ROWS, np.uint8),
                  ("fd_times", FD_TIME_ROWS, np.float64))

    def _fd_arrays(self, size):
        """(Re)allocate the per-fd blocks for fds below ``size``, keeping what they held; each row is also an
        attribute (``gen``, ``clean``, ...: views, so a write through one is the kernels')."""
        old = {name: getattr(self, name, None) for name, _, _ in self._FD_BLOCKS}
        for name, rows, dtype in self._FD_BLOCKS:
            setattr(self, name, np.zeros((rows, size), dtype))
        for name, row, attr, fill in self._FD_ARRAYS:
            block = getattr(self, name)
            block[row] = fill
            if old[name] is not None:
                block[row, :old[name].shape[1]] = old[name][row]
            setattr(self, attr, block[row])

    # ---- membership ------------------------------------------------------------------------------------
    def add(self, session, now):
        fd = session.fd
        while fd >= self.gen.size:
            self._fd_arrays(self.gen.size * 2)
        self.gen[fd] += 1
        self.busy[fd] = 1 if session.wbuf else 0  # output queued before the pump knew the fd goes first
        self.clean[fd] = 0
        self.last_read[fd] = now
        self.tally[fd] = 0
        self.tally_topic[fd] = -1
        self.streak[fd] = 0
        self.streak_owner[fd] = -1
        self.moved_in[fd] = 1 if session.moved_in else 0
        self.took_before[fd] = session.moved_in_took if session.moved_in else 0.0
        self.best_since[fd] = 0.0
        self.stay_out[fd] = 1 if session.stay_out else 0
        self.rates[MOVED_HERE] += self.moved_in[fd]
        self.sessions[fd] = session
        self.ep.register(fd, select.EPOLLIN)

    def remove(self, session):
        fd = session.fd
        if self.sessions.get(fd) is not session:
            return
        self.settle(session)
        del self.sessions[fd]
        self.gen[fd] += 1
        self.rates[MOVED_HERE] -= self.moved_in[fd]
        self.moved_in[fd] = 0
        self.stay_out[fd] = 0
        self.pause(fd)

    def pause(self, fd):
        try:
            self.ep.unregister(fd)
        except (OSError, ValueError):
            pass

    def resume(self, fd):
        self.ep.register(fd, select.EPOLLIN)

    def learn_topic(self, name, owner):
        """A topic name the parser accepted (owned by worker ``owner``): lone PUBs to it may be staged now."""
        if name in self.topic_ids or len(self.topics) >= MAX_TOPICS:
            return
        t = len(self.topics)
        self.topic_owner[t] = owner
        _insert_topic(np.frombuffer(name.encode(), np.uint8), self.names, self.name_lens, self.table, t)
        self.topics.append(name)
        self.topic_ids[name] = t

    def set_load(self, cpu_s, wall_s):
        """This worker used cpu_s of CPU in the last wall_s seconds: above busy_share of a core, the producers
        moved here (auto) move out at the end of their current window, all but the last. -> whether it was busy
        (the worker publishes it: no producer moves in while it is)."""
        busy = cpu_s > self.busy_share * wall_s
        self.rates[OWNER_BUSY] = 1.0 if busy else 0.0
        return busy

    def settle(self, session):
        """Fold the session's tally of lone PUBs into its pub_counts."""
        fd = session.fd
        t = int(self.tally_topic[fd])
        if t >= 0 and self.tally[fd]:
            topic = self.topics[t]
            session.pub_counts[topic] = session.pub_counts.get(topic, 0) + int(self.tally[fd])
        self.tally[fd] = 0

    # ---- reading ---------------------------------------------------------------------------------------
    def read(self):
        """One compiled pass over the ready sockets; data and closed results go to their sessions."""
        _read(self.counts, self.events, self.buf, self.fd_int, self.fd_flags, self.fd_times, self.names,
              self.topic_words, self.table, self.st, self.out)
        self.after_read()

    def after_read(self):
        """Take the results of a compiled read (``_read``, here or in the forward lane): what it staged is
        committed by ``commit``; data and closed results go to their sessions now."""
        self.staged = int(self.counts[CN_STAGED])
        other = int(self.counts[CN_OTHER])
        if not other:
            return
        out, buf, sessions = self.out, self.buf, self.sessions
        for fd, kind, off, n in zip(*out[:, :other].tolist()):
            s = sessions.get(fd)
            if s is None:
                continue
            if kind == CLOSED:
                s.close()
            else:
                s.on_data(buf[off:off + n].tobytes())

    # ---- committing ------------------------------------------------------------------------------------
    def commit(self, publish, move):
        """Publish what ``read`` staged: ``publish(topic, buf, offsets, lengths)`` for each topic -> True
        (stored), False (refused: E_PUB_FAILED) or a parked publish (the ring to the topic's owner is full: it
        kept a copy, and each of its sessions is added to it with ``parked.add(session)``, which stops reading
        the session until the OK can go); then the OKs, then ``move(session, worker)`` for each producer that
        should live with its topics' owner. Must run before the next ``read`` (the bodies are still in the read
        buffer). A session that ``publish`` closed gets no OK (its generation changed)."""
        n = self.staged
        if not n:
            return
        self.staged = 0
        st = self.st
        topics, offs, lens = st[ST_TOPIC, :n], st[ST_OFF, :n], st[ST_LEN, :n]
        failed = {}
        if not self.counts[CN_TOPICS]:
            t = int(topics[0])
            ok = publish(self.topics[t], self.bodies, offs, lens)
            if ok is not True:
                failed[t] = ok
        else:
            for t in np.unique(topics).tolist():
                sel = topics == t
                ok = publish(self.topics[t], self.bodies, offs[sel], lens[sel])
                if ok is not True:
                    failed[t] = ok
        for t, ok in failed.items():
            self.failed[t] = FAILED if ok is False else PARKED
        k, attention, m = _settle_and_send(st, n, self.counts, self.fd_int, self.fd_flags, self.fd_times,
                                           self.topic_words, self.ok_frame, self.sw, self.rates, time.monotonic())
        self.settled(n, k, attention, m, failed, move)

    def settled(self, n, k, attention, m, failed, move):
        """What Python must do after ``_settle_and_send`` answered the n staged messages (here, or in the
        forward lane): fold the k tallies it reported, answer the ``attention`` OKs it could not send (through
        the session: refused, parked, or behind queued output), and move its m movers."""
        st, sent, sw = self.st, self.sent[:n], self.sw
        fds, topics = st[ST_FD, :n], st[ST_TOPIC, :n]
        for fd, t, count in zip(sw[SW_FD, :k].tolist(), sw[SW_TOPIC, :k].tolist(), sw[SW_COUNT, :k].tolist()):
            counts = self.sessions[fd].pub_counts
            counts[self.topics[t]] = counts.get(self.topics[t], 0) + count
        if attention:
            for i in np.flatnonzero(sent != OK_SIZE).tolist():
                s = self.sessions.get(int(fds[i]))
                if s is None or sent[i] == -2:
                    continue  # the connection went away before its OK
                n_msgs = int(st[ST_N, i])
                if sent[i] == -3:
                    s.pub_failed(self.topics[int(topics[i])], MPUB_VERB if n_msgs > 1 else PUB_VERB)
                elif sent[i] == -4:
                    failed[int(topics[i])].add(s, n_msgs, *(MPUB_VERB if n_msgs > 1 else PUB_VERB))
                else:  # output was queued before it, or the socket took only part of it
                    s.write(OK_FRAME[max(int(sent[i]), 0):])
        for t in failed:
            self.failed[t] = 0
        if m:
            self._move(self.movers[:m].tolist(), move)

    def _move(self, fds, move):
        """``move(session, worker)`` for each producer listed by ``move_decision``: worker is the owner of its
        topics, or -1 to move a producer out of this worker (the owner) to another."""
        for fd in fds:
            s = self.sessions.get(fd)
            if s is not None:
                owner = int(self.streak_owner[fd])
                move(s, -1 if owner == self.me else owner)

    def close(self):
        self.ep.close()


@warm_up_step
def warm_up():
    """The pump's kernels with the broker's argument types: a read that stages a lone PUB, its commit and OK
    (workers/lane/warmup.py schedules this before fork)."""
    import socket
    from nsqpy.protocol import client as enc
    from nsqpy.workers.publishing.records import pack_forward
    here, there = socket.socketpair()
    pump = Pump(1 << 20)
    try:
        here.setblocking(False)
        peer = PumpPeer(here.fileno())
        pump.add(peer, time.monotonic())
        pump.clean[peer.fd] = 1
        pump.learn_topic("t", 0)
        there.sendall(enc.pub("t", b"x"))
        select.select([here], [], [], 5)
        pump.read()
        out = np.empty(64, np.uint8)
        pump.commit(lambda topic, buf, offsets, lengths: pack_forward(out, b"t", buf, offsets, lengths, 0, 0).size > 0,
                    lambda session, worker: None)
        there.recv(64)
        pump.remove(peer)
    finally:
        pump.close()
        here.close()
        there.close()
