"""A worker's topics and channels: creating them on first use, deleting them, subscribing consumers, and the
control commands other processes send (``workers/control/commands.py``, through ``workers/control/client.py``).

A mixin of ``nsqpy.workers.processes.worker.Worker``; it uses the worker's ``topics``, ``topics_by_index``, ``channels_by_key``,
``directory`` (the topic journal, ``workers/storage/topic_journal.py``), ``stats`` and ``_catch_up``.
"""


from nsqpy.ipc.msglog import LogError
from nsqpy.protocol.errors import SubFailed, TooManyChannelConsumers
from nsqpy.protocol.frames import OK_FRAME
from nsqpy.workers.control import commands as CMD
from nsqpy.workers.publishing.records import owner_of
from nsqpy.workers.domain.session import MIGRATED
from nsqpy.workers.domain.topic import StorageError, Topic


class Registry:
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
            self.stats.structure_changed(name)  # published, and registered with lookupd, in this loop iteration
            self.log.info(f"TOPIC({name}): created")
        return t

    def delete_topic(self, name):
        if name in self.topics:
            # publishes other workers answered OK before this came first: append them, so they go with the topic
            # (an #ephemeral topic whose last consumer left must not come back with them)
            self._catch_up()
        t = self.topics.pop(name, None)
        if t is not None:
            self.topics_by_index.pop(t.index, None)
            t.destroy()
            self.stats.structure_changed(name)
            self._record(self.directory.topic_deleted, t.index)
            self.log.info(f"TOPIC({name}): deleted")

    def _record(self, change, *args):
        """A deletion for the directory; one that cannot be written is logged: the replacement of a worker that
        dies before the next change skips what it cannot find any more (``_recover``)."""
        try:
            change(*args)
        except OSError as e:
            self.log.error(f"worker {self.index}: the topic directory could not record a deletion: {e}")

    def control_command(self, op, topic, channel=None):
        """Carry out a control command (workers/control/commands.py) for a topic this worker owns; -> a status code.
        Called for commands other processes send through the control plane."""
        self.stats.changed.add(topic)
        name = CMD.OP_NAMES.get(op, op)
        if name not in CMD.OP_CODES or (name.startswith("channel_") and not channel):
            return CMD.INVALID
        if owner_of(topic, self.plan.workers) != self.index:
            return CMD.NOT_OWNER
        try:
            if name == "topic_create":
                self.get_topic(topic)
                return CMD.OK
            if name == "channel_create":
                self.get_topic(topic).get_channel(channel)
                return CMD.OK
        except StorageError:
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
