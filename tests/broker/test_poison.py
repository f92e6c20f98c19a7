"""A message that crashes its owner worker twice is set aside (on disk, logged), and the worker's other messages
and topics keep flowing. The crash is real (SIGSEGV), made by nsqd's fault-injection option --crash-on-body."""
import os
import zlib

from nsqpy.protocol import client as C
from tests.broker.wire import Conn, consumer, producer, unique

POISON = b"POISON-"


def _drain(address, topic, want, timeout=120):
    """Consume on fresh connections (the owner dies under them) until every body in ``want`` has arrived;
    -> the set of bodies seen."""
    seen = set()
    while not want <= seen:
        c = consumer(address, topic, "ch", rdy=10)
        with c:
            try:
                while not want <= seen:
                    m = c.read_message(timeout=timeout)
                    seen.add(m.body)
                    c.send(C.fin(m.id))
            except AssertionError:
                pass  # the connection died with the worker: subscribe again
    return seen


def test_a_message_that_crashes_its_owner_twice_is_set_aside(nsqd_factory):
    n = nsqd_factory(f"--crash-on-body={POISON.decode()}")
    topic = unique()
    bad = POISON + b"x" * 100
    good = {b"a1", b"a2", b"a3"}
    with Conn(n.address) as p:
        p.publish(topic, b"a1", bad, b"a2", b"a3")
    seen = _drain(n.address, topic, good)
    assert bad not in seen
    n.wait_for_line(r"crashed this worker twice; set aside in ", timeout=60)
    qdir = os.path.join(n.data_path, "quarantine")
    files = os.listdir(qdir)
    assert len(files) == 1 and files[0].startswith(topic)
    with open(os.path.join(qdir, files[0]), "rb") as f:
        assert f.read() == bad
    # the worker serves on: a new message on the same topic and channel is delivered
    producer(n.address, topic, b"after")
    with consumer(n.address, topic, "ch", rdy=10) as c:
        while True:  # messages FINned on a connection that died with the worker come again first
            m = c.read_message(timeout=60)
            assert m.body != bad
            c.send(C.fin(m.id))
            if m.body == b"after":
                break
    assert "giving up" not in n.output()


def test_other_topics_of_the_worker_are_not_held_up(nsqd_factory):
    n = nsqd_factory(f"--crash-on-body={POISON.decode()}", workers=1)
    sick, healthy = unique(), unique()
    producer(n.address, sick, POISON + b"y", b"fine")
    producer(n.address, healthy, b"h1")
    assert _drain(n.address, sick, {b"fine"}) >= {b"fine"}
    with consumer(n.address, healthy, "ch", rdy=1) as c:
        assert c.read_message(timeout=60).body == b"h1"


def owned_by(worker, workers):
    """A fresh topic name whose owner is ``worker`` (workers/publishing/records.py: crc32 of the name)."""
    return next(t for t in (unique() for _ in range(1000)) if zlib.crc32(t.encode()) % workers == worker)


def test_a_forwarded_publish_that_crashes_its_owner_twice_is_set_aside(nsqd_factory):
    """One producer publishes to a topic of each worker, so one of its publishes is forwarded to the other worker
    (spread placement keeps it where the acceptor put it); the forwarded poison kills that owner as it appends,
    in a run, then again alone ("careful"), and is set aside, while the messages after it in the same ring and
    the worker's other topics flow on. The poison published to the producer's own worker is not forwarded: it
    arrives."""
    n = nsqd_factory(f"--crash-on-forwarded-body={POISON.decode()}", "--producer-placement=spread")
    topics = [owned_by(w, 2) for w in range(2)]
    with Conn(n.address) as p:
        for t in topics:
            p.publish(t, POISON + t.encode())
        for t in topics:
            p.publish(t, b"after-" + t.encode())
    m = n.wait_for_line(r"a forwarded publish of 1 messages to topic (\S+) crashed this worker twice; set aside "
                        r"in (\S+)$", timeout=120)
    sick, path = m.group(1), m.group(2)
    assert sick in topics and os.path.dirname(path) == os.path.join(n.data_path, "quarantine")
    with open(path, "rb") as f:
        assert POISON + sick.encode() in f.read()
    healthy = next(t for t in topics if t != sick)
    assert _drain(n.address, sick, {b"after-" + sick.encode()}) == {b"after-" + sick.encode()}
    assert _drain(n.address, healthy, {POISON + healthy.encode(), b"after-" + healthy.encode()}) == {
        POISON + healthy.encode(), b"after-" + healthy.encode()}
    assert "giving up" not in n.output()
