"""The pump: a worker's socket reads, and the OKs of its lone PUBs, in compiled code.

Theory of operation
-------------------
A round-trip producer sends one PUB and waits for its OK. At that rate every Python bytecode on the way shows
(a worker spent ~8 us of interpreter time per PUB on top of ~8 us of kernel time), so the common case runs in
numba, with libc called directly (``ipc.sysio``):

* Every session's socket sits in the pump's own epoll set, which is itself one fd in the worker's loop. When
  it is readable, ``read`` makes one compiled call: ``epoll_wait`` (no wait), then ``recv`` for every ready
  socket into one big buffer. A read that is exactly one complete, valid PUB for a topic name the pump already
  knows, on a session whose parser holds nothing (``clean``), is *staged*: fd, body position, topic id. Every
  other read comes back as *data* for the session's parser (``Session.on_data``), and an end of stream or a
  socket error as *closed*. Python looks only at data and closed results.
* ``commit`` (the worker's idle step, once per loop iteration, before the buffer is reused) publishes each
  topic's staged bodies as one batch, straight from the buffer, and then ``_settle_and_send`` sends every OK in one
  compiled loop. A session with output already queued (``busy``), or whose OK did not fit in the socket, gets
  it through its write buffer instead, so replies never overtake each other. A batch the worker had to park (its
  ring to the owner is full: it keeps a copy) gets no OK now: its sessions are held until the worker commits it
  and answers them.
* Topic names enter the table only after the Python path validated them (a first PUB of a topic always goes
  through the parser), so the compiled check is a lookup, never a reimplementation of NSQ's name rules. The
  table holds MAX_TOPICS names; past that, further topics simply keep using the parser.
* Producers move to their topics' owner. A lone PUB for a topic owned by another worker crosses a ring, and
  the owner pays per ring record; a producer whose last MOVE_AFTER lone PUBs all went to one other worker is
  handed there (``Worker.move_producer``, the SUB hand-over), but only once MOVE_CROWD producers here qualify
  for the same worker: one or two round-trip producers per worker are latency-bound, and spreading them keeps
  both cores awake (measurements in ARCHITECTURE.md).

Per-fd state lives in numpy arrays indexed by fd (grown on demand): ``gen`` (bumped whenever an fd joins or
leaves, so an OK staged for a connection that closed, maybe with its fd reused, is never sent), ``clean``,
``busy``, ``last_read`` (time.monotonic() of the last read: the read deadline between commands; the session
keeps when a partly received command began, see ``workers/session.py``), the publish tally (count and topic of
the session's current run of lone PUBs, folded into ``Session.pub_counts`` when the topic changes or someone asks)
and the move streak.

Resource handling: the epoll fd is the pump's; sockets stay owned by their sessions, which call ``remove``
before closing or handing one away.
"""
import os
import select
import time

import numpy as np
from numba import njit

from ipc import sysio as S
from nsqpy.protocol.frames import OK_FRAME
from nsqpy.protocol.names import MAX_NAME_LENGTH
from workers.records import pack_bodies  # noqa: F401 (warm-up imports it from here)

READ_SIZE = 64 * 1024       # one recv (glibc mmaps a Python bytes of >= 128 KiB: keep data copies below that)
BUFFER_SIZE = 8 << 20       # one read call's recvs; it stops taking sockets when less than READ_SIZE is left
MAX_EVENTS = 1024
MOVE_AFTER = 64             # lone PUBs in a row to another worker's topics: the producer may move there...
MOVE_CROWD = 4              # ...once this many producers here may move to the same worker (see ARCHITECTURE.md)
FOLLOW_S = 1.0              # after a crowd moved, seconds during which single producers follow it
SPREAD_MIN_CPUS = 4         # --producer-placement=auto: spread producers when nsqd can use this many CPUs
MAX_TOPICS = 4096
TABLE_SLOTS = 8192          # open addressing, at most half full
DATA, CLOSED = 1, 2
FAILED, PARKED = 1, 2       # a staged topic's outcome in ``failed``: refused (topic full), or waiting for room
OK_SIZE = len(OK_FRAME)
_PUB = np.frombuffer(b"PUB ", np.uint8).copy()


@njit(cache=True)
def _name_hash(buf, start, n):
    h = np.uint64(1469598103934665603)
    for i in range(n):
        h = (h ^ np.uint64(buf[start + i])) * np.uint64(1099511628211)
    return np.int64(h & np.uint64(TABLE_SLOTS - 1))


@njit(cache=True)
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


@njit(cache=True)
def _insert_topic(name, names, name_lens, table, t):
    n = name.size
    slot = _name_hash(name, 0, n)
    while table[slot] >= 0:
        slot = (slot + 1) & (TABLE_SLOTS - 1)
    names[t, :n] = name
    name_lens[t] = n
    table[slot] = t


@njit(cache=True)
def lone_pub_line(buf, at, got, max_msg):
    """The offset of the "\\n" when buf[at:at+got] is exactly one `PUB <name>\\n<size><body>` with
    0 < size <= max_msg (the name is not checked here), else -1."""
    if got < 11:
        return -1
    for i in range(4):
        if buf[at + i] != _PUB[i]:
            return -1
    nl = -1
    for i in range(5, min(got, 4 + MAX_NAME_LENGTH + 1)):
        if buf[at + i] == 10:
            nl = i
            break
    if nl < 0 or nl + 5 >= got:
        return -1
    size = S.be32(buf, at + nl + 1)
    if size <= 0 or size > max_msg or nl + 5 + size != got:
        return -1
    return nl


@njit(cache=True)
def _read(epfd, events, buf, max_msg, clean, last_read, gen, names, name_lens, table,
          st_fd, st_gen, st_topic, st_off, st_len, out_fd, out_kind, out_off, out_len, counts):
    counts[0] = 0
    counts[1] = 0
    counts[2] = 0
    n = S.epoll_wait(epfd, events.ctypes.data, MAX_EVENTS, 0)
    if n <= 0:
        return
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
            out_fd[other] = fd
            out_kind[other] = CLOSED
            other += 1
            continue
        last_read[fd] = now
        if clean[fd]:
            nl = lone_pub_line(buf, cur, got, max_msg)
            if nl > 0:
                t = find_topic(buf, cur + 4, nl - 4, names, name_lens, table)
                if t >= 0:
                    if staged and t != st_topic[0]:
                        counts[2] = 1  # more than one topic: commit groups them
                    st_fd[staged] = fd
                    st_gen[staged] = gen[fd]
                    st_topic[staged] = t
                    st_off[staged] = cur + nl + 5
                    st_len[staged] = got - nl - 5
                    staged += 1
                    cur += got
                    continue
        out_fd[other] = fd
        out_kind[other] = DATA
        out_off[other] = cur
        out_len[other] = got
        other += 1
        cur += got
    counts[0] = staged
    counts[1] = other


@njit(cache=True)
def _settle_and_send(st_fd, st_gen, st_topic, failed, n, gen, busy, tally, tally_topic, frame, sent, sw,
                     me, topic_owner, streak, streak_owner, movers):
    """After the staged PUBs were published: count each in its session's tally and send its OK, unless its
    connection is gone (gen changed: sent -2), its topic failed (failed[topic] FAILED: sent -3) or waits for room
    in the ring to its owner (PARKED: sent -4, the OK comes once it is committed), or output is queued
    (busy) or the socket took less than the frame (sent -1 / bytes sent: Python queues the rest).
    A session that switched topics has its old tally reported in sw (fd, topic, count) for Python to fold.
    A session whose last MOVE_AFTER lone PUBs all went to topics of one other worker is listed in movers.
    Returns (tallies reported, OKs needing Python, movers)."""
    k = 0
    attention = 0
    m = 0
    for i in range(n):
        fd = st_fd[i]
        t = st_topic[i]
        if gen[fd] != st_gen[i]:
            sent[i] = -2
        elif failed[t]:
            sent[i] = -3 if failed[t] == FAILED else -4
        else:
            if tally_topic[fd] != t:
                if tally[fd] > 0:
                    sw[0, k] = fd
                    sw[1, k] = tally_topic[fd]
                    sw[2, k] = tally[fd]
                    k += 1
                tally_topic[fd] = t
                tally[fd] = 0
            tally[fd] += 1
            owner = topic_owner[t]
            if owner == me:
                streak[fd] = 0
            else:
                if streak_owner[fd] != owner:
                    streak_owner[fd] = owner
                    streak[fd] = 0
                streak[fd] += 1
                if streak[fd] == MOVE_AFTER:
                    movers[m] = fd
                    m += 1
            if busy[fd]:
                sent[i] = -1
            else:
                sent[i] = S.send_from(fd, frame, 0, frame.size)
        if sent[i] != frame.size:
            attention += 1
    return k, attention, m


def moves_producers(placement, workers, cpus=None):
    """--producer-placement: do round-trip producers move to their topics' owner? (ARCHITECTURE.md: with few
    CPUs the forwarding's extra CPU costs more than one worker doing all socket calls; with more, spreading the
    socket calls over every worker wins.)"""
    if placement != "auto":
        return placement == "owner"
    if cpus is None:
        cpus = len(os.sched_getaffinity(0))
    return min(workers, cpus) < SPREAD_MIN_CPUS


class Pump:
    def __init__(self, max_msg_size, me=0, move=True):
        self.max_msg = max_msg_size
        self.me = me
        self.move = move  # round-trip producers may move to their topics' owner (moves_producers)
        self.ep = select.epoll()
        self.epfd = self.ep.fileno()
        self.buf = np.empty(BUFFER_SIZE, np.uint8)
        self.ok_frame = np.frombuffer(OK_FRAME, np.uint8).copy()
        self.events = S.events_buffer(MAX_EVENTS)
        self.sessions = {}   # fd -> Session
        self._fd_arrays(1024)
        self.names = np.zeros((MAX_TOPICS, MAX_NAME_LENGTH), np.uint8)
        self.name_lens = np.zeros(MAX_TOPICS, np.int64)
        self.table = np.full(TABLE_SLOTS, -1, np.int64)
        self.topics = []     # id -> name
        self.topic_ids = {}  # name -> id
        self.st = {k: np.zeros(MAX_EVENTS, np.int64) for k in ("fd", "gen", "topic", "off", "len", "sent")}
        self.failed = np.zeros(MAX_TOPICS, np.uint8)
        self.topic_owner = np.zeros(MAX_TOPICS, np.int64)
        self.movers = np.zeros(MAX_EVENTS, np.int64)
        self.candidates = {}  # worker -> sessions that may move there (see _move_crowds)
        self.moved_at = {}    # worker -> when a crowd last moved there
        self.sw = np.zeros((3, MAX_EVENTS), np.int64)
        self.out = {k: np.zeros(MAX_EVENTS, np.int64) for k in ("fd", "kind", "off", "len")}
        self.counts = np.zeros(3, np.int64)
        self.staged = 0

    _FD_ARRAYS = (("gen", np.int64, 0), ("clean", np.uint8, 0), ("busy", np.uint8, 0),
                  ("last_read", np.float64, 0), ("tally", np.int64, 0), ("tally_topic", np.int64, -1),
                  ("streak", np.int64, 0), ("streak_owner", np.int64, -1))

    def _fd_arrays(self, size):
        """(Re)allocate the per-fd arrays for fds below ``size``, keeping what they held."""
        for name, dtype, fill in self._FD_ARRAYS:
            arr = np.full(size, fill, dtype)
            old = getattr(self, name, None)
            if old is not None:
                arr[:old.size] = old
            setattr(self, name, arr)

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
        self.sessions[fd] = session
        self.ep.register(fd, select.EPOLLIN)

    def remove(self, session):
        fd = session.fd
        if self.sessions.get(fd) is not session:
            return
        self.settle(session)
        del self.sessions[fd]
        self.gen[fd] += 1
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
        st, out = self.st, self.out
        _read(self.epfd, self.events, self.buf, self.max_msg, self.clean, self.last_read, self.gen, self.names,
              self.name_lens, self.table, st["fd"], st["gen"], st["topic"], st["off"], st["len"],
              out["fd"], out["kind"], out["off"], out["len"], self.counts)
        self.staged = int(self.counts[0])
        other = int(self.counts[1])
        if not other:
            return
        buf, sessions = self.buf, self.sessions
        for fd, kind, off, n in zip(out["fd"][:other].tolist(), out["kind"][:other].tolist(),
                                    out["off"][:other].tolist(), out["len"][:other].tolist()):
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
        buffer)."""
        n = self.staged
        if not n:
            return
        self.staged = 0
        st = self.st
        fds, topics, offs, lens = st["fd"][:n], st["topic"][:n], st["off"][:n], st["len"][:n]
        failed = {}
        if not self.counts[2]:
            t = int(topics[0])
            ok = publish(self.topics[t], self.buf, offs, lens)
            if ok is not True:
                failed[t] = ok
        else:
            for t in np.unique(topics).tolist():
                sel = topics == t
                ok = publish(self.topics[t], self.buf, offs[sel], lens[sel])
                if ok is not True:
                    failed[t] = ok
        for t, ok in failed.items():
            self.failed[t] = FAILED if ok is False else PARKED
        sent, sw = st["sent"][:n], self.sw
        k, attention, m = _settle_and_send(
            fds, st["gen"][:n], topics, self.failed, n, self.gen, self.busy, self.tally, self.tally_topic,
            self.ok_frame, sent, sw, self.me, self.topic_owner, self.streak, self.streak_owner, self.movers)
        for fd, t, count in zip(sw[0, :k].tolist(), sw[1, :k].tolist(), sw[2, :k].tolist()):
            counts = self.sessions[fd].pub_counts
            counts[self.topics[t]] = counts.get(self.topics[t], 0) + count
        if attention:
            for i in np.flatnonzero(sent != OK_SIZE).tolist():
                s = self.sessions.get(int(fds[i]))
                if s is None or sent[i] == -2:
                    continue  # the connection went away before its OK
                if sent[i] == -3:
                    s.pub_failed(self.topics[int(topics[i])])
                elif sent[i] == -4:
                    failed[int(topics[i])].add(s)
                else:  # output was queued before it, or the socket took only part of it
                    s.write(OK_FRAME[max(int(sent[i]), 0):])
        for t in failed:
            self.failed[t] = 0
        if m and self.move:
            self._move_crowds(self.movers[:m].tolist(), move)

    def _move_crowds(self, fds, move):
        """Producers whose lone PUBs all go to one other worker move there, but only in crowds: with one to three
        round-trip producers per worker, spreading them keeps both cores awake and answers sooner than crowding
        them onto the owner (see ARCHITECTURE.md). Stragglers follow a crowd that moved in the last FOLLOW_S."""
        now = time.monotonic()
        for fd in fds:
            self.candidates.setdefault(int(self.streak_owner[fd]), set()).add(self.sessions.get(fd))
        for owner, group in self.candidates.items():
            still = {s for s in group if s is not None and self.sessions.get(s.fd) is s
                     and self.streak_owner[s.fd] == owner and self.streak[s.fd] >= MOVE_AFTER}
            self.candidates[owner] = still
            if len(still) >= MOVE_CROWD or still and now - self.moved_at.get(owner, -FOLLOW_S) < FOLLOW_S:
                self.candidates[owner] = set()
                self.moved_at[owner] = now
                for s in still:
                    move(s, owner)

    def close(self):
        self.ep.close()
