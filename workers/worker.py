"""A worker process: serves the V2 sessions handed to it and owns the topics that hash to it.

Theory of operation (see ARCHITECTURE.md for the whole broker):
* Connections arrive on the worker's hand-over channel (from the acceptor, or from another worker), see
  ``workers/handover.py``; the pump (``workers/pump.py``) reads them all.
* PUB/MPUB/DPUB for a topic this worker owns are appended to the topic's log; for any other topic they are
  written into the ring towards the owner, and either way ``OK`` goes out only once the messages are committed in
  shared memory. Lone PUBs are published by the pump in one batch per topic and iteration.
* SUB for a topic owned elsewhere hands the connection over to the owner (``migrate``); otherwise the session
  joins the channel here, so a channel's consumers, in-flight slots and cursor all live in one process. Round-trip
  producers follow their topics to the owner too (``move_producer``).
* Every loop iteration ends with ``_idle``: drain the input rings (forwarded publishes, scanner expiries), commit
  the pump's lone PUBs, deliver to channels that have both messages and ready consumers, then flush every session
  that has output.

Restart: a worker forked again after a crash (``restarted``) reads its topic directory, re-attaches and recovers
each topic's log, recovers its in-flight table and requeues everything that was in flight at the dead process's
connections (their clients are gone), then tells the scanner to reset its heap and re-posts the deferred timers.
"""
import os
import signal
import struct
import time
import traceback
import zlib

import numpy as np

from ipc import inflight as IF
from ipc.msglog import NO_LOW_WATER, LogError
from ipc.msglog_layout import FRAME_OVERHEAD
from ipc.ring import C_HEAD, C_READ, P_TAIL
from nsqpy.protocol.errors import DpubFailed, MpubFailed, PubFailed, SubFailed, TooManyChannelConsumers
from nsqpy.protocol.frames import OK_FRAME
from nsqpy.protocol.identify import ServerSettings
from nsqpy.protocol.v2_parser import Limits
from workers import kernels as K
from workers.handover import Connections, owner_of
from workers.loop import Loop
from workers.pump import Pump, pack_bodies
from workers.scanner import EXPIRED, REMOVE, RESET, START
from workers.session import MIGRATED
from workers.suspects import COUNT as SUSPECT_COUNT, DELIVERY as DELIVERY_SUSPECT, FORWARD as FORWARD_SUSPECT, \
    quarantine_file
from workers.timers import TimerBatches
from workers.topic import StorageError, Topic

FORWARD = 1          # ring record: a forwarded publish
FORWARD_BY_FILE = 2  # ring record: the path of a file holding a forwarded publish too big for the ring
LARGE_FORWARD = 4 << 20  # bytes: bigger forwarded publishes go by file (a ring record is at most half the ring)
_FWD_HEAD = struct.Struct("<qqqq")  # forwarded publish: message count, timestamp ns, defer ms, topic name length
FRAME_SCRATCH = 8 << 20
SCANNER_POLL_NS = 50_000_000   # how late the scanner may see a timer event; see _send_scanner
FORWARD_WAIT = 0.5             # seconds a publish waits for room in a full ring before it fails
FORWARD_RETRY = 0.05           # seconds before a forwarded publish the owner could not append is tried again
LOW_WATER_PERIOD = 1.0         # seconds between reclaim passes over the topic logs (and at once when full)


def _nothing():
    pass


def server_settings(opts):
    ms = 1_000_000
    return ServerSettings(
        max_heartbeat_interval_ms=opts.max_heartbeat_interval // ms,
        max_output_buffer_size=opts.max_output_buffer_size,
        min_output_buffer_timeout_ms=opts.min_output_buffer_timeout // ms,
        max_output_buffer_timeout_ms=opts.max_output_buffer_timeout // ms,
        output_buffer_timeout_ms=opts.output_buffer_timeout // ms,
        max_msg_timeout_ms=opts.max_msg_timeout // ms,
        msg_timeout_ms=opts.msg_timeout // ms,
        max_rdy_count=opts.max_rdy_count,
        tls_available=False, snappy_enabled=False, deflate_enabled=False,
        max_deflate_level=opts.max_deflate_level, auth_required=False)


class Worker(Connections):
    def __init__(self, plan, index, restarted, log):
        self.plan = plan
        self.opts = plan.opts
        self.index = index
        self.log = log
        self.data_path = plan.data_path
        self.loop = Loop(log)
        lim = self.opts.limits()
        self.limits = Limits(lim.max_msg_size, lim.max_body_size, lim.max_rdy_count, lim.max_req_timeout_ms)
        self.server_settings = server_settings(self.opts)
        self.inflight = plan.inflight[index]
        self.directory = plan.meta[index]
        self.control = plan.control
        self.links = plan.link_set
        self.inbox = plan.inboxes[index][0]
        self.sessions = {}
        self.topics = {}
        self.topics_by_index = {}
        self.channels_by_key = {}
        self.dirty = []
        self.pending = set()
        self.table_blocked = set()     # channels stopped by a full in-flight table
        self.touched = set()           # topics whose low-water marks may have moved since the last reclaim pass
        self._fwd_blocked_until = 0.0  # forwarded publishes wait until then (their topic could not take them)
        self._storage_logged = {}
        self.pump = Pump(self.limits.max_msg_size, index)
        self.timers = TimerBatches(self.inflight.capacity)
        self._conn_seq = (int(time.time()) & 0xFFFFF) << 24
        self._topic_seq = 0
        self._channel_seq = 0
        self._scratch = np.empty(FRAME_SCRATCH, np.uint8)
        self._pack = np.empty(FRAME_SCRATCH, np.uint8)  # forwarded publishes (bigger ones get their own)
        self._one_off, self._one_len = np.zeros(1, np.int64), np.zeros(1, np.int64)
        self._fwd_off, self._fwd_len = np.zeros(1, np.int64), np.zeros(1, np.int64)
        self._scanner_epoch = self.control.scanner_epoch()
        self.pub_in = [self.links.pub(j, index) for j in range(plan.workers) if j != index]
        self.pub_out = {j: self.links.pub(index, j) for j in range(plan.workers) if j != index}
        self.to_scanner = self.links.to_scanner(index)
        self.from_scanner = self.links.from_scanner(index)
        for link in self.pub_in + [self.from_scanner]:
            self.links.recover_reader(link)
        for link in list(self.pub_out.values()) + [self.to_scanner]:
            self.links.recover_writer(link)
        self._stopping = False
        self.suspect = self.control.suspect(index)
        self._fwd_k = 0                 # index of the forwarded record being appended, in its drain batch
        self._fwd_poison = None         # (link, index in its first batch): a forwarded record to set aside
        self._fwd_files = 0             # large forwarded publishes written (file names)
        self._crash_on = self.opts.crash_on_body.encode()
        if restarted:
            self._recover()
            self._after_crash()

    # ---- plumbing --------------------------------------------------------------------------------------
    def run(self, ready_fd):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.loop.add_signal_handler(signal.SIGTERM, self.stop)
        self.loop.add_signal_handler(signal.SIGUSR1, self.dump_state)
        self.loop.add_reader(self.inbox.fileno(), self._on_handoff)
        self.loop.add_reader(self.links.eventfd(self.index), self._on_wake)
        self.loop.add_reader(self.pump.epfd, self.pump.read)
        for fd in (self.pump.epfd, self.links.eventfd(self.index), self.inbox.fileno()):
            self.loop.keep_on_error(fd)
        self.loop.add_idle(self._idle)
        self.loop.call_later(LOW_WATER_PERIOD, self._periodic)
        os.write(ready_fd, b"w")
        self.loop.run()

    def stop(self):
        if self._stopping:
            return
        self._stopping = True
        for s in list(self.sessions.values()):
            s.flush()
            s.close()
        self._idle()
        for t in list(self.topics.values()):
            t.destroy()
        self.loop.stop()

    def dump_state(self):
        """SIGUSR1: one log line per owned channel and its consumers (a debugging aid for operators)."""
        for t in self.topics.values():
            for ch in t.channels.values():
                cons = ", ".join(f"{c.remote_text} rdy={c.rdy} in_flight={c.in_flight}" for c in ch.consumers)
                self.log.info(f"worker {self.index}: {t.name}/{ch.name} depth={t.log.depth(ch.ch)} "
                              f"requeued={len(ch.requeued)} live_slots={len(self.inflight)} "
                              f"pending={ch in self.pending} consumers=[{cons}]")

    def _on_wake(self):
        self.links.awake(self.index)

    def _periodic(self):
        # only topics whose channels delivered, finished, requeued or changed since the last pass (and full ones):
        # an idle topic's low-water marks cannot have moved, and a pass over 50,000 idle topics cost a worker
        # about half of every second
        touched, self.touched = self.touched, set()
        self.refresh_low_water([t for t in touched if not t.deleted])
        self.loop.call_later(LOW_WATER_PERIOD, self._periodic)

    # ---- publishing ------------------------------------------------------------------------------------
    def publish(self, s, topic, bodies, defer_ms, verb):
        # one message: reuse one-element arrays (appending copies them into the log), no allocation per PUB
        body = bodies[0]
        self._one_len[0] = len(body)
        self._publish(s, topic, np.frombuffer(body, np.uint8), self._one_off, self._one_len, defer_ms,
                      DpubFailed if verb == "DPUB" else PubFailed, verb)

    def publish_mpub(self, s, cmd):
        self._publish(s, cmd.topic, np.frombuffer(cmd.buffer, np.uint8), cmd.offsets, cmd.lengths, 0, MpubFailed,
                      "MPUB")

    def _publish(self, s, topic, src, offsets, lengths, defer_ms, error, verb):
        n = len(lengths)
        now = time.time_ns()
        owner = owner_of(topic, self.plan.workers)
        try:
            if owner == self.index:
                self._catch_up()
                ok = self.get_topic(topic).append(src, offsets, lengths, now, defer_ms)
            else:
                ok = self._forward(owner, topic, src, offsets, lengths, now, defer_ms)
        except StorageError as e:
            raise error(f"{verb} failed {e}") from None
        if not ok:
            raise error(f"{verb} failed topic {topic} is full")
        s.count_pub(topic, n)
        self.pump.learn_topic(topic, owner)

    def _publish_staged(self, topic, buf, offsets, lengths):
        """The pump's lone PUBs of this iteration for one topic, as one batch (their OKs follow on success)."""
        now = time.time_ns()
        owner = owner_of(topic, self.plan.workers)
        try:
            if owner == self.index:
                return self.get_topic(topic).append(buf, offsets, lengths, now)
            return self._forward(owner, topic, buf, offsets, lengths, now, 0)
        except StorageError:
            return False  # already logged; the pump answers E_PUB_FAILED

    def _forward(self, owner, topic, src, offsets, lengths, now, defer_ms):
        """Commit n messages (bodies src[offsets[i]:offsets[i]+lengths[i]]) to the owner's ring as one record;
        False when the owner marked the topic full, or its ring stayed full."""
        name = topic.encode()
        if self.control.topic_full(owner, zlib.crc32(name)):
            return False  # the owner could not take the last ones: refuse now, as nsqd would
        n = len(lengths)
        head = _FWD_HEAD.pack(n, now, defer_ms, len(name)) + name
        size = len(head) + 8 * n + int(lengths.sum())
        out = self._pack if size <= self._pack.size else np.empty(size, np.uint8)
        out[:len(head)] = np.frombuffer(head, np.uint8)
        return self._send_forward(owner, out[:pack_bodies(src, offsets, lengths, out, len(head))])

    def _send_forward(self, owner, payload):
        """Commit one record to the owner's ring; False when it stayed full for FORWARD_WAIT (the owner cannot
        append: a topic's budgets are used up), so the publish fails instead of the worker hanging."""
        ring = self.pub_out[owner]
        rtype = FORWARD
        if len(payload) > LARGE_FORWARD:
            payload, rtype = self._forward_file(payload), FORWARD_BY_FILE
        deadline = None
        while not ring.send(rtype, payload):
            # the owner is behind: keep draining what others forward to us (so two full rings cannot
            # deadlock), nudge the owner, and wait for room
            now = time.monotonic()
            if deadline is None:
                deadline = now + FORWARD_WAIT
            elif now > deadline:
                if rtype == FORWARD_BY_FILE:
                    os.unlink(bytes(payload).decode())
                return False
            self._drain_pub_rings()
            self.links.wake(owner)
            ring.wait_for_room(len(payload), 0.001)
        self.links.wake(owner)
        return True

    def _forward_file(self, payload):
        """Write a forwarded publish too big for the ring to a file under the data path; -> its path, the ring
        record. The owner appends from it and removes it; a file whose record was released is gone, so a
        re-read after a crash finds no file and knows the publish was appended (at worst it appends twice)."""
        self._fwd_files += 1
        path = os.path.join(self.data_path, f"{self.plan.prefix.strip('/')}fwd-{self.index}-{os.getpid()}-"
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
        FORWARD_RETRY so the worker does not spin on it; it is never dropped."""
        if self._fwd_blocked_until:
            if time.monotonic() < self._fwd_blocked_until:
                return False
            self._fwd_blocked_until = 0.0
        self.suspect.w[self.suspect.base + SUSPECT_COUNT] = self._fwd_k
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
        n, ts, defer_ms, tl = _FWD_HEAD.unpack_from(payload)
        p = _FWD_HEAD.size
        topic = bytes(payload[p:p + tl]).decode()
        p += tl
        if n == 1:
            lengths, offsets = self._fwd_len, self._fwd_off
            lengths[0] = payload[p:p + 8].view("<i8")[0]
            offsets[0] = p + 8
        else:
            lengths = np.frombuffer(payload, "<i8", n, p).astype(np.int64)
            p += 8 * n
            offsets = np.empty(n, np.int64)
            offsets[0] = p
            np.cumsum(lengths[:-1], out=offsets[1:])
            offsets[1:] += p
        return self.get_topic(topic).append(payload, offsets, lengths, ts, defer_ms, acknowledged=True)

    def _catch_up(self):
        """Append everything other workers committed to their rings so far, before publishing here: a producer
        handed over to this worker must not have its next messages overtake those it published before the
        move (they were committed before their OK, so before the client sent the next one)."""
        for i, link in enumerate(self.pub_in):
            ctl = link.ring.ctl
            target = int(ctl[P_TAIL])
            while int(ctl[C_READ]) < target and self._drain_from(i):
                pass

    def _drain_pub_rings(self):
        return sum(self._drain_from(i) for i in range(len(self.pub_in)))

    def _drain_from(self, i):
        """Drain forwarded publishes from the i-th input ring, with the suspect words naming each record (the ring's
        release position when the drain began, and the record's index after it)."""
        link = self.pub_in[i]
        ctl = link.ring.ctl
        if ctl[P_TAIL] == ctl[C_READ]:
            return 0
        self.suspect.begin(FORWARD_SUSPECT, i, 0, int(ctl[C_HEAD]), 0)
        self._fwd_k = 0
        handler = self._on_forwarded
        if self._fwd_poison is not None and self._fwd_poison[0] == i:
            handler = self._set_aside_forwarded
        done = link.drain(handler)
        self.suspect.end()
        return done

    def _set_aside_forwarded(self, rtype, payload):
        """The first drain of the ring a poison record came from: set that record aside, append the others."""
        if self._fwd_k != self._fwd_poison[1]:
            return self._on_forwarded(rtype, payload)
        path, payload = self._load_forwarded(rtype, payload)
        if payload is None:
            payload = np.frombuffer(_FWD_HEAD.pack(0, 0, 0, 0), np.uint8)
        elif path is not None:
            os.unlink(path)
        n, ts, _, tl = _FWD_HEAD.unpack_from(payload)
        topic = bytes(payload[_FWD_HEAD.size:_FWD_HEAD.size + tl]).decode(errors="replace")
        path = quarantine_file(self.data_path, f"{topic}.forwarded.{ts}", bytes(payload))
        self._fwd_poison = None
        self._fwd_k += 1
        self.suspect.count_quarantined()
        self.log.error(f"worker {self.index}: a forwarded publish of {n} messages to topic {topic} crashed this "
                       f"worker twice; set aside in {path}")
        return True

    # ---- topics and channels ---------------------------------------------------------------------------
    def get_topic(self, name, restarted=False):
        """The topic, created on first use. Raises StorageError (logged) when its shared memory cannot be had."""
        t = self.topics.get(name)
        if t is None:
            self._topic_seq += 1
            try:
                t = Topic(self, name, self._topic_seq, restarted)
            except (OSError, LogError) as e:
                self.storage_failed(f"TOPIC({name}): cannot be created", e)
                raise StorageError(f"topic {name} cannot be created: {e}") from None
            try:
                self.directory.topic_created(name, t.index)
            except OSError as e:  # unrecorded, a replacement could not find it: undo
                t.destroy()
                self.storage_failed(f"TOPIC({name}): cannot be recorded", e)
                raise StorageError(f"topic {name} cannot be recorded: {e}") from None
            self.topics[name] = t
            self.topics_by_index[t.index] = t
            self.log.info(f"TOPIC({name}): created")
        return t

    def delete_topic(self, name):
        t = self.topics.pop(name, None)
        if t is not None:
            self.topics_by_index.pop(t.index, None)
            t.destroy()
            self._record(self.directory.topic_deleted, t.index)
            self.log.info(f"TOPIC({name}): deleted")

    def _record(self, change, *args):
        """A deletion for the directory; one that cannot be written is logged: the replacement of a worker that
        dies before the next change skips what it cannot find any more (``_recover``)."""
        try:
            change(*args)
        except OSError as e:
            self.log.error(f"worker {self.index}: the topic directory could not record a deletion: {e}")

    def next_channel_key(self):
        self._channel_seq += 1
        return self._channel_seq

    def subscribe(self, s, topic, channel):
        if owner_of(topic, self.plan.workers) != self.index:
            return MIGRATED
        try:
            ch = self.get_topic(topic).get_channel(channel)
        except StorageError as e:
            raise SubFailed(f"SUB failed {e}") from None
        limit = self.opts.max_channel_consumers
        if limit and len(ch.consumers) >= limit:
            raise TooManyChannelConsumers(f"channel consumers for {topic}:{channel} exceeds limit of {limit}")
        ch.add_consumer(s)
        s.write(OK_FRAME)
        return None

    # ---- delivery and flushing -------------------------------------------------------------------------
    def write_frames(self, s, log, positions, attempts):
        """Frame the records at positions into s's output. A round is at most MAX_ROUND_BYTES of frames, unless
        one message is bigger: then it comes alone and gets a buffer of its own size."""
        if self._crash_on:
            self._fault_injection(log, positions)
        out = self._scratch
        try:
            end = log.write_frames(out, 0, positions, attempts)
        except ValueError:  # bigger than the scratch buffer: only a single big message can be (rare path)
            need = int(log.records_at(positions).lengths[:len(positions)].sum()) + FRAME_OVERHEAD * len(positions)
            out = np.empty(need, np.uint8)
            end = log.write_frames(out, 0, positions, attempts)
        s.write(memoryview(out)[:end])

    def _fault_injection(self, log, positions):
        """--crash-on-body (tests only): die as a kernel bug would, on framing a message that starts so."""
        for p in np.asarray(positions).tolist():
            if log.body(p).startswith(self._crash_on):
                os.kill(os.getpid(), signal.SIGSEGV)

    def storage_failed(self, what, exc):
        """A publish or topic creation failed for lack of memory or disk: one log line per cause and second (a
        full /dev/shm would otherwise log once per PUB)."""
        now = time.monotonic()
        key = (what, type(exc))
        if now - self._storage_logged.get(key, 0.0) >= 1.0:
            self._storage_logged[key] = now
            self.log.error(f"{what}: {exc}")

    def _inputs_empty(self):
        return self.from_scanner.empty() and all(r.empty() for r in self.pub_in)

    def _idle(self):
        more = False
        if self._drain_pub_rings():
            more = True
        if self.pump.staged:
            self._catch_up()
            self.pump.commit(self._publish_staged, self.move_producer)
        if self.from_scanner.drain(self._on_scanner):
            more = True
        epoch = self.control.scanner_epoch()
        if epoch != self._scanner_epoch:
            self._scanner_epoch = epoch
            self.resync_scanner()
        if self.table_blocked and len(self.inflight) < self.inflight.capacity:
            self.pending |= self.table_blocked  # slots were freed: resume the channels the full table stopped
            self.table_blocked.clear()
        if self.pending:
            pending, self.pending = self.pending, set()
            for ch in pending:
                self.touched.add(ch.topic)
                try:
                    if ch.deliver():
                        self.pending.add(ch)
                        more = True
                except Exception:
                    # never let one channel's delivery kill the worker (and every other topic with it); its
                    # messages stay where they are and the next FIN/REQ/publish tries again
                    self.log.error(f"worker {self.index}: delivery on {ch.topic.name}/{ch.name} failed: "
                                   f"{traceback.format_exc().strip()}")
        if self.dirty:
            dirty, self.dirty = self.dirty, []
            for s in dirty:
                s.flush()
        if more or self.pending:
            return True
        return not self.links.prepare_sleep(self.index, self._inputs_empty)

    # ---- scanner ---------------------------------------------------------------------------------------
    def _send_scanner(self, rtype, payload, key=None):
        """Post a timer event. The scanner is woken only for a key due within its polling period (or when the
        ring fills up): it drains its rings at least every MAX_SLEEP anyway, and most keys lie a message timeout
        (>= 1 s) ahead, so waking it per delivery round would only burn a core on wake-ups."""
        while not self.to_scanner.send(rtype, payload):
            self.links.wake(self.links.SCANNER)
            self.to_scanner.wait_for_room(len(payload), 0.001)
        if key is not None and key - time.time_ns() < SCANNER_POLL_NS:
            self.links.wake(self.links.SCANNER)

    def timer_start(self, slots, key):
        """One timer (deadline or due time `key`) for all these slots."""
        if len(slots) == 0:
            return
        b = self.timers.add(slots)
        self._send_scanner(START, np.array([b, self.timers.gen[b], key], np.int64).tobytes(), key)

    def timer_start_each(self, slots, keys):
        """A timer of its own for every slot (TOUCH, deferred messages, recovery)."""
        rows = np.empty((len(slots), 3), np.int64)
        for i, (slot, key) in enumerate(zip(slots, keys)):
            b = self.timers.add([slot])
            rows[i] = (b, self.timers.gen[b], key)
        for k in range(0, len(rows), 65536):
            part = rows[k:k + 65536]
            self._send_scanner(START, part.tobytes(), int(part[:, 2].min()))

    def timer_leave(self, slots):
        empty = self.timers.leave(slots)
        if len(empty):
            self._send_scanner(REMOVE, np.array(empty, np.int64).tobytes())

    def _on_scanner(self, rtype, payload):
        if rtype != EXPIRED:
            return True
        table = self.inflight
        for b, gen in np.frombuffer(payload, np.int64).reshape(-1, 2).tolist():
            for slot in self.timers.expire(b, gen).tolist():
                info = table.slot(slot)
                ch = self.channels_by_key.get(info.channel)
                if ch is None:
                    table.release(slot)
                elif info.state in (IF.IN_FLIGHT, IF.DEFERRED):
                    ch.on_expired(slot, info, self.sessions.get(info.conn))
        return True

    def resync_scanner(self):
        """The scanner restarted with empty heaps: post every timer this worker holds."""
        self._send_scanner(RESET, b"")
        self.timers.clear()
        slots, keys = [], []
        for slot in self.inflight.recover().tolist():
            info = self.inflight.slot(slot)
            if info.state in (IF.IN_FLIGHT, IF.DEFERRED):
                slots.append(slot)
                keys.append(info.deadline_ns)
        self.timer_start_each(slots, keys)

    def slots_of_channel(self, key):
        out = np.empty(self.inflight.capacity, np.int64)
        n = K.slots_of_channel(self.inflight.slots, key, out)
        return out[:n].tolist()

    def refresh_low_water(self, topics):
        """Tell each topic's log the oldest position each channel still holds, so it can reclaim behind it.
        One pass over the in-flight table serves all topics (it is the expensive part)."""
        lows = np.full(self._channel_seq + 1, NO_LOW_WATER, np.int64)
        if len(self.inflight):
            K.low_water(self.inflight.slots, lows)
        for topic in topics:
            for ch in topic.channels.values():
                topic.log.set_low_water(ch.ch, int(lows[ch.key]))
            topic.log.reclaim()
            if topic.full and topic.log.has_room():
                topic.set_full(False)

    # ---- the topic directory and recovery --------------------------------------------------------------
    def _after_crash(self):
        """Read what the dead predecessor was doing (workers/suspects.py): a delivery round makes its channel
        careful, a record that crashed it twice is set aside."""
        kind, a, key, pos, count = self.suspect.left_behind()
        if kind == DELIVERY_SUSPECT:
            ch = self.channels_by_key.get(key)
            if ch is None:
                return
            if count == 1 and self.suspect.careful_rounds(key) > 0:
                self._set_aside(ch, pos)
                self.suspect.set_careful(0, 0)
            else:
                # deliver this channel one message per round until the suspect round's messages (now requeued,
                # with whatever else was in flight) have gone out alone: the next crash names the message
                self.suspect.set_careful(key, count + len(ch.requeued))
                self.log.warn(f"worker {self.index}: died delivering {count} messages of {ch.topic.name}/"
                              f"{ch.name}; delivering them one at a time")
        elif kind == FORWARD_SUSPECT:
            if self.suspect.forwarded_again(a, pos, count):
                self._fwd_poison = (a, count)

    def _set_aside(self, ch, pos):
        """Take the message at log position pos out of channel ch's delivery and keep its body on disk."""
        log = ch.topic.log
        table = self.inflight
        for slot in list(ch.requeued):
            if table.slot(slot).log_pos == pos:
                ch.requeued.remove(slot)
                break
        else:
            slot = None
        msg_id = int(log.records_at([pos]).ids[0]) & 0xFFFFFFFFFFFFFFFF
        path = quarantine_file(self.data_path, f"{ch.topic.name}.{ch.name}.{msg_id:016x}", log.body(pos))
        if slot is not None:
            table.release(slot)
        elif log.cursor(ch.ch) == pos:
            log.advance(ch.ch, log.read(ch.ch, 1, 1 << 62).next_position)
        self.suspect.count_quarantined()
        self.log.error(f"worker {self.index}: message {msg_id:016x} of {ch.topic.name}/{ch.name} crashed this "
                       f"worker twice; set aside in {path}")

    def _recover(self):
        from workers.channel import Channel
        doc = self.directory.read() or {"topics": []}
        self._topic_seq = doc.get("topic_seq", 0)
        self._channel_seq = doc.get("channel_seq", 0)
        for td in doc["topics"]:
            t = Topic.__new__(Topic)
            try:
                Topic.__init__(t, self, td["name"], td["index"], restarted=True)
            except Exception as e:
                # e.g. deleted by the dead process after its last recorded change: a topic that cannot be
                # re-attached must not take the worker's other topics down with it (a crash loop)
                self.log.error(f"worker {self.index}: TOPIC({td['name']}) cannot be recovered: {e!r}")
                continue
            t.paused = td["paused"]
            self.topics[t.name] = t
            self.topics_by_index[t.index] = t
            for cd in td["channels"]:
                ch = Channel(t, cd["name"], cd["ch"], cd["key"])
                ch.paused = cd["paused"]
                t.channels[ch.name] = ch
                self.channels_by_key[ch.key] = ch
            known = {c.ch for c in t.channels.values()}
            for slot in t.log.open_channels():
                if slot not in known:  # opened by the dead process just before it could record it
                    t.log.close_channel(slot)
        table = self.inflight
        self._send_scanner(RESET, b"")
        deferred, dues = [], []
        for slot in table.recover().tolist():
            info = table.slot(slot)
            ch = self.channels_by_key.get(info.channel)
            if ch is None:
                table.release(slot)
            elif info.state == IF.DEFERRED:
                deferred.append(slot)
                dues.append(info.deadline_ns)
            else:
                if info.state == IF.IN_FLIGHT:
                    table.requeue(slot, 0)
                ch.requeued.append(slot)
        self.timer_start_each(deferred, dues)
        self.touched.update(self.topics.values())  # set every low-water mark once from the recovered table
        self.log.info(f"worker {self.index}: recovered {len(self.topics)} topics after a restart")
        self.control.set_connections(self.index, 0)


def worker_main(plan, index, restarted, ready_fd, log):
    Worker(plan, index, restarted, log).run(ready_fd)
