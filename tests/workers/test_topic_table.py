"""The worker's TopicTable without a broker, with fakes of what it uses (tests/workers/worker_fakes.py): topics made
once and journaled, capacity edges as clear errors (a topic that cannot be created, a topic whose channel slots
are all taken, a channel at its consumer limit), deleting a topic with consumers, #ephemeral channels and topics
going away with their last consumer, control commands, and the re-attachment of a crashed predecessor's topics."""
import pytest

from nsqpy.protocol.errors import SubFailed, TooManyChannelConsumers
from nsqpy.protocol.frames import OK_FRAME
from nsqpy.workers.control import commands as CMD
from nsqpy.workers.domain.session import MIGRATED
from nsqpy.workers.domain.topic import StorageError
from nsqpy.workers.domain.topics import TopicTable
from tests.workers.worker_fakes import (FailureReports, FakeLog, RecordingJournal, RecordingStats, Subscriber,
                                        TableChannel, TableHost, TopicMaker, topic_owned_by)

OURS, THEIRS = topic_owned_by(0), topic_owned_by(1)


class Rig:
    def __init__(self, max_channel_consumers=0, slots=4, doc=None):
        self.host = TableHost()
        self.journal = RecordingJournal(doc)
        self.stats = RecordingStats()
        self.catch_ups = 0
        self.failures = FailureReports()
        self.log = FakeLog()
        self.maker = TopicMaker(slots)
        opts = type("Opts", (), {"max_channel_consumers": max_channel_consumers})
        self.table = TopicTable(self.host, 0, 2, opts, self.journal, self.stats, self._catch_up, self.failures,
                                self.log, topic_class=self.maker, channel_class=TableChannel)
        self.host.table = self.table

    def _catch_up(self):
        self.catch_ups += 1


@pytest.fixture
def rig():
    return Rig()


def op(name):
    return CMD.OP_CODES[name]


# ---- topics ---------------------------------------------------------------------------------------------------
def test_a_topic_is_made_once_journaled_and_announced(rig):
    t = rig.table.get_topic(OURS)
    assert rig.table.get_topic(OURS) is t and len(rig.maker.made) == 1
    assert rig.table.topics == {OURS: t} and rig.table.topics_by_index == {t.index: t}
    assert rig.journal.changes == [("topic_created", OURS, t.index)] and rig.stats.structure == [OURS]


def test_a_topic_that_cannot_be_created_is_a_clear_error_and_leaves_nothing(rig):
    rig.maker.refuse = OSError(24, "Too many open files")
    with pytest.raises(StorageError, match=f"topic {OURS} cannot be created: .*Too many open files"):
        rig.table.get_topic(OURS)
    assert rig.table.topics == {} and rig.journal.changes == []
    assert rig.failures.reports and "cannot be created" in rig.failures.reports[0][0]
    rig.maker.refuse = None  # the next publish tries again
    assert rig.table.get_topic(OURS).name == OURS


def test_a_topic_the_journal_cannot_record_is_undone(rig):
    rig.journal.fail = True
    with pytest.raises(StorageError, match="cannot be recorded"):
        rig.table.get_topic(OURS)
    assert rig.table.topics == {} and rig.maker.made[0].deleted  # destroyed: a replacement could not find it


def test_subscribing_to_a_topic_owned_elsewhere_hands_the_connection_over(rig):
    s = Subscriber()
    assert rig.table.subscribe(s, THEIRS, "c") is MIGRATED
    assert rig.table.topics == {} and s.written == []


def test_a_subscriber_joins_its_channel_and_gets_ok(rig):
    s = Subscriber()
    assert rig.table.subscribe(s, OURS, "c") is None
    ch = rig.table.topics[OURS].channels["c"]
    assert s.channel is ch and ch.consumers == [s] and s.written == [OK_FRAME]
    assert rig.table.channels_by_key == {ch.key: ch} and rig.table.channel_seq == ch.key


def test_a_topic_whose_channel_slots_are_all_taken_refuses_the_next_channel_clearly():
    rig = Rig(slots=2)
    for c in ("a", "b"):
        rig.table.subscribe(Subscriber(), OURS, c)
    s = Subscriber()
    with pytest.raises(SubFailed, match=f"SUB failed channel {OURS}:c3 cannot be created: all 2 channel slots"):
        rig.table.subscribe(s, OURS, "c3")
    assert s.written == [] and sorted(rig.table.topics[OURS].channels) == ["a", "b"]
    assert rig.table.control_command(op("channel_create"), OURS, "c4") == CMD.FAILED
    rig.table.subscribe(Subscriber(), OURS, "a")  # an existing channel still takes consumers


def test_a_channel_at_its_consumer_limit_refuses_the_next_consumer():
    rig = Rig(max_channel_consumers=2)
    for _ in range(2):
        rig.table.subscribe(Subscriber(), OURS, "c")
    with pytest.raises(TooManyChannelConsumers, match=f"{OURS}:c exceeds limit of 2"):
        rig.table.subscribe(Subscriber(), OURS, "c")


def test_deleting_a_topic_with_consumers_catches_up_closes_them_and_journals_it(rig):
    consumers = [Subscriber() for _ in range(3)]
    for i, s in enumerate(consumers):
        rig.table.subscribe(s, OURS, f"c{i % 2}")
    t = rig.table.topics[OURS]
    rig.table.delete_topic(OURS)
    assert rig.catch_ups == 1  # publishes other workers answered OK first go with the topic
    assert all(s.closed and s.channel is None for s in consumers)
    assert t.deleted and rig.table.topics == {} and rig.table.topics_by_index == {} and rig.table.channels_by_key == {}
    assert ("topic_deleted", t.index) in rig.journal.changes and rig.stats.structure.count(OURS) == 2
    again = rig.table.get_topic(OURS)  # a publish after the delete makes a new topic
    assert again is not t and again.index > t.index


def test_deleting_an_unknown_topic_does_nothing(rig):
    rig.table.delete_topic(OURS)
    assert rig.catch_ups == 0 and rig.journal.changes == []


def test_an_ephemeral_channel_and_topic_go_away_with_their_last_consumer(rig):
    topic = topic_owned_by(0, stem="e") + "#ephemeral"
    a, b = Subscriber(), Subscriber()
    rig.table.subscribe(a, topic, "c#ephemeral")
    rig.table.subscribe(b, topic, "c#ephemeral")
    ch = rig.table.topics[topic].channels["c#ephemeral"]
    ch.remove_consumer(a)
    assert topic in rig.table.topics
    ch.remove_consumer(b)
    assert topic not in rig.table.topics and rig.table.channels_by_key == {}


def test_an_ephemeral_channel_of_a_durable_topic_leaves_the_topic(rig):
    s = Subscriber()
    rig.table.subscribe(s, OURS, "c#ephemeral")
    rig.table.topics[OURS].channels["c#ephemeral"].remove_consumer(s)
    assert rig.table.topics[OURS].channels == {}


# ---- control commands -----------------------------------------------------------------------------------------
def test_control_commands(rig):
    assert rig.table.control_command(op("topic_create"), THEIRS) == CMD.NOT_OWNER
    assert rig.table.control_command(op("topic_delete"), OURS) == CMD.TOPIC_NOT_FOUND
    assert rig.table.control_command(op("channel_create"), OURS) == CMD.INVALID  # no channel named
    assert rig.table.control_command(op("channel_create"), OURS, "c") == CMD.OK
    assert rig.table.control_command(op("channel_delete"), OURS, "nope") == CMD.CHANNEL_NOT_FOUND
    assert rig.table.control_command(op("channel_delete"), OURS, "c") == CMD.OK
    assert rig.table.control_command(op("topic_delete"), OURS) == CMD.OK and rig.table.topics == {}
    rig.maker.refuse = OSError(12, "Cannot allocate memory")
    assert rig.table.control_command(op("topic_create"), OURS) == CMD.FAILED


# ---- a replacement worker -----------------------------------------------------------------------------------
def test_recovery_reattaches_the_journaled_topics_and_closes_unrecorded_channel_slots():
    doc = {"topic_seq": 7, "channel_seq": 9, "topics": [
        {"name": OURS, "index": 3, "paused": True, "channels": [
            {"name": "c", "ch": 0, "key": 5, "paused": False},
            {"name": "d", "ch": 1, "key": 9, "paused": True}]},
        {"name": "gone", "index": 4, "paused": False, "channels": []}]}
    rig = Rig(doc=doc)
    rig.maker.open_slots = {OURS: (0, 1, 2)}  # slot 2: opened by the dead process, never recorded
    made = rig.maker

    def refuse_gone(host, name, index, restarted=False):
        if name == "gone":
            raise FileNotFoundError("its log was removed")
        return made(host, name, index, restarted)

    rig.table.topic_class = refuse_gone
    rig.table.recover(doc)
    t = rig.table.topics[OURS]
    assert list(rig.table.topics) == [OURS] and t.restarted and t.paused and t.index == 3
    assert sorted(rig.table.channels_by_key) == [5, 9] and rig.table.channels_by_key[9].paused
    assert t.log.open_channels() == [0, 1]
    assert t.log.closed == [(2, True)]  # its cursor goes back to the backlog (a first channel took it)
    assert (rig.table.topic_seq, rig.table.channel_seq) == (7, 9) and rig.table.next_channel_key() == 10
    assert any("TOPIC(gone) cannot be recovered" in msg for _, msg in rig.log.lines)
