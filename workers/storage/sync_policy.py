"""The worker's sync policy for durable topics (``--mem-queue-size=0``: every message on disk, see
``workers/domain/topic.py``): NSQ's ``--sync-every`` and ``--sync-timeout``, as group commit.

Theory of operation
-------------------
Appends to a durable topic count towards the worker's unsynced messages (``appended``). Once per loop iteration,
after the iteration's publishes were appended and before the iteration's replies are flushed (``Worker._idle``),
the worker syncs when ``--sync-every`` messages are waiting or the oldest has waited ``--sync-timeout``: one
fdatasync per file touched since the last sync (the topics' head disk segments and control blocks), the worker's
journal when it changed, and the data directory when files were created. However many messages the iteration
appended, that is one write (the appends, in the page cache) and at most one sync per file: ``--sync-every=1``
costs a sync per iteration, not per message. With ``--sync-every=1`` the replies of the iteration's PUB/MPUB
commands that went through the session (MPUB, DPUB, forwarded publishes) leave after the sync; a lone PUB
answered by the pump's compiled fast path may leave just before it, as nsqd's reply may leave before its disk
queue syncs (NSQ syncs after the write that reached the count). A timer makes the timeout hold when no further
iteration comes.

What survives a reboot then is what the last sync covered: the log's records up to the synced head, the channel
cursors and low-water marks in the synced control block, the topic directory (the journal) and nsqd.dat (written
with fsync by the supervisor). Messages in flight or deferred at the reboot are the log's records between a
channel's cursor or low-water mark and its head, delivered again (NSQ loses those: they are in its memory).
"""
import os
import time
from typing import Callable, Protocol


class Journal(Protocol):
    """What the sync policy uses of the worker's topic directory (``workers/storage/topic_journal.py``)."""
    size: int

    def sync(self) -> None: ...


class Timers(Protocol):
    """The loop's one-shot timers (``workers/processes/event_loop.py``)."""

    def call_later(self, delay: float, callback: Callable[[], object]): ...


class SyncPolicy:
    """A worker's group commit for durable topics. Its own state: the unsynced topics and counts, the timeout timer
    and the journal size last synced. Needs the loop's timers, the topic directory, the data path (its directory is
    synced when files were created) and the worker's storage-health report (``storage_failed(what, exc)``)."""

    def __init__(self, opts, loop: Timers, directory: Journal, data_path: str,
                 storage_failed: Callable[[str, BaseException], None]):
        self.loop = loop
        self.directory = directory
        self.data_path = data_path
        self.storage_failed = storage_failed
        self.unsynced = {}            # durable topic -> messages appended since its last sync (empty: nothing due)
        self._unsynced_count = 0
        self._unsynced_since = 0.0
        self._sync_timer = None
        self._journal_synced = -1
        self._sync_every = max(1, opts.sync_every)
        self._sync_timeout = max(0.0, opts.sync_timeout / 1e9)

    def appended(self, topic, n):
        """(Topic.append) n messages are in a durable topic's log, not yet synced."""
        if not self.unsynced:
            self._unsynced_since = time.monotonic()
            if self._sync_timer is None:
                self._sync_timer = self.loop.call_later(self._sync_timeout, self._sync_timer_fired)
        self.unsynced[topic] = self.unsynced.get(topic, 0) + n
        self._unsynced_count += n

    def _sync_timer_fired(self):
        self._sync_timer = None
        self.sync_due(force=True)

    def sync_due(self, force=False):
        """Sync when the policy says so (or ``force``): called once per loop iteration while messages wait."""
        if not self.unsynced:
            return
        if not (force or self._unsynced_count >= self._sync_every
                or time.monotonic() - self._unsynced_since >= self._sync_timeout):
            if self._sync_timer is None:
                left = self._sync_timeout - (time.monotonic() - self._unsynced_since)
                self._sync_timer = self.loop.call_later(max(0.0, left), self._sync_timer_fired)
            return
        self.sync_now()

    def sync_now(self):
        topics, self.unsynced, self._unsynced_count = self.unsynced, {}, 0
        new_files = False
        for t in topics:
            if t.deleted:
                continue
            before = t.synced_segment
            try:
                t.sync()
            except OSError as e:
                self.storage_failed(f"TOPIC({t.name}): cannot sync its disk queue", e)
                continue
            new_files = new_files or t.synced_segment != before
        if self.directory.size != self._journal_synced:
            try:
                self.directory.sync()
                self._journal_synced = self.directory.size
            except OSError as e:
                self.storage_failed("cannot sync the topic directory", e)
            new_files = True
        if new_files:
            try:
                fd = os.open(self.data_path, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                self.storage_failed("cannot sync the data directory", e)
