"""A worker process: serves the V2 sessions handed to it and owns the topics that hash to it.

Theory of operation (see ARCHITECTURE.md for the whole broker):
* Connections arrive on the worker's hand-over channel (from the acceptor, or from another worker), see
  ``workers/connections/handover.py``; the pump (``workers/lane/pump.py``) reads them all.
* PUB/MPUB/DPUB for a topic this worker owns are appended to the topic's log; for any other topic they are
  written into the ring towards the owner, and either way ``OK`` goes out only once the messages are committed in
  shared memory. Lone PUBs are published by the pump in one batch per topic and iteration. A ring without room is
  back-pressure: the publish is parked (``Parked``) with its sessions held (they read nothing more) and committed
  from the idle hook once the owner has drained some records and woken us (ring word WANT_ROOM); only a topic the
  owner marked full, or a ring it stopped draining for want of storage (STALLED), fails it.
* SUB for a topic owned elsewhere hands the connection over to the owner (``migrate``); otherwise the session
  joins the channel here, so a channel's consumers, in-flight slots and cursor all live in one process. Round-trip
  producers follow their topics to the owner too (``move_producer``).
* Every loop iteration ends with ``_idle``: drain the input rings (forwarded publishes, scanner expiries), commit
  the pump's lone PUBs, deliver to channels that have both messages and ready consumers, then flush every session
  that has output. Sessions given messages flush first, and lone PUBs to our own topics deliver before the
  pump's OKs (``Forwarder.publish_staged``): a PUB's consumers get it before its producer gets the OK.

The worker's jobs are parts it owns, each a class with its own state in a module of its own, built in
``Worker.__init__`` with exactly what it uses (another part's service comes in typed by a small ``Protocol`` of
that module): ``Forwarder`` (publishing and the rings, ``workers/publishing/forwarding.py``), ``TopicTable`` (topics,
channels, SUB and control commands, ``workers/domain/topics.py``), ``Connections`` (``workers/connections/handover.py``),
``Deadlines`` (timers and deferred messages, ``workers/timing/deadlines.py``), ``LogSpace`` (low-water marks and
compaction, ``workers/storage/log_space.py``), ``SyncPolicy`` (``workers/storage/sync_policy.py``), ``CleanStop`` (save
and load, ``workers/storage/clean_stop.py``) and ``Restart`` (after a crash, ``workers/storage/worker_restart.py``);
this module keeps the process's plumbing, the loop's idle work, delivery and flushing. Topic, Channel and Session
are given the worker and use a narrow set of its services (``workers/domain/channel.py`` lists what a channel
needs), so each is unit-tested with a small fake (``tests/workers/fakes.py``); the parts are unit-tested with
fakes of their Protocols (``tests/workers/worker_fakes.py``).

Restart: a worker forked again after a crash (``restarted``) reads its topic directory, re-attaches and recovers
each topic's log, recovers its in-flight table and requeues everything that was in flight at the dead process's
connections (their clients are gone), tells the scanner to reset its heap, and rebuilds the deferred store's
due-time heap from its entries (``workers/storage/worker_restart.py``).
"""
import gc
import os
import signal
import time
import traceback

import numpy as np

from nsqpy.ipc.msglog_layout import FRAME_OVERHEAD
from nsqpy.workers.domain.deferred import DeferredStore, ShmChunks
from nsqpy.workers.storage.sync_policy import SyncPolicy
from nsqpy.workers.lane.fastlane import FastLane
from nsqpy.workers.publishing.forwarding import Forwarder, crash_if_marked
from nsqpy.workers.connections.handover import Connections, OwnerNaps
from nsqpy.workers.processes.event_loop import Loop
from nsqpy.workers.lane.ownpath import OwnPath
from nsqpy.workers.storage.clean_stop import CleanStop
from nsqpy.workers.lane.pump import AUTO, PLACEMENTS, Pump
from nsqpy.workers.storage.log_space import LogSpace
from nsqpy.workers.storage.policy_file import PolicyBook
from nsqpy.workers.domain.topic import StorageError
from nsqpy.workers.domain.topics import TopicTable
from nsqpy.workers.storage.worker_restart import Restart
from nsqpy.workers.domain.stats_rows import STATS_WAKE_SIGNAL, StatsPublisher
from nsqpy.workers.timing.deadlines import Deadlines
from nsqpy.workers.timing.timer_batches import TimerBatches

FRAME_SCRATCH = 8 << 20
QUIESCE_WAIT = 5.0             # seconds a stopping worker waits for the others to stop taking publishes
LOW_WATER_PERIOD = 1.0         # seconds between reclaim passes over the topic logs (and at once when full)


def _nothing():
    pass


def server_settings(opts):
    """IDENTIFY's settings: the options' limits (NsqdOptions.limits, the one derivation, which the parser shares
    through ``.limits``) and their features."""
    return opts.server_settings()


class Worker:
    """One worker process: its plumbing (the loop, the shared-memory handles, health), the loop's idle work,
    delivery and flushing; the rest is done by the parts it owns (built here, each with what it uses):

    ============== ============================================ ================================================
    part           class (module)                               its job
    ============== ============================================ ================================================
    ``sync``       SyncPolicy (storage/sync_policy.py)          group commit of durable topics
    ``table``      TopicTable (domain/topics.py)                topics, channels, SUB, control commands
    ``connections`` Connections (connections/handover.py)       sessions: arrival, hand-over, leaving
    ``log_space``  LogSpace (storage/log_space.py)              low-water marks, reclaim, compaction
    ``deadlines``  Deadlines (timing/deadlines.py)              in-flight timers (scanner), deferred due times
    ``forwarder``  Forwarder (publishing/forwarding.py)         the publish path, rings, back-pressure
    ``clean_stop`` CleanStop (storage/clean_stop.py)            save at a clean stop, load at start
    (once)         Restart (storage/worker_restart.py)          pick up after a crashed predecessor
    ============== ============================================ ================================================

    Topic, Channel, Session, the own path and the stats plane are given the worker itself and call the
    services they need on it (``workers/domain/channel.py`` lists a channel's); those services are the parts'
    bound methods, set as attributes below ("services"), or the worker's own methods."""

    def __init__(self, plan, index, restarted, log):
        self.plan = plan
        self.lane = None  # the forward lane (workers/lane/fastlane.py), once on: _lane_on_when_ready
        self._lane_failed = False
        self.opts = opts = plan.opts
        self.index = index
        self.log = log
        self.data_path = plan.data_path
        self.loop = Loop(log)
        self.server_settings = server_settings(opts)
        self.limits = self.server_settings.limits  # the parser's: the same object IDENTIFY checks against
        self.inflight = plan.inflight[index]
        self.directory = plan.meta[index]
        self.control = plan.control
        self.links = plan.link_set
        self.suspect = self.control.suspect(index)
        self.dirty = []
        self.delivered = []  # sessions given message frames since the last flush: flushed before the rest
        self.pending = set()
        self.table_blocked = set()     # channels stopped by a full in-flight table
        self.touched = set()           # topics whose low-water marks may have moved since the last reclaim pass
        self._storage_logged = {}
        self.storage_failing = False
        self.placement = PLACEMENTS[opts.producer_placement]
        self.pump = Pump(self.limits.max_msg_size, index, self.placement, self.limits.max_body_size,
                         (opts.producer_move_in_rate, opts.producer_move_out_rate),
                         opts.producer_busy_percent / 100)
        self.timers = TimerBatches(self.inflight.capacity)
        self._scratch = np.empty(FRAME_SCRATCH, np.uint8)
        self._scanner_epoch = self.control.scanner_epoch()
        self.deferred = DeferredStore(ShmChunks(self.data_path, opts.node_id, index), recovering=restarted)
        self.to_scanner = self.links.to_scanner(index)
        self.from_scanner = self.links.from_scanner(index)
        self.links.recover_reader(self.from_scanner)
        self.links.recover_writer(self.to_scanner)
        self._stopping = False
        self._owner_naps = OwnerNaps(plan.workers)  # how often forwards found each owner asleep (auto placement)
        self._crash_on = opts.crash_on_body.encode()
        # frames of a compiled delivery round (kernels.deliver_round); None turns those rounds off, so that
        # --crash-on-body sees every message framed (write_frames)
        self.round_buffer = None if self._crash_on else self._scratch
        self.own_path = OwnPath(self)   # the lane publishes lone PUBs to our own topics (workers/lane/ownpath.py)
        self.stats = StatsPublisher(self, plan.stats_board)  # the stats plane: workers/domain/stats_rows.py

        # ---- the parts -----------------------------------------------------------------------------------
        self.sync = SyncPolicy(opts, self.loop, self.directory, self.data_path, self.storage_failed)
        # the policies' configs (workers/storage/policy_file.py): read before any channel is made or recovered
        self.policies = PolicyBook(self.data_path, opts, log).load()
        self.table = TopicTable(self, index, plan.workers, opts, self.directory, self.stats,
                                lambda: self.forwarder.catch_up(), self.storage_failed, log, policies=self.policies)
        self.connections = Connections(self, index, plan.workers, plan.inboxes, self.loop, log, self.control,
                                       self.pump, self.limits, self.placement, self._owner_naps, self.table)
        self.log_space = LogSpace(self.inflight, self.deferred, self.table, log)
        self.deadlines = Deadlines(self.links, self.to_scanner, self.timers, self.inflight, self.deferred,
                                   self.loop, self.table.channels_by_key, self.connections.sessions)
        self.forwarder = Forwarder(index, plan.workers, self.links, self.control, self.suspect, self.loop, log,
                                   self.data_path, plan.prefix, opts, self.table, self.pump, self.own_path,
                                   self._owner_naps, self._deliver_now, self.storage_failed)
        self.clean_stop = CleanStop(index, plan.workers, self.data_path, opts, log, self.inflight, self.deferred,
                                    self._scratch, self.table, self.log_space, self.sync, self.deadlines,
                                    self.stats)

        # ---- services: what Topic, Channel, Session, the own path and the stats plane use ----------------
        # (the parts' own objects and bound methods: the dicts and sets are never rebound by their owners)
        self.topics = self.table.topics
        self.topics_by_index = self.table.topics_by_index
        self.channels_by_key = self.table.channels_by_key
        self.get_topic = self.table.get_topic
        self.delete_topic = self.table.delete_topic
        self._record = self.table.record
        self.next_channel_key = self.table.next_channel_key
        self.channel_policy = self.table.channel_policy
        self.subscribe = self.table.subscribe
        self.control_command = self.table.control_command
        self.sessions = self.connections.sessions
        self.forget_session = self.connections.forget_session
        self.migrate = self.connections.migrate
        self.move_producer = self.connections.move_producer
        self.publish = self.forwarder.publish
        self.publish_mpub = self.forwarder.publish_mpub
        self.pub_in = self.forwarder.pub_in
        self.pub_pending = self.forwarder.pub_pending
        self.pub_out = self.forwarder.pub_out
        self.watch_limits = self.forwarder.watch
        self.appended = self.sync.appended
        self.sync_now = self.sync.sync_now
        self.refresh_low_water = self.log_space.refresh_low_water
        self.slots_of_channel = self.log_space.slots_of_channel
        self.deferred_changed = self.deadlines.deferred_changed
        self.retry_later = self.deadlines.retry_later
        self.timer_start = self.deadlines.timer_start
        self.timer_start_each = self.deadlines.timer_start_each
        self.timer_leave = self.deadlines.timer_leave
        self.timer_leave_one = self.deadlines.timer_leave_one
        self.resync_scanner = self.deadlines.resync_scanner

        self.saved = False              # stop() wrote every unfinished message to disk (workers/storage/clean_stop.py)
        self.control.clear_flags(index)  # neither quiesced nor busy
        self.control.set_storage_failed(index, 0)
        if restarted:
            restart = Restart(index, self.data_path, log, self.control, self.suspect, self.inflight, self.deferred,
                              self.directory, self.table, self.deadlines, self.forwarder)
            restart.recover()
            self.touched.update(self.topics.values())  # set every low-water mark once from the recovered table
            restart.after_crash()
        else:
            self.clean_stop.load_queues()

    @property
    def _conn_seq(self):
        """The last connection id given out (the stats plane compares it to see new clients)."""
        return self.connections.conn_seq

    # ---- plumbing --------------------------------------------------------------------------------------
    def run(self, ready_fd):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.loop.add_signal_handler(signal.SIGTERM, self.stop)
        self.loop.add_signal_handler(signal.SIGUSR1, self.dump_state)
        self.loop.add_signal_handler(STATS_WAKE_SIGNAL, _nothing)  # a stats reader without our eventfd wakes us
        self.loop.add_reader(self.connections.inbox.fileno(), self.connections.on_handoff)
        self.loop.add_reader(self.links.eventfd(self.index), self._on_wake)
        self.loop.add_reader(self.pump.epfd, self.pump.read)
        for fd in (self.pump.epfd, self.links.eventfd(self.index), self.connections.inbox.fileno()):
            self.loop.keep_on_error(fd)
        self.loop.add_idle(self._idle)
        self._lane_on_when_ready()
        self._load_mark = (time.process_time(), time.monotonic())
        self.loop.call_later(LOW_WATER_PERIOD, self._periodic)
        gc.collect()
        gc.freeze()  # start-up's objects (modules, numba's dispatchers) leave the collector's passes for good
        os.write(ready_fd, b"w")
        self.loop.run()

    def _lane_on_when_ready(self):
        """Switch the forward lane on (forwards, and the own path; with one worker there is nothing to forward: the
        own path alone) once its kernels are compiled: at once, but after a first start only when the supervisor's
        background compile is done (workers/lane/warmup.py Background; until then the loop's Python path does the same
        work), checked again every period. Loading its kernels from numba's cache then takes milliseconds."""
        background = self.plan.background
        if self.lane is not None or self._lane_failed or (background is not None and not background.ready()):
            return
        if background is not None:
            try:
                background.load()
            except Exception as e:  # e.g. no file descriptor left for the lane's throwaway sockets: not again
                self._lane_failed = True
                self.log.error(f"worker {self.index}: cannot load the forward lane ({e!r}); going on without it")
                return
            self.log.debug(f"worker {self.index}: forward lane on")
        fwd = self.forwarder
        self.lane = FastLane(self.pump, self.loop.epoll, self.links.seg.buf,
                             {j: link.ring for j, link in fwd.pub_out.items()}, self.links.wakeups, self.control,
                             self._owner_naps, fwd.large_forward, lambda: not fwd.parked, self.move_producer,
                             self.own_path, self._quiet, inputs=fwd.lane_inputs(), scanner=self.from_scanner.ring,
                             may_drain=fwd.lane_may_drain,
                             sleep=lambda: self.links.prepare_sleep(self.index, self._inputs_empty))
        self.loop.fast_poll = self.lane.poll

    @property
    def stopping(self):
        return self._stopping

    def stop(self):
        if self._stopping:
            return
        self._stopping = True
        for s in list(self.sessions.values()):
            s.flush()
            s.close()
        self.forwarder.drop_parked()  # never answered: their sessions are closed
        self._quiesce()
        try:
            self.clean_stop.save_queues()
        except Exception:
            # the shared memory stays as it is: the next start salvages it (workers/storage/broker_crash.py)
            self.log.error(f"worker {self.index}: cannot save messages to disk, leaving them in shared memory "
                           f"for the next start: {traceback.format_exc().strip()}")
        else:
            self.saved = True
            for t in list(self.topics.values()):
                t.discard_storage()
            self.deferred.destroy()
        self.loop.stop()

    def _quiesce(self):
        """Shutdown: take no more publishes, then drain the rings until every other worker stopped taking them
        too (the supervisor stopped the other producers before the workers), so that whatever another worker
        committed to us, answered OK, is in our logs before we save them."""
        self.control.set_quiesced(self.index, True)
        deadline = time.monotonic() + QUIESCE_WAIT
        others = [w for w in range(self.plan.workers) if w != self.index]
        drain = self.forwarder.drain_rings
        while True:
            while drain():
                pass
            if all(self.control.quiesced(w) for w in others) or time.monotonic() > deadline:
                break
            time.sleep(0.002)  # shutdown only: the others close their sessions within milliseconds
        while drain():
            pass
        self._idle()

    def dump_state(self):
        """SIGUSR1: one log line per owned channel and its consumers (a debugging aid for operators)."""
        for t in self.topics.values():
            for ch in t.channels.values():
                cons = ", ".join(f"{c.remote_text} rdy={c.rdy} in_flight={c.in_flight}" for c in ch.consumers)
                self.log.info(f"worker {self.index}: {t.name}/{ch.name} depth={t.log.depth(ch.ch)} "
                              f"requeued={len(ch.requeued)} due={len(ch.due)} deferred={ch.deferred_count} "
                              f"live_slots={len(self.inflight)} "
                              f"pending={ch in self.pending} consumers=[{cons}]")

    def _on_wake(self):
        self.links.awake(self.index)

    def _periodic(self):
        # only topics whose channels delivered, finished, requeued or changed since the last pass (and full ones):
        # an idle topic's low-water marks cannot have moved, and a pass over 50,000 idle topics cost a worker
        # about half of every second
        touched, self.touched = self.touched, set()
        self.refresh_low_water([t for t in touched if not t.deleted])
        cpu, now = time.process_time(), time.monotonic()
        self._publish_load(cpu - self._load_mark[0], now - self._load_mark[1])
        self._load_mark = (cpu, now)
        self._lane_on_when_ready()
        self.loop.call_later(LOW_WATER_PERIOD, self._periodic)

    def _publish_load(self, cpu_s, wall_s):
        """Auto placement: over its busy share of a core, this worker moves out the producers moved in but the
        last (the pump's rule), and the others move none in (the control block's flag; workers/lane/pump.py)."""
        busy = self.pump.set_load(cpu_s, wall_s)
        if busy != self.control.busy(self.index):
            self.control.set_busy(self.index, busy)
            if self.placement == AUTO:
                self.log.debug(f"worker {self.index}: {'busy' if busy else 'no longer busy'} "
                               f"({100 * cpu_s / max(wall_s, 1e-9):.0f}% of a core over the last {wall_s:.1f} s)")

    # ---- delivery and flushing -------------------------------------------------------------------------
    def write_frames(self, s, log, positions, attempts):
        """Frame the records at positions into s's output. A round is at most MAX_ROUND_BYTES of frames, unless
        one message is bigger: then it comes alone and gets a buffer of its own size."""
        if self._crash_on:  # --crash-on-body (tests only): framing a marked message
            crash_if_marked((log.body(p) for p in np.asarray(positions).tolist()), self._crash_on)
        out = self._scratch
        try:
            end = log.write_frames(out, 0, positions, attempts)
        except ValueError:  # bigger than the scratch buffer: only a single big message can be (rare path)
            need = int(log.records_at(positions).lengths[:len(positions)].sum()) + FRAME_OVERHEAD * len(positions)
            out = np.empty(need, np.uint8)
            end = log.write_frames(out, 0, positions, attempts)
        self.send_frames(s, out, end)

    def send_frames(self, s, out, end, sent=0):
        """out[:end], a round's frames, of which the first ``sent`` bytes went to s's socket already: the rest to
        s's output (flushed by _deliver_and_flush)."""
        if sent < end:
            s.write(memoryview(out)[sent:end])
            self.delivered.append(s)

    @staticmethod
    def direct_fd(s):
        """s's socket when a compiled round may send its frames at once: nothing is queued for it (they would
        overtake it). They go before the idle step's sync (--sync-every): only replies, OKs, wait for that."""
        return -1 if s.wbuf or s.closed else s.fd

    def storage_works(self):
        """A store worked after failures: healthy again (as nsqd after its next good disk write)."""
        self.storage_failing = False
        self.control.set_storage_failed(self.index, 0)

    def storage_failed(self, what, exc):
        """A publish or topic creation failed for lack of memory or disk: one log line per cause and second (a
        full /dev/shm would otherwise log once per PUB)."""
        if not self.storage_failing:
            self.storage_failing = True
            self.control.set_storage_failed(self.index, time.time_ns())  # /ping: unhealthy until a store works
        now = time.monotonic()
        key = (what, type(exc))
        if now - self._storage_logged.get(key, 0.0) >= 1.0:
            self._storage_logged[key] = now
            self.log.error(f"{what}: {exc}")

    def _quiet(self):
        """None when the idle step has work, else the loop's timeout for its next wait (-1: no timer): asked by the
        forward lane after the own path's publish, to go on without the loop (``FastLane.poll``). The idle step's
        other inputs (rings, the scanner's, a stats request) write this worker's eventfd, which ends the lane."""
        if self.pending or self.delivered or self.dirty or self.sync.unsynced or self.pump.staged or \
                self.forwarder.parked_count or self.table_blocked:
            return None
        return self.loop.next_timeout()

    def _inputs_empty(self):
        fwd = self.forwarder
        return self.from_scanner.empty() and not fwd.pub_pending.any() and not (
            fwd.parked_count and fwd.parked_room()) and not self.stats.requested()

    def _idle(self):
        fwd = self.forwarder
        drained = fwd.drain_rings()
        more = drained > 0
        if fwd.parked_count:
            fwd.retry_parked()
        if self.pump.staged:
            if drained:
                # what was read was sent after every forward committed before it, and the drain above (after the
                # read) found those; only a drain that took a batch may have left some of them behind
                fwd.catch_up()
            self.pump.commit(fwd.publish_staged, self.move_producer)
        if self.from_scanner.drain(self.deadlines.on_scanner):
            more = True
        epoch = self.control.scanner_epoch()
        if epoch != self._scanner_epoch:
            self._scanner_epoch = epoch
            self.resync_scanner()
        if self.table_blocked and len(self.inflight) < self.inflight.capacity:
            self.pending |= self.table_blocked  # slots were freed: resume the channels the full table stopped
            self.table_blocked.clear()
        if self._deliver_and_flush():
            more = True
        self.stats.poll()
        if more or self.pending:
            return True
        return not self.links.prepare_sleep(self.index, self._inputs_empty)

    def dead_letter(self, topic, src, offsets, lengths):
        """A channel's dead letters (workers/domain/dead_letter.py): the one publish decision, as a PUB's."""
        try:
            return self.forwarder.commit(topic, src, offsets, lengths)
        except StorageError:
            return False  # already logged (storage_failed); the channel keeps the messages and tries again

    def _deliver_now(self):
        """Lone PUBs were appended to a topic of ours: its channels deliver and flush before the pump's OKs."""
        if self.pending:
            self._deliver_and_flush()

    def channel_changed(self, ch):
        """ch delivered or finished: its topic's low-water mark and statistics may have moved."""
        self.touched.add(ch.topic)
        self.stats.changed.add(ch.topic.name)

    def _deliver_and_flush(self):
        """Deliver to every channel with messages and ready consumers, then send every session's output, the
        sessions given messages first (a PUB's OK goes after the message it published); True if a channel has
        more to deliver now. Also run after the pump's lone PUBs to a topic of ours, before their OKs go out
        (``_deliver_now``, from ``Forwarder.commit``)."""
        more = False
        if self.pending:
            pending, self.pending = self.pending, set()
            for ch in pending:
                self.channel_changed(ch)
                try:
                    if ch.deliver():
                        self.pending.add(ch)
                        more = True
                except Exception:
                    # never let one channel's delivery kill the worker (and every other topic with it); its
                    # messages stay where they are and the next FIN/REQ/publish tries again
                    self.log.error(f"worker {self.index}: delivery on {ch.topic.name}/{ch.name} failed: "
                                   f"{traceback.format_exc().strip()}")
        if self.sync.unsynced:
            self.sync.sync_due()  # before the replies go out: --sync-every=1 answers after the sync (group commit)
        if self.dirty or self.delivered:
            delivered, self.delivered = self.delivered, []
            dirty, self.dirty = self.dirty, []
            for s in delivered + dirty:  # messages first: a reply's send (an OK) wakes its client, which may take
                s.flush()                # our CPU; a session flushed twice has nothing left the second time
        return more


EXIT_UNSAVED = 4  # the worker stopped without saving its messages: the supervisor must keep its shared memory


def worker_main(plan, index, restarted, ready_fd, log):
    worker = Worker(plan, index, restarted, log)
    worker.run(ready_fd)
    if not worker.saved:
        raise SystemExit(EXIT_UNSAVED)
