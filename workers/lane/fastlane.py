"""The forward lane: a worker's whole loop iteration for lone PUBs to topics other workers own, in compiled code.

Theory of operation
-------------------
A round-trip producer whose topic another worker owns costs its worker one loop iteration per message: wake on
the pump's epoll fd, read (compiled, ``workers/lane/pump.py``), then Python's idle step publishes the staged message
into the owner's ring, wakes the owner if it sleeps, sends the OK (compiled) and checks every other input before
it sleeps again. The compiled parts are cheap; the Python around them is most of the worker's CPU per message,
and at one message per iteration it sets the round trip (ARCHITECTURE.md, "Single PUB: cost model").

So, when the loop is about to block (its idle step found nothing to do and armed its wake-up flag), it calls
``FastLane.poll`` instead of epoll's poll. ``serve`` (compiled) waits on the loop's own epoll set and, as long
as the only thing ready is the pump and what the pump reads is whole PUBs, MPUBs of one message (which NSQ's
bench_writer sends for --batch-size=1) or a batch producer's MPUBs (below) for one topic owned by another
worker, does the iteration itself:
read, pack the staged bodies into one FORWARD record straight into the owner's ring (``workers/publishing/records.py``'s
layout), wake the owner if its flag says it sleeps (``ipc/wake.py``), count the forward in ``OwnerNaps``, and
send the OKs (``_settle_and_send``, the pump's own). Then it waits again. It returns to Python with:

* R_EVENTS: something else is ready (a ring's eventfd, the hand-over channel, a signal, a second ready fd): the
  events, as epoll's poll would have returned them;
* R_READ: the pump's read found something the lane does not do (data for a session's parser, a closed socket, a PUB
  to a topic this worker owns that is not armed or that the kernel gave up on, PUBs to several topics, an MPUB of
  2 to BATCH - 1 messages, a full ring, a topic its owner marked full, a forward too big for the ring):
  ``Pump.after_read`` takes it, exactly as after the loop's own read, and the idle step commits what was staged;
* R_SETTLED: a forward was committed but an OK needs Python (queued output, a partial send), or a tally or a
  producer move does (``Pump.settled``);
* R_OWN: what the pump read was PUBs or MPUBs (at most ``ownpath.MAX_N`` messages in all) to the topic of this
  worker that ``OwnPath`` armed before the call (and maybe data for Python from other sessions): ``own_publish``
  appended them and delivered them to the armed consumers, then their OKs went out; Python's share follows
  (``OwnPath.done``, then ``Pump.settled`` if needed; ``workers/lane/ownpath.py``), then ``Pump.after_read`` takes the
  data. If that left the worker nothing for the loop's idle step (``quiet()``: no channel to deliver, no output
  queued, nothing staged, parked or to sync, no timer due) ``FastLane.poll`` arms the own path again and calls the
  lane again itself, for up to SLICE: a round-trip producer's next PUB (and its consumer's FIN) then cost no pass
  of the loop, which was most of the owner's CPU per round trip (by hand, perf);
* R_DRAINED: this worker's eventfd woke the lane (alone, or beside the pump's fd) while the own path was armed, and
  what the input rings held was plain forwards to the armed topic: ``own_drain`` appended and delivered them
  (``workers/lane/ownpath.py``); Python's share follows (``OwnPath.done``) and, while ``quiet()`` and once
  ``sleep()`` armed the wake-up flag again with nothing waiting, the lane goes on as after R_OWN. Anything else
  there (a command, another topic, a deferred publish, the scanner's ring, a sender waiting for room, more than
  ``ownpath.MAX_N`` messages) is offered again untouched and the lane returns R_EVENTS, its eventfd written back for
  the loop;
* R_TIMEOUT: the loop's timeout passed (timers are Python's), or the lane has run for SLICE seconds since its
  first forward or FIN (the idle step's periodic duties get a turn), or it took MAX_FINS FINs, or epoll was
  interrupted.

A read that is one whole FIN from a consumer of the armed own topic (``ownpath.own_fin``) is taken in the lane:
the message is freed, and the lane waits on (alone) or publishes the PUBs beside it with the RDY it freed. Python
applies its share (``OwnPath.fins_done``) as soon as the lane returns, whatever it returns, before anything else.

Why this is safe: the lane only runs while the worker's wake-up flag is armed, so any process committing to one of
this worker's rings writes its eventfd, which ends the lane (R_EVENTS, or R_DRAINED, after which the lane runs again
only once ``sleep()`` armed the flag with the rings found empty). A forward never overtakes a parked one: the lane
is not used while any publish is parked. A claim that fails leaves the ring as a failed ``Ring.write`` would (its
WANT/OUTGROWN words then make Python's own attempt reserve pages), and the staged messages are still in the pump for
Python's commit.

Batches take the lane when they are a batch producer's, an MPUB of BATCH messages or more: such a producer
(NSQ's bench_writer sends MPUBs of 200) waits for each OK, and without the lane each MPUB cost the forwarding
worker a whole pass of the Python loop (ARCHITECTURE.md, "Single PUB: cost model", on batch producers). A
smaller MPUB is usually a paced producer's, sending whatever fell due (the latency tool): answered at once,
it sends the next one sooner and smaller, each one more ring record and wake-up for the owner, and at 100k
msgs/s p99 latency leaned worse in the runs that tried it. The own path takes small MPUBs too: a paced
producer (the latency tool at 10k msgs/s, an app that sends whatever fell due) often sends MPUBs of two or
three, and there each one is also its consumers' delivery, which the Python commit path would otherwise do.

The worker skips the lane for SKIP_AFTER_MISS loop iterations after MISSES_BEFORE_SKIP calls in a row that
neither forwarded nor published (a worker that only serves consumers, or an owner woken by its rings): each call
costs a few microseconds of argument unboxing, which only pays when forwards or own PUBs follow. (An owner's own
PUBs alternate with its consumers' FINs, so one miss alone must not turn the lane off.)
"""
import math
import time
import zlib

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE, warm_up_step
from nsqpy.ipc import sysio as S
from nsqpy.ipc.ring import C_READ, CONTROL_WORDS, P_TAIL, ring_claim, ring_commit
from nsqpy.ipc.wake import wake_check
from nsqpy.workers.connections.handover import owner_nap
from nsqpy.workers.lane import kernels as lane_kernels, pump as lane_pump
from nsqpy.workers.lane.ownpath import idle_args, own_drain, own_fin, own_publish
from nsqpy.workers.lane.pump import _read, _settle_and_send
from nsqpy.workers.lane.words import (CN_OTHER, CN_STAGED, CN_TOPICS, FD_BUSY, LANE_WORDS, LN_DRAIN, LN_EVENTFD,
                                      LN_LARGE, LN_MAIN_EP, LN_SCAN_CTL, LN_SLICE_NS, LN_UNTIL_NS, MAX_EVENTS,
                                      MAX_FINS, OW_ARMED, OW_FINS, OW_T, OW_WORDS, PW_EPFD, PW_ME, R_DRAINED,
                                      R_EVENTS, R_OWN, R_READ, R_SETTLED, R_TIMEOUT, RES_ATTENTION, RES_CODE,
                                      RES_DRAINED, RES_EVENTS, RES_FORWARDS, RES_MOVERS, RES_STAGED, RES_TALLIES,
                                      RES_WORDS, RG_CAPACITY, RG_CTL_AT, RG_DATA_AT, RG_EVENTFD, RG_ROWS, RI_CAPACITY,
                                      RI_CTL_AT, RI_DATA_AT, RI_PROC, RI_ROWS, RI_WAKE_FD, ST_LEN, ST_N, ST_OFF,
                                      ST_TOPIC, TP_FULL_AT, TP_FULL_VAL, TP_NAME_LEN, TP_OWNER)
from nsqpy.workers.publishing.records import FORWARD, FWD_HEAD_SIZE, write_forward

SLICE = 0.005        # seconds a busy lane runs before it lets the idle step run
SLICE_NS = int(SLICE * 1e9)
SKIP_AFTER_MISS = 32  # loop iterations without the lane after MISSES_BEFORE_SKIP calls that did nothing
MISSES_BEFORE_SKIP = 4  # in a row: neither forwarded nor published (an owner's own PUBs alternate with FINs)
BATCH = 64           # an MPUB of at least this many messages takes the lane (a batch producer's)
EVENT_DTYPE = np.dtype([("events", "<u4"), ("fd", "<i4"), ("pad", "<u4")])  # struct epoll_event (packed)


@njit(inline="always", **JIT_CALLEE)
def _sliced(stop_at, now, slice_s):
    """The lane's stop time once its first forward or FIN is done: at most SLICE from now (R_TIMEOUT)."""
    return now + slice_s if stop_at < 0 or now + slice_s < stop_at else stop_at


@njit(inline="always", **JIT_CALLEE)
def _woken(events, n, pump_ep, eventfd):
    """Whether the ready fds are this worker's eventfd, maybe with the pump's."""
    if n == 1:
        return S.event_data(events, 0) == eventfd
    a, b = S.event_data(events, 0), S.event_data(events, 1)
    return n == 2 and (a == eventfd and b == pump_ep or a == pump_ep and b == eventfd)


@njit(**JIT_CALLEE)
def _lane_commands(st, n):
    """Whether each of the n staged messages came alone in its command (a PUB, or an MPUB of one) or in an MPUB of
    at least BATCH messages (a batch producer's); a smaller MPUB is a paced producer's (module docstring)."""
    for i in range(n):
        if st[ST_N, i] != 1 and st[ST_N, i] < BATCH:
            return False
    return True


@njit(**JIT_CALLEE)
def forward_staged(st, n, t, names, topics, buf, seg_words, seg_bytes, rings, owner, timestamp_ns, large):
    """Write the n staged messages (all of topic t) as one FORWARD record into the ring to ``owner`` (with
    ``records.write_forward``, the Python path's encoder too) and commit it; False (nothing written) when it is
    bigger than ``large`` or the ring has no room now."""
    name_len = topics[TP_NAME_LEN, t]
    size = FWD_HEAD_SIZE + name_len + 8 * n
    for i in range(n):
        size += st[ST_LEN, i]
    if size > large:
        return False
    a = rings[RG_CTL_AT, owner]
    ctl = seg_words[a:a + CONTROL_WORDS]
    d = rings[RG_DATA_AT, owner]
    data = seg_bytes[d:d + rings[RG_CAPACITY, owner]]
    at = ring_claim(ctl, data, size, np.int64(FORWARD))  # typed: no Literal copy of ring_claim
    if at < 0:
        return False
    write_forward(data, at, names[t], name_len, buf, st[ST_OFF, :n], st[ST_LEN, :n], timestamp_ns, np.int64(0))
    ring_commit(ctl)
    return True


@njit(**JIT)
def serve(lane, events, pevents, counts, buf, fd_int, fd_flags, fd_times, names, topics, table, st, out, sw, frame,
          rates, rings, rin, seg_words, seg_bytes, control_words, wake_flags, naps,
          own, lctrl, ldata, ldata64, table_ctl, table_slots, table_index, rout, swords):
    """The lane (module docstring): wait on the loop's epoll set (``lane[LN_MAIN_EP]``) until LN_UNTIL_NS
    (time.monotonic_ns(); < 0: no limit) and forward lone PUBs until something needs Python; ``lane`` receives the
    outcome (RES_* words). ``events`` is the lane's epoll buffer; ``pevents`` to ``rates`` are the pump's
    (``counts`` is its words, with its settings), ``rings`` to ``naps`` this worker's rings to the other workers
    (``rin``: from them, and from the other producers) and their wake-ups; ``own`` and the arrays after it are the
    armed own topic's (``workers/lane/ownpath.py``).
    The blocks' words are ``workers/lane/words.py``'s."""
    lane[:RES_WORDS] = 0
    main_ep, slice_s, large = lane[LN_MAIN_EP], lane[LN_SLICE_NS] * 1e-9, lane[LN_LARGE]
    stop_at = lane[LN_UNTIL_NS] * 1e-9 if lane[LN_UNTIL_NS] >= 0 else -1.0
    pump_ep, me = counts[PW_EPFD], counts[PW_ME]
    topic_owner, full_at, full_val = topics[TP_OWNER], topics[TP_FULL_AT], topics[TP_FULL_VAL]
    busy = fd_flags[FD_BUSY]
    forwards = 0
    while True:
        ms = -1
        if stop_at >= 0:
            left = stop_at - S.monotonic()
            ms = 0 if left <= 0 else int(math.ceil(left * 1000.0))
        n = S.epoll_wait(main_ep, events.ctypes.data, MAX_EVENTS, ms)
        if n <= 0:  # timed out, or interrupted (a signal: its wake-up fd is in the set, Python sees it next)
            lane[RES_CODE] = R_TIMEOUT
            break
        if n > 1 or S.event_data(events, 0) != pump_ep:
            # forwards to the armed own topic woke us: appended and delivered here when they are all plain ones
            drained = 0
            if lane[LN_DRAIN] != 0 and own[OW_ARMED] != 0 and _woken(events, n, pump_ep, lane[LN_EVENTFD]):
                t = own[OW_T]
                drained = own_drain(lane, rin, seg_words, seg_bytes, wake_flags, me, names[t], topics[TP_NAME_LEN, t],
                                    busy, own, lctrl, ldata, ldata64, table_ctl, table_slots, table_index, rout,
                                    swords)
            if drained > 0:
                lane[RES_CODE] = R_DRAINED
                lane[RES_DRAINED] = drained
            else:
                lane[RES_CODE] = R_EVENTS
                lane[RES_EVENTS] = n
            break
        _read(counts, pevents, buf, fd_int, fd_flags, fd_times, names, topics, table, st, out)
        staged = counts[CN_STAGED]
        # a consumer's FIN on the armed topic, alone or beside its PUBs (first: the RDY it frees takes them)
        if own[OW_ARMED] != 0 and own_fin(counts, out, buf, own, table_ctl, table_slots, table_index) and \
                staged == 0:
            if own[OW_FINS] >= MAX_FINS:
                lane[RES_CODE] = R_TIMEOUT  # Python's share of them is due
                break
            if own[OW_FINS] == 1:
                stop_at = _sliced(stop_at, S.monotonic(), slice_s)
            continue
        if staged == 0 or counts[CN_TOPICS]:
            lane[RES_CODE] = R_READ
            break
        t = st[ST_TOPIC, 0]
        owner = topic_owner[t]
        # the armed own topic's PUBs and small MPUBs go now even beside data for Python (a consumer's FIN in the
        # same read); a forward only when nothing in the read is for Python and no MPUB is a small batch
        mine = owner == me and own[OW_ARMED] != 0 and t == own[OW_T] and own_publish(
            st, staged, buf, busy, own, lctrl, ldata, ldata64, table_ctl, table_slots, table_index, rout, swords)
        if not mine:
            if counts[CN_OTHER] or owner == me or not _lane_commands(st, staged) or \
                    control_words[full_at[t]] == full_val[t] or not forward_staged(
                        st, staged, t, names, topics, buf, seg_words, seg_bytes, rings, owner, S.realtime_ns(),
                        large):
                lane[RES_CODE] = R_READ
                break
            woke = 0
            if wake_check(wake_flags, owner):
                S.eventfd_signal(rings[RG_EVENTFD, owner])
                woke = 1
            owner_nap(naps, owner, woke)
            forwards += 1
        counts[CN_STAGED] = 0  # published here or committed to the ring: nothing left staged for Python (data may be)
        now = S.monotonic()
        k, attention, m = _settle_and_send(st, staged, counts, fd_int, fd_flags, fd_times, topics, frame, sw, rates,
                                           now)
        if mine or k or attention or m:
            lane[RES_CODE] = R_OWN if mine else R_SETTLED
            lane[RES_TALLIES], lane[RES_ATTENTION], lane[RES_MOVERS], lane[RES_STAGED] = k, attention, m, staged
            break
        if forwards == 1:
            stop_at = _sliced(stop_at, now, slice_s)
    lane[RES_FORWARDS] = forwards


def _placed(ring, base):
    """(control block in int64 words, data in bytes, capacity) of a ring in the rings' buffer at address base."""
    return (ring.ctl.ctypes.data - base) // 8, ring.data.ctypes.data - base, ring.capacity


class FastLane:
    """The lane of one worker: ``poll(timeout)`` stands in for the loop's epoll poll (``Loop.fast_poll``).

    ``rings`` maps each other worker to the ``nsqpy.ipc.ring.Ring`` of this worker's forwards to it, all in ``buf``;
    ``wakeups`` is the ``nsqpy.ipc.wake.Wakeups`` of the workers (eventfds by worker index); ``control`` the control
    block (``full_word``: a topic its owner marked full); ``naps`` the worker's ``OwnerNaps``. ``usable()`` says
    whether the lane may run now (no parked publish); ``move(session, worker)`` is the worker's producer move."""

    def __init__(self, pump, main_ep, buf, rings, wakeups, control, naps, large_forward, usable, move, own=None,
                 quiet=None, inputs=(), scanner=None, may_drain=None, sleep=None):
        self.pump = pump
        self.main_ep = main_ep
        self.poll_plain = main_ep.poll
        self.events = S.events_buffer(MAX_EVENTS)
        self.seg_words = np.frombuffer(buf, np.int64, len(buf) // 8)
        self.seg_bytes = np.frombuffer(buf, np.uint8)
        base = self.seg_bytes.ctypes.data
        workers = len(wakeups.fds)
        self.rings = np.zeros((RG_ROWS, workers), np.int64)  # words.py: rows RG_*
        for j, ring in rings.items():
            self.rings[[RG_CTL_AT, RG_DATA_AT, RG_CAPACITY], j] = _placed(ring, base)
        self.rings[RG_EVENTFD] = wakeups.fds
        self.rin = np.zeros((RI_ROWS, len(inputs)), np.int64)  # words.py: rows RI_*
        for i, (ring, proc) in enumerate(inputs):
            self.rin[[RI_CTL_AT, RI_DATA_AT, RI_CAPACITY], i] = _placed(ring, base)
            self.rin[RI_PROC, i], self.rin[RI_WAKE_FD, i] = proc, wakeups.fds[proc]
        self.wake_flags = wakeups.flags
        self.control = control
        self.control_words = control.w
        self.naps = naps.naps
        self.large = int(large_forward)
        self.lane = np.zeros(LANE_WORDS, np.int64)  # words.py: RES_* (the outcome), LN_* (a call's inputs)
        self.lane[LN_MAIN_EP], self.lane[LN_SLICE_NS], self.lane[LN_LARGE] = main_ep.fileno(), SLICE_NS, self.large
        self.lane[LN_EVENTFD] = wakeups.fds[int(pump.counts[PW_ME])]
        if scanner is not None:
            self.lane[LN_SCAN_CTL] = _placed(scanner, base)[0]
        # () -> whether the lane may drain now; it needs the rings and sleep(): () -> True once the wake-up flag
        # is armed again with no input waiting (the idle step's check)
        self.may_drain = may_drain if scanner is not None and len(inputs) and sleep is not None else None
        self.sleep = sleep
        self.res = self.lane
        self.usable = usable
        self.move = move
        self.known = 0        # topics of the pump whose full words are filled in
        self.skip = 0
        self.forwards = 0     # forwards the lane committed (statistics, tests)
        self.own = own        # the owner's own lone PUBs (workers/lane/ownpath.py OwnPath), or None
        self._no_own = idle_args(np.zeros(OW_WORDS, np.int64))
        self.misses = 0       # calls in a row that neither forwarded nor published
        self.quiet = quiet    # () -> None when the loop's idle step has work, else its next wait's timeout (``poll``)
        self.again = 0        # own publishes the lane went on after without the loop (statistics, tests)

    def _learn(self):
        p = self.pump
        for t in range(self.known, len(p.topics)):
            name = p.topics[t].encode()
            p.topic_words[TP_FULL_AT, t], p.topic_words[TP_FULL_VAL, t] = self.control.full_word(
                int(p.topic_owner[t]), zlib.crc32(name))
        self.known = len(p.topics)

    def poll(self, timeout):
        """epoll's poll(timeout) for the loop, doing lone forwards on the way (module docstring). After the own
        path's publish, while ``quiet()`` says the loop's idle step would find nothing to do, the lane goes on
        (armed again) instead of returning, for up to SLICE; its wait then ends at the loop's next timer as
        ``quiet()`` gives it (the publish's Python share may have added one)."""
        if self.skip:
            self.skip -= 1
            return self.poll_plain(timeout)
        if not self.usable():
            return self.poll_plain(timeout)
        until = -1.0 if timeout < 0 else time.monotonic() + timeout
        stop_at = None
        while True:
            events = self._serve(until)
            if events is not None:
                return events
            now = time.monotonic()
            if stop_at is None:
                stop_at = now + SLICE
            timeout = self.quiet() if now < stop_at and self.usable() else None
            if timeout is None or timeout == 0:
                return []
            until = -1.0 if timeout < 0 else now + timeout
            self.again += 1

    def _serve(self, until):
        """One call of the lane and Python's share of what it did: -> the events for the loop, or None after an
        own publish that Python settled whole here (the lane may go on, ``poll``)."""
        p = self.pump
        if self.known != len(p.topics):
            self._learn()
        res = self.res
        drain = self.may_drain is not None and self.own is not None and self.own.topic is not None and \
            self.may_drain()
        own = self._no_own if self.own is None else self.own.arm(drain)
        res[LN_UNTIL_NS] = -1 if until < 0 else int(until * 1e9)
        res[LN_DRAIN] = drain and self.own.armed is not None and self.own.armed.limited is None
        serve(res, self.events, p.events, p.counts, p.buf, p.fd_int, p.fd_flags, p.fd_times, p.names, p.topic_words,
              p.table, p.st, p.out, p.sw, p.ok_frame, p.rates, self.rings, self.rin, self.seg_words, self.seg_bytes,
              self.control_words, self.wake_flags, self.naps, *own)
        code, forwards = int(res[RES_CODE]), int(res[RES_FORWARDS])
        self.forwards += forwards
        fins = self.own is not None and self.own.words[OW_FINS] > 0
        if fins:
            self.own.fins_done()  # before the publish's share below (ownpath.OwnPath.fins_done)
        if forwards or fins or code == R_OWN or code == R_DRAINED:
            self.misses = 0
        else:
            self.misses += 1
            if self.misses >= MISSES_BEFORE_SKIP:
                self.misses = 0
                self.skip = SKIP_AFTER_MISS
        if code == R_EVENTS:
            ev = self.events[:int(res[RES_EVENTS]) * EVENT_DTYPE.itemsize].view(EVENT_DTYPE)
            return list(zip(ev["fd"].tolist(), ev["events"].tolist()))
        if code == R_READ:
            p.after_read()
        elif code == R_OWN:
            staged = int(res[RES_STAGED])
            p.staged = 0
            self.own.done(staged)
            k, attention, m = int(res[RES_TALLIES]), int(res[RES_ATTENTION]), int(res[RES_MOVERS])
            if k or attention or m:
                p.settled(staged, k, attention, m, {}, self.move)
            p.after_read()  # the same read's data and closed sockets, if any (a FIN usually)
            if self.quiet is not None and not (k or attention or m):
                return None
        elif code == R_DRAINED:
            self.own.done(int(res[RES_DRAINED]), forwarded=True)
            if self.quiet is not None and self.sleep():  # (own_drain left the worker awake)
                return None
        elif code == R_SETTLED:
            p.settled(int(res[RES_STAGED]), int(res[RES_TALLIES]), int(res[RES_ATTENTION]), int(res[RES_MOVERS]),
                      {}, self.move)
        return []


class LaneRig:
    """A lane over throwaway memory: one pump, a ring from worker 0 to worker 1 and the two workers' wake-up
    flags and eventfds, in buffers of the same types the broker's shared memory gives. The warm-up compiles the
    lane with it; the unit tests drive it. ``owner_full(crc)`` marks a topic of worker 1 full."""

    FULL_AT = 64  # the control words' full-topic slot (one is enough here)

    def __init__(self, capacity=1 << 12, max_msg=1 << 20, large=1 << 20, own=None):
        import select
        from nsqpy.ipc.ring import Ring
        from nsqpy.ipc.wake import Wakeups, make_eventfd
        from nsqpy.workers.connections.handover import OwnerNaps
        from nsqpy.workers.lane.pump import Pump
        self.eventfds = [make_eventfd(), make_eventfd()]
        size = Ring.size_for(capacity)
        self.buf = bytearray(3 * size + Wakeups.size_for(2))
        self.ring = Ring.create(self.buf, 0, capacity)
        self.inbox = Ring.create(self.buf, size, capacity)        # worker 1's forwards to us
        self.scanner = Ring.create(self.buf, 2 * size, capacity)  # the scanner's ring to us
        self.wakeups = Wakeups.create(self.buf, 3 * size, self.eventfds)
        self.w = np.zeros(self.FULL_AT + 1, np.int64)
        self.ep = select.epoll()
        self.pump = Pump(max_msg)
        self.ep.register(self.pump.epfd, select.EPOLLIN)
        self.ep.register(self.eventfds[0], select.EPOLLIN)  # our wake-up, as in the worker's loop
        self.naps = OwnerNaps(2)
        self.moves = []
        self.parked = False
        self.drain_ok = True  # what the worker's Forwarder.lane_may_drain says
        self.lane = FastLane(self.pump, self.ep, self.buf, {1: self.ring}, self.wakeups, self, self.naps, large,
                             lambda: not self.parked, lambda s, w: self.moves.append((s, w)), own,
                             inputs=[(self.inbox, 1)], scanner=self.scanner, may_drain=lambda: self.drain_ok,
                             sleep=lambda: self.wakeups.prepare_sleep(0, self._inputs_waiting))

    def _inputs_waiting(self):
        return any(r.ctl[P_TAIL] != r.ctl[C_READ] for r in (self.inbox, self.scanner))

    def full_word(self, w, crc):
        return self.FULL_AT, (1 << 40) | crc

    def owner_full(self, crc):
        self.w[self.FULL_AT] = (1 << 40) | crc

    def close(self):
        import os
        self.pump.close()
        self.ep.close()
        for fd in self.eventfds:
            os.close(fd)


# its kernels call the delivery round's and the pump's: compiled in parallel, it waits for those, and loads them
@warm_up_step(deferred="lane", waits_for=(lane_kernels.warm_up, lane_pump.warm_up))
def warm_up():
    """Compile (or load) the lane with the broker's argument types: a forward, a publish it leaves to Python, a
    foreign event and a timeout."""
    import socket
    from nsqpy.protocol import client as enc

    from nsqpy.workers.lane.pump import PumpPeer as Peer

    rig = LaneRig()
    here, there = socket.socketpair()
    other_r, other_w = socket.socketpair()
    try:
        here.setblocking(False)
        peer = Peer(here.fileno())
        rig.pump.add(peer, time.monotonic())
        rig.pump.clean[peer.fd] = 1
        rig.pump.learn_topic("theirs", 1)
        rig.pump.learn_topic("ours", 0)
        rig.wakeups.prepare_sleep(1, lambda: False)  # the owner sleeps: the forward wakes it
        there.sendall(enc.pub("theirs", b"x"))
        rig.lane.poll(0.001)  # forwards, then times out
        there.sendall(enc.pub("ours", b"y"))
        rig.lane.poll(1.0)    # R_READ: left staged for the worker's commit
        rig.pump.staged = 0
        rig.lane.skip = 0
        rig.ep.register(other_r.fileno(), 1)
        other_w.send(b"x")
        rig.lane.poll(1.0)    # R_EVENTS
        rig.pump.remove(peer)
    finally:
        rig.close()
        for s in (here, there, other_r, other_w):
            s.close()
