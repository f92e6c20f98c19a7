"""A worker's topics and channels: creating them on first use, deleting them, subscribing consumers, and the
control commands other processes send (``workers/control/commands.py``, through ``workers/control/client.py``).

``TopicTable`` is one part of ``nsqpy.workers.processes.worker.Worker``. It owns the worker's topics (by name and by
log index), its channels by in-flight key and the two sequence counters the topic journal records; the dicts are
never rebound, so others may hold them (read only). It is built with what it uses: the host handed to each Topic
(the worker: ``Topic(host, ...)``; the Topic and Channel classes declare what they use of it), the topic journal
(``Directory``), the stats plane (``StructureStats``), ``catch_up`` (append what other workers committed to
their rings before a topic goes), ``storage_failed(what, exc)``, and the Topic and Channel classes (tests give
fakes).

Policies (``workers/domain/policy.py``): ``policies`` is the worker's ``PolicyBook``
(``workers/storage/policy_file.py``, loaded when the worker starts); every channel gets its effective policy when
it is made (``Topic.get_channel`` asks ``channel_policy``; ``recover`` sets the recovered ones') and again at a
``policy_changed`` command (``apply_policies``).

Capacity: a topic that cannot be created (no shared memory, no file descriptor, the journal cannot record it) is
StorageError, a clear E_PUB_FAILED / E_SUB_FAILED for its client; a topic whose channel slots are all taken
(``MessageLog.open_channel``) refuses the next channel with E_SUB_FAILED saying so.
"""
from typing import Callable, Protocol

from nsqpy.ipc.msglog import LogError
from nsqpy.protocol.errors import SubFailed, TooManyChannelConsumers
from nsqpy.protocol.frames import OK_FRAME
from nsqpy.workers.control import commands as CMD
from nsqpy.workers.publishing.records import owner_of
from nsqpy.workers.domain.channel import Channel
from nsqpy.workers.domain.policy import Policy
from nsqpy.workers.domain.session import MIGRATED
from nsqpy.workers.domain.topic import StorageError, Topic


class Directory(Protocol):
    """What the table uses of the topic journal (``workers/storage/topic_journal.py``)."""

    def topic_created(self, name: str, index: int) -> None: ...

    def topic_deleted(self, index: int) -> None: ...


class StructureStats(Protocol):
    """What the table uses of the stats plane (``workers/domain/stats_rows.py``)."""
    changed: set

    def structure_changed(self, name: str) -> None: ...


class TopicTable:
    def __init__(self, host, index: int, workers: int, opts, directory: Directory, stats: StructureStats,
                 catch_up: Callable[[], None], storage_failed: Callable[[str, BaseException], None], log,
                 topic_class=Topic, channel_class=Channel, policies=None):
        self.host = host
        self.index = index
        self.workers = workers
        self.max_channel_consumers = opts.max_channel_consumers
        self.directory = directory
        self.stats = stats
        self.catch_up = catch_up
        self.storage_failed = storage_failed
        self.log = log
        self.topic_class = topic_class
        self.channel_class = channel_class
        self.policies = policies  # PolicyBook, or None: every channel's policy is Policy.OFF
        self.topics = {}
        self.topics_by_index = {}
        self.channels_by_key = {}
        self.topic_seq = 0
        self.channel_seq = 0

    # ---- topics and channels ---------------------------------------------------------------------------
    def get_topic(self, name, restarted=False):
        """The topic, created on first use. Raises StorageError (logged) when its shared memory cannot be had."""
        t = self.topics.get(name)
        if t is None:
            self.topic_seq += 1
            try:
                t = self.topic_class(self.host, name, self.topic_seq, restarted)
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
            self.stats.structure_changed(name)  # published, and registered with lookupd, in this loop iteration
            self.log.info(f"TOPIC({name}): created")
        return t

    def delete_topic(self, name):
        if name in self.topics:
            # publishes other workers answered OK before this came first: append them, so they go with the topic
            # (an #ephemeral topic whose last consumer left must not come back with them)
            self.catch_up()
        t = self.topics.pop(name, None)
        if t is not None:
            self.topics_by_index.pop(t.index, None)
            t.destroy()
            self.stats.structure_changed(name)
            self.record(self.directory.topic_deleted, t.index)
            self.log.info(f"TOPIC({name}): deleted")

    def record(self, change, *args):
        """A deletion for the directory; one that cannot be written is logged: the replacement of a worker that
        dies before the next change skips what it cannot find any more (``recover``)."""
        try:
            change(*args)
        except OSError as e:
            self.log.error(f"worker {self.index}: the topic directory could not record a deletion: {e}")

    def channel_policy(self, topic, channel):
        """The effective policy of a channel (None: of the topic's own queue) from the configs last read."""
        return Policy.OFF if self.policies is None else self.policies.effective(topic, channel)

    def apply_policies(self, topic, reload=True):
        """Re-read the policy file (``reload``) and give every channel of ``topic`` its effective policy."""
        if self.policies is not None and reload:
            self.policies.load()
        t = self.topics.get(topic)
        if t is None:
            return
        changed = False
        for ch in t.channels.values():
            policy = self.channel_policy(topic, ch.name)
            if policy != ch.policy:
                ch.policy = policy
                changed = True
                self.log.info(f"CHANNEL({topic}:{ch.name}): policy {_describe(policy)}")
        if changed:
            _policies_set(t)

    def control_command(self, op, topic, channel=None):
        """Carry out a control command (workers/control/commands.py) for a topic this worker owns; -> a status code.
        Called for commands other processes send through the control plane."""
        self.stats.changed.add(topic)
        name = CMD.OP_NAMES.get(op, op)
        if name not in CMD.OP_CODES or (name.startswith("channel_") and not channel):
            return CMD.INVALID
        if owner_of(topic, self.workers) != self.index:
            return CMD.NOT_OWNER
        if name == "policy_changed":
            try:
                self.apply_policies(topic)
            except OSError as e:
                self.log.error(f"worker {self.index}: the policy file cannot be read: {e}")
                return CMD.FAILED
            return CMD.OK
        try:
            if name == "topic_create":
                self.get_topic(topic)
                return CMD.OK
            if name == "channel_create":
                self.get_topic(topic).get_channel(channel)
                return CMD.OK
        except StorageError:
            return CMD.FAILED
        except LogError as e:  # every channel slot of the topic is taken
            self.log.error(f"worker {self.index}: CHANNEL({topic}:{channel}) cannot be created: {e}")
            return CMD.FAILED
        t = self.topics.get(topic)
        if t is None:
            return CMD.TOPIC_NOT_FOUND
        if name == "topic_delete":
            self.delete_topic(topic)
        elif name == "topic_empty":
            t.empty()
        elif name in ("topic_pause", "topic_unpause"):
            t.pause(name == "topic_pause")
        else:
            ch = t.channels.get(channel)
            if ch is None:
                return CMD.CHANNEL_NOT_FOUND
            if name == "channel_delete":
                t.delete_channel(channel)
            elif name == "channel_empty":
                ch.empty()
            else:
                ch.pause(name == "channel_pause")
        return CMD.OK

    def next_channel_key(self):
        self.channel_seq += 1
        return self.channel_seq

    def subscribe(self, s, topic, channel):
        if owner_of(topic, self.workers) != self.index:
            return MIGRATED
        try:
            ch = self.get_topic(topic).get_channel(channel)
        except StorageError as e:
            raise SubFailed(f"SUB failed {e}") from None
        except LogError as e:  # every channel slot of the topic is taken
            raise SubFailed(f"SUB failed channel {topic}:{channel} cannot be created: {e}") from None
        limit = self.max_channel_consumers
        if limit and len(ch.consumers) >= limit:
            raise TooManyChannelConsumers(f"channel consumers for {topic}:{channel} exceeds limit of {limit}")
        ch.add_consumer(s)
        s.write(OK_FRAME)
        return None

    # ---- a replacement worker ------------------------------------------------------------------------
    def recover(self, doc):
        """Re-attach the topics and channels of the topic directory ``doc`` (what the dead predecessor recorded),
        with its counters; a topic that cannot be re-attached is logged and skipped."""
        self.topic_seq = doc.get("topic_seq", 0)
        self.channel_seq = doc.get("channel_seq", 0)
        for td in doc["topics"]:
            try:
                t = self.topic_class(self.host, td["name"], td["index"], restarted=True)
            except Exception as e:
                # e.g. deleted by the dead process after its last recorded change: a topic that cannot be
                # re-attached must not take the worker's other topics down with it (a crash loop)
                self.log.error(f"worker {self.index}: TOPIC({td['name']}) cannot be recovered: {e!r}")
                continue
            t.paused = td["paused"]
            self.topics[t.name] = t
            self.topics_by_index[t.index] = t
            for cd in td["channels"]:
                ch = self.channel_class(t, cd["name"], cd["ch"], cd["key"])
                ch.paused = cd["paused"]
                ch.policy = self.channel_policy(t.name, ch.name)
                t.channels[ch.name] = ch
                self.channels_by_key[ch.key] = ch
            _policies_set(t)
            known = {c.ch for c in t.channels.values()}
            for slot in t.log.open_channels():
                if slot not in known:  # opened by the dead process just before it could record it: it took
                    t.log.close_channel(slot, give_back=True)  # the backlog (a first channel), delivered none


def _describe(policy):
    if policy == Policy.OFF:
        return "off"
    return " ".join(f"{k}={v}" for k, v in policy.to_json().items() if v != getattr(Policy.OFF, k))


def _policies_set(t):
    """Tell a topic its channels' policies were set (``Topic.policy_changed``: which channels are bounded); a
    topic class without the hook (tests' fakes) needs nothing."""
    hook = getattr(t, "policy_changed", None)
    if hook is not None:
        hook()
