"""A channel, inside its topic's owner worker: consumers, delivery, FIN/REQ/TOUCH, timeouts.

Theory of operation: the channel's queue is its cursor in the topic's message log plus two deques of messages that
came back: in-flight slots (REQ 0, timeout, a consumer that disconnected) and deferred-store entries that came due.
Each waits behind what was waiting in the channel when it came back (NSQ puts it back into the channel's queue):
its mark is the log's head at that moment, and the log's records before the earliest mark go out first.
Delivery is credit-based like RDY itself: a consumer gets up to ``rdy - in_flight`` messages, handed out in
rounds of at most ``ROUND`` per consumer. Consumers take turns: a pass starts with the consumer after the last one
that got messages, so a pass that delivers nothing (a FIN's, with nothing waiting) moves no turn. One round
for one consumer is one log read, one in-flight ``start_batch`` and one framing call, never a Python loop per
message; the usual round does all three in one compiled call (``kernels.deliver_round``). Every state change of
a slot is reported to the scanner (START with a deadline, REMOVE), which owns the timers and sends EXPIRED back
(``on_expired``).

A message whose ``not_before`` lies in the future (DPUB) is parked in the worker's deferred store
(``workers/domain/deferred.py``) when the cursor reaches it, so that it is deferred per channel as NSQ does; a REQ with
a delay moves its message from its in-flight slot to the same store. The store grows on demand: deferred
messages never take in-flight slots while they wait. When they come due they queue in ``due`` and take a slot
only when a consumer gets them. A DPUB to a topic with channels is parked for each of them as it is appended
(``Topic.append``), so it counts as deferred at once, as in nsqd.

``message_count`` is nsqd's: every message put into the channel (counted as its topic appends it,
``Topic.count_appended``), not deliveries; a requeue, timeout or due deferred message does not count again.

nsqpy's policies (``self.policy``, ``workers/domain/policy.py``; set by the owner, ``Policy.OFF`` unless configured).
``max_attempts``: a message delivered that many times and then REQ'd (any delay), timed out or left in flight by a
consumer that went away goes to the dead-letter topic instead of back into the channel. ``message_ttl_ms``: a
message older than that (its publish timestamp) when it comes up for delivery (read from the log, requeued, or due
from the deferred store) is never delivered: it goes to the dead-letter topic when one is in effect, else it is
dropped; both count in ``expired_count``, the moved ones in ``dead_lettered_count`` too. A TTL channel keeps the
compiled rounds: each round's words carry the TTL's cutoff, and the kernel stops before the first expired record it
reads, which the next round leaves to the general path (it expires what it reads with one array compare); so a TTL
that expires nothing costs a compare per record. A bound is a publish-side check (``workers/domain/bounds.py``) and costs delivery nothing; max_attempts
costs a slot read per REQ, timeout and disconnect only when it is set. A message being moved holds
its in-flight slot, REQUEUED and in no queue, until its dead letter is committed (``_dead_letter``; the format, the
crash marks and the parked publish's waiter: ``workers/domain/dead_letter.py``).

What a channel needs from its worker is narrow and declared: ``hosts.ChannelHost`` names every service (the
in-flight table, the deferred store, the timers, the frame writers, the sets of pending and blocked channels...),
and ``hosts.ChannelParent`` what it uses of its topic; a unit test passes small fakes of both
(tests/workers/fakes.py, tests/workers/test_channel_*.py). With ``opts.e2e_processing_latency_percentile`` and
``_window_time``, FIN also records end-to-end latencies (``workers/domain/e2e.py``).
"""
import collections
import itertools
import time

import numpy as np

from nsqpy.ipc import inflight as IF
from nsqpy.protocol.errors import FinFailed, PubFailed, ReqFailed, TouchFailed
from nsqpy.protocol.ids import hex_to_id
from nsqpy.protocol.names import is_valid_name
from nsqpy.ipc.msglog_layout import FRAME_OVERHEAD
from nsqpy.workers.domain import dead_letter as DL
from nsqpy.workers.domain.deferred import DeferredNoSpace
from nsqpy.workers.domain.e2e import new_window
from nsqpy.workers.domain.hosts import ChannelParent
from nsqpy.workers.domain.policy import Policy
from nsqpy.workers.lane.kernels import deliver_round, generations, round_words, waiting_positions
from nsqpy.workers.lane.words import ROUND_WORDS
from nsqpy.workers.storage.poison import DELIVERY

ROUND = 256            # messages per consumer per round: fairness between consumers vs. calls per message
MAX_ROUND_BYTES = 4 << 20   # frames per round (a single bigger message goes alone)
NO_STOP = np.iinfo(np.int64).max
DEAD_LETTER_RETRY = 0.05    # seconds: expired messages whose dead-letter publish was refused are tried again after
_FAIL_TEXT = {IF.ST_NOT_OWNER: "client does not own message"}


def _round_size(frames, at_least):
    """How many of these frame sizes (in order) fit one round's MAX_ROUND_BYTES, but at least `at_least` (a
    message bigger than a round goes alone)."""
    return max(int(np.searchsorted(np.cumsum(frames), MAX_ROUND_BYTES, side="right")), at_least)


def _fail_text(status):
    return _FAIL_TEXT.get(status, "ID not in flight")


class Channel:
    def __init__(self, topic: ChannelParent, name, ch, key):
        self.topic = topic
        self.worker = topic.worker  # hosts.ChannelHost
        self.name = name
        self.ch = ch            # slot in the topic's message log
        self.key = key          # worker-unique channel number (the in-flight table's channel field)
        self.ephemeral = name.endswith("#ephemeral")
        self.paused = False
        self.consumers = []
        self.requeued = collections.deque()   # (in-flight slot, mark): to deliver again (REQ 0, timeout, disconnect)
        self.due = collections.deque()        # (deferred-store entry, mark): came due, waiting for a consumer
        self.message_count = 0  # messages put into the channel (nsqd's channel message_count)
        self.requeue_count = 0
        self.timeout_count = 0
        # nsqpy's policies (workers/domain/policy.py): the effective values, set by the owner; what they did
        self.policy = Policy.OFF
        self.dead_lettered_count = 0
        self.expired_count = 0
        self.dropped_count = 0
        self.doomed = collections.deque()     # (held slot, reason): to dead-letter (after a crash, or a refusal)
        self._doomed_at = 0.0                 # time.monotonic() before which ``doomed`` is not tried again
        self._expiring = []                   # held slots of this round's expired messages (dead-lettered after it)
        self._dying = []                      # held slots over max_attempts (their REQ, timeout, disconnect), marked:
                                              # dead-lettered as one publish at the channel's next pass
        self._refused_logged = {}             # cause of a dead-letter warning -> when it was last logged
        self.deleted = False
        self.blocked = False    # the last delivery pass found the in-flight table full
        self._rr = 0            # the consumer whose turn it is to be served first
        self._slots = np.empty(ROUND, np.int64)
        self._round = np.empty(ROUND_WORDS, np.int64)  # a compiled round's words (kernels.round_words)
        self._status = np.empty(65536, np.int64)
        self._freed = np.empty(65536, np.int64)
        # end-to-end latencies of FINed messages (workers/domain/e2e.py): None without --e2e-processing-latency-percentile
        self.e2e = new_window(self.worker.opts)

    # ---- consumers -------------------------------------------------------------------------------------
    def add_consumer(self, session):
        self.consumers.append(session)
        session.channel = self

    def remove_consumer(self, session):
        if session in self.consumers:
            self.consumers.remove(session)
        self.requeue_conn(session)
        if self.ephemeral and not self.consumers and not self.deleted:
            self.topic.delete_channel(self.name)

    def wants_delivery(self):
        self.worker.pending.add(self)

    # ---- delivery --------------------------------------------------------------------------------------
    def has_messages(self):
        return bool(self.requeued) or bool(self.due) or self.topic.log.depth(self.ch) > 0

    @property
    def deferred_count(self):
        """Deferred messages not yet due (NSQ's deferred_count; due ones count in the depth)."""
        return self.worker.deferred.counts.get(self.key, 0) - len(self.due)

    def depth(self):
        """NSQ's depth: messages waiting for delivery (the log ahead of the cursor, requeued, due)."""
        return self.topic.log.depth(self.ch) + len(self.requeued) + len(self.due)

    def delivering(self):
        """Whether a delivery pass may hand out messages now (consumers, nothing paused, not deleted)."""
        return not (self.paused or self.topic.paused or not self.consumers or self.deleted)

    def turn(self):
        """Index in ``consumers`` of the consumer to serve first (after the last one served)."""
        return self._rr % len(self.consumers)

    def served(self, s):
        """s got messages: the next pass starts with the consumer after it."""
        try:
            self._rr = self.consumers.index(s) + 1
        except ValueError:
            pass

    def deliver(self):
        """One delivery pass over the consumers, starting with the one whose turn it is; True when more could be
        delivered right away."""
        if self._dying:
            self._dead_letter_dying()
        if self.doomed and time.monotonic() >= self._doomed_at:
            self._dead_letter_doomed()
        if not self.delivering():
            return False
        consumers = self.consumers
        n = len(consumers)
        start = self.turn()
        self.blocked = False
        for i in range(n):
            if self.blocked:
                return False
            k = (start + i) % n
            s = consumers[k]
            free = s.rdy - s.in_flight
            if free <= 0 or not s.ready_for_more():
                continue
            budget = min(free, ROUND)
            careful = self.worker.suspect.careful_rounds(self.key)
            if careful:
                budget = 1  # the worker died delivering this channel: one message per round names the culprit
            delivered = self._deliver_to(s, budget)
            if self._expiring:  # after the round: its reads and cursor are done with
                self._dead_letter_expiring()
            if delivered:
                self._rr = k + 1
                if careful:
                    self.worker.suspect.careful_done()
            if delivered == 0 and not self.has_messages():
                return False
        if self.blocked:
            return False
        return any(c.ready_for_more() for c in self.consumers) and self.has_messages()

    def _deliver_to(self, s, budget):
        now = time.time_ns()
        deadline = now + s.settings.msg_timeout_ms * 1_000_000
        log = self.topic.log
        mark = NO_STOP
        if self.requeued or self.due:
            mark = self._earliest_mark()
            cursor = log.cursor(self.ch)
            if cursor >= mark:
                return self._deliver_came_back(s, budget, now, deadline, cursor)
        elif self.worker.round_buffer is not None and s.settings.sample_rate <= 0:
            n = self._deliver_round(s, budget, now, deadline)
            if n >= 0:
                return n
        b = log.read(self.ch, budget, MAX_ROUND_BYTES)  # at least one record, however big (delivered alone)
        n, nxt = b.n, b.next_position
        if mark != NO_STOP:
            k = int(np.searchsorted(b.positions[:n], mark))
            if k == 0:  # nothing of the log lies before the mark: the messages that came back are next
                return self._deliver_came_back(s, budget, now, deadline, int(b.positions[0]) if n else NO_STOP)
            if k < n:
                n, nxt = k, int(b.positions[k])
        delivered = self._deliver_read(s, b, n, nxt, now, deadline)
        if not delivered and self.blocked and self.requeued:
            # the in-flight table is full, and the requeued messages hold slots of their own that only their
            # delivery (and a FIN) can free: they go now rather than wait behind messages that wait for slots
            self.blocked = False
            self.worker.table_blocked.discard(self)
            return self._redeliver(s, min(budget, len(self.requeued)), now, deadline)
        return delivered

    def _deliver_read(self, s, b, n, nxt, now, deadline):
        """The first n records of read b (the cursor moves to nxt at most): started in flight at s and framed,
        deferred ones parked, sampled ones skipped; -> how many were delivered."""
        if n == 0:
            return 0
        log = self.topic.log
        pos, ids, att = b.positions[:n], b.ids[:n], b.attempts[:n] + 1
        keep = None
        stop = NO_STOP  # the first record that found no in-flight slot: the cursor stops there
        old = None
        if self.policy.message_ttl_ms:  # (the compiled round stops at an expired record and leaves it to us)
            old = b.timestamps[:n] < now - self.policy.message_ttl_ns
            if old.any():
                stop = self._expire_read(s, pos[old], ids[old], att[old] - 1, now)
                keep = ~old
            else:
                old = None
        spent_at = self._spent_at()
        if spent_at:  # delivered max_attempts times already (loaded or recovered after a stop or crash)
            spent = att - 1 >= spent_at
            if old is not None:
                spent &= ~old
            if spent.any():
                stop = min(stop, self._spend_read(s, pos[spent], ids[spent], att[spent] - 1, now))
                keep = ~spent if keep is None else keep & ~spent
                old = spent if old is None else old | spent  # (neither is deferred or delivered)
        if b.latest_not_before > now:  # (a comparison of ints: no array test on every round)
            nb = b.not_before[:n]
            deferred = nb > now if old is None else (nb > now) & ~old
            stop = min(stop, self._park_deferred(pos[deferred], ids[deferred], att[deferred] - 1, nb[deferred], now))
            keep = ~deferred if keep is None else keep & ~deferred
        if s.settings.sample_rate > 0:
            sampled = np.random.randint(0, 100, n) <= s.settings.sample_rate
            keep = sampled if keep is None else keep & sampled
        if keep is not None:
            pos, ids, att = pos[keep], ids[keep], att[keep]
        if stop != NO_STOP:
            before = pos < stop
            pos, ids, att = pos[before], ids[before], att[before]
        pos, att, slots, full_at = self._start(s, pos, ids, att, now, deadline)
        stop = min(stop, full_at)
        if old is not None and not self.policy.dead_letter_topic:  # expired and dropped: those the cursor passes
            # (spent ones exist only with a dead-letter topic)
            self.expired_count += int((b.positions[:n][old] < stop).sum())
        # A full in-flight table is back-pressure, never loss: the cursor passes only what was started, parked
        # or skipped; what follows is read again once FIN/REQ/timeouts free slots (they all call
        # wants_delivery). Records after the stop that did get a slot are live in it; re-reading them finds
        # ST_DUPLICATE and skips them, so they are delivered once, through their slot.
        # The cursor moves before the frames are written: from here on the messages live in their slots, so a
        # worker that dies framing them (workers/storage/poison.py) finds them there, requeued, and can set one aside.
        log.advance(self.ch, nxt if stop == NO_STOP else stop)
        return self._send(s, pos, att, slots, deadline)

    def _expire_read(self, s, pos, ids, att, now):
        """Records of the log older than the TTL: never delivered. With a dead-letter topic each takes an in-flight
        slot, held (REQUEUED, in no queue) until its dead letter is committed after the round
        (``_dead_letter_expiring``) -> NO_STOP, or the position of the first that found the table full (the cursor
        stops there: back-pressure). Without one they are dropped as the cursor passes them."""
        if not self.policy.dead_letter_topic:
            return NO_STOP
        return self._hold_read(s, pos, ids, att, now, self._expire_held)

    def _hold_read(self, s, pos, ids, att, now, then):
        """Records of the log that are not to be delivered: each takes an in-flight slot, held (REQUEUED, in no
        queue), handed to ``then`` -> NO_STOP, or the position of the first that found the table full."""
        _, _, slots, full_at = self._start(s, pos, ids, att, now, now)
        then(self._requeue_all(slots))
        return full_at

    def _spend_read(self, s, pos, ids, att, now):
        """Records of the log already delivered max_attempts times (a message in flight at its last attempt when
        the broker stopped or crashed comes back so): never delivered again; each takes an in-flight slot, held
        and dead-lettered after the round (``_doom``) -> NO_STOP, or the position of the first that found the
        table full (the cursor stops there)."""
        return self._hold_read(s, pos, ids, att, now, self._doom)

    def _spent_at(self):
        """max_attempts when a message delivered that many times is dead-lettered rather than delivered again (a
        valid dead-letter topic in effect), else 0."""
        p = self.policy
        return p.max_attempts if p.max_attempts and is_valid_name(p.dead_letter_topic) else 0

    def _requeue_all(self, slots):
        """In-flight slots -> REQUEUED in the table (held: in no queue of the channel) -> their list."""
        table = self.worker.inflight
        slots = slots.tolist() if isinstance(slots, np.ndarray) else list(slots)
        for slot in slots:
            table.requeue(slot, 0)
        return slots

    def _expire_held(self, slots):
        """Held slots (REQUEUED, in no queue) of messages older than the TTL: dead-lettered after this round
        (``_dead_letter_expiring``) when a dead-letter topic is in effect, else dropped now (freed, counted)."""
        if not slots:
            return
        if self.policy.dead_letter_topic:
            self._expiring.extend(slots)
            return
        table = self.worker.inflight
        for slot in slots:
            table.release(slot)
        self.expired_count += len(slots)
        self.worker.touched.add(self.topic)  # the log may reclaim what they pinned

    def _earliest_mark(self):
        """The log position before which the oldest message that came back waits (the head when it came back)."""
        return min(self.requeued[0][1] if self.requeued else NO_STOP, self.due[0][1] if self.due else NO_STOP)

    def _deliver_came_back(self, s, budget, now, deadline, limit):
        """Requeued or due messages, whichever came back first, and of that kind those that came back before the
        other kind's first and with no message of the log ahead of them (``limit``: the position of the log's next
        one for this channel, or a position at or before it)."""
        requeued = self.requeued[0][1] if self.requeued else NO_STOP
        due = self.due[0][1] if self.due else NO_STOP
        if requeued <= due:
            queue, deliver, bound = self.requeued, self._redeliver, min(limit, due)
        else:
            queue, deliver, bound = self.due, self._deliver_due, min(limit, requeued)
        want = 0
        for _, mark in itertools.islice(queue, budget):
            if mark > bound and want:
                break
            want += 1
        return deliver(s, want, now, deadline)

    def put_back(self, slots):
        """In-flight slots requeued in the table (REQ 0, timeout, disconnect) wait behind what the channel holds
        now, as nsqd puts such a message back into the channel's queue."""
        mark = self.topic.log.head
        self.requeued.extend((slot, mark) for slot in slots)

    def came_due(self, entry):
        """A deferred-store entry came due: it waits behind what the channel holds now."""
        self.due.append((entry, self.topic.log.head))

    def _deliver_round(self, s, budget, now, deadline):
        """The usual round from the cursor in one compiled call (``kernels.deliver_round``: read, in-flight slots,
        cursor, frames, and their send when nothing is queued before them); -> messages delivered, or < 0 for a
        round it leaves to the general path (a deferred record, too few free slots, a round bigger than the
        worker's frame buffer, a first record past the TTL), which reads again. With a TTL the round stops before
        the first expired record: the next round finds it first and leaves it to the general path, which expires
        it (``_deliver_read``)."""
        w = self.worker
        log, table, out, suspect = self.topic.log, w.inflight, w.round_buffer, w.suspect
        win = log.window
        ttl = self.policy.message_ttl_ns
        rd = round_words(self.ch, budget, MAX_ROUND_BYTES, now, deadline, self.topic.index, self.key, s.conn_id,
                         suspect.base, w.direct_fd(s), now - ttl if ttl else 0, self._round, self._spent_at())
        n, end, sent = deliver_round(log.ctrl, win.data, win.data64, table.ctl, table.slots, table.index, rd,
                                     log.read_block(budget), self._slots, out, suspect.w)
        if n > 0:
            w.send_frames(s, out, end, sent)
            self._started(s, self._slots[:n], deadline)
        return n

    def _start(self, s, pos, ids, att, now, deadline):
        """In-flight slots for these messages -> (positions, attempts, slots of those that got one, position of
        the first that found the table full or NO_STOP)."""
        n = len(pos)
        if n == 0:
            return pos, att, pos, NO_STOP
        w = self.worker
        slots = self._slots[:n] if n <= ROUND else np.empty(n, np.int64)
        started = w.inflight.start_batch(self.topic.index, self.key, s.conn_id, now, deadline, ids, pos, att, slots)
        full_at = NO_STOP
        if started != n:  # duplicates after a crash re-read, or a full table: deliver only what got a slot
            full = slots == IF.ST_FULL
            if full.any():
                full_at = int(pos[full].min())
                self._table_full()
            ok = slots >= 0
            pos, att, slots = pos[ok], att[ok], slots[ok]
        return pos, att, slots, full_at

    def _send(self, s, pos, att, slots, deadline):
        """Frame the started messages into s's output and post their timer; -> how many."""
        n = len(slots)
        if n == 0:
            return 0
        w = self.worker
        w.suspect.begin(DELIVERY, self.topic.index, self.key, int(pos[0]), n)
        w.write_frames(s, self.topic.log, pos, att)
        w.suspect.end()
        self._started(s, slots, deadline)
        return n

    def _started(self, s, slots, deadline):
        """The slots' messages were framed into s's output: their timer and counts."""
        n = len(slots)
        self.worker.timer_start(slots, deadline)
        s.in_flight += n
        s.message_count += n

    def _table_full(self):
        """No in-flight slot left: stop this pass; the worker resumes the channel once a slot is free."""
        self.blocked = True
        self.worker.table_blocked.add(self)

    def _redeliver(self, s, budget, now, deadline):
        """Requeued messages first, up to ``budget`` of them and MAX_ROUND_BYTES of frames (at least one, however
        big it is): a round's frames must fit the worker's frame buffer whatever was requeued."""
        w = self.worker
        table = w.inflight
        want = min(budget, len(self.requeued))
        peek = np.fromiter((e[0] for e in itertools.islice(self.requeued, want)), np.int64, want)
        pos = np.empty(want, np.int64)
        waiting_positions(table.slots, peek, pos)
        live = pos >= 0
        frames = np.zeros(want, np.int64)
        old = None
        if live.any():
            recs = self.topic.log.records_at(pos[live])
            k = int(live.sum())
            frames[live] = recs.lengths[:k] + FRAME_OVERHEAD
            if self.policy.message_ttl_ms:
                old = np.zeros(want, np.bool_)
                old[live] = recs.timestamps[:k] < now - self.policy.message_ttl_ns
                frames[old] = 0  # never delivered: no room in the round
        take = _round_size(frames, int(np.argmax(live)) + 1)
        taken, expired = [], []
        for i in range(min(take, want)):
            slot = self.requeued.popleft()[0]
            if old is not None and old[i]:
                expired.append(slot)
            elif table.redeliver(slot, s.conn_id, now, deadline) == IF.OK:
                taken.append(slot)
        if expired:
            self._expire_held(expired)
        slots = np.array(taken, np.int64)
        _, pos, att = generations(table, slots)
        return self._send(s, pos, att, slots, deadline)

    def _park_deferred(self, pos, ids, att, not_before, now):
        """Deferred messages wait in the worker's deferred store until due; -> NO_STOP, or the first position
        when the store could not grow (no shared memory): the cursor stops there and the channel is tried
        again shortly, nothing is lost."""
        w = self.worker
        try:
            w.deferred.add(self.topic.index, self.key, ids, pos, att, not_before)
        except DeferredNoSpace as e:
            w.storage_failed(f"CHANNEL({self.topic.name}:{self.name}): cannot defer messages", e)
            self.blocked = True
            w.retry_later(self)
            return int(pos.min())
        w.deferred_changed()
        return NO_STOP

    def _deliver_due(self, s, budget, now, deadline):
        """Deferred messages that came due: each takes an in-flight slot now (the store entry is freed once the
        slot holds it); at most ``budget`` and MAX_ROUND_BYTES of frames (at least one). A full table stops
        here, the rest stay due."""
        store = self.worker.deferred
        want = min(budget, len(self.due))
        idx = np.fromiter((e[0] for e in itertools.islice(self.due, want)), np.int64, want)
        _, _, ids, pos, att, _ = store.fields(idx)
        recs = self.topic.log.records_at(pos)
        lengths = recs.lengths[:want] + FRAME_OVERHEAD
        old = None
        if self.policy.message_ttl_ms:
            old = recs.timestamps[:want] < now - self.policy.message_ttl_ns
            if old.any():
                lengths[old] = 0  # never delivered: no room in the round
            else:
                old = None
        take = _round_size(lengths, 1)
        idx, ids, pos, att = idx[:take], ids[:take], pos[:take], att[:take] + 1
        if old is not None:
            old = old[:take]
            att = att - old  # an expired one was not delivered again: its slot keeps the count it had
        table = self.worker.inflight
        slots = self._slots[:take] if take <= ROUND else np.empty(take, np.int64)
        table.start_batch(self.topic.index, self.key, s.conn_id, now, deadline, ids, pos, att, slots)
        full = slots == IF.ST_FULL
        stop = int(np.argmax(full)) if full.any() else take
        for _ in range(stop):
            self.due.popleft()
        if stop < take:
            self._table_full()
        # started, or already holding a slot (a crash between start and free): either way the slot delivers it
        store.free(idx[:stop])
        ok = slots[:stop] >= 0
        if old is not None:
            expired = ok & old[:stop]
            self._expire_held(self._requeue_all(slots[:stop][expired]))
            ok &= ~old[:stop]
        pos, att, slots = pos[:stop][ok], att[:stop][ok], slots[:stop][ok]
        return self._send(s, pos, att, slots, deadline)

    # ---- FIN / REQ / TOUCH -------------------------------------------------------------------------------
    def finish_one(self, s, msg_id):
        slot = self._lookup(s, msg_id, "FIN", FinFailed)
        table = self.worker.inflight
        table.release(slot)
        if self.e2e is not None:
            self.e2e.record(self.topic.log, table.slots, np.array([slot], np.int64))
        self.finished_one(s, slot)

    def finished_one(self, s, slot):
        """s's message in ``slot`` was finished (released in the in-flight table, here or in the lane's own path):
        its round's timer, the counts, and the channel's next delivery or its change mark."""
        w = self.worker
        w.timer_leave_one(slot)
        s.in_flight -= 1
        s.finish_count += 1
        if self.has_messages():
            self.wants_delivery()
        else:
            w.channel_changed(self)  # what a delivery pass marks, without a pass (an unbuffered consumer's FINs)

    def finish_batch(self, s, batch):
        n = len(batch)
        status, freed = self._status[:n], self._freed[:n]
        if n > len(self._status):
            status, freed = np.empty(n, np.int64), np.empty(n, np.int64)
        ids = batch.values
        table = self.worker.inflight
        done = table.finish_batch(self.key, ids, s.conn_id, status, freed)
        if done:
            if self.e2e is not None:
                self.e2e.record(self.topic.log, table.slots, freed)  # (failures' entries are -1)
            self.worker.timer_leave(freed)  # (a FIN that failed freed no slot: -1, skipped)
            s.in_flight -= done
            s.finish_count += done
            self.wants_delivery()
        if done != n:
            for i in np.nonzero(status != IF.OK)[0].tolist():
                s._fail(FinFailed(f"FIN {bytes(batch.ids[i]).decode('latin-1')} failed "
                                  f"{_fail_text(int(status[i]))}"))

    def _lookup(self, s, msg_id, verb, error):
        value = hex_to_id(msg_id)
        slot = IF.ST_NOT_FOUND if value is None else self.worker.inflight.lookup(self.key, value, s.conn_id)
        if slot < 0:
            raise error(f"{verb} {msg_id.decode('latin-1')} failed {_fail_text(slot)}")
        return slot

    def requeue(self, s, msg_id, timeout_ms):
        slot = self._lookup(s, msg_id, "REQ", ReqFailed)
        table = self.worker.inflight
        self.worker.timer_leave_one(slot)
        if self.policy.max_attempts and self._over_attempts(DL.attempts_of(table, slot)):
            table.requeue(slot, 0)  # held for its dead letter; the REQ is answered as nsqd does (nothing)
            self._doom((slot,))  # (the channel counts it in dead_lettered_count)
        else:
            self.requeue_count += 1
            if timeout_ms <= 0:
                table.requeue(slot, 0)
                self.put_back((slot,))
            elif not self._defer_slot(slot, time.time_ns() + timeout_ms * 1_000_000):
                table.requeue(slot, 0)  # the store cannot grow: requeue now rather than lose it
                self.put_back((slot,))
        s.in_flight -= 1
        s.requeue_count += 1
        self.wants_delivery()

    def _defer_slot(self, slot, due):
        """Move an in-flight message to the deferred store until `due` (entry first, then the slot is freed: a
        crash in between leaves both, and recovery keeps the slot). False if the store cannot grow."""
        w = self.worker
        info = w.inflight.slot(slot)
        msg_id = info.msg_id - (1 << 64) if info.msg_id >= 1 << 63 else info.msg_id
        try:
            w.deferred.add(self.topic.index, self.key, np.array([msg_id], np.int64),
                           np.array([info.log_pos], np.int64), np.array([info.attempts], np.int64),
                           np.array([due], np.int64))
        except DeferredNoSpace as e:
            w.storage_failed(f"CHANNEL({self.topic.name}:{self.name}): cannot defer a message", e)
            return False
        w.inflight.release(slot)
        w.deferred_changed()
        return True

    def touch(self, s, msg_id):
        slot = self._lookup(s, msg_id, "TOUCH", TouchFailed)
        table = self.worker.inflight
        info = table.slot(slot)
        now = time.time_ns()
        deadline = min(now + s.settings.msg_timeout_ms * 1_000_000,
                       info.delivered_ns + self.worker.opts.max_msg_timeout)
        table.touch(slot, deadline)
        self.worker.timer_leave_one(slot)
        self.worker.timer_start_each([slot], [deadline])

    # ---- timers and disconnects ------------------------------------------------------------------------
    def on_expired(self, slot, info, session):
        """The scanner says slot's deadline passed (the generation was already checked): an in-flight message
        timed out, or a deferred one is due. Either way it goes back into the channel, behind what waits there."""
        if info.state == IF.IN_FLIGHT:
            self.timeout_count += 1
            if session is not None:
                session.in_flight -= 1
                if session.ready_for_more():
                    self.wants_delivery()
            self.worker.inflight.requeue(slot, 0)
            if self.policy.max_attempts and self._over_attempts(info.attempts):
                self._doom((slot,))
                return
        self.put_back((slot,))
        self.wants_delivery()

    def requeue_conn(self, session):
        """Everything in flight at a consumer that went away comes back at once."""
        table = self.worker.inflight
        slots = table.iter_conn(session.conn_id)
        mine = [x for x in slots.tolist() if table.slot(x).channel == self.key]
        for slot in mine:
            table.requeue(slot, 0)
        back = mine
        if mine and self.policy.max_attempts:  # nsqd would time them out: over the attempts, they are dead
            dead = [x for x in mine if self._over_attempts(DL.attempts_of(table, x))]
            if dead:
                back = [x for x in mine if x not in set(dead)]
                self._doom(dead)
        self.put_back(back)
        if mine:
            self.worker.timer_leave(np.array(mine, np.int64))
            session.in_flight = 0
            self.wants_delivery()

    def pause(self, paused):
        """Stop (or resume) delivery; messages keep arriving (NSQ's channel pause)."""
        if paused == self.paused:
            return
        self.paused = paused
        self.worker._record(self.worker.directory.channel_paused, self.key, paused)
        if not paused:
            self.wants_delivery()

    def empty(self):
        """NSQ's channel empty: its queue (memory and disk), in-flight and deferred messages are gone; the
        consumers stay (FIN of a message they still hold then fails, as in nsqd)."""
        self.drop_all()
        log = self.topic.log
        log.advance(self.ch, log.head)
        self.worker.touched.add(self.topic)

    def drop_all(self):
        """Channel deleted or emptied: free every slot it holds."""
        table = self.worker.inflight
        slots = self.worker.slots_of_channel(self.key)
        self.worker.timer_leave(np.array(slots, np.int64))
        for slot in slots:
            table.release(slot)
        self.requeued.clear()
        self.due.clear()
        self.doomed.clear()
        self._expiring = []
        self._dying = []
        self.worker.deferred.drop_channel(self.key)
        for s in self.consumers:
            s.in_flight = 0


    # ---- dead letters (workers/domain/dead_letter.py) --------------------------------------------------------
    def _over_attempts(self, attempts):
        """A message delivered this many times is dead at its REQ, timeout or consumer's disconnect."""
        return attempts >= self.policy.max_attempts > 0 and bool(self.policy.dead_letter_topic)

    def recover_held(self, slot):
        """A restarted worker's recovery: a slot of this channel whose dead letter was under way when its
        predecessor died (``dead_letter.marked``) is dead-lettered again, never delivered again -> True; False
        for any other slot (requeued as before)."""
        reason = DL.marked(self.worker.inflight, slot)
        if reason is None:
            return False
        self.doomed.append((slot, reason))
        self.wants_delivery()
        return True

    def _doom(self, slots):
        """Held slots (REQUEUED, in no queue) over max_attempts: marked now (a crash from here on sends them to the
        dead-letter topic, never to a consumer), published together at the channel's next pass (the REQs of one
        read of a connection make one publish)."""
        table = self.worker.inflight
        for slot in slots:
            DL.mark(table, slot, DL.MAX_ATTEMPTS)
        self._dying.extend(slots)
        self.wants_delivery()

    def _dead_letter_dying(self):
        slots, self._dying = self._dying, []
        self._dead_letter(slots, DL.MAX_ATTEMPTS)

    def _dead_letter_expiring(self):
        slots, self._expiring = self._expiring, []
        self._dead_letter(slots, DL.TTL)

    def _dead_letter_doomed(self):
        """Held slots waiting for their dead letter (recovered after a crash, or refused before): try again."""
        by_reason = {}
        while self.doomed:
            slot, reason = self.doomed.popleft()
            by_reason.setdefault(reason, []).append(slot)
        for reason, slots in by_reason.items():
            self._dead_letter(slots, reason)

    def _dead_letter(self, slots, reason):
        """Move the messages of held slots (REQUEUED in the table, in no queue of the channel, no timer) to the
        dead-letter topic as one publish: each slot marked, the dead letters committed through the worker's one
        publish decision (``Forwarder.commit``), then the slots released. A publish parked for room in the ring
        completes later (``dead_letter.Waiter``); a refused one puts the messages back (``_dead_letter_refused``)."""
        w = self.worker
        if w.stopping:
            # the other workers may have saved already (a dead letter committed to one now would go with the
            # shared memory): the held slots are saved with their attempts, and the next start dead-letters them
            # when they come up for delivery (``_spent_at``; an expired one by its TTL)
            return
        table = w.inflight
        dead = self.policy.dead_letter_topic
        if dead and not is_valid_name(dead):  # (an ephemeral topic's name + the suffix): as if none were set
            self._log_once(f"dead-letter topic {dead!r} is not a valid topic name: none is used", "")
            dead = ""
        if not dead:  # the policy changed since these were decided
            if reason == DL.TTL and self.policy.message_ttl_ms:
                self._expire_held(slots)
            else:
                self.put_back(slots)
                self.wants_delivery()
            return
        marks = [DL.mark(table, x, reason) for x in slots]
        src, offsets, lengths = DL.pack(self.topic.name, self.name, self.topic.log, table, slots, reason)
        done = w.dead_letter(dead, src, offsets, lengths)
        if done is True:
            self._dead_lettered(slots, marks, reason)
        elif not done:
            self._dead_letter_refused(slots, marks, reason, f"topic {dead} is full or cannot store them")
        else:  # parked: the ring to the dead-letter topic's owner has no room now
            done.add(DL.Waiter(lambda: self._dead_lettered(slots, marks, reason),
                               lambda err: self._dead_letter_refused(slots, marks, reason, str(err))),
                     len(slots), PubFailed, "PUB")

    def _dead_lettered(self, slots, marks, reason):
        """The dead letters were committed: free the slots that still hold them (one the channel's deletion or
        emptying freed meanwhile is not touched: its mark no longer holds)."""
        table = self.worker.inflight
        n = 0
        for slot, value in zip(slots, marks):
            if DL.still_marked(table, slot, value):
                table.release(slot)
                n += 1
        self.dead_lettered_count += n
        if reason == DL.TTL:
            self.expired_count += n
        self.worker.channel_changed(self)  # the log may reclaim what they pinned; the counts changed

    def _dead_letter_refused(self, slots, marks, reason, why):
        """The dead-letter topic refused them (full, no space): nothing is lost. Over max_attempts, a message is
        delivered again and dead-lettered at its next REQ or timeout; an expired one is never delivered: it
        waits in ``doomed`` and is tried again after DEAD_LETTER_RETRY. One log line per cause and second."""
        table = self.worker.inflight
        live = [slot for slot, value in zip(slots, marks) if DL.still_marked(table, slot, value)]
        for slot in live:
            DL.unmark(table, slot)
        then = "delivered again" if reason == DL.MAX_ATTEMPTS else "kept and tried again"
        self._log_once(f"dead letters to {self.policy.dead_letter_topic} refused ({why}): {len(live)} messages "
                       f"{then}", why)
        if reason == DL.MAX_ATTEMPTS:
            self.put_back(live)
        else:
            self.doomed.extend((slot, reason) for slot in live)
            self._doomed_at = time.monotonic() + DEAD_LETTER_RETRY / 2  # (retry_later's wake-up comes after DEFER_RETRY)
            self.worker.retry_later(self)
        self.wants_delivery()

    def _log_once(self, text, cause):
        """A warning about this channel's dead letters, at most once per cause and second."""
        now = time.monotonic()
        if now - self._refused_logged.get(cause, 0.0) >= 1.0:
            self._refused_logged[cause] = now
            self.worker.log.warn(f"CHANNEL({self.topic.name}:{self.name}): {text}")
