"""Small fakes for unit tests of the worker's parts (``Forwarder``, ``TopicTable``) without a broker.

Each fake stands in for one Protocol a part declares (``workers/publishing/forwarding.py``: ``Topics``,
``TopicLearner``, ``OwnTopicHint``; ``workers/domain/topics.py``: ``Directory``, ``StructureStats``) or for a
service it takes as a plain argument (the loop's timers, the control block's full marks, the suspect words, the
log), and records what it was asked. The rings are real: ``two_workers`` builds a real ``LinkSet`` in this
process's memory, so a full ring, a drain and the owner's wake-up are the broker's own code.
"""
import mmap
import zlib
from types import SimpleNamespace

import numpy as np

from nsqpy.ipc.msglog import LogError
from nsqpy.workers.connections.handover import OwnerNaps
from nsqpy.workers.domain.topic import StorageError
from nsqpy.workers.publishing import links as L
from nsqpy.workers.publishing.forwarding import Forwarder
from nsqpy.workers.publishing.records import owner_of


# ---- services both parts take ------------------------------------------------------------------------------
class FakeLog:
    def __init__(self):
        self.lines = []

    def _line(self, level):
        return lambda msg: self.lines.append((level, msg))

    def __getattr__(self, level):  # debug, info, warn, error
        return self._line(level)


class FakeLoop:
    """The loop's one-shot timers: recorded, fired only when a test says so."""

    def __init__(self):
        self.timers = []

    def call_later(self, delay, callback):
        self.timers.append((delay, callback))
        return len(self.timers)


class FailureReports:
    """``storage_failed(what, exc)``: what the part reported."""

    def __init__(self):
        self.reports = []

    def __call__(self, what, exc):
        self.reports.append((what, exc))


# ---- the forwarder's ---------------------------------------------------------------------------------------
class FullMarks:
    """The control block's topic-full marks (``Control.topic_full``): (owner, crc) pairs."""

    def __init__(self):
        self.full = set()

    def topic_full(self, owner, crc):
        return (owner, crc) in self.full

    def refusal(self, owner, crc, topic):
        return f"topic {topic} is full" if (owner, crc) in self.full else None


class FakeSuspect:
    """The poison-record words a drain writes (``workers/storage/poison.py``)."""

    def __init__(self):
        self.w = np.zeros(16, np.int64)
        self.base = 0
        self.quarantined = 0

    def begin(self, *args):
        pass

    def end(self):
        pass

    def count_quarantined(self):
        self.quarantined += 1


class AppendOnlyTopic:
    """What the forwarder uses of a Topic: ``append``. Keeps the bodies; ``room`` messages at most (then False,
    as a topic whose budgets are used up); ``broken`` makes it raise StorageError (no memory or disk)."""
    bounded = ()     # no bounded channel (workers/domain/bounds.py)
    limited = None

    def __init__(self, name, room=None):
        self.name = name
        self.crc = zlib.crc32(name.encode())
        self.bodies = []
        self.acknowledged = []
        self.room = room
        self.broken = False

    def append(self, src, offsets, lengths, timestamp, defer_ms=0, acknowledged=False):
        if self.broken:
            raise StorageError(f"topic {self.name}: no space left on device")
        n = len(lengths)
        if self.room is not None and len(self.bodies) + n > self.room:
            return False
        for o, k in zip(np.asarray(offsets).tolist(), np.asarray(lengths).tolist()):
            self.bodies.append(bytes(src[o:o + k]))
            self.acknowledged.append(acknowledged)
        return True


class PublishTopics:
    """``forwarding.Topics``: topics created on first use, and the control commands carried out."""

    def __init__(self):
        self.topics = {}
        self.commands = []

    def get_topic(self, name):
        t = self.topics.get(name)
        if t is None:
            t = self.topics[name] = AppendOnlyTopic(name)
        return t

    def control_command(self, op, topic, channel=None):
        self.commands.append((op, topic, channel))
        return 0


class LearningPump:
    """``forwarding.TopicLearner``."""

    def __init__(self):
        self.learned = []

    def learn_topic(self, topic, owner):
        self.learned.append((topic, owner))


class HintedOwnPath:
    """``forwarding.OwnTopicHint``."""

    def __init__(self):
        self.hints = []

    def hint(self, topic):
        self.hints.append(topic)


class PublishingSession:
    """What a publish does to its session: ``count_pub`` (the OK), ``hold``/``release`` while parked,
    ``fail_held`` (the error of a parked publish)."""

    def __init__(self, name="s"):
        self.remote_text = name
        self.oks = 0
        self.errors = []
        self.held = False
        self.closed = False

    def count_pub(self, topic, n):
        self.oks += 1

    def hold(self):
        self.held = True

    def release(self):
        self.held = False

    def fail_held(self, err):
        self.errors.append(err)
        self.held = False


class _Memory:
    def __init__(self, buf):
        self.buf = buf


class ForwarderRig:
    """One worker's forwarder and every fake it was built with."""

    def __init__(self, index, links, workers, data_path):
        self.topics = PublishTopics()
        self.pump = LearningPump()
        self.own_path = HintedOwnPath()
        self.marks = FullMarks()
        self.loop = FakeLoop()
        self.log = FakeLog()
        self.failures = FailureReports()
        self.delivered = 0
        self.forwarder = Forwarder(index, workers, links, self.marks, FakeSuspect(), self.loop, self.log, data_path,
                                   "/t-", SimpleNamespace(crash_on_forwarded_body=""), self.topics, self.pump,
                                   self.own_path, OwnerNaps(workers), self._deliver_now, self.failures)

    def _deliver_now(self):
        self.delivered += 1


def two_workers(data_path, capacity=1 << 16):
    """Two workers' forwarders over one real LinkSet in this process's memory (pub rings of ``capacity`` bytes);
    -> (rig of worker 0, rig of worker 1, the LinkSet). Close the LinkSet's eventfds with ``close_links``."""
    shared = mmap.mmap(-1, L.nbytes(2, 2, capacity))
    links = L.LinkSet.create(_Memory(np.frombuffer(shared, np.uint8)), 2, 2, capacity)
    return ForwarderRig(0, links, 2, data_path), ForwarderRig(1, links, 2, data_path), links


def close_links(links):
    import os
    for fd in links.eventfds:
        os.close(fd)


def topic_owned_by(owner, workers=2, stem="t"):
    """A topic name that hashes to ``owner``."""
    for i in range(1000):
        name = f"{stem}{i}"
        if owner_of(name, workers) == owner:
            return name
    raise AssertionError("no such name")


# ---- the topic table's ---------------------------------------------------------------------------------------
class RecordingJournal:
    """``topics.Directory``: the changes recorded; ``fail`` makes the next topic_created raise OSError."""

    def __init__(self, doc=None):
        self.changes = []
        self.fail = False
        self.doc = doc

    def topic_created(self, name, index):
        if self.fail:
            raise OSError(28, "No space left on device")
        self.changes.append(("topic_created", name, index))

    def topic_deleted(self, index):
        self.changes.append(("topic_deleted", index))

    def read(self):
        return self.doc


class RecordingStats:
    """``topics.StructureStats``."""

    def __init__(self):
        self.changed = set()
        self.structure = []

    def structure_changed(self, name):
        self.structure.append(name)


class SlotLog:
    """A topic log's channel slots, as ``MessageLog.open_channel``/``close_channel``: ``slots`` of them."""

    def __init__(self, slots, open_slots=()):
        self.free = [s for s in range(slots) if s not in open_slots]
        self.taken = set(open_slots)
        self.slots = slots
        self.closed = []  # (slot, give_back) of each close_channel

    def open_channel(self):
        if not self.free:
            raise LogError(f"all {self.slots} channel slots are taken")
        slot = self.free.pop(0)
        self.taken.add(slot)
        return slot

    def close_channel(self, slot, give_back=False):
        self.taken.discard(slot)
        self.free.append(slot)
        self.closed.append((slot, give_back))

    def open_channels(self):
        return sorted(self.taken)


class TableChannel:
    """A channel as the table and its topic see it: consumers; the last consumer of an #ephemeral channel leaving
    deletes it (Channel.remove_consumer)."""

    def __init__(self, topic, name, ch, key):
        self.topic, self.name, self.ch, self.key = topic, name, ch, key
        self.ephemeral = name.endswith("#ephemeral")
        self.consumers = []
        self.paused = False
        self.deleted = False

    def add_consumer(self, s):
        self.consumers.append(s)
        s.channel = self

    def remove_consumer(self, s):
        self.consumers.remove(s)
        if self.ephemeral and not self.consumers and not self.deleted:
            self.topic.delete_channel(self.name)


class TableTopic:
    """A topic as the table uses it (``Topic(host, name, index, restarted)``, ``get_channel``,
    ``delete_channel``, ``destroy``), with a log of ``slots`` channel slots. Its host is what the real Topic's
    is, for the services the table provides: ``next_channel_key``, ``channels_by_key`` and ``delete_topic``."""

    def __init__(self, host, name, index, restarted=False, slots=4, open_slots=()):
        self.host, self.name, self.index, self.restarted = host, name, index, restarted
        self.ephemeral = name.endswith("#ephemeral")
        self.channels = {}
        self.paused = False
        self.deleted = False
        self.log = SlotLog(slots, open_slots)

    def get_channel(self, name):
        ch = self.channels.get(name)
        if ch is None:
            ch = TableChannel(self, name, self.log.open_channel(), self.host.next_channel_key())
            self.channels[name] = ch
            self.host.channels_by_key[ch.key] = ch
        return ch

    def delete_channel(self, name):
        ch = self.channels.pop(name, None)
        if ch is None:
            return
        ch.deleted = True
        self.host.channels_by_key.pop(ch.key, None)
        for s in list(ch.consumers):
            s.channel = None
            s.close()
        self.log.close_channel(ch.ch)
        if self.ephemeral and not self.channels:
            self.host.delete_topic(self.name)

    def destroy(self):
        self.deleted = True
        for name in list(self.channels):
            self.delete_channel(name)


class TopicMaker:
    """The table's ``topic_class``: makes TableTopics of ``slots`` channel slots; ``refuse`` (an exception) makes
    the next ones fail as a Topic without shared memory does; ``open_slots[name]``: channel slots a recovered
    topic's log has open (the dead process opened them)."""

    def __init__(self, slots=4):
        self.slots = slots
        self.refuse = None
        self.open_slots = {}
        self.made = []

    def __call__(self, host, name, index, restarted=False):
        if self.refuse is not None:
            raise self.refuse
        t = TableTopic(host, name, index, restarted, self.slots, self.open_slots.get(name, ()))
        self.made.append(t)
        return t


class TableHost:
    """The worker as a TableTopic sees it: the table's services (set once the table exists)."""

    def __init__(self):
        self.table = None

    def next_channel_key(self):
        return self.table.next_channel_key()

    @property
    def channels_by_key(self):
        return self.table.channels_by_key

    def delete_topic(self, name):
        self.table.delete_topic(name)


class Subscriber:
    """A session subscribing: the OK it was written, and whether it was closed."""

    def __init__(self):
        self.written = []
        self.channel = None
        self.closed = False

    def write(self, data):
        self.written.append(bytes(data))

    def close(self):
        self.closed = True
