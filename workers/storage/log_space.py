"""Giving log space back: low-water marks from what channels hold, reclaiming segments behind them, and moving held
messages forward so that they never pin the log (``compact``).

``LogSpace`` is one part of ``nsqpy.workers.processes.worker.Worker``, built with what it uses: the in-flight table,
the deferred store, the channel keys given out so far (``ChannelKeys``, the worker's topic table) and the log.
"""
import time
from typing import Protocol

import numpy as np

from nsqpy.ipc.msglog import NO_LOW_WATER, LogError
from nsqpy.workers.lane import kernels as K

COMPACT_SPAN = 2               # segments of log that held messages may pin behind every cursor before moving


class ChannelKeys(Protocol):
    """The highest in-flight channel key given out so far (``TopicTable.channel_seq``): lows are indexed by key."""
    channel_seq: int


class LogSpace:
    """Low-water marks and compaction for the worker's topic logs; its own state: when a failed compaction was
    last logged (once a second at most)."""

    def __init__(self, inflight, deferred, keys: ChannelKeys, log):
        self.inflight = inflight
        self.deferred = deferred
        self.keys = keys
        self.log = log
        self._compact_logged = 0.0

    # ---- low-water marks and compaction ---------------------------------------------------------------
    def slots_of_channel(self, key):
        out = np.empty(self.inflight.capacity, np.int64)
        n = K.slots_of_channel(self.inflight.slots, key, out)
        return out[:n].tolist()

    def refresh_low_water(self, topics):
        """Tell each topic's log the oldest position each channel still holds, so it can reclaim behind it.
        One pass over the in-flight table and the deferred store serves all topics (it is the expensive part).
        A topic whose held messages (in flight, requeued, deferred) pin too much of the log behind every cursor
        has them moved forward first (``compact``)."""
        lows = self._held_lows()
        if any([self.compact(t, lows) for t in topics]):
            lows = self._held_lows()
        for topic in topics:
            for ch in topic.channels.values():
                topic.log.set_low_water(ch.ch, int(lows[ch.key]))
            topic.log.reclaim()
            if topic.full and topic.log.has_room():
                topic.set_full(False)

    def _held_lows(self):
        lows = np.full(self.keys.channel_seq + 1, NO_LOW_WATER, np.int64)
        if len(self.inflight):
            K.low_water(self.inflight.slots, lows)
        self.deferred.low_water(lows)
        return lows

    def compact(self, topic, lows):
        """Requeue without pinning: when messages that channels hold by position (in flight, requeued, deferred)
        keep segments alive behind every cursor, and that span is more than COMPACT_SPAN segments (or the topic
        is full), re-append them at the head as parked records private to their channel and point their slot or
        deferred entry there; the old segments are then reclaimed. A message held for an hour thus costs its own
        bytes, copied about once per turn of the log, not the log behind it. -> True if anything moved."""
        if not topic.channels:
            return False
        log = topic.log
        seg = log.segment_size
        held = min(int(lows[ch.key]) for ch in topic.channels.values())
        if held == NO_LOW_WATER:
            return False
        limit = min(log.cursor(ch.ch) for ch in topic.channels.values()) // seg * seg
        if held >= limit or (limit - held < COMPACT_SPAN * seg and not topic.full):
            return False
        moved = 0
        try:
            for ch in topic.channels.values():
                if int(lows[ch.key]) < limit:
                    moved += self._move_held(ch, limit)
        except (LogError, ValueError) as e:
            now = time.monotonic()
            if now - self._compact_logged >= 1.0:
                self._compact_logged = now
                self.log.warn(f"TOPIC({topic.name}): cannot move held messages forward: {e}")
        return moved > 0

    def _move_held(self, ch, limit):
        """Copy ch's held messages below position limit to the head (parked); -> how many moved."""
        log = ch.topic.log
        moved = 0
        slots = np.array(self.slots_of_channel(ch.key), np.int64)
        if len(slots):
            _, pos, att = K.generations(self.inflight, slots)
            old = pos < limit
            if old.any():
                new = log.copy_forward(ch.ch, pos[old], att[old], parked=True)
                for slot, p in zip(slots[old].tolist(), new.tolist()):
                    self.inflight.set_log_pos(slot, p)
                moved += int(old.sum())
        if self.deferred.counts.get(ch.key):
            idx = self.deferred.of_channel(ch.key)
            _, _, _, pos, att, _ = self.deferred.fields(idx)
            old = pos < limit
            if old.any():
                new = log.copy_forward(ch.ch, pos[old], att[old], parked=True)
                self.deferred.set_log_pos(idx[old], new)
                moved += int(old.sum())
        return moved
