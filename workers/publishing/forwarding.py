"""Publishing from a worker: PUB/MPUB/DPUB appended here or forwarded to the topic's owner, the owner's side of
the rings (forwarded publishes and control commands), and back-pressure when a ring is full.

``Forwarder`` is one part of ``nsqpy.workers.processes.worker.Worker``. It owns the worker's rings (its input rings
from every other producer, its output rings to every other worker), the parked publishes and the state of a ring
drain (the record being appended, a record to set aside, a ring to drain record by record). It is built with
what it uses: the link set, the control block (``topic_full``), the suspect words, the loop's timers, the log,
and five services through narrow interfaces: the topic table (``Topics``: ``get_topic``, ``control_command``),
the pump (``TopicLearner``: ``learn_topic``), the own path (``OwnTopicHint``: ``hint``), the worker's
``deliver_now()`` (deliver and flush channels with something pending, before the pump's OKs) and its
``storage_failed(what, exc)``.

One publish path: ``commit`` decides owner or forward for every publish made in Python (a session's PUB, MPUB,
DPUB through ``publish``/``publish_mpub``; the pump's lone PUBs of an iteration through ``publish_staged``), and
either appends to the topic's log here or commits one FORWARD record to the owner's ring. The compiled forward
lane (``workers/lane/``) makes the same decision for the lone PUBs it takes.

Bounded channels (``workers/domain/bounds.py``): a topic whose owner marked it for a channel at its limit
(``Control.mark_kind``) is refused before anything is forwarded (overflow reject: ``E_*_FAILED`` naming the
channel), or its publish is held back (overflow block: a ``Parked`` publish in ``blocked``, its sessions held,
retried once the owner clears the mark; the owner wakes every sender then). The owner holds back its own
topics' publishes the same way when ``Topic.append`` raises ``ChannelBlocked``, and watches each of its topics
with a channel mark (``watched``) until the channel is below its limit again, then clears the mark.
Theory of operation: ARCHITECTURE.md, "Message flow" and "Overload slows producers down".
"""
import os
import time
import traceback
import signal
import zlib
from collections import deque
from functools import partial
from typing import Callable, Protocol

import numpy as np

from nsqpy.ipc.ring import C_HEAD, C_READ, C_STALLED, P_TAIL
from nsqpy.protocol.errors import DpubFailed, MpubFailed, PubFailed
from nsqpy.workers.control import commands as CMD
from nsqpy.workers.publishing.links import DRAIN_BATCH
from nsqpy.workers.publishing.records import COMMAND, EMPTY_FORWARD, FORWARD, FORWARD_BY_FILE, RUN_APPEND, RUN_FIRST, RUN_MSG, \
    RUN_MSGS, RUN_NAME, RUN_NAME_LEN, RUN_RECORDS, RUN_WORDS, forward_size, forward_topic, owner_of, pack_forward, \
    plan_forward_runs, set_want_room, unpack_command, unpack_forward, want_room
from nsqpy.workers.storage.poison import COUNT as SUSPECT_COUNT, FORWARD as FORWARD_SUSPECT, quarantine_file
from nsqpy.workers.domain import bounds
from nsqpy.workers.domain.topic import ChannelBlocked, ChannelFull, StorageError

PARKED_POLL = 0.05             # seconds: parked publishes are retried at least this often (the owner wakes us)
FORWARD_RETRY = 0.05           # seconds before a forwarded publish the owner could not append is tried again
LARGE_FORWARD = 4 << 20        # bytes: bigger forwarded publishes go by file (a ring record is at most half the ring)
PACK_SIZE = 8 << 20            # the buffer forwarded publishes are packed in (bigger ones get their own)


def _nothing():
    pass


def crash_if_marked(bodies, marker):
    """Fault injection (tests only): die as a kernel bug would, by SIGSEGV, if a body starts with marker."""
    for body in bodies:
        if body.startswith(marker):
            os.kill(os.getpid(), signal.SIGSEGV)


class Topics(Protocol):
    """The topic table (``workers/domain/topics.py``): the topic a publish goes to, created on first use (raises
    StorageError when it cannot be), and control commands from the rings."""

    def get_topic(self, name: str): ...

    def control_command(self, op: int, topic: str, channel=None) -> int: ...


class TopicLearner(Protocol):
    """The pump (``workers/lane/pump.py``): which worker owns a topic a session published to."""

    def learn_topic(self, topic: str, owner: int) -> None: ...


class OwnTopicHint(Protocol):
    """The own path (``workers/lane/ownpath.py``): the topic of ours the lane may take lone PUBs of next."""

    def hint(self, topic) -> None: ...


class Parked:
    """A forwarded publish waiting for room in the ring to its topic's owner (a copy of its record), and the
    sessions whose OK waits for it: one for a PUB/MPUB/DPUB, every session of a batch of the pump's lone PUBs.
    Each session is held meanwhile (``Session.hold``: it reads nothing more)."""
    __slots__ = ("rtype", "payload", "topic", "crc", "waiters", "lengths")

    def __init__(self, rtype, payload, topic, crc, lengths=None):
        self.rtype = rtype
        self.payload = payload
        self.topic = topic
        self.crc = crc
        self.waiters = []  # (session, messages, error class, verb)
        self.lengths = lengths  # a held-back publish to a topic of ours: its body lengths (the room it needs)

    def add(self, s, n=1, error=PubFailed, verb="PUB"):
        self.waiters.append((s, n, error, verb))
        s.hold()

    def wanted(self):
        """Some session still waits for it (one closed while held gets no answer, and its messages go nowhere)."""
        return any(not w[0].closed for w in self.waiters)

    def drop(self):
        if self.rtype == FORWARD_BY_FILE and self.payload is not None:
            try:
                os.unlink(bytes(self.payload).decode())
            except OSError:
                pass
        self.payload = None


class Refused:
    """The pump's lone PUBs to a topic a bounded channel refuses (``publish_staged``): each session gets
    E_PUB_FAILED with the reason (the pump adds them as it adds a Parked publish's)."""
    __slots__ = ("why",)

    def __init__(self, why):
        self.why = why

    def add(self, s, n=1, error=PubFailed, verb="PUB"):
        s.fail_held(error(f"{verb} failed {self.why}"))


class Forwarder:
    _draining = False  # inside a ring drain (its handlers may delete topics, which catch up first)

    def __init__(self, index, workers, links, control, suspect, loop, log, data_path, prefix, opts,
                 topics: Topics, pump: TopicLearner, own_path: OwnTopicHint, owner_naps,
                 deliver_now: Callable[[], None], storage_failed: Callable[[str, BaseException], None]):
        self.index = index
        self.workers = workers
        self.links = links
        self.control = control
        self.suspect = suspect
        self.loop = loop
        self.log = log
        self.data_path = data_path
        self.prefix = prefix
        self.topics = topics
        self.pump = pump
        self.own_path = own_path
        self.owner_naps = owner_naps
        self.deliver_now = deliver_now
        self.storage_failed = storage_failed
        self.pub_in = links.inputs_of(index)  # from every producer slot but ours: workers, then others
        self.pub_pending = links.watch(self.pub_in)
        self.pub_out = {j: links.pub(index, j) for j in range(workers) if j != index}
        # the wake-up line of who writes pub_in[i] (the owner wakes a sender waiting for room: _drain_from)
        self._pub_in_from = [links.proc_of(j) for j in range(links.producers) if j != index]
        for link in self.pub_in:
            links.recover_reader(link)
        for link in self.pub_out.values():
            links.recover_writer(link)
            set_want_room(link.ring.ctl, 0)  # a dead predecessor may have left it set
        self.large_forward = min([LARGE_FORWARD] + [link.large_forward for link in self.pub_out.values()])
        self._pack = np.empty(PACK_SIZE, np.uint8)
        self._one_off, self._one_len = np.zeros(1, np.int64), np.zeros(1, np.int64)
        self._fwd_off, self._fwd_len = np.zeros(1, np.int64), np.zeros(1, np.int64)
        self._crash_on_forwarded = opts.crash_on_forwarded_body.encode()
        self._fwd_blocked_until = 0.0  # forwarded publishes wait until then (their topic could not take them)
        self._fwd_k = 0                 # index of the forwarded record being appended, in its drain batch
        self._fwd_refused = False       # the drain stopped at a record its topic cannot take (ring: C_STALLED)
        self._fwd_poison = None         # (link, index in its first batch): a forwarded record to set aside
        self._fwd_careful = None        # a link whose next drain goes record by record (a drain of it crashed)
        self._fwd_runs = np.zeros((DRAIN_BATCH, RUN_WORDS), np.int64)  # plan_forward_runs' output
        self._fwd_msgs = tuple(np.zeros(4096, np.int64) for _ in range(3))  # its messages: offsets, lengths, ts
        self._fwd_batch = None          # (ring data, offsets, lengths, types) of the batch being drained
        self._fwd_files = 0             # large forwarded publishes written (file names)
        self.parked = {}                # owner -> deque of Parked publishes waiting for room in its ring, in order
        # (owner, topic) -> deque of Parked publishes held back while the topic's channel is at its limit (block)
        self.blocked = {}
        self.watched = set()            # topics of ours with a channel mark, cleared once they drain
        self.parked_count = 0           # publishes parked or held back, plus watched topics: retry_parked has work
        self._parked_poll = None
        self._parked_logged = 0.0

    # ---- publishing ------------------------------------------------------------------------------------
    def publish(self, s, topic, bodies, defer_ms, verb):
        # one message: reuse one-element arrays (appending copies them into the log), no allocation per PUB
        body = bodies[0]
        self._one_len[0] = len(body)
        self._publish_for(s, topic, np.frombuffer(body, np.uint8), self._one_off, self._one_len, defer_ms,
                          DpubFailed if verb == "DPUB" else PubFailed, verb)

    def publish_mpub(self, s, cmd):
        self._publish_for(s, cmd.topic, np.frombuffer(cmd.buffer, np.uint8), cmd.offsets, cmd.lengths, 0,
                          MpubFailed, "MPUB")

    def _publish_for(self, s, topic, src, offsets, lengths, defer_ms, error, verb):
        """A session's publish: commit it, then OK (counted), E_*_FAILED (raised) or held until its ring has room."""
        owner = owner_of(topic, self.workers)
        try:
            ok = self._commit_to(owner, topic, src, offsets, lengths, defer_ms, False)
        except StorageError as e:
            raise error(f"{verb} failed {e}") from None
        if ok is False:
            raise error(f"{verb} failed topic {topic} is full")
        if ok is True:
            s.count_pub(topic, len(lengths))
        else:
            ok.add(s, len(lengths), error, verb)  # parked: the OK goes once the ring took it, the session reads no more
        self.pump.learn_topic(topic, owner)

    def publish_staged(self, topic, buf, offsets, lengths):
        """The pump's lone PUBs of this iteration for one topic, as one batch -> True (their OKs follow), False
        (E_PUB_FAILED) or a Parked publish (the pump adds their sessions to it; see Pump.commit). For a topic of
        ours, the channels that can take them deliver and flush before this returns, so before the OKs; a
        session that flush closes gets no OK (the pump checks its fd's generation)."""
        try:
            return self.commit(topic, buf, offsets, lengths, 0, lone=True)
        except ChannelFull as e:
            return Refused(str(e))
        except StorageError:
            return False  # already logged; the pump answers E_PUB_FAILED

    def commit(self, topic, src, offsets, lengths, defer_ms=0, lone=False):
        """The owner-or-forward decision of every publish made in Python: n messages (bodies
        src[offsets[i]:offsets[i]+lengths[i]]) appended to the topic's log when this worker owns it, else one
        record committed to the owner's ring (``_forward``). -> True (committed), False (the topic is full: the
        owner refused, or marked it full for the others) or a Parked publish (the ring has no room now: the
        caller adds the sessions whose OK waits for it). Raises StorageError when the topic cannot store it.

        ``lone``: the pump's lone PUBs, committed in the idle step after the rings were caught up; the own path
        is hinted at the topic and its channels deliver now (``deliver_now``), before the pump's OKs: an OK's
        send wakes its producer, which on a busy host may take this worker's CPU before the consumers got the
        messages. Otherwise (a session's command) what other workers committed to our rings is appended first
        (``catch_up``), so a producer moved here is not overtaken by its own earlier publishes."""
        return self._commit_to(owner_of(topic, self.workers), topic, src, offsets, lengths, defer_ms, lone)

    def _commit_to(self, owner, topic, src, offsets, lengths, defer_ms, lone):
        now = time.time_ns()
        if owner != self.index:
            return self._forward(owner, topic, src, offsets, lengths, now, defer_ms)
        if not lone:
            self.catch_up()
        t = self.topics.get_topic(topic)
        if lone:
            self.own_path.hint(t)  # the lane may take this topic's next lone PUBs (workers/lane/ownpath.py)
        try:
            if t.bounded and (owner, topic) in self.blocked:
                raise ChannelBlocked(topic)  # behind the publishes held back before it
            ok = t.append(src, offsets, lengths, now, defer_ms)
        except ChannelBlocked:
            payload = self._packed(topic.encode(), src, offsets, lengths, now, defer_ms)
            ok = self._hold_back(owner, topic, t.crc, payload, lengths.copy())
        finally:
            if t.limited is not None:
                self.watch(t)
        if lone:
            self.deliver_now()
        return ok

    def _packed(self, name, src, offsets, lengths, now, defer_ms):
        """The publish as one FORWARD record (in the pack buffer, or its own when bigger)."""
        size = forward_size(name, lengths)
        out = self._pack if size <= self._pack.size else np.empty(size, np.uint8)
        return pack_forward(out, name, src, offsets, lengths, now, defer_ms)

    def _forward(self, owner, topic, src, offsets, lengths, now, defer_ms):
        """Commit n messages (bodies src[offsets[i]:offsets[i]+lengths[i]]) to the owner's ring as one record.
        -> True when committed; False when the owner marked the topic full (E_PUB_FAILED, as nsqd); a Parked
        publish (holding a copy) when the ring has no room now, or earlier publishes to this owner still wait, or
        a channel of the topic is at its limit (overflow block): the caller adds the sessions whose OK waits for
        it. A full ring is back-pressure, never an error. Raises ChannelFull for a channel at its limit with
        overflow reject."""
        name = topic.encode()
        crc = zlib.crc32(name)
        if self.control.topic_full(owner, crc):
            why = self.control.refusal(owner, crc, topic)
            if why is not None:  # the owner could not take the last ones: refuse now, as nsqd would
                if why.startswith("channel "):
                    raise ChannelFull(why)
                return False
            # a channel with overflow block is at its limit: hold the publish back until the owner clears the mark
            return self._hold_back(owner, topic, crc, self._packed(name, src, offsets, lengths, now, defer_ms))
        payload = self._packed(name, src, offsets, lengths, now, defer_ms)
        if self.blocked and (owner, topic) in self.blocked:
            return self._hold_back(owner, topic, crc, payload)  # behind the publishes held back before it
        return self._send_forward(owner, payload, topic, crc)

    def _send_forward(self, owner, payload, topic, crc):
        """Commit one record to the owner's ring at once, or park it behind what already waits for that owner
        (-> the Parked publish). Never waits: the loop goes on serving every other session, and the owner wakes
        us when it has released records of a ring we wait on (``_drain_from``)."""
        ring = self.pub_out[owner]
        rtype = FORWARD
        if len(payload) > self.large_forward:
            payload, rtype = self._forward_file(payload), FORWARD_BY_FILE
        if owner not in self.parked and ring.send(rtype, payload):
            self.owner_naps.saw(owner, self.links.wake(owner))
            return True
        p = Parked(rtype, payload.copy() if rtype == FORWARD else payload, topic, crc)
        q = self.parked.get(owner)
        if q is None:
            q = self.parked[owner] = deque()
            set_want_room(ring.ring.ctl, 1)  # before the room check that precedes any sleep (_inputs_empty)
            now = time.monotonic()
            if now - self._parked_logged >= 1.0:
                self._parked_logged = now
                self.log.debug(f"worker {self.index}: worker {owner} is behind: publishes to it wait for room")
        q.append(p)
        self.parked_count += 1
        if self._parked_poll is None:
            self._parked_poll = self.loop.call_later(PARKED_POLL, self._poll_parked)
        self.links.wake(owner)
        return p

    # ---- bounded channels: held-back publishes and watched topics -----------------------------------------
    def _hold_back(self, owner, topic, crc, payload, lengths=None):
        """Park a publish (a copy of its FORWARD record) while ``topic``'s channel is at its limit (overflow block),
        behind what is held back for it already; -> the Parked publish (the caller adds its sessions)."""
        p = Parked(FORWARD, payload.copy(), topic, crc, lengths)
        self._queue_blocked(owner, p)
        if self._parked_poll is None:
            self._parked_poll = self.loop.call_later(PARKED_POLL, self._poll_parked)
        return p

    def watch(self, t):
        """t (ours) carries a channel mark: watch it until it can be cleared (``_retry_blocked``)."""
        if t not in self.watched:
            self.watched.add(t)
            self.parked_count += 1

    def _retry_blocked(self):
        """Clear the marks of watched topics that drained (waking every sender), then retry held-back publishes
        in order per topic: appended here (ours), sent on to the owner's ring once it cleared the mark, or
        refused when the mark now says so."""
        for t in list(self.watched):
            if t.deleted or t.check_limits() is None:
                self.watched.discard(t)
                self.parked_count -= 1
                for proc in self._pub_in_from:
                    self.links.wake(proc)
        for key in list(self.blocked):
            owner, topic = key
            q = self.blocked[key]
            while q:
                p = q[0]
                answer = None
                if not p.wanted():
                    p.drop()
                elif owner == self.index:
                    answer = self._append_held(p)
                    if answer is None:
                        break
                elif self.control.topic_full(owner, p.crc):
                    why = self.control.refusal(owner, p.crc, topic)
                    if why is None:
                        break  # still blocked
                    p.drop()
                    answer = partial(self._answer_parked, p, why)
                else:
                    q.popleft()
                    self.parked_count -= 1
                    self._send_parked(owner, p)
                    continue
                q.popleft()
                self.parked_count -= 1
                if answer is not None:
                    answer()
            if not q:
                del self.blocked[key]

    def _append_held(self, p):
        """Append a publish held back for a topic of ours -> how to answer it, or None while it still does not fit."""
        topic, offsets, lengths, ts, defer_ms = unpack_forward(p.payload, self._fwd_off, self._fwd_len)
        try:
            t = self.topics.get_topic(topic)
            try:
                ok = t.append(p.payload, offsets, lengths, ts, defer_ms)
            finally:
                if t.limited is not None:
                    self.watch(t)
        except ChannelBlocked:
            return None
        except StorageError as e:
            ok, why = False, str(e)
        else:
            why = f"topic {topic} is full"
        p.drop()
        return partial(self._answer_parked, p, None if ok else why)

    def _send_parked(self, owner, p):
        """A held-back publish its owner takes again: into the ring now, or parked behind what waits for room."""
        ring = self.pub_out[owner]
        if p.rtype == FORWARD and len(p.payload) > self.large_forward:
            try:
                p.payload, p.rtype = self._forward_file(p.payload), FORWARD_BY_FILE
            except StorageError as e:
                p.payload = None
                self._answer_parked(p, str(e))
                return
        if owner not in self.parked and ring.send(p.rtype, p.payload):
            p.payload = None
            self.links.wake(owner)
            self._answer_parked(p, None)
            return
        q = self.parked.get(owner)
        if q is None:
            q = self.parked[owner] = deque()
            set_want_room(ring.ring.ctl, 1)
        q.append(p)
        self.parked_count += 1

    def _blocked_room(self):
        """Whether ``_retry_blocked`` has something to do now (a watched topic drained, a held-back publish fits)."""
        for t in self.watched:
            if t.deleted or bounds.limit_state(t) is None:
                return True
        for (owner, topic), q in self.blocked.items():
            p = q[0]
            if owner == self.index:
                t = self.topics.get_topic(topic)
                refused = bounds.admit(t, len(p.lengths), p.lengths) if t.bounded else None
                if refused is None or refused[0] == "reject":
                    return True
            elif not self.control.topic_full(owner, p.crc) or self.control.refusal(owner, p.crc, topic):
                return True
        return False

    def retry_parked(self):
        """Commit parked publishes, oldest first for each owner, as far as its ring takes them; answer their
        sessions (OK, or E_*_FAILED when the owner marked the topic full meanwhile) and let them read again.
        Held-back publishes and watched topics (bounded channels) first."""
        if self.watched or self.blocked:
            self._retry_blocked()
        for owner in list(self.parked):
            q = self.parked[owner]
            ring = self.pub_out[owner]
            sent = False
            while q:
                p = q[0]
                why = None
                if p.wanted() and self.control.topic_full(owner, p.crc):
                    why = self.control.refusal(owner, p.crc, p.topic)
                    if why is None or (owner, p.topic) in self.blocked:  # its channel is at its limit (block)
                        q.popleft()
                        self.parked_count -= 1
                        self._queue_blocked(owner, p)  # its channel reached its limit (block) meanwhile
                        continue
                if not p.wanted():
                    p.drop()
                    answer = None
                elif why is not None:
                    p.drop()
                    answer = partial(self._answer_parked, p, why)
                elif ring.send(p.rtype, p.payload):
                    sent = True
                    p.payload = None  # the ring (or the owner, for a file) has it now
                    answer = partial(self._answer_parked, p, None)
                elif ring.ring.ctl[C_STALLED] or ring.ring.out_of_pages:
                    # not slow but stuck: the owner cannot store the record at the head of this ring (no space,
                    # or its budgets and overdraft are used up), or /dev/shm has no page for this one in the ring
                    # (nsqpy.ipc.ring, lazy pages), so this waits on a real limit: fail, as nsqd's publish fails on a
                    # full disk
                    p.drop()
                    answer = partial(self._answer_parked, p, f"topic {p.topic} cannot be stored now: no space")
                else:
                    break
                q.popleft()
                self.parked_count -= 1
                if answer is not None:
                    answer()  # may publish again: to this owner, that queues behind what still waits here
            if sent:
                self.links.wake(owner)
            if not q:
                del self.parked[owner]
                set_want_room(ring.ring.ctl, 0)

    def _queue_blocked(self, owner, p):
        """p waits, behind what is held back for its topic already, until the topic's channel has room."""
        q = self.blocked.get((owner, p.topic))
        if q is None:
            q = self.blocked[(owner, p.topic)] = deque()
        q.append(p)
        self.parked_count += 1

    def _answer_parked(self, p, why):
        """OK (``why`` None: committed) or E_*_FAILED (``why`` the reason after 'PUB failed ') for each session
        still waiting on a parked publish; then each reads again (``Session.release``). One session's failure
        stays its own."""
        for s, n, error, verb in p.waiters:
            if s.closed:
                continue
            try:
                if why is None:
                    s.count_pub(p.topic, n)
                    s.release()
                else:
                    s.fail_held(error(f"{verb} failed {why}"))
            except Exception:
                self.log.error(f"worker {self.index}: [{s.remote_text}] failed after its parked publish: "
                               f"{traceback.format_exc().strip()}")
                s.close()

    def parked_room(self):
        """Whether the first parked publish of some owner fits in its ring now (or ``_blocked_room``)."""
        if (self.watched or self.blocked) and self._blocked_room():
            return True
        for owner, q in self.parked.items():
            if self.pub_out[owner].ring.can_claim(len(q[0].payload)):
                return True
        return False

    def _poll_parked(self):
        """A safety net while publishes are parked (the owner's wake-up is what normally retries them)."""
        self._parked_poll = None
        if self.parked_count > len(self.watched):  # publishes wait (a watched topic drains by this worker's work)
            self._parked_poll = self.loop.call_later(PARKED_POLL, self._poll_parked)

    def drop_parked(self):
        for q in list(self.parked.values()) + list(self.blocked.values()):
            for p in q:
                p.drop()
        self.parked.clear()
        self.blocked.clear()
        self.watched.clear()
        self.parked_count = 0

    def _forward_file(self, payload):
        """Write a forwarded publish too big for the ring to a file under the data path; -> its path, the ring
        record. The owner appends from it and removes it; a file whose record was released is gone, so a
        re-read after a crash finds no file and knows the publish was appended (at worst it appends twice)."""
        self._fwd_files += 1
        path = os.path.join(self.data_path, f"{self.prefix.strip('/')}fwd-{self.index}-{os.getpid()}-"
                                            f"{self._fwd_files}.bin")
        try:
            with open(path, "xb") as f:
                f.write(memoryview(payload))
        except OSError as e:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            self.storage_failed("a large publish cannot be forwarded", e)
            raise StorageError(f"cannot forward a publish of {len(payload)} bytes: {e}") from None
        return np.frombuffer(path.encode(), np.uint8)

    def _on_forwarded(self, rtype, payload):
        """Append one forwarded publish (already answered OK by the sender). False keeps it in the ring: the
        topic cannot take it now (budgets used up, no space, topic cannot be created), and draining pauses for
        FORWARD_RETRY so the worker does not spin on it; it is never dropped. Meanwhile the ring counts as
        stalled (C_STALLED, see _drain_from), as does any other ring this pause keeps us from draining."""
        if self._fwd_blocked_until:
            if time.monotonic() < self._fwd_blocked_until:
                self._fwd_refused = True
                return False
            self._fwd_blocked_until = 0.0
        self.suspect.w[self.suspect.base + SUSPECT_COUNT] = self._fwd_k
        if rtype == COMMAND:
            self._on_command(payload)
            self._fwd_k += 1
            return True
        path, payload = self._load_forwarded(rtype, payload)
        if payload is None:
            self._fwd_k += 1
            return True  # appended and its file removed before a crash kept the record from being released
        try:
            ok = self._append_forwarded(payload)
        except StorageError:
            ok = False
        if ok and path is not None:
            os.unlink(path)
        self._fwd_k += 1
        if not ok:
            self._fwd_refused = True
            self._fwd_blocked_until = time.monotonic() + FORWARD_RETRY
            self.loop.call_later(FORWARD_RETRY, _nothing)  # wakes the loop to try again
        return ok

    @staticmethod
    def _load_forwarded(rtype, payload):
        """-> (path of its file or None, the publish's bytes; None when the file is gone: already appended)."""
        if rtype != FORWARD_BY_FILE:
            return None, payload
        path = bytes(payload).decode()
        try:
            return path, np.fromfile(path, np.uint8)
        except FileNotFoundError:
            return path, None

    def _append_forwarded(self, payload):
        topic, offsets, lengths, ts, defer_ms = unpack_forward(payload, self._fwd_off, self._fwd_len)
        if self._crash_on_forwarded:
            self._fault_injection(payload, offsets, lengths)
        t = self.topics.get_topic(topic)
        ok = t.append(payload, offsets, lengths, ts, defer_ms, acknowledged=True)
        if t.limited is not None:
            self.watch(t)
        return ok

    def _on_command(self, payload):
        """A control command from another process (workers/control/client.py): carry it out (``control_command``),
        store (sequence, status) in the sender's reply words. Never raises: a record that cannot even be read is
        logged and dropped (its sender times out), it must not wedge the ring."""
        try:
            slot, seq, op, topic, channel, _ = unpack_command(payload)
        except Exception as e:
            self.log.error(f"worker {self.index}: dropped an unreadable control command: {e!r}")
            return
        try:
            status = int(self.topics.control_command(op, topic, channel))
        except Exception:
            self.log.error(f"worker {self.index}: control command {CMD.OP_NAMES.get(op, op)} {topic} "
                           f"{channel or ''} failed: {traceback.format_exc().strip()}")
            status = CMD.FAILED
        try:
            self.links.post_reply(slot, self.index, seq, status)
        except ValueError as e:  # a reply slot that does not exist
            self.log.error(f"worker {self.index}: cannot answer control command {seq}: {e}")

    def catch_up(self):
        """Append everything other workers committed to their rings so far, before publishing here: a producer
        handed over to this worker must not have its next messages overtake those it published before the
        move (they were committed before their OK, so before the client sent the next one)."""
        if self._draining:
            return
        for i in self.pub_pending.which():
            ctl = self.pub_in[i].ring.ctl
            target = int(ctl[P_TAIL])
            while int(ctl[C_READ]) < target and self._drain_from(i):
                pass

    def lane_inputs(self):
        """The input rings and their senders' wake-up lines, for the lane's drain (``ownpath.own_drain``)."""
        return [(link.ring, proc) for link, proc in zip(self.pub_in, self._pub_in_from)]

    def lane_may_drain(self):
        """Whether the lane may take plain forwards from the rings now: not while a drain must go record by record
        (after a crash: Restart), a refused append waits for its retry, or fault injection looks at bodies."""
        return self._fwd_poison is None and self._fwd_careful is None and not self._fwd_blocked_until and \
            not self._crash_on_forwarded and not self._draining

    def drain_rings(self):
        return sum(self._drain_from(i) for i in self.pub_pending.which())

    def _drain_from(self, i):
        """Drain forwarded publishes from the i-th input ring, with the suspect words naming each record (the ring's
        release position when the drain began, and the record's index after it)."""
        link = self.pub_in[i]
        ctl = link.ring.ctl
        if ctl[P_TAIL] == ctl[C_READ]:
            return 0
        self.suspect.begin(FORWARD_SUSPECT, i, 0, int(ctl[C_HEAD]), 0)
        self._fwd_k = 0
        self._fwd_refused = False
        self._draining = True  # a command in the ring (e.g. topic_delete) must not drain rings again
        try:
            if self._fwd_poison is not None and self._fwd_poison[0] == i:
                done = link.drain(self._set_aside_forwarded)
            elif self._fwd_careful == i:
                self._fwd_careful = None
                done = link.drain(self._on_forwarded)
            else:
                done = link.drain_runs(self._plan_runs, self._on_run)
        finally:
            self._draining = False
        self.suspect.end()
        if self._fwd_refused:
            ctl[C_STALLED] = 1  # its sender fails what it cannot put into this ring (instead of waiting)
        elif done and ctl[C_STALLED]:
            ctl[C_STALLED] = 0
        if done and want_room(ctl):  # its sender parked publishes for want of room: there is some now
            self.links.wake(self._pub_in_from[i])
        return done

    def _plan_runs(self, data, offs, lens, types):
        """The drained batch as runs (records.plan_forward_runs): -> (first record, record count) per run."""
        runs, msgs = self._fwd_runs, self._fwd_msgs
        self._fwd_batch = (data, offs, lens, types)
        r, m = plan_forward_runs(data, offs, lens, types, runs, *msgs)
        if r < 0:  # more messages than the arrays hold: grow them (to a power of two) and plan again
            self._fwd_msgs = msgs = tuple(np.zeros(1 << (m - 1).bit_length(), np.int64) for _ in range(3))
            r, m = plan_forward_runs(data, offs, lens, types, runs, *msgs)
        return runs[:r, RUN_FIRST:RUN_RECORDS + 1].tolist()

    def _on_run(self, j, first, count):
        """Append run j of the batch being drained: consecutive forwarded publishes to one topic, with one
        Topic.append (each message keeps its record's timestamp); any other record through _on_forwarded. The
        suspect words name the run's first record (a crash then drains that ring record by record once:
        Restart). -> False (exactly) to stop the drain at this run, as _on_forwarded."""
        self._fwd_k = first
        run = self._fwd_runs[j]
        data, offs, lens, types = self._fwd_batch
        if not run[RUN_APPEND]:
            off = int(offs[first])
            return self._on_forwarded(int(types[first]), data[off:off + int(lens[first])])
        if self._fwd_blocked_until:
            if time.monotonic() < self._fwd_blocked_until:
                self._fwd_refused = True
                return False
            self._fwd_blocked_until = 0.0
        self.suspect.w[self.suspect.base + SUSPECT_COUNT] = first
        a, b = int(run[RUN_MSG]), int(run[RUN_MSG] + run[RUN_MSGS])
        topic = bytes(data[run[RUN_NAME]:run[RUN_NAME] + run[RUN_NAME_LEN]]).decode()
        m_offs, m_lens, m_ts = (x[a:b] for x in self._fwd_msgs)
        if self._crash_on_forwarded:
            self._fault_injection(data, m_offs, m_lens)
        try:
            t = self.topics.get_topic(topic)
            ok = t.append(data, m_offs, m_lens, m_ts, acknowledged=True)
            if t.limited is not None:
                self.watch(t)
        except StorageError:
            ok = False
        if not ok:
            self._fwd_refused = True
            self._fwd_blocked_until = time.monotonic() + FORWARD_RETRY
            self.loop.call_later(FORWARD_RETRY, _nothing)  # wakes the loop to try again
            return False
        self._fwd_k = first + count
        return True

    def _set_aside_forwarded(self, rtype, payload):
        """The first drain of the ring a poison record came from: set that record aside, append the others (those
        after it in the same drain too, once ``_fwd_poison`` is cleared)."""
        if self._fwd_poison is None or self._fwd_k != self._fwd_poison[1]:
            return self._on_forwarded(rtype, payload)
        if rtype == COMMAND:
            self._fwd_poison = None
            self._fwd_k += 1
            self.log.error(f"worker {self.index}: a control command crashed this worker twice; dropped "
                           f"({unpack_command(payload)[2:5]}), its sender times out")
            return True
        path, payload = self._load_forwarded(rtype, payload)
        if payload is None:
            payload = EMPTY_FORWARD
        elif path is not None:
            os.unlink(path)
        n, ts, topic = forward_topic(payload)
        path = quarantine_file(self.data_path, f"{topic}.forwarded.{ts}", bytes(payload))
        self._fwd_poison = None
        self._fwd_k += 1
        self.suspect.count_quarantined()
        self.log.error(f"worker {self.index}: a forwarded publish of {n} messages to topic {topic} crashed this "
                       f"worker twice; set aside in {path}")
        return True

    # ---- after a crash (workers/storage/worker_restart.py) --------------------------------------------
    def set_aside_forwarded(self, link, index):
        """The record at ``index`` of the next drain of input ring ``link`` crashed the worker twice: set it aside."""
        self._fwd_poison = (link, index)

    def drain_carefully(self, link):
        """The next drain of input ring ``link`` goes record by record (a drain of its runs crashed the worker)."""
        self._fwd_careful = link

    # ---- fault injection (tests only) -----------------------------------------------------------------
    def _fault_injection(self, src, offsets, lengths):
        """--crash-on-forwarded-body: appending a marked forwarded message."""
        crash_if_marked((bytes(src[o:o + n]) for o, n in zip(np.asarray(offsets).tolist(),
                                                              np.asarray(lengths).tolist())), self._crash_on_forwarded)
