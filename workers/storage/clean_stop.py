"""The worker's part of persistence: at a clean stop it saves every unfinished message of its topics as NSQ's
on-disk queues; at start it loads the queues of the topics it owns (its own or Go nsqd's, ``nsqpy/store``).

Theory of operation
-------------------
* **Save** (``save_queues``, from ``Worker.stop`` once its clients are closed, so that everything they held in
  flight is requeued): per channel, the queue ``topic:channel`` gets its held slots (requeued), its deferred-store
  entries (their due times go to nsqpy's side file) and the log from its cursor to the head (DPUB records not yet
  due are deferred too); a topic without channels saves its backlog as the queue ``topic``, as NSQ's topic queue.
  Ephemeral topics and channels are not saved (NSQ neither). One ``write_frames`` kernel call frames a batch and
  one ``frames_to_records`` call turns the frames into diskqueue records; each file is fsynced and the meta file
  is written last (``DiskQueueWriter.close``). Only then is the topic's shared memory destroyed.
* **Load** (``load_queues``, before the worker reports ready): topics and channels of ``nsqd.dat`` that hash to
  this worker are created and paused as recorded; then each queue of an owned topic is appended: a topic queue
  publicly (every channel gets it, or the backlog keeps it for the first channel), a channel queue as records
  private to that channel (``MessageLog.append_private``), keeping ids, timestamps and attempts; a message still
  deferred is parked there and goes into the deferred store with its due time (counted as deferred at once). A queue
  is removed once all of it is in the log. When the topic cannot take more (its budgets), the rest stays on
  disk: the meta file's read position moves past what was loaded, and the next start carries on from there.
* Which worker loads a queue does not depend on the worker count the queue was saved with: ownership is the
  topic name's hash over the current workers, so a restart with another ``--workers`` loads everything.

``CleanStop`` is one part of ``nsqpy.workers.processes.worker.Worker``, built with what it uses: the worker's index,
worker count, data path, options and log, the in-flight table, the deferred store, the frame scratch buffer, and
four parts through narrow interfaces: the topic table (``OwnedTopics``), the log space (``HeldSlots``), the sync
policy (``Syncing``) and the deadlines (``DeferredTimer``); plus the stats plane (``ChangedTopics``).
"""
import time
from typing import Mapping, Protocol

import numpy as np

from nsqpy.ipc import diskqueue_kernels as DK
from nsqpy.ipc.msglog import LogError
from nsqpy.ipc.msglog_layout import FRAME_OVERHEAD
from nsqpy.store import diskqueue as DQ
from nsqpy.store import metadata
from nsqpy.workers.lane.kernels import generations
from nsqpy.workers.publishing.records import owner_of
from nsqpy.workers.domain.topic import StorageError

SAVE_BATCH = 4096            # messages framed per kernel call when saving
LOAD_BATCH = 4096            # messages appended per log call when loading
LOAD_BATCH_BYTES = 4 << 20
ID_MASK = (1 << 64) - 1


class LoadStopped(Exception):
    """Only the first ``appended`` records of a batch went into the log; ``cause`` stopped the load there."""

    def __init__(self, appended, cause):
        super().__init__(str(cause))
        self.appended, self.cause = appended, cause


def _hex(ids):
    return [b"%016x" % (int(i) & ID_MASK) for i in ids]


class OwnedTopics(Protocol):
    """The topic table (``workers/domain/topics.py``)."""
    topics: Mapping

    def get_topic(self, name: str): ...


class HeldSlots(Protocol):
    """The log space (``workers/storage/log_space.py``): a channel's in-flight slots."""

    def slots_of_channel(self, key: int) -> list: ...


class Syncing(Protocol):
    """The sync policy (``workers/storage/sync_policy.py``)."""

    def appended(self, topic, n: int) -> None: ...

    def sync_now(self) -> None: ...


class DeferredTimer(Protocol):
    """The deadlines (``workers/timing/deadlines.py``): deferred-store entries were added."""

    def deferred_changed(self) -> None: ...


class ChangedTopics(Protocol):
    """The stats plane (``workers/domain/stats_rows.py``): names of topics whose statistics may have moved."""
    changed: set


class CleanStop:
    def __init__(self, index, workers, data_path, opts, log, inflight, deferred, scratch, table: OwnedTopics,
                 held: HeldSlots, sync: Syncing, deadlines: DeferredTimer, stats: ChangedTopics):
        self.index = index
        self.workers = workers
        self.data_path = data_path
        self.opts = opts
        self.log = log
        self.inflight = inflight
        self.deferred = deferred
        self._scratch = scratch
        self.table = table
        self.held = held
        self.sync = sync
        self.deadlines = deadlines
        self.stats = stats
        self._existing_queues = set()

    # ---- save ------------------------------------------------------------------------------------------
    def save_queues(self):
        """Write every unfinished message of this worker's topics to their on-disk queues; -> messages saved."""
        t0 = time.monotonic()
        saved = self._save_all()
        if saved:
            self.log.info(f"worker {self.index}: saved {saved} messages to disk in {time.monotonic() - t0:.2f}s")
        return saved

    def _save_all(self):
        saved = 0
        writers = []
        self._existing_queues = set(DQ.queue_files(self.data_path))
        for t in list(self.table.topics.values()):
            if t.ephemeral or t.deleted:
                continue
            if not t.channels:
                saved += self._save_backlog(t, writers)
            for ch in t.channels.values():
                if not ch.ephemeral:
                    saved += self._save_channel(t, ch, writers)
        DQ.commit(writers, self.data_path)  # two file-system syncs for every queue of the worker
        return saved

    def _writer(self, name, writers):
        w = DQ.DiskQueueWriter(self.data_path, name, self.opts.max_bytes_per_file, self._existing_queues)
        writers.append(w)
        return w

    def _save_backlog(self, t, writers):
        ch = t.log.open_channel()  # the first channel takes the backlog: read it through a throwaway cursor
        try:
            return self._save_log(t, ch, self._writer(t.name, writers))
        finally:
            t.log.close_channel(ch, give_back=True)  # an error on the way keeps what was not saved

    def _save_channel(self, t, ch, writers):
        w = self._writer(f"{t.name}:{ch.name}", writers)
        slots = np.array(self.held.slots_of_channel(ch.key), np.int64)
        n = 0
        if len(slots):
            _, pos, att = generations(self.inflight, slots)
            n += self._save_positions(t, w, pos, att)
        idx = self.deferred.of_channel(ch.key)
        if len(idx):
            idx = np.asarray(idx, np.int64)
            _, _, ids, pos, att, due = self.deferred.fields(idx)
            n += self._save_positions(t, w, pos, att)
            w.defer(_hex(ids), due.tolist())
        return n + self._save_log(t, ch.ch, w)

    def _save_log(self, t, ch, w):
        """The log from channel slot ch's cursor to the head (moving the cursor: the topic is being closed)."""
        log = t.log
        now = time.time_ns()
        n = 0
        while True:
            batch = log.read(ch, SAVE_BATCH, 1 << 62)
            if batch.n == 0:
                return n
            k = batch.n
            pos, att = batch.positions[:k].copy(), batch.attempts[:k].copy()
            later = batch.not_before[:k] > now
            if later.any():
                w.defer(_hex(batch.ids[:k][later]), batch.not_before[:k][later].tolist())
            nxt = batch.next_position
            n += self._save_positions(t, w, pos, att)
            log.advance(ch, nxt)

    def _save_positions(self, t, w, positions, attempts):
        log = t.log
        total = 0
        for start in range(0, len(positions), SAVE_BATCH):
            pos = np.ascontiguousarray(positions[start:start + SAVE_BATCH], np.int64)
            att = np.ascontiguousarray(attempts[start:start + SAVE_BATCH], np.int64)
            need = int(log.records_at(pos).lengths[:len(pos)].sum()) + FRAME_OVERHEAD * len(pos)
            out = self._scratch if need <= self._scratch.size else np.empty(need, np.uint8)
            end = log.write_frames(out, 0, pos, att)
            end = DK.frames_to_records(out, end)
            w.write_records(memoryview(out)[:end], len(pos))
            total += len(pos)
        return total

    # ---- load ------------------------------------------------------------------------------------------
    def load_queues(self):
        """Create this worker's topics and channels from nsqd.dat and append their on-disk queues; -> messages
        loaded."""
        t0 = time.monotonic()
        loaded = self._load_all()
        if loaded:
            self.log.info(f"worker {self.index}: loaded {loaded} messages from disk in {time.monotonic() - t0:.2f}s")
        return loaded

    def _load_all(self):
        workers = self.workers
        for tm in metadata.load(self.data_path):
            if owner_of(tm.name, workers) != self.index:
                continue
            t = self.table.get_topic(tm.name)
            for cm in tm.channels:
                ch = t.get_channel(cm.name)
                if cm.paused:
                    ch.pause(True)
            if tm.paused:
                t.pause(True)
        loaded = 0
        for name, files in sorted(DQ.queue_files(self.data_path).items()):
            topic, _, channel = name.partition(":")
            if owner_of(topic, workers) == self.index:
                loaded += self._load_queue(name, topic, channel, files)
        return loaded

    def _load_queue(self, name, topic, channel, files):
        try:
            t = self.table.get_topic(topic)
            ch = t.get_channel(channel) if channel else None
        except (StorageError, ValueError) as e:
            self.log.error(f"DISKQUEUE({name}): cannot be loaded: {e}")
            return 0
        reader = DQ.DiskQueueReader(self.data_path, name, self.opts.max_msg_size, files)
        due = reader.deferred()
        loaded = 0
        done = True
        for path, data, start, limit in reader.files():
            n, pos, status = self._load_file(t, ch, data, start, limit, due)
            loaded += n
            if status == DK.BAD_LENGTH or (status == DK.CUT and pos < limit):
                reader.mark_bad(path)
                self.log.error(f"DISKQUEUE({name}): {path} is corrupt after {n} messages; renamed to .bad")
            elif pos < limit:  # the topic is full: the rest waits on disk for the next start
                reader.keep_from(path, pos, loaded)
                done = False
                break
        if t.durable and loaded:
            self.sync.sync_now()  # in the durable log on disk before the queue files go
        if done:
            DQ.remove_queue(self.data_path, name, files)  # (a file renamed .bad is kept for inspection)
        for path in reader.bad:
            self.log.error(f"DISKQUEUE({name}): skipped corrupt file {path}.bad")
        if loaded:
            self.log.info(f"DISKQUEUE({name}): loaded {loaded} messages")
        return loaded

    def _load_file(self, t, ch, data, start, limit, due):
        """Append the records of one data file; -> (messages, position reached, scan status)."""
        buf = np.frombuffer(data, np.uint8)
        cap = LOAD_BATCH
        off, ln, ts, att, ids = (np.empty(cap, np.int64) for _ in range(5))
        pos, n = start, 0
        max_message = self.opts.max_msg_size + DK.MESSAGE_HEADER
        while pos < limit:
            k, nxt, status = DK.scan_records(buf, pos, limit, max_message, off, ln, ts, att, ids)
            k = _within_bytes(ln, k)
            if k:
                nxt = int(off[k - 1] + ln[k - 1])
                try:
                    self._append_loaded(t, ch, buf, off[:k], ln[:k], ts[:k], att[:k], ids[:k], due)
                except (StorageError, LogError, LoadStopped) as e:
                    self.log.error(f"TOPIC({t.name}): cannot load more from disk now: {e}")
                    done = e.appended if isinstance(e, LoadStopped) else 0
                    if done:  # the rest waits on disk from the first record not appended: none comes twice
                        n, pos = n + done, int(off[done - 1] + ln[done - 1])
                    return n, pos, DK.OK
                n += k
                pos = nxt
                continue
            return n, pos, status
        return n, pos, DK.OK

    def _append_loaded(self, t, ch, buf, off, ln, ts, att, ids, due):
        ids = ids.copy()
        fresh = ids == 0
        if fresh.any():
            ids[fresh] = t.ids.next_ids(int(fresh.sum()), time.time_ns()).view(np.int64)
        not_before = np.zeros(len(ln), np.int64)
        if due:
            for i, key in enumerate(_hex(ids)):
                when = due.get(key)
                if when is not None:
                    not_before[i] = when
        try:
            if ch is None:
                t.log.append_batch(buf, off, ln, ts, ids, not_before)
            else:
                self._append_private(t, ch, buf, off, ln, ts, att, ids, not_before)
        except OSError as e:
            raise StorageError(str(e)) from None
        except LoadStopped as stop:
            self._loaded(t, stop.appended)
            raise
        self._loaded(t, len(ln))

    def _loaded(self, t, n):
        if n:
            self.stats.changed.add(t.name)
            if t.durable:
                self.sync.appended(t, n)
            if t.bounded:  # a channel loaded at its limit is marked for the other workers now, as after an append
                t.policy_changed()

    def _append_private(self, t, ch, buf, off, ln, ts, att, ids, not_before):
        """A channel queue's records, private to ch. Those still deferred go where a REQ with a delay puts them:
        parked in the log (the cursor passes them) and in the deferred store, so they count as deferred from the
        start, as before the restart. Appended in runs of consecutive due or deferred records, each all or
        nothing (a deferred run's store entries are reserved before its records go in): when one fails,
        LoadStopped says how many of the batch went in, and the load resumes at the first that did not, so a
        record is never loaded twice."""
        later = not_before > time.time_ns()
        n = len(ln)
        cuts = np.flatnonzero(later[1:] != later[:-1]) + 1
        done = 0
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
            run = slice(a, b)
            try:
                if not later[a]:
                    t.log.append_private(ch.ch, buf, off[run], ln[run], ts[run], ids[run], att[run],
                                         not_before[run])
                    done = b
                    continue
                self.deferred.reserve(b - a)  # DeferredNoSpace here, before anything of the run is in the log
                pos = t.log.append_private(ch.ch, buf, off[run], ln[run], ts[run], ids[run], att[run],
                                           not_before[run], parked=True)
            except (OSError, LogError) as e:
                raise LoadStopped(done, e) from None
            self.deferred.add(t.index, ch.key, ids[run], pos, att[run], not_before[run])
            self.deadlines.deferred_changed()
            done = b


def _within_bytes(lengths, k):
    """How many of the first k records to append at once (at most LOAD_BATCH_BYTES, at least one)."""
    if k <= 1:
        return k
    return max(1, int(np.searchsorted(np.cumsum(lengths[:k]), LOAD_BATCH_BYTES, side="right")))
