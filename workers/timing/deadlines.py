"""A worker's timers: in-flight deadlines through the scanner process (timer batches, ``workers/timing/timer_batches.py``) and
deferred messages through the worker's own deferred store (``workers/domain/deferred.py``).

``Deadlines`` is one part of ``nsqpy.workers.processes.worker.Worker``, built with exactly what it uses: the link
set (to wake the scanner) and the ring to it, the timer batches, the in-flight table, the deferred store, the
loop's timers, the channels by key and the sessions by connection id (both owned elsewhere: read only here), and
a channel that came due is told so (``Channel.came_due``, ``wants_delivery``).
"""
import time
from typing import Callable, Mapping, Protocol

import numpy as np

from nsqpy.ipc import inflight as IF
from nsqpy.workers.processes.scanner import EXPIRED, REMOVE, RESET, START

SCANNER_POLL_NS = 50_000_000   # how late the scanner may see a timer event; see _send_scanner
HOLD_S = SCANNER_POLL_NS / 1e9  # how long a delivery round's START waits in the worker (workers/timing/timer_batches.py)
HOLD_MIN_AHEAD_NS = 4 * SCANNER_POLL_NS  # only deadlines at least this far ahead are held
START_ROWS = 65536             # START rows per ring record at most
DEFER_RETRY = 0.05             # seconds before a channel whose deferred messages found no room is tried again


class ScannerLinks(Protocol):
    """What the deadlines use of the link set (``workers/publishing/links.py``): waking the scanner."""
    SCANNER: int

    def wake(self, proc: int) -> bool: ...


class Timers(Protocol):
    """The loop's one-shot timers (``workers/processes/event_loop.py``)."""

    def call_later(self, delay: float, callback: Callable[[], object]): ...


class Deadlines:
    """In-flight deadlines through the scanner, and the deferred store's due times through a loop timer. Its
    own state: the due time of the loop timer armed for the deferred store."""

    def __init__(self, links: ScannerLinks, to_scanner, timers, inflight, deferred, loop: Timers,
                 channels_by_key: Mapping, sessions: Mapping):
        self.links = links
        self.to_scanner = to_scanner
        self.timers = timers
        self.inflight = inflight
        self.deferred = deferred
        self.loop = loop
        self.channels_by_key = channels_by_key
        self.sessions = sessions
        self._deferred_at = None       # due time of the loop timer armed for the deferred store

    # ---- deferred messages -----------------------------------------------------------------------------
    def deferred_changed(self):
        """Deferred entries were added: make sure a loop timer fires at the earliest due time. (The scanner's
        heaps are fixed-size and indexed by in-flight slot; deferred messages are unbounded and only their owner
        acts on them, so their heap is the store's own, in this process, rebuilt after a crash.)"""
        due = self.deferred.earliest()
        if due is None or (self._deferred_at is not None and self._deferred_at <= due):
            return
        self._deferred_at = due
        self.loop.call_later(max(0.0, (due - time.time_ns()) / 1e9), self._on_deferred_due)

    def _on_deferred_due(self):
        self._deferred_at = None
        idx = self.deferred.due(time.time_ns())
        if len(idx):
            _, channels, _, _, _, _ = self.deferred.fields(idx)
            orphans = []
            for i, key in zip(idx.tolist(), channels.tolist()):
                ch = self.channels_by_key.get(key)
                if ch is None:
                    orphans.append(i)  # its channel is gone (deleted while the entry was popped)
                else:
                    ch.came_due(i)
                    ch.wants_delivery()
            self.deferred.free(orphans)
        self.deferred_changed()

    def retry_later(self, ch):
        """Deliver on ch again after DEFER_RETRY (its deferred messages found no room to wait in)."""
        self.loop.call_later(DEFER_RETRY, ch.wants_delivery)

    # ---- scanner ---------------------------------------------------------------------------------------
    def send_scanner(self, rtype, payload, key=None):
        """Post a timer event. The scanner is woken only for a key due within its polling period (or when the
        ring fills up): it drains its rings at least every MAX_SLEEP anyway, and most keys lie a message timeout
        (>= 1 s) ahead, so waking it per delivery round would only burn a core on wake-ups."""
        while not self.to_scanner.send(rtype, payload):
            self.links.wake(self.links.SCANNER)
            self.to_scanner.wait_for_room(len(payload), 0.001)
        if key is not None and key - time.time_ns() < SCANNER_POLL_NS:
            self.links.wake(self.links.SCANNER)

    def timer_start(self, slots, key):
        """One timer (deadline or due time `key`) for all these slots. A deadline far enough ahead is held for
        up to HOLD_S before it is posted: if the slots are finished by then, the scanner never hears of it."""
        if len(slots) == 0:
            return
        timers = self.timers
        b = timers.add(slots)
        if key - time.time_ns() >= HOLD_MIN_AHEAD_NS:
            if not timers.held():
                self.loop.call_later(HOLD_S, self.post_held_timers)
            timers.hold(b, key)
            return
        self.send_scanner(START, np.array([b, timers.gen[b], key], np.int64).tobytes(), key)

    def post_held_timers(self):
        """Post the held timers that are still live (the loop calls this HOLD_S after the first was held)."""
        self._post_starts(np.array(self.timers.take_held(), np.int64).reshape(-1, 3))

    def timer_start_each(self, slots, keys):
        """A timer of its own for every slot (TOUCH, deferred messages, recovery), posted at once."""
        rows = np.empty((len(slots), 3), np.int64)
        for i, (slot, key) in enumerate(zip(slots, keys)):
            b = self.timers.add([slot])
            rows[i] = (b, self.timers.gen[b], key)
        self._post_starts(rows)

    def _post_starts(self, rows):
        for k in range(0, len(rows), START_ROWS):
            part = rows[k:k + START_ROWS]
            self.send_scanner(START, part.tobytes(), int(part[:, 2].min()))

    def timer_leave(self, slots):
        self._removed(self.timers.leave(slots))

    def timer_leave_one(self, slot):
        self._removed(self.timers.leave_one(slot))

    def _removed(self, empty):
        if len(empty):
            self.send_scanner(REMOVE, np.array(empty, np.int64).tobytes())

    def on_scanner(self, rtype, payload):
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
        self.send_scanner(RESET, b"")
        self.timers.clear()
        slots, keys = [], []
        for slot in self.inflight.recover().tolist():
            info = self.inflight.slot(slot)
            if info.state in (IF.IN_FLIGHT, IF.DEFERRED):
                slots.append(slot)
                keys.append(info.deadline_ns)
        self.timer_start_each(slots, keys)
