"""The topic directory journal (workers/storage/topic_journal.py) on its own: scale, torn records, compaction, deletes.

What must hold: a change costs O(1) (100,000 topics are recorded in seconds, not the O(n^2) of rewriting the
whole directory), a restarted reader sees exactly the changes whose records are complete, a writer that takes a
journal over cuts a torn tail before appending, compaction keeps the directory while shrinking the file, and a
new instance never reads a previous one's journal."""
import os
import signal
import time

import pytest

from nsqpy.workers.storage import topic_journal as meta
from nsqpy.workers.storage.topic_journal import Directory, journal_path, remove_journals, replay

N_TOPICS = 100_000
N_CHANNELS = 1_000


def topic_name(i):
    return f"orders.region-{i % 97:02d}.stream-{i:06d}"  # 32 characters, realistic NSQ names


def test_100k_topics_and_1000_channels_in_seconds(tmp_path):
    path = str(tmp_path / "j")
    d = Directory.create(path)
    t0 = time.perf_counter()
    for i in range(1, N_TOPICS + 1):
        d.topic_created(topic_name(i), i)
    topics_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for k in range(1, N_CHANNELS + 1):
        d.channel_created(k, f"ch{k}", k % 64, k)
    channels_s = time.perf_counter() - t0
    print(f"recorded {N_TOPICS} topics in {topics_s:.3f} s, {N_CHANNELS} channels in {channels_s:.4f} s")
    assert topics_s < 5.0 and channels_s < 0.5
    d.close()

    t0 = time.perf_counter()
    doc = Directory(path).read()
    print(f"replayed in {time.perf_counter() - t0:.3f} s ({os.path.getsize(path)} bytes)")
    assert len(doc["topics"]) == N_TOPICS
    assert doc["topic_seq"] == N_TOPICS and doc["channel_seq"] == N_CHANNELS
    first, last = doc["topics"][0], doc["topics"][-1]
    assert first == {"name": topic_name(1), "index": 1, "paused": False,
                     "channels": [{"name": "ch1", "ch": 1, "key": 1, "paused": False}]}
    assert last == {"name": topic_name(N_TOPICS), "index": N_TOPICS, "paused": False, "channels": []}
    assert sum(len(t["channels"]) for t in doc["topics"]) == N_CHANNELS


def test_a_torn_last_record_is_ignored_and_cut_before_the_next_append(tmp_path):
    path = str(tmp_path / "j")
    d = Directory.create(path)
    d.topic_created("a", 1)
    d.channel_created(1, "c", 0, 1)
    d.close()
    whole = os.path.getsize(path)
    torn = meta._record(meta.TOPIC, 2, name=b"b")
    for cut in (3, len(torn) - 1):  # a torn length word, then a record missing its last byte
        with open(path, "ab") as f:
            f.write(torn[:cut])
        assert [t["name"] for t in replay(path)["topics"]] == ["a"]
        os.truncate(path, whole)
    with open(path, "ab") as f:  # complete, but its checksum does not match: also torn
        f.write(torn[:-1] + bytes([torn[-1] ^ 0xFF]))
    assert replay(path)["topic_seq"] == 1
    assert os.path.getsize(path) > whole  # replay reads without cutting

    d = Directory(path)  # the replacement writer
    assert [t["name"] for t in d.read()["topics"]] == ["a"]
    assert os.path.getsize(path) == whole
    d.topic_created("b", 2)
    doc = replay(path)
    assert [(t["name"], t["index"]) for t in doc["topics"]] == [("a", 1), ("b", 2)]
    assert doc["topics"][0]["channels"] == [{"name": "c", "ch": 0, "key": 1, "paused": False}]


def test_a_killed_writer_leaves_exactly_its_completed_changes(tmp_path):
    """A real process, SIGKILLed while it records topics and channels as fast as it can: what a reader finds is
    a prefix of its changes, each topic whole (the last one may lack its channel: that is a later change)."""
    path = str(tmp_path / "j")
    Directory.create(path)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            d = Directory(path)
            for i in range(1, 10**9):
                d.topic_created(topic_name(i), i)
                d.channel_created(i, "c", i, i)
                d.topic_paused(i, True)
                if i == 2000:
                    os.write(w, b"x")  # well under way: compactions have not happened (no deletes), writes have
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"x"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(r)
    doc = Directory(path).read()
    topics = doc["topics"]
    assert len(topics) >= 2000
    assert [t["index"] for t in topics] == list(range(1, len(topics) + 1))
    for t in topics[:-1]:
        assert t["paused"] and t["channels"] == [{"name": "c", "ch": t["index"], "key": t["index"],
                                                   "paused": False}]


def test_compaction_shrinks_the_journal_and_keeps_the_directory(tmp_path):
    path = str(tmp_path / "j")
    d = Directory.create(path)
    for i in range(1, 5001):
        d.topic_created(topic_name(i), i)
        d.channel_created(i, "c", 0, i)
    d.topic_paused(7, True)
    d.channel_paused(8, True)
    peak = os.path.getsize(path)
    for i in range(5000, 100, -1):  # delete from the top: the counters must not fall back with the indexes
        d.topic_deleted(i)
    size = os.path.getsize(path)
    assert size < peak / 2
    assert size <= max(2 * d._live.size, meta.COMPACT_MIN) + 64
    assert not os.path.exists(path + ".tmp")

    for doc in (d.read(), replay(path), Directory(path).read()):
        assert [t["index"] for t in doc["topics"]] == list(range(1, 101))
        assert doc["topic_seq"] == 5000 and doc["channel_seq"] == 5000
        assert doc["topics"][6]["paused"] and not doc["topics"][5]["paused"]
        assert doc["topics"][7]["channels"][0]["paused"]

    # a snapshot holds exactly what the live directory says it takes
    d._rewrite(d._live)
    assert os.path.getsize(path) == d._live.size


def test_deletes_pauses_and_counters(tmp_path):
    path = str(tmp_path / "j")
    d = Directory.create(path)
    d.topic_created("t1", 1)
    d.topic_created("t2", 2)
    for key, (topic, name) in enumerate([(1, "a"), (1, "b"), (2, "a")], 1):
        d.channel_created(topic, name, key - 1, key)
    d.channel_deleted(1)
    d.channel_deleted(1)           # idempotent: no record
    d.topic_paused(2, True)
    d.channel_paused(3, True)
    d.channel_paused(3, False)
    d.topic_deleted(1)             # its remaining channel goes with it
    d.counters(9, 2)
    with pytest.raises(ValueError):
        d.channel_created(1, "gone", 0, 4)
    with pytest.raises(ValueError):
        d.topic_created("again", 2)
    expected = {"topics": [{"name": "t2", "index": 2, "paused": True,
                            "channels": [{"name": "a", "ch": 2, "key": 3, "paused": False}]}],
                "topic_seq": 9, "channel_seq": 3}
    assert d.read() == expected
    assert Directory(path).read() == expected


def test_write_replaces_the_whole_directory(tmp_path):
    """The compatibility path: a whole document, written atomically; incremental changes continue on top."""
    path = str(tmp_path / "j")
    d = Directory.create(path)
    d.topic_created("old", 1)
    doc = {"topics": [{"name": "x", "index": 3, "paused": True,
                       "channels": [{"name": "c", "ch": 1, "key": 5, "paused": True}]}],
           "topic_seq": 4, "channel_seq": 6}
    d.write(doc)
    assert replay(path) == doc
    d.channel_created(3, "d", 2, 7)
    assert Directory(path).read()["topics"][0]["channels"][1] == {"name": "d", "ch": 2, "key": 7, "paused": False}


def test_a_new_instance_starts_empty_and_shutdown_removes_every_journal(tmp_path):
    prefix = "/nsqpy-0123456789-"
    paths = [journal_path(str(tmp_path), prefix, w) for w in range(3)]
    for p in paths:
        Directory.create(p).topic_created("t", 1)
    open(paths[0] + ".tmp", "wb").close()          # a compaction that died before its rename
    other = tmp_path / "nsqpy-9876543210-meta-0.journal"  # another instance's
    other.write_bytes(b"")
    assert Directory.create(paths[0]).read() == {"topics": [], "topic_seq": 0, "channel_seq": 0}
    remove_journals(str(tmp_path), prefix)
    assert sorted(os.listdir(tmp_path)) == [other.name]
