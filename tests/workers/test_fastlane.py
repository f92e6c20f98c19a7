"""The forward lane (workers/lane/fastlane.py) without a broker: a real pump, ring, wake-up flags and eventfds in local
memory (``LaneRig``), real sockets. What it forwards must be exactly the record the Python path writes, and
everything it does not do must come back to Python untouched: staged for the commit, or as epoll events."""
import os
import select
import socket
import time
import zlib

import numpy as np
import pytest

from nsqpy.protocol import client as C
from nsqpy.protocol.frames import OK_FRAME
from nsqpy.workers.lane.fastlane import BATCH, MISSES_BEFORE_SKIP, SKIP_AFTER_MISS, LaneRig
from nsqpy.workers.connections.handover import NAPS_FORWARDS, NAPS_WOKE
from nsqpy.workers.publishing.records import FORWARD, unpack_forward


class Peer:
    """Just enough of a Session for the pump."""
    moved_in, moved_in_took, stay_out = False, 0.0, False

    def __init__(self, sock):
        self.sock = sock
        self.fd = sock.fileno()
        self.wbuf = b""
        self.pub_counts = {}
        self.data = []
        self.written = []

    def on_data(self, data):
        self.data.append(data)

    def write(self, data):
        self.written.append(bytes(data))


def add_client(pump, socks):
    """A producer's connection in the pump (its sockets added to socks) -> (Peer, the client's socket)."""
    here, there = socket.socketpair()
    here.setblocking(False)
    socks.extend((here, there))
    peer = Peer(here)
    pump.add(peer, time.monotonic())
    pump.clean[peer.fd] = 1
    return peer, there


@pytest.fixture
def rig():
    rig = LaneRig()
    rig.pump.learn_topic("theirs", 1)
    rig.pump.learn_topic("ours", 0)
    socks = []
    rig.client = lambda: add_client(rig.pump, socks)
    yield rig
    rig.close()
    for s in socks:
        s.close()


def records(ring):
    """(type, payload) of every committed record not read yet."""
    offsets, lengths, types = ring.read_batch(16)
    return [(int(t), bytes(ring.data[o:o + n])) for o, n, t in zip(offsets, lengths, types)]


def forwarded(rig):
    """The FORWARD records in the ring, each as (topic, [bodies], timestamp ns, defer ms)."""
    got = []
    for rtype, payload in records(rig.ring):
        assert rtype == FORWARD
        arr = np.frombuffer(payload, np.uint8)
        topic, offs, lens, ts, defer = unpack_forward(arr, np.zeros(1, np.int64), np.zeros(1, np.int64))
        got.append((topic, [payload[o:o + n] for o, n in zip(offs.tolist(), lens.tolist())], ts, defer))
    return got


def recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        data += sock.recv(n - len(data))
    return data


def wait_readable(sock):
    select.select([sock], [], [], 10)


def test_a_lone_pub_to_another_owner_is_forwarded_and_answered(rig):
    peer, there = rig.client()
    there.sendall(C.pub("theirs", b"hello"))
    before = time.time_ns()
    assert rig.lane.poll(30.0) == []  # the forward, then the lane's slice ends (or the timeout)
    assert rig.lane.forwards == 1
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    [(topic, bodies, ts, defer)] = forwarded(rig)
    assert (topic, bodies, defer) == ("theirs", [b"hello"], 0)
    assert before <= ts <= time.time_ns()
    assert rig.pump.staged == 0
    rig.pump.settle(peer)
    assert peer.pub_counts == {"theirs": 1}


def test_several_producers_make_one_record_each_read(rig):
    a, a_sock = rig.client()
    b, b_sock = rig.client()
    a_sock.sendall(C.pub("theirs", b"one"))
    b_sock.sendall(C.mpub("theirs", [b"two"]))  # bench_writer --batch-size=1 sends MPUBs of one message
    for s in (a, b):
        wait_readable(s.sock)
    rig.lane.poll(30.0)
    got = forwarded(rig)
    assert sorted(body for _, bodies, _, _ in got for body in bodies) == [b"one", b"two"]
    assert rig.lane.forwards == len(got) <= 2
    for s in (a_sock, b_sock):
        assert recv_exactly(s, len(OK_FRAME)) == OK_FRAME


def test_a_batch_producers_mpub_is_forwarded_as_one_record_with_one_ok(rig):
    """An MPUB of BATCH messages or more (a batch producer's) goes through the lane: one record, its bodies in
    order, one OK for the command."""
    peer, there = rig.client()
    bodies = [b"m%d" % i for i in range(BATCH - 1)] + [b"x" * 300]
    there.sendall(C.mpub("theirs", bodies))
    assert rig.lane.poll(30.0) == []
    assert rig.lane.forwards == 1 and rig.pump.staged == 0
    [(topic, got, ts, defer)] = forwarded(rig)
    assert (topic, got, defer) == ("theirs", bodies, 0)
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    there.setblocking(False)  # the lane sent what it sends before poll returned (a socketpair delivers at once)
    with pytest.raises(BlockingIOError):
        there.recv(1)
    rig.pump.settle(peer)
    assert peer.pub_counts == {"theirs": BATCH}


def test_a_small_batch_is_left_to_python(rig):
    """A smaller MPUB is a paced producer's (what fell due): the idle step's commit publishes it, as before."""
    peer, there = rig.client()
    there.sendall(C.mpub("theirs", [b"m"] * (BATCH - 1)))
    assert rig.lane.poll(30.0) == []
    assert rig.pump.staged == BATCH - 1 and forwarded(rig) == []


def test_the_sleeping_owner_is_woken_once_and_counted(rig):
    peer, there = rig.client()
    rig.wakeups.prepare_sleep(1, lambda: False)
    there.sendall(C.pub("theirs", b"x"))
    rig.lane.poll(30.0)
    recv_exactly(there, len(OK_FRAME))
    assert os.eventfd_read(rig.eventfds[1]) == 1
    there.sendall(C.pub("theirs", b"y"))  # the owner is awake now (the flag was taken): no second write
    rig.lane.poll(30.0)
    recv_exactly(there, len(OK_FRAME))
    with pytest.raises(BlockingIOError):
        os.eventfd_read(rig.eventfds[1])
    assert rig.naps.naps[NAPS_FORWARDS, 1] == 2 and rig.naps.naps[NAPS_WOKE, 1] == 1


def test_a_pub_to_our_own_topic_is_left_staged_for_the_commit(rig):
    peer, there = rig.client()
    there.sendall(C.pub("ours", b"mine"))
    assert rig.lane.poll(30.0) == []
    assert rig.pump.staged == 1 and rig.lane.forwards == 0
    assert forwarded(rig) == []
    committed = []
    rig.pump.commit(lambda topic, buf, offs, lens: committed.append(
        (topic, bytes(buf[offs[0]:offs[0] + lens[0]]))) or True, None)
    assert committed == [("ours", b"mine")]
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    assert rig.lane.misses == 1 and rig.lane.skip == 0  # one miss: an owner's PUBs alternate with FINs


def test_a_session_closed_while_its_publish_is_committed_gets_no_ok(rig):
    """The worker delivers and flushes inside the publish (Forwarder.publish_staged); a flush can close a
    producer's session before the pump sends its OK."""
    peer, there = rig.client()
    there.sendall(C.pub("ours", b"mine"))
    assert rig.lane.poll(30.0) == [] and rig.pump.staged == 1
    rig.pump.commit(lambda topic, buf, offs, lens: rig.pump.remove(peer) or True, None)
    with pytest.raises(BlockingIOError):  # the commit sends in the call: nothing came of it by its return
        there.recv(64, socket.MSG_DONTWAIT)


def test_other_input_comes_back_as_epoll_events(rig):
    r, w = socket.socketpair()
    try:
        rig.ep.register(r.fileno(), select.EPOLLIN)
        w.send(b"!")
        for i in range(MISSES_BEFORE_SKIP):
            assert rig.lane.skip == 0
            assert rig.lane.poll(30.0) == [(r.fileno(), select.EPOLLIN)]
        assert rig.lane.forwards == 0
        assert rig.lane.skip == SKIP_AFTER_MISS  # it did nothing that often in a row: epoll's own poll for a while
        peer, there = rig.client()
        there.sendall(C.pub("theirs", b"x"))
        assert sorted(rig.lane.poll(30.0)) == sorted([(r.fileno(), select.EPOLLIN), (rig.pump.epfd, select.EPOLLIN)])
        assert rig.lane.forwards == 0 and rig.lane.skip == SKIP_AFTER_MISS - 1
    finally:
        r.close()
        w.close()


def test_parser_data_goes_to_the_session(rig):
    peer, there = rig.client()
    there.sendall(C.nop())
    assert rig.lane.poll(30.0) == []
    assert peer.data == [C.nop()] and rig.pump.staged == 0


def test_a_full_ring_leaves_the_publish_to_python(rig):
    peer, there = rig.client()
    big = b"z" * (rig.ring.max_payload - 100)
    assert rig.ring.write(big, 9) and rig.ring.write(big, 9)
    assert rig.ring.free() < 400
    there.sendall(C.pub("theirs", b"x" * 400))
    rig.lane.poll(30.0)
    assert rig.pump.staged == 1 and rig.lane.forwards == 0  # the commit parks it (or retries)
    assert [rtype for rtype, _ in records(rig.ring)] == [9, 9]
    there.setblocking(False)
    with pytest.raises(BlockingIOError):
        there.recv(16)  # no OK before the message is in


def test_a_topic_its_owner_marked_full_is_left_to_python(rig):
    peer, there = rig.client()
    rig.owner_full(zlib.crc32(b"theirs"))
    there.sendall(C.pub("theirs", b"x"))
    rig.lane.poll(30.0)
    assert rig.pump.staged == 1 and forwarded(rig) == []


def test_no_lane_while_a_publish_is_parked(rig):
    peer, there = rig.client()
    rig.parked = True
    there.sendall(C.pub("theirs", b"x"))
    assert rig.lane.poll(30.0) == [(rig.pump.epfd, select.EPOLLIN)]
    assert forwarded(rig) == [] and rig.pump.staged == 0


def test_an_ok_behind_queued_output_goes_through_the_session(rig):
    peer, there = rig.client()
    rig.pump.busy[peer.fd] = 1
    there.sendall(C.pub("theirs", b"x"))
    assert rig.lane.poll(30.0) == []
    assert [b for _, bodies, _, _ in forwarded(rig) for b in bodies] == [b"x"]
    assert peer.written == [OK_FRAME]


def test_a_timeout_returns_nothing(rig):
    assert rig.lane.poll(0.01) == []
    assert rig.lane.forwards == 0
