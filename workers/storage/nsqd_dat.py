"""Keeps ``<data-path>/nsqd.dat`` (NSQ's metadata file, ``nsqpy/store/metadata.py``) in step with the workers'
journals (``workers/storage/topic_journal.py``), from the supervisor.

Each worker records its topic and channel changes in its own journal (one pwrite, no fsync: a worker never waits
for a disk). The supervisor looks at the journals' (size, mtime, inode) every loop turn (``Supervisor.periodic``,
at most ``PERIOD`` apart); when one changed it replays them all and writes nsqd.dat atomically (tmp, fsync,
rename). So nsqd.dat follows a create, delete, pause or unpause within PERIOD, costs nothing while nothing
changes, and a burst of changes (creating 10,000 topics) is one rewrite per period, not one per change. It is
written a last time at shutdown, after the workers stopped and before the journals are removed.
"""
import os

from nsqpy.store import metadata
from nsqpy.workers.storage import topic_journal as meta

PERIOD = 0.25


class MetadataSync:
    def __init__(self, plan, version):
        self.plan = plan
        self.version = version
        self._seen = None

    def _paths(self):
        return [meta.journal_path(self.plan.data_path, self.plan.prefix, w) for w in range(self.plan.workers)]

    def _signature(self):
        sig = []
        for path in self._paths():
            try:
                st = os.stat(path)
                sig.append((st.st_size, st.st_mtime_ns, st.st_ino))
            except FileNotFoundError:
                sig.append(None)
        return sig

    def poll(self, force=False):
        sig = self._signature()
        if sig == self._seen and not force:
            return False
        topics = []
        for path in self._paths():
            try:
                doc = meta.replay(path)
            except FileNotFoundError:
                continue
            for t in doc["topics"]:
                chans = [metadata.ChannelMeta(c["name"], c["paused"]) for c in t["channels"]]
                topics.append(metadata.TopicMeta(t["name"], t["paused"], chans))
        topics.sort(key=lambda t: t.name)
        try:
            metadata.save(self.plan.data_path, topics, self.version)
        except OSError as e:
            self.plan.log.error(f"failed to persist metadata - {e}")
            return False
        self._seen = sig
        return True
