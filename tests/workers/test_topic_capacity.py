"""A real Topic (workers/domain/topic.py) at its capacity edges, without a broker: its host is
tests/workers/fakes.py ``FakeTopicHost`` (``hosts.TopicHost``), its log real (shared memory up to the memory budget,
files under a tmp data path beyond it).

What must hold: a topic whose memory and disk budgets are used up refuses the publish (``append`` -> False, which
the worker answers E_PUB_FAILED ... is full) and marks itself full for the other workers, having appended nothing
of it and counted nothing; what was accepted before is all still there; a publish other workers already
acknowledged may use the overdraft; once its channels drain, the next publish goes in and the mark is cleared. An
#ephemeral topic drops what it cannot hold, as NSQ does (counted nowhere, never marked full). Storage that fails
(a segment file that cannot be made) is StorageError with the cause, reported to the worker, and the topic is
marked full: never a silent drop."""
import time

import numpy as np
import pytest

from nsqpy.workers.domain.topic import SEGMENT_SIZE, StorageError, Topic
from tests.workers.fakes import FakeTopicHost

BODY = 1 << 20  # the largest message by default: budgets fill in a few dozen appends


def one(body=b"x" * BODY):
    src = np.frombuffer(body, np.uint8)
    return src, np.zeros(1, np.int64), np.array([len(body)], np.int64)


@pytest.fixture
def topics(tmp_path, shm_prefix):
    made = []

    def make(name="t", data_path=None, **opts):
        host = FakeTopicHost(data_path or tmp_path, shm_prefix, **opts)
        t = Topic(host, name, len(made) + 1)
        made.append(t)
        return host, t

    yield make
    for t in made:
        if not t.deleted:
            t.destroy()


def fill(t, limit=200):
    """Append one BODY at a time until the topic refuses one; -> how many it took (bounded: a topic that never
    fills fails)."""
    for n in range(limit):
        if not t.append(*one(), time.time_ns()):
            return n
    raise AssertionError("the topic never filled up")


def test_a_full_topic_refuses_the_publish_marks_itself_full_and_keeps_what_it_took(topics):
    host, t = topics(mem_queue_size=10, max_disk_bytes_per_topic=2 * SEGMENT_SIZE)
    ch = t.get_channel("c")  # no consumer: nothing drains
    took = fill(t)
    assert took > 0 and t.message_count == took and ch.message_count == took
    assert t.log.depth(ch.ch) == took  # every accepted message is still the channel's
    assert t.full and host.control.full[(0, t.crc)]  # the other workers refuse its publishes at once now
    assert host.low_water  # it tried reclaiming before refusing
    assert not t.append(*one(), time.time_ns())  # and refuses again, still counting nothing
    assert t.message_count == took and t.log.depth(ch.ch) == took


def test_a_publish_already_acknowledged_elsewhere_may_use_the_overdraft(topics):
    host, t = topics(mem_queue_size=10, max_disk_bytes_per_topic=2 * SEGMENT_SIZE)
    ch = t.get_channel("c")
    took = fill(t)
    assert t.append(*one(), time.time_ns(), acknowledged=True)
    assert t.message_count == took + 1 and t.log.depth(ch.ch) == took + 1 and t.full


def test_once_its_channels_drain_a_full_topic_takes_publishes_again_and_clears_its_mark(topics):
    host, t = topics(mem_queue_size=10, max_disk_bytes_per_topic=2 * SEGMENT_SIZE)
    ch = t.get_channel("c")
    took = fill(t)
    t.log.advance(ch.ch, t.log.head)  # its consumers got (and finished) everything
    assert t.append(*one(), time.time_ns())
    assert not t.full and not host.control.full[(0, t.crc)] and t.message_count == took + 1


def test_an_ephemeral_topic_drops_what_it_cannot_hold_as_nsq_does(topics):
    host, t = topics("t#ephemeral", mem_queue_size=10)
    ch = t.get_channel("c#ephemeral")
    for _ in range(64):
        assert t.append(*one(), time.time_ns())  # a drop is reported as taken (nsqd answers OK)
    n = t.message_count
    assert 0 < n < 64 and n * BODY <= 3 * SEGMENT_SIZE  # only what its memory holds was kept, and counted
    assert t.log.depth(ch.ch) == n and not t.full and not host.control.full.get((0, t.crc))


def test_storage_that_fails_is_a_clear_error_reported_and_marks_the_topic_full(topics, tmp_path):
    # memory takes one segment's worth (mem_queue_size 1: later segments spill), the disk tier's directory is gone
    gone = tmp_path / "gone"
    gone.mkdir()
    host, t = topics(data_path=gone, mem_queue_size=1)
    t.get_channel("c")
    gone.rmdir()
    with pytest.raises(StorageError, match="topic t: "):
        for _ in range(200):
            t.append(*one(), time.time_ns())
    assert t.full and host.control.full[(0, t.crc)] and host.failures
    what, exc = host.failures[-1]
    assert what == "TOPIC(t): cannot store messages" and "No such file or directory" in str(exc)
