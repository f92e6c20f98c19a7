"""A topic, inside its owner worker: its message log, its ID generator and its channels.

Theory of operation: the owner is the only process that appends to the topic's log (``nsqpy.ipc.msglog``), so message
IDs are generated here, once, and every channel sees the same ID for a message. The log's control block lives
in a shared-memory segment named from the broker instance and a hash of the topic name, so a restarted owner
finds it again; its segments live in shared memory up to the memory budget and spill to files under the data
path beyond it (none for ``#ephemeral`` topics, which drop what does not fit, as NSQ does).

Memory budget: ``--mem-queue-size`` counts messages, as NSQ's: a new log segment goes to shared memory only while
the topic's slowest channel has fewer than that many messages waiting (``MessageLog`` Tiers), so memory holds them
plus at most one segment more. Its bytes are capped too, at ``mem-queue-size x MEM_BYTES_PER_MESSAGE`` rounded up
to whole segments (at least two: the head is always inside the newest one, so a log of one segment could never
turn over): big messages spill to disk before their count is reached, /dev/shm is not a place for gigabytes.

What a topic uses of its worker is declared in ``hosts.TopicHost`` (its channels' ``hosts.ChannelHost`` included),
so a unit test gives it a small fake (tests/workers/fakes.py).
"""
import errno
import hashlib
import os
import time
import zlib

import numpy as np

from nsqpy.ipc.filesegment import FileSegment, FileSegmentProvider
from nsqpy.ipc.msglog import LogError, LogFull, MessageLog, ShmSegmentProvider, log_ctrl_nbytes
from nsqpy.ipc.msglog_layout import record_size
from nsqpy.ipc.layout import LayoutError
from nsqpy.ipc.shm import Segment, SegmentError, segment_name, unlink_name
from nsqpy.protocol.ids import SEQUENCE_MASK, TWEPOCH, IdGenerator
from nsqpy.workers.domain import bounds
from nsqpy.workers.domain.channel import Channel
from nsqpy.workers.domain.deferred import DeferredNoSpace
from nsqpy.workers.domain.hosts import TopicHost

SEGMENT_SIZE = 8 << 20   # the smallest segment; topics get bigger ones when --max-msg-size asks for it
MEM_BYTES_PER_MESSAGE = 1024


class StorageError(RuntimeError):
    """A topic could not store a publish: no shared memory or disk space, or its segments could not be made.
    The message says why; nothing of the publish was stored."""


class ChannelFull(StorageError):
    """A channel with ``overflow`` reject has no room for the publish (workers/domain/bounds.py); the message names
    the channel and its limit. Nothing of the publish was stored."""


class ChannelBlocked(StorageError):
    """A channel with ``overflow`` block has no room for the publish now: nothing was stored; the caller parks it
    and holds its producer until the channel has room (``Topic.limited`` is then None, or the append succeeds)."""


def segment_size_for(max_msg_size):
    """A record never crosses a segment, so a segment must hold the largest message --max-msg-size allows:
    the smallest power of two >= SEGMENT_SIZE that does (segments are reserved lazily, so a big segment costs
    address space, not memory, until messages fill it)."""
    need = max(SEGMENT_SIZE, record_size(max_msg_size))
    return 1 << (need - 1).bit_length()


def ctrl_path(data_path, h):
    """A durable topic's control block: a file next to its disk segments."""
    return os.path.join(data_path, f"nsqpy-{h:x}.ctrl")


def name_hash(name):
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=7).digest(), "big")


class Topic:
    def __init__(self, worker: TopicHost, name, index, restarted=False):
        self.worker = worker
        self.name = name
        self.index = index
        self.ephemeral = name.endswith("#ephemeral")
        self.paused = False
        self.channels = {}
        self.message_count = 0
        self.message_bytes = 0
        self.ids = IdGenerator(worker.opts.node_id)
        self._one_id, self._one_ts = np.zeros(1, np.int64), np.zeros(1, np.int64)
        self.deleted = False
        self.crc = zlib.crc32(name.encode())
        self.full = worker.control.topic_full(worker.index, self.crc)  # a restarted owner keeps the mark
        self.bounded = ()      # channels with a max_depth or max_bytes (workers/domain/bounds.py): policy_changed
        self.limited = None    # the channel mark published for the other workers (bounds.limit_state), or None
        self._open_log(restarted)

    # ---- the log ---------------------------------------------------------------------------------------
    def _open_log(self, restarted):
        opts = self.worker.opts
        h = name_hash(self.name)
        base = segment_name(self.worker.data_path, opts.node_id, "log", h)
        self.memory = ShmSegmentProvider(base)
        self.disk = None if self.ephemeral else FileSegmentProvider(self.worker.data_path, f"nsqpy-{h:x}")
        seg = segment_size_for(opts.max_msg_size)
        # --mem-queue-size=0: every message on disk, control block included (a file next to the segments), so
        # that a reboot finds the log again (as NSQ's disk queue); the worker fsyncs by --sync-every/-timeout
        self.durable = opts.mem_queue_size == 0 and not self.ephemeral
        self.synced_segment = 0
        # at least two segments: the head is always inside the newest one, so with a single segment a full log
        # could never turn over, however fast its channels drain it
        mem_bytes = 0 if self.durable else max(2 * seg, -(-opts.mem_queue_size * MEM_BYTES_PER_MESSAGE // seg) * seg)
        mem_messages = None if self.durable else opts.mem_queue_size
        disk_bytes = 0 if self.ephemeral else max(opts.max_disk_bytes_per_topic, 2 * seg)
        ctrl_name = (ctrl_path(self.worker.data_path, h) if self.durable
                     else segment_name(self.worker.data_path, opts.node_id, "topic", h))
        if not restarted:
            try:
                self.ctrl = self._ctrl_create(ctrl_name, log_ctrl_nbytes(seg, mem_bytes, disk_bytes))
            except SegmentError as e:
                if e.errno != errno.EEXIST:
                    raise
                # left by a crash between creating the log and recording it: keep its messages, unless the crash
                # came before the log was initialised (then it holds none: start it over)
                if self._half_made(ctrl_name):
                    return self._open_log(False)
                restarted = True
            else:
                try:
                    self.log = MessageLog.create(self.ctrl.buf, 0, segment_size=seg, mem_bytes=mem_bytes,
                                                 memory=self.memory, disk_bytes=disk_bytes, disk=self.disk,
                                                 mem_messages=mem_messages)
                except BaseException:
                    self.ctrl.close()  # its window could not be mapped (too many maps?): leave nothing behind
                    self.ctrl.unlink()
                    raise
                return
        self.ctrl = self._ctrl_attach(ctrl_name)
        self.log = MessageLog.attach(self.ctrl.buf, 0, self.memory, self.disk, mem_messages)
        self.log.recover()
        last = self.log.last_id & 0xFFFFFFFFFFFFFFFF
        if last:
            # continue after the last ID the previous owner gave out, never reuse one
            self.ids.last_tick = (last >> 22) + TWEPOCH
            self.ids.sequence = last & SEQUENCE_MASK

    def _ctrl_create(self, name, size):
        if self.durable:
            return FileSegment.create(name, size)
        return Segment.create(name, size)

    def _ctrl_attach(self, name):
        if self.durable:
            return FileSegment.attach(name)
        ctrl = Segment.attach(name)
        ctrl.adopt()
        return ctrl

    def _half_made(self, ctrl_name):
        """True (and the control segment removed) when it was created but its log never initialised."""
        try:
            ctrl = self._ctrl_attach(ctrl_name)
            try:
                MessageLog.attach(ctrl.buf, 0, self.memory, self.disk).close()
            finally:
                ctrl.close()
            return False
        except LayoutError:
            if self.durable:
                FileSegment.unlink_path(ctrl_name)
            else:
                unlink_name(ctrl_name)
            return True

    def sync(self):
        """Make what was appended so far durable (disk-tier segments and, for a durable topic, the control block
        with the head and the cursors): fdatasync of each file touched."""
        self.synced_segment = self.log.sync(self.synced_segment)
        if self.durable:
            self.ctrl.flush()

    def append(self, src, offsets, lengths, timestamp, defer_ms=0, acknowledged=False):
        """Append n messages accepted at `timestamp` ns (or at timestamp[i] ns each, an int64 array: a run of
        forwarded publishes) (all or nothing). Returns False when the log is full and nothing was appended.
        ``acknowledged``: another worker already answered OK for them, so they may use
        the log's overdraft; the topic is then marked full, so that no more are forwarded."""
        n = len(lengths)
        if self.bounded and not acknowledged:
            self._admit(n, lengths)
        now = time.time_ns()
        if n == 1:  # a single PUB: no allocation (the log copies the arrays' values)
            ids, timestamps = self._one_id, self._one_ts
            value = self.ids.next_id(now)
            ids[0] = value - (1 << 64) if value >= 1 << 63 else value  # the uint64 ID as the log's int64 word
            timestamps[0] = timestamp[0] if isinstance(timestamp, np.ndarray) else timestamp
        else:
            ids = self.ids.next_ids(n, now).view(np.int64)
            timestamps = timestamp if isinstance(timestamp, np.ndarray) else np.full(n, timestamp, np.int64)
        not_before = parked_for = positions = None
        if defer_ms:
            not_before = np.full(n, now + defer_ms * 1_000_000, np.int64)
            parked_for = self._defer_for(n)
            if parked_for:
                positions = np.empty(n, np.int64)
        args = (src, offsets, lengths, timestamps, ids, not_before, positions)
        parked = parked_for is not None
        try:
            try:
                self._append(*args, parked=parked)
            except StorageError:
                if not acknowledged:
                    raise
                # already answered OK by the worker that forwarded it: it may use /dev/shm's safety reserve (at
                # most a ring's worth per sending worker arrives before they see the topic marked full); if even
                # that fails, it waits in the ring (StorageError) and nothing behind it there is lost
                self._append(*args, parked=parked, overdraft=True)
        except LogFull:
            self.worker.refresh_low_water([self])
            try:
                self._append(*args, parked=parked)
            except LogFull:
                if self.ephemeral:
                    return True  # NSQ drops what an ephemeral topic cannot hold
                self.set_full(True)
                if not acknowledged:
                    return False
                try:
                    self._append(*args, parked=parked, overdraft=True)
                except LogFull:
                    return False
        else:
            if self.full and self.log.has_room():
                self.set_full(False)
        if parked:
            self._deferred(parked_for, ids, positions, not_before)
        if self.worker.storage_failing:
            self.worker.storage_works()
        if self.durable:
            self.worker.appended(self, n)
        self.count_appended(n, lengths)
        if self.bounded:
            bounds.trim(self)
            self.check_limits()
        return True

    # ---- bounded channels (workers/domain/bounds.py) -------------------------------------------------------
    def _admit(self, n, lengths):
        refused = bounds.admit(self, n, lengths)
        if refused is not None:
            kind, why = refused
            self.check_limits()
            raise (ChannelFull if kind == "reject" else ChannelBlocked)(why)

    def policy_changed(self):
        """Some channel's ``policy`` was set (or a channel came or went): which channels are bounded, trimmed to
        their new limits, and the mark set or cleared for what they hold now (a set mark is watched by the
        ``Forwarder``, which clears it once the channel drains: ``watch_limits``)."""
        self.bounded = tuple(ch for ch in self.channels.values() if ch.policy.bounded)
        if self.bounded:
            bounds.trim(self)
        if (self.bounded or self.limited is not None) and self.check_limits() is not None:
            # at its limit already (a new channel took the backlog, or a lower limit): marked now, so that other
            # workers refuse or park the next publish as after an append, and watched until it can be cleared
            self.worker.watch_limits(self)

    def check_limits(self):
        """Publish the channel mark the topic should carry now for the other workers (refuse or park its publishes);
        -> it (None: no channel at its limit)."""
        state = bounds.limit_state(self) if self.bounded and not self.deleted else None
        if state != self.limited:
            self.limited = state
            self._publish_mark()
        return state

    def count_appended(self, n, lengths):
        """n messages (body lengths ``lengths``) were appended: counters (each channel's too: nsqd counts a
        message for a channel as its topic puts it there), stats, and a delivery pass for every channel with
        consumers (also after the lane appended them: workers/lane/ownpath.py)."""
        self.message_count += n
        self.message_bytes += int(lengths[0]) if n == 1 else int(lengths.sum())
        self.worker.stats.changed.add(self.name)
        for ch in self.channels.values():
            ch.message_count += n
            if ch.consumers:
                self.worker.pending.add(ch)

    def _defer_for(self, n):
        """The channels a deferred publish of n messages is parked for as it is appended, room for their entries
        reserved in the deferred store: nsqd defers a message per channel as it copies it from the topic, so it is
        a deferred message of each at once (deferred_count, not depth). None: appended for the cursors to meet
        (no channel yet: the backlog of the first one; or the store cannot grow)."""
        channels = list(self.channels.values())
        if not channels:
            return None
        try:
            self.worker.deferred.reserve(n * len(channels))
        except DeferredNoSpace:
            return None
        return channels

    def _deferred(self, channels, ids, positions, not_before):
        """The parked records of a deferred publish become each channel's deferred-store entries (the room was
        reserved: this cannot fail)."""
        w = self.worker
        attempts = np.zeros(len(ids), np.int64)
        for ch in channels:
            w.deferred.add(self.index, ch.key, ids, positions, attempts, not_before)
        w.deferred_changed()

    def _append(self, *args, overdraft=False, parked=False):
        """The log's append_batch; any failure but a full budget (LogFull) becomes StorageError, after marking
        the topic full for the other workers (they refuse its publishes at once instead of forwarding what cannot
        be stored) and one log line with the cause."""
        try:
            self.log.append_batch(*args, overdraft=overdraft, parked=parked)
        except LogFull:
            raise
        except (LogError, OSError, ValueError) as e:
            self.set_full(True)
            self.worker.storage_failed(f"TOPIC({self.name}): cannot store messages", e)
            raise StorageError(f"topic {self.name}: {e}") from None

    # ---- channels --------------------------------------------------------------------------------------
    def get_channel(self, name):
        ch = self.channels.get(name)
        if ch is None:
            ch = Channel(self, name, self.log.open_channel(), self.worker.next_channel_key())
            ch.policy = self.worker.channel_policy(self.name, name)  # its effective policy (workers/domain/policy.py)
            ch.message_count = self.log.depth(ch.ch)  # the first channel takes the backlog: put into it now
            try:
                self.worker.directory.channel_created(self.index, name, ch.ch, ch.key)
            except OSError as e:  # unrecorded, a replacement would not know its cursor: undo (a first channel
                self.log.close_channel(ch.ch, give_back=True)  # gives the backlog it took back)
                raise StorageError(f"channel {self.name}:{name} cannot be recorded: {e}") from None
            self.channels[name] = ch
            self.worker.channels_by_key[ch.key] = ch
            self.worker.touched.add(self)
            self.worker.stats.structure_changed(self.name)
            if ch.policy.bounded or self.bounded:
                self.policy_changed()
        return ch

    def delete_channel(self, name):
        ch = self.channels.pop(name, None)
        if ch is None:
            return
        ch.deleted = True
        self.worker.channels_by_key.pop(ch.key, None)
        self.worker.touched.add(self)
        self.worker.stats.structure_changed(self.name)
        ch.drop_all()
        for s in list(ch.consumers):
            s.channel = None
            s.close()
        self.log.close_channel(ch.ch)
        self.worker._record(self.worker.directory.channel_deleted, ch.key)
        if ch in self.bounded:
            self.policy_changed()
        if self.ephemeral and not self.channels:
            self.worker.delete_topic(self.name)

    def pause(self, paused):
        """Stop (or resume) delivery on every channel; publishing goes on (NSQ's topic pause)."""
        if paused == self.paused:
            return
        self.paused = paused
        self.worker._record(self.worker.directory.topic_paused, self.index, paused)
        if not paused:
            for ch in self.channels.values():
                ch.wants_delivery()

    def empty(self):
        """NSQ's topic empty: what waits in the topic itself, i.e. the backlog kept for its first channel while
        it has none. Channels keep their queues (their own empty clears them)."""
        if self.log.drop_backlog():
            self.log.reclaim()

    def set_full(self, full):
        """Mark (or clear) this topic as full for the other workers: they refuse its publishes at once."""
        if full:
            self.worker.touched.add(self)  # the reclaim pass clears the mark once there is room
        if full != self.full:
            self.full = full
            self._publish_mark()

    def _publish_mark(self):
        """The control block's mark of this topic: full (its log), else its channel mark (``limited``), else none."""
        control, w = self.worker.control, self.worker.index
        if self.full or self.limited is None:
            control.set_topic_full(w, self.crc, self.full)
        else:
            kind, channel, limit, value = self.limited
            control.set_topic_mark(w, self.crc, kind, channel, limit, value)

    def discard_storage(self):
        """Its messages are saved to disk (a clean stop): free the shared memory, keep the directory entry."""
        self.deleted = True
        self.limited = None
        self.set_full(False)
        self._publish_mark()
        self.log.destroy()
        self.ctrl.close()
        self.ctrl.unlink()

    def destroy(self):
        """Delete the topic: channels, log segments and the control segment."""
        self.deleted = True
        self.limited = None
        self.set_full(False)
        self._publish_mark()
        for name in list(self.channels):
            self.delete_channel(name)
        self.log.destroy()
        self.ctrl.close()
        self.ctrl.unlink()
