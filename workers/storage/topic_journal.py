"""A worker's directory of the topics and channels it owns, kept in a journal file so that its replacement finds them.

Theory of operation
-------------------
The directory holds topic names with their log index, their channels with log channel slot and in-flight channel
key, paused flags, and the worker's two sequence counters. It changes only when a topic or channel is created,
deleted, paused or unpaused, and every such change is one record appended to the worker's journal with one
``pwrite``: O(1) per change whatever the number of topics. (The first build rewrote the whole directory as one JSON
document in a fixed 1 MiB shared-memory segment: O(n) per change, O(n^2) to create n topics, and a worker crashed
at ~9,500 topics when the document outgrew its half of the segment.) The writing worker also keeps the live
directory in memory, for ``read`` and for compaction.

Torn records: every record carries its length and a CRC-32 of its payload. A worker killed in the middle of a
write leaves at most one torn record, at the end; replay stops at the first record whose length overruns the file
or whose checksum is wrong, so a change is either wholly visible or not at all. The next writer truncates the torn
tail before it appends, so garbage never ends up between valid records.

Compaction: when the journal is more than twice the size a snapshot of the live directory would have (and at least
COMPACT_MIN), the live directory is written as records (counters first) to ``<journal>.tmp``, which is renamed over
the journal: a reader opens either the old file or the new one, both complete. A compaction copies the live size,
and at least a comparable number of bytes was appended since the last one, so the cost per change stays O(1)
amortised. There is no fsync: the journal must outlive a process crash (the page cache does), not a machine crash
(the shared memory it describes does not either).

Processes: the supervisor creates (truncates) the file before it forks; a worker opens it on first use, in its own
process (a descriptor inherited through fork would share its file offset with every other copy). A restarted
worker takes the journal over with ``read``: replay, truncate a torn tail, carry on appending. ``replay`` reads a
journal without touching it. Keeping the directory across broker restarts belongs to the persistence work: for
now ``create`` starts every instance empty, and ``remove_journals`` deletes the files at a clean shutdown.

    file     b"NSQMETA2", then records: [u32 payload length][u32 crc32(payload)][payload]
    payload  kind byte, fixed little-endian fields, then the name (utf-8) for TOPIC and CHANNEL
             TOPIC(index, name)  TOPIC_GONE(index)  TOPIC_PAUSED(index, flag)
             CHANNEL(topic index, ch, key, name)  CHANNEL_GONE(key)  CHANNEL_PAUSED(key, flag)
             COUNTERS(topic_seq, channel_seq)
"""
import errno
import glob
import os
import struct
import zlib

MAGIC = b"NSQMETA2"
HEAD = struct.Struct("<II")
COMPACT_MIN = 64 << 10      # smaller journals are never compacted: not worth a rewrite
MAX_PAYLOAD = 1024          # far above the longest record (a channel with a 64-byte name): longer is a torn length

TOPIC, TOPIC_GONE, TOPIC_PAUSED, CHANNEL, CHANNEL_GONE, CHANNEL_PAUSED, COUNTERS = range(1, 8)
_FIELDS = {
    TOPIC: struct.Struct("<Bq"), TOPIC_GONE: struct.Struct("<Bq"), TOPIC_PAUSED: struct.Struct("<Bq?"),
    CHANNEL: struct.Struct("<Bqqq"), CHANNEL_GONE: struct.Struct("<Bq"), CHANNEL_PAUSED: struct.Struct("<Bq?"),
    COUNTERS: struct.Struct("<Bqq"),
}
_NAMED = (TOPIC, CHANNEL)
PAUSED_SIZE = HEAD.size + _FIELDS[TOPIC_PAUSED].size
COUNTERS_SIZE = HEAD.size + _FIELDS[COUNTERS].size


def _record(kind, *fields, name=b""):
    payload = _FIELDS[kind].pack(kind, *fields) + name
    return HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def journal_path(data_path, prefix, index):
    """Worker ``index``'s journal: under the data path, named from the instance's segment prefix."""
    return os.path.join(data_path, f"{prefix.strip('/')}meta-{index}.journal")


def remove_journals(data_path, prefix):
    """Every journal of the instance (and a compaction's leftover temporary file), whatever its worker count was."""
    for path in glob.glob(os.path.join(glob.escape(data_path), glob.escape(prefix.strip("/")) + "meta-*.journal*")):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class _Topic:
    __slots__ = ("name", "paused", "channels", "size")

    def __init__(self, name, size):
        self.name = name
        self.paused = False
        self.channels = {}  # key -> _Channel, in creation order
        self.size = size    # bytes of its TOPIC record


class _Channel:
    __slots__ = ("name", "ch", "key", "paused", "topic", "size")

    def __init__(self, name, ch, key, topic, size):
        self.name, self.ch, self.key, self.topic, self.size = name, ch, key, topic, size
        self.paused = False


class _Live:
    """The directory as the journal's records build it; ``size`` is what a snapshot of it takes. Applying is
    lenient (a duplicate replaces, an unknown id is ignored): the writer checks its calls, replay must not fail."""

    def __init__(self):
        self.topics = {}    # index -> _Topic, in creation order
        self.channels = {}  # key -> _Channel
        self.topic_seq = 0
        self.channel_seq = 0
        self.size = len(MAGIC) + COUNTERS_SIZE

    def topic(self, index, name):
        self.topic_gone(index)
        self.topics[index] = _Topic(name, HEAD.size + _FIELDS[TOPIC].size + len(name.encode()))
        self.size += self.topics[index].size
        self.topic_seq = max(self.topic_seq, index)

    def topic_gone(self, index):
        t = self.topics.get(index)
        if t is not None:
            for key in list(t.channels):
                self.channel_gone(key)
            del self.topics[index]
            self.size -= t.size + PAUSED_SIZE * t.paused

    def topic_paused(self, index, paused):
        t = self.topics.get(index)
        if t is not None and t.paused != paused:
            t.paused = paused
            self.size += PAUSED_SIZE if paused else -PAUSED_SIZE

    def channel(self, topic, ch, key, name):
        t = self.topics.get(topic)
        if t is None:
            return
        self.channel_gone(key)
        c = t.channels[key] = self.channels[key] = _Channel(
            name, ch, key, topic, HEAD.size + _FIELDS[CHANNEL].size + len(name.encode()))
        self.size += c.size
        self.channel_seq = max(self.channel_seq, key)

    def channel_gone(self, key):
        c = self.channels.pop(key, None)
        if c is not None:
            del self.topics[c.topic].channels[key]
            self.size -= c.size + PAUSED_SIZE * c.paused

    def channel_paused(self, key, paused):
        c = self.channels.get(key)
        if c is not None and c.paused != paused:
            c.paused = paused
            self.size += PAUSED_SIZE if paused else -PAUSED_SIZE

    def counters(self, topic_seq, channel_seq):
        # counters only go up: a replayed or compacted journal never hands out an index or key twice
        self.topic_seq = max(self.topic_seq, topic_seq)
        self.channel_seq = max(self.channel_seq, channel_seq)

    _APPLY = {TOPIC: topic, TOPIC_GONE: topic_gone, TOPIC_PAUSED: topic_paused, CHANNEL: channel,
              CHANNEL_GONE: channel_gone, CHANNEL_PAUSED: channel_paused, COUNTERS: counters}

    def replay(self, data):
        """Apply the records of a journal's bytes; returns where the valid part ends."""
        if data[:len(MAGIC)] != MAGIC:
            raise ValueError(f"not a topic directory journal (magic {bytes(data[:len(MAGIC)])!r})")
        pos, end = len(MAGIC), len(data)
        while pos + HEAD.size <= end:
            n, crc = HEAD.unpack_from(data, pos)
            start = pos + HEAD.size
            if not 0 < n <= MAX_PAYLOAD or start + n > end:
                break  # torn: the writer died before the record was complete
            payload = data[start:start + n]
            if zlib.crc32(payload) != crc:
                break
            kind = payload[0]
            fields = _FIELDS.get(kind)
            if fields is None:
                raise ValueError(f"topic directory journal: unknown record kind {kind} at offset {pos}")
            values = fields.unpack_from(payload)[1:]
            if kind in _NAMED:
                values += (bytes(payload[fields.size:]).decode(),)
            self._APPLY[kind](self, *values)
            pos = start + n
        return pos

    def records(self):
        """The snapshot: records that rebuild this directory, counters first."""
        yield _record(COUNTERS, self.topic_seq, self.channel_seq)
        for index, t in self.topics.items():
            yield _record(TOPIC, index, name=t.name.encode())
            if t.paused:
                yield _record(TOPIC_PAUSED, index, True)
            for key, c in t.channels.items():
                yield _record(CHANNEL, index, c.ch, key, name=c.name.encode())
                if c.paused:
                    yield _record(CHANNEL_PAUSED, key, True)

    def doc(self):
        return {"topics": [
            {"name": t.name, "index": index, "paused": t.paused,
             "channels": [{"name": c.name, "ch": c.ch, "key": key, "paused": c.paused}
                          for key, c in t.channels.items()]}
            for index, t in self.topics.items()],
            "topic_seq": self.topic_seq, "channel_seq": self.channel_seq}

    @classmethod
    def from_doc(cls, doc):
        live = cls()
        for td in doc.get("topics", ()):
            live.topic(td["index"], td["name"])
            live.topic_paused(td["index"], bool(td.get("paused")))
            for cd in td.get("channels", ()):
                live.channel(td["index"], cd["ch"], cd["key"], cd["name"])
                live.channel_paused(cd["key"], bool(cd.get("paused")))
        live.counters(doc.get("topic_seq", 0), doc.get("channel_seq", 0))
        return live


def replay(path):
    """The directory a journal holds, read without changing the file (its torn tail, if any, is left alone)."""
    with open(path, "rb") as f:
        data = f.read()
    live = _Live()
    live.replay(data)
    return live.doc()


class Directory:
    """One worker's directory. Change it with the incremental calls (one record each); ``read`` returns the whole
    directory, ``write`` replaces it (O(size), kept for callers that still build the whole document)."""

    def __init__(self, path):
        self.path = path
        self._fd = -1
        self._pid = 0
        self._live = _Live()
        self._size = 0               # bytes of the journal file
        self._compact_after = COMPACT_MIN
        self.compaction_error = None  # the last failed compaction's OSError (the journal stays valid without it)

    @classmethod
    def create(cls, path):
        """A new, empty journal at path (a previous instance's file is truncated, never read)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, MAGIC)
        finally:
            os.close(fd)
        return cls(path)

    # ---- taking the journal over -----------------------------------------------------------------------
    def _attach(self):
        """Open the journal in this process: replay it, cut a torn tail, append from there."""
        pid = os.getpid()
        if self._fd >= 0:
            if self._pid == pid:
                return
            os.close(self._fd)  # this process's copy of a descriptor inherited through fork
        fd = os.open(self.path, os.O_RDWR)
        try:
            with open(fd, "rb", closefd=False) as f:
                data = f.read()
            live = _Live()
            end = live.replay(data)
            if end < len(data):
                os.ftruncate(fd, end)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._pid, self._live, self._size = fd, pid, live, end
        self._compact_after = COMPACT_MIN

    def read(self):
        """The directory ({"topics": [{"name", "index", "paused", "channels": [{"name", "ch", "key",
        "paused"}]}], "topic_seq", "channel_seq"}). The first call in a process takes the journal over."""
        self._attach()
        return self._live.doc()

    def sync(self):
        """fsync the journal (a durable broker's directory must outlive a reboot, not only a crash)."""
        if self._fd >= 0 and self._pid == os.getpid():
            os.fsync(self._fd)

    @property
    def size(self):
        return self._size

    def close(self):
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = -1

    def destroy(self):
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    # ---- changes: one record each ----------------------------------------------------------------------
    def topic_created(self, name, index):
        self._attach()
        if index in self._live.topics:
            raise ValueError(f"topic index {index} is already in the directory")
        self._change(TOPIC, index, name=name)

    def topic_deleted(self, index):
        """The topic and all its channels are gone."""
        self._attach()
        if index in self._live.topics:
            self._change(TOPIC_GONE, index)

    def topic_paused(self, index, paused):
        self._attach()
        self._set_paused(TOPIC_PAUSED, self._live.topics.get(index), index, paused)

    def channel_created(self, topic_index, name, ch, key):
        self._attach()
        if topic_index not in self._live.topics:
            raise ValueError(f"no topic index {topic_index} in the directory")
        if key in self._live.channels:
            raise ValueError(f"channel key {key} is already in the directory")
        self._change(CHANNEL, topic_index, ch, key, name=name)

    def channel_deleted(self, key):
        self._attach()
        if key in self._live.channels:
            self._change(CHANNEL_GONE, key)

    def channel_paused(self, key, paused):
        self._attach()
        self._set_paused(CHANNEL_PAUSED, self._live.channels.get(key), key, paused)

    def counters(self, topic_seq, channel_seq):
        """Record sequence counters beyond what created topics and channels imply (they never go down)."""
        self._attach()
        if topic_seq > self._live.topic_seq or channel_seq > self._live.channel_seq:
            self._change(COUNTERS, topic_seq, channel_seq)

    def _set_paused(self, kind, entry, ident, paused):
        if entry is None:
            raise ValueError(f"no {'topic index' if kind == TOPIC_PAUSED else 'channel key'} {ident} in the directory")
        if entry.paused != bool(paused):
            self._change(kind, ident, bool(paused))

    def write(self, doc):
        """Replace the whole directory with doc (the shape ``read`` returns), atomically. O(size of doc): for
        callers that build the whole document; the incremental calls above are O(1)."""
        self._attach()
        self._rewrite(_Live.from_doc(doc))

    # ---- the file ----------------------------------------------------------------------------------------
    def _change(self, kind, *fields, name=None):
        """Append one record at the end of the valid journal, then apply it to the live directory (a record's
        fields, then its name, are the arguments of its ``_Live`` method). On failure (disk full) the journal is
        cut back to what it was, so nothing of the change is visible, and the error propagates."""
        if name is None:
            rec, args = _record(kind, *fields), fields
        else:
            rec, args = _record(kind, *fields, name=name.encode()), fields + (name,)
        try:
            if os.pwrite(self._fd, rec, self._size) != len(rec):
                raise OSError(errno.ENOSPC, f"short write to {self.path}")
        except OSError:
            os.ftruncate(self._fd, self._size)
            raise
        self._size += len(rec)
        _Live._APPLY[kind](self._live, *args)
        if self._size > self._compact_after and self._size > 2 * self._live.size:
            try:
                self._rewrite(self._live)
            except OSError as e:
                # the journal is still complete; retry only once it has doubled again, not on every change
                self.compaction_error = e
                self._compact_after = 2 * self._size

    def _rewrite(self, live):
        """Write live as a snapshot to a temporary file and rename it over the journal."""
        tmp = self.path + ".tmp"
        data = MAGIC + b"".join(live.records())
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        os.close(self._fd)
        self._fd, self._live, self._size = fd, live, len(data)
        self._compact_after = COMPACT_MIN
