"""The owner's lone PUBs in the lane (workers/lane/ownpath.py) without a broker: the lane's rig (a real pump, epoll and
sockets), a real message log in shared memory and a real in-flight table; the worker, topic, channels and
consumers are small fakes with just what ``OwnPath`` reads. Each message must be appended once, reach its
consumer before its OK reaches the producer, and everything the kernel does not take must come back to Python
untouched (staged for the commit, nothing written)."""
import collections
import os
import select
import socket
import struct
import time
from types import SimpleNamespace

import numpy as np
import pytest

import nsqpy.workers.domain.channel
import nsqpy.workers.domain.session
import nsqpy.workers.domain.topic
from nsqpy.ipc import msglog_kernels as MK
from nsqpy.workers.domain.policy import Policy
from nsqpy.ipc.inflight import C_N_LIVE, InFlightTable, inflight_nbytes
from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_MESSAGE, OK_FRAME
from nsqpy.protocol.ids import IdGenerator
from nsqpy.protocol.states import STATE_SUBSCRIBED
from nsqpy.workers.lane.fastlane import LaneRig, serve
from nsqpy.workers.lane.ownpath import MAX_N, OwnPath
from nsqpy.workers.storage.poison import Suspect
from nsqpy.workers.lane.warmup import _throwaway_log
from nsqpy.ipc.ring import C_HEAD, C_READ, C_STALLED, P_TAIL
from nsqpy.workers.publishing.records import COMMAND, FORWARD, forward_size, pack_forward, set_want_room

from test_fastlane import add_client, recv_exactly, records


class Worker:
    def __init__(self, pump):
        self.pump = pump
        self.topics = {}
        self.inflight = InFlightTable.create(bytearray(inflight_nbytes(64)), 0, 64)
        self.round_buffer = np.empty(1 << 16, np.uint8)
        self.suspect = Suspect(np.zeros(16, np.int64), 0)
        self.pending = set()
        self.stats = SimpleNamespace(changed=set())
        self.storage_failing = False
        self.pub_pending = SimpleNamespace(any=lambda: False)
        self.frames = []    # (session, bytes the socket did not take)
        self.changed = []
        self.left = []      # slots whose timers FINs ended

    @staticmethod
    def direct_fd(s):
        return -1 if s.wbuf or s.closed else s.fd

    def send_frames(self, s, out, end, sent=0):
        if sent < end:
            self.frames.append((s, bytes(out[sent:end])))

    def channel_changed(self, ch):
        self.changed.append(ch)

    def timer_leave_one(self, slot):
        self.left.append(slot)


class Topic:
    count_appended = nsqpy.workers.domain.topic.Topic.count_appended  # the real bookkeeping, on the fake's fields

    def __init__(self, name, log, worker):
        self.name, self.log, self.worker = name, log, worker
        self.deleted = self.durable = self.full = self.paused = False
        self.limited = None
        self.channels = {}
        self.ids = IdGenerator(7)
        self.index = 3
        self.message_count = self.message_bytes = 0


class Channel:
    delivering = nsqpy.workers.domain.channel.Channel.delivering  # the real checks, on the fake's fields
    has_messages = nsqpy.workers.domain.channel.Channel.has_messages
    finished_one = nsqpy.workers.domain.channel.Channel.finished_one
    turn = nsqpy.workers.domain.channel.Channel.turn
    served = nsqpy.workers.domain.channel.Channel.served

    def __init__(self, topic, name, key):
        self.topic, self.name, self.key, self.worker = topic, name, key, topic.worker
        self.ch = topic.log.open_channel()
        topic.log.advance(self.ch, topic.log.head)  # what the fixture appended is behind it
        self.consumers = []
        self.paused = self.deleted = False
        self.requeued, self.due = collections.deque(), collections.deque()
        self._rr = self.message_count = 0
        self.started = []
        self.e2e = None
        self.policy = Policy.OFF
        topic.channels[name] = self

    def wants_delivery(self):
        self.topic.worker.pending.add(self)

    def _started(self, s, slots, deadline):
        self.started.append((s, slots.tolist(), deadline))
        s.in_flight += len(slots)


class Consumer:
    fin_fast_path = nsqpy.workers.domain.session.Session.fin_fast_path  # the real rule, on the fake's fields

    def __init__(self, conn_id, rdy):
        self.sock, self.peer = socket.socketpair()
        self.sock.setblocking(False)
        self.fd = self.sock.fileno()
        self.conn_id, self.rdy, self.in_flight = conn_id, rdy, 0
        self.settings = SimpleNamespace(msg_timeout_ms=60_000, sample_rate=0)
        self.wbuf = b""
        self.closed = False
        # what the lane asks of a session whose FINs it takes, and what the pump reads (its socket may be in it)
        self.state, self.parser = STATE_SUBSCRIBED, SimpleNamespace(idle=True, state=STATE_SUBSCRIBED)
        self.held = self.closing_after_flush = self._tls_missing = False
        self.finish_count = 0
        self.pub_counts, self.moved_in, self.stay_out, self.data = {}, False, False, []

    def on_data(self, data):
        self.data.append(data)

    def ready_for_more(self):
        return self.in_flight < self.rdy

    def message(self):
        """(attempts, id, body) of the next MSG frame."""
        size, kind = struct.unpack(">ii", recv_exactly(self.peer, 8))
        assert kind == FRAME_MESSAGE
        rest = recv_exactly(self.peer, size - 4)
        return struct.unpack(">H", rest[8:10])[0], int(rest[10:26], 16), rest[26:]

    def close(self):
        self.sock.close()
        self.peer.close()


@pytest.fixture
def own():
    rig = LaneRig()
    worker = Worker(rig.pump)
    rig.lane.own = OwnPath(worker)
    rig.pump.learn_topic("ours", 0)
    socks = []
    with _throwaway_log(f"nsqpy-test-own-{time.monotonic_ns()}") as (log, _, _):
        log.append(b"first", time.time_ns(), 1)  # the log's first segment (the kernel never allocates one)
        topic = Topic("ours", log, worker)
        worker.topics["ours"] = topic
        rig.lane.own.hint(topic)

        def producer():
            return add_client(rig.pump, socks)[1]

        def consumer(channel, conn_id, rdy, reads=False):
            """A consumer of channel; with reads, its socket is in the pump (its FINs reach the lane)."""
            c = Consumer(conn_id, rdy)
            socks.append(c)
            channel.consumers.append(c)
            if reads:
                rig.pump.add(c, time.monotonic())
            return c

        yield SimpleNamespace(rig=rig, worker=worker, topic=topic, log=log, lane=rig.lane, path=rig.lane.own,
                              producer=producer, consumer=consumer)
    rig.close()
    for s in socks:
        s.close()


def test_an_armed_pub_is_appended_delivered_and_answered_in_the_lane(own):
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=10)
    there = own.producer()
    before = time.time_ns()
    there.sendall(C.pub("ours", b"mine"))
    assert own.lane.poll(30.0) == []
    assert own.path.published == 1 and own.rig.pump.staged == 0
    attempts, msg_id, body = c.message()
    assert (attempts, body) == (1, b"mine")
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    assert own.log.depth(ch.ch) == 0 and own.worker.inflight.ctl[C_N_LIVE] == 1
    [(s, slots, deadline)] = ch.started
    assert s is c and len(slots) == 1 and deadline >= before + 60_000 * 1_000_000
    assert c.in_flight == 1 and ch._rr == 1
    assert (own.topic.message_count, own.topic.message_bytes) == (1, 4) and "ours" in own.worker.stats.changed
    assert own.worker.changed == [ch] and not own.worker.pending and not own.worker.frames
    assert own.topic.ids.next_id(time.time_ns()) > msg_id  # the kernel's IDs went back to the topic's generator
    assert len(serve.signatures) == 1  # the armed arrays have the stand-ins' types: nothing compiled again


def test_an_armed_small_mpub_is_appended_delivered_and_answered_once(own):
    """A producer that sends whatever fell due (the latency tool, a paced app) often sends MPUBs of 2 or 3."""
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=10)
    there = own.producer()
    there.sendall(C.mpub("ours", [b"one", b"two", b"three"]))
    assert own.lane.poll(30.0) == []
    assert own.path.published == 3 and own.rig.pump.staged == 0
    assert [c.message()[2] for _ in range(3)] == [b"one", b"two", b"three"]
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    there.setblocking(False)
    with pytest.raises(BlockingIOError):
        there.recv(1)  # one OK for the command, not one per message
    assert own.log.depth(ch.ch) == 0 and own.worker.inflight.ctl[C_N_LIVE] == 3 and c.in_flight == 3
    assert (own.topic.message_count, own.topic.message_bytes) == (3, 11)
    assert not own.worker.pending


def test_an_mpub_bigger_than_a_consumers_room_leaves_the_rest_to_a_delivery_pass(own):
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=2)
    there = own.producer()
    there.sendall(C.mpub("ours", [b"one", b"two", b"three"]))
    assert own.lane.poll(30.0) == [] and own.path.published == 3
    assert [c.message()[2] for _ in range(2)] == [b"one", b"two"]
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    assert own.log.depth(ch.ch) == 1 and c.in_flight == 2 and own.worker.pending == {ch}


def test_an_mpub_of_more_than_the_kernel_takes_is_left_to_python(own):
    ch = Channel(own.topic, "ch", key=5)
    own.consumer(ch, conn_id=9, rdy=100)
    there = own.producer()
    there.sendall(C.mpub("ours", [b"m%d" % i for i in range(MAX_N + 1)]))
    assert own.lane.poll(30.0) == []
    assert own.path.published == 0 and own.rig.pump.staged == MAX_N + 1 and own.log.depth(ch.ch) == 0


def test_a_channel_with_messages_waiting_is_not_armed(own):
    ch = Channel(own.topic, "ch", key=5)
    own.consumer(ch, conn_id=9, rdy=10)
    own.log.append(b"older", time.time_ns(), 1)
    there = own.producer()
    there.sendall(C.pub("ours", b"mine"))
    assert own.lane.poll(30.0) == []
    assert own.path.published == 0 and own.rig.pump.staged == 1  # the Python path publishes it, after "older"
    assert own.log.depth(ch.ch) == 1


def test_only_consumers_with_room_get_rows_the_other_channels_get_a_delivery_pass(own):
    ready, full = Channel(own.topic, "ready", key=5), Channel(own.topic, "full", key=6)
    c = own.consumer(ready, conn_id=9, rdy=1)
    own.consumer(full, conn_id=10, rdy=0)
    Channel(own.topic, "nobody", key=7)
    there = own.producer()
    there.sendall(C.pub("ours", b"mine"))
    assert own.lane.poll(30.0) == [] and own.path.published == 1
    assert c.message()[2] == b"mine"
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    assert own.worker.pending == {full}  # as after Topic.append: channels with consumers; "nobody" has none
    assert own.log.depth(full.ch) == 1 and own.log.depth(ready.ch) == 0


def test_frames_the_socket_does_not_take_go_to_python_and_hold_back_that_socket(own):
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=10)
    try:
        while True:
            c.sock.send(b"x" * 65536)  # fill the consumer's socket: the kernel's send takes nothing
    except BlockingIOError:
        pass
    there = own.producer()
    there.sendall(C.pub("ours", b"mine"))
    assert own.lane.poll(30.0) == [] and own.path.published == 1
    [(s, frame)] = own.worker.frames
    assert s is c and frame.endswith(b"mine") and own.rig.pump.busy[c.fd] == 1
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME  # another socket: its OK is not held back
    assert ch.started and own.worker.inflight.ctl[C_N_LIVE] == 1


def test_a_log_that_needs_a_new_segment_is_left_to_python_with_nothing_written(own):
    ch = Channel(own.topic, "ch", key=5)
    own.consumer(ch, conn_id=9, rdy=10)
    log, body = own.log, np.zeros(60_000, np.uint8)
    one, zero = np.ones(1, np.int64), np.zeros(1, np.int64)
    win = log.window
    while MK.append_batch(log.ctrl, win.data, win.data64, body, zero, np.array([body.size], np.int64), zero, one,
                          zero, 0, 1, np.empty(0, np.int64)) >= 0:
        pass
    log.advance(ch.ch, log.head)
    tick = own.topic.ids.last_tick
    there = own.producer()
    there.sendall(C.pub("ours", b"x" * 50_000))
    assert own.lane.poll(30.0) == []
    assert own.path.published == 0 and own.rig.pump.staged == 1  # the commit will allocate the segment
    assert log.depth(ch.ch) == 0 and own.topic.ids.last_tick == tick


@pytest.mark.parametrize("why", ["durable", "full", "deleted", "storage failing", "output queued", "sampling",
                                 "requeued", "careful rounds", "forwards waiting", "no compiled rounds"])
def test_what_the_python_path_must_see_is_never_armed(own, why):
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=10)
    w, t = own.worker, own.topic
    if why in ("durable", "full", "deleted"):
        setattr(t, why, True)
    elif why == "storage failing":
        w.storage_failing = True
    elif why == "output queued":
        c.wbuf = b"queued"
    elif why == "sampling":
        c.settings.sample_rate = 50
    elif why == "requeued":
        ch.requeued.append(1)
    elif why == "careful rounds":
        w.suspect.set_careful(ch.key, 3)
    elif why == "forwards waiting":  # ... that the lane may not take (ownpath.own_drain)
        w.pub_pending = SimpleNamespace(any=lambda: True)
        own.rig.drain_ok = False
    else:
        w.round_buffer = None
    there = own.producer()
    there.sendall(C.pub("ours", b"mine"))
    assert own.lane.poll(30.0) == []
    assert own.path.published == 0 and own.rig.pump.staged == 1 and own.log.depth(ch.ch) == 0


def test_a_paused_topic_appends_and_answers_without_delivering(own):
    ch = Channel(own.topic, "ch", key=5)
    own.consumer(ch, conn_id=9, rdy=10)
    own.topic.paused = True
    there = own.producer()
    there.sendall(C.pub("ours", b"mine"))
    assert own.lane.poll(30.0) == [] and own.path.published == 1
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    assert own.log.depth(ch.ch) == 1 and not ch.started and own.worker.pending == {ch}


def test_data_for_python_in_the_same_read_still_reaches_its_session(own):
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=10)
    other, other_there = add_client(own.rig.pump, [])
    there = own.producer()
    other_there.sendall(b"NOP\n")  # a consumer's command, read in the same pass as the PUB
    there.sendall(C.pub("ours", b"mine"))
    try:
        assert own.lane.poll(30.0) == [] and own.path.published == 1
        assert other.data == [b"NOP\n"] and own.rig.pump.staged == 0
        assert c.message()[2] == b"mine"
        assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    finally:
        other.sock.close()
        other_there.close()


def _fin(msg_id):
    return b"FIN %016x\n" % msg_id


def _one_in_flight(own):
    """A round-trip consumer (RDY 1, its socket in the pump) holding the one message a producer published in the
    lane -> (channel, consumer, the producer's socket, the message's ID)."""
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=1, reads=True)
    there = own.producer()
    there.sendall(C.pub("ours", b"one"))
    assert own.lane.poll(30.0) == [] and own.path.published == 1
    _, msg_id, _ = c.message()
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    return ch, c, there, msg_id


def test_a_consumers_fin_is_taken_in_the_lane_and_frees_its_rdy(own):
    """A round-trip consumer (RDY 1): its FIN frees the message in the lane, and Python applies the rest after."""
    ch, c, _, msg_id = _one_in_flight(own)
    [(_, [slot], _)] = ch.started
    c.peer.sendall(_fin(msg_id))
    assert own.lane.poll(30.0) == []  # took the FIN, then waited on for SLICE (nothing else came)
    assert own.path.fins == 1 and c.data == []  # not Python's
    assert own.worker.inflight.ctl[C_N_LIVE] == 0 and own.worker.left == [slot]
    assert (c.in_flight, c.finish_count) == (0, 1) and own.worker.changed[-1] is ch


def test_a_fin_beside_a_pub_frees_the_rdy_that_pub_then_takes(own):
    ch, c, there, first = _one_in_flight(own)
    c.peer.sendall(_fin(first))
    there.sendall(C.pub("ours", b"two"))
    deadline = time.monotonic() + 30
    while own.path.published < 2 and time.monotonic() < deadline:  # one read, or the FIN's and then the PUB's
        own.lane.poll(30.0)
    assert (own.path.published, own.path.fins) == (2, 1) and c.data == []
    assert c.message()[2] == b"two"
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    assert c.in_flight == 1 and c.finish_count == 1 and own.worker.inflight.ctl[C_N_LIVE] == 1
    assert len(ch.started) == 2 and own.worker.left == [ch.started[0][1][0]]


@pytest.mark.parametrize("why", ["unknown id", "another consumer's", "not lowercase hex", "crlf", "parser busy",
                                 "e2e"])
def test_a_fin_the_lane_must_not_take_reaches_python_untouched(own, why):
    ch, c, _, msg_id = _one_in_flight(own)
    line = _fin(msg_id)
    if why == "unknown id":
        line = _fin(msg_id + 1)
    elif why == "another consumer's":
        c.conn_id = 10
    elif why == "not lowercase hex":
        line = line[:4] + b"F" + line[5:]  # nsqd's IDs are lowercase: it fails such a FIN
    elif why == "crlf":
        line = line[:-1] + b"\r\n"
    elif why == "parser busy":
        c.parser.idle = False
    else:
        ch.e2e = object()
    c.peer.sendall(line)
    assert own.lane.poll(30.0) == []
    assert c.data == [line] and own.path.fins == 0
    assert own.worker.inflight.ctl[C_N_LIVE] == 1 and c.in_flight == 1 and own.worker.left == []


def test_the_lane_goes_on_after_an_own_publish_while_the_worker_is_quiet(own):
    """A round trip (PUB, its message FINed, the next PUB) with nothing else for the loop: after the first
    publish the lane is armed again and goes on without returning to the loop; the second PUB's message reaches
    the consumer with the RDY the FIN freed, and Python's share of each step is applied in order. The client is
    a forked process: the lane holds the GIL while it waits."""
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=1, reads=True)
    there = own.producer()
    other, other_there = add_client(own.rig.pump, [])
    own.lane.quiet = lambda: None if own.worker.pending or own.worker.frames else -1
    report_r, report_w = os.pipe()
    there.sendall(C.pub("ours", b"one"))
    pid = os.fork()
    if pid == 0:  # the producer and the consumer: two round trips, then a command for Python
        code = 1
        try:
            for body in (b"two", None):
                _, msg_id, seen = c.message()
                os.write(report_w, seen + b"\n")
                c.peer.sendall(_fin(msg_id))
                assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
                if body is not None:
                    there.sendall(C.pub("ours", body))
            other_there.sendall(b"NOP\n")  # data for Python: the lane returns to the loop
            code = 0
        finally:
            os._exit(code)
    try:
        os.close(report_w)
        deadline = time.monotonic() + 30
        while other.data == [] and time.monotonic() < deadline:
            own.lane.poll(30.0)
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert status == 0 and os.read(report_r, 100) == b"one\ntwo\n" and other.data == [b"NOP\n"]
        assert own.lane.again >= 1 and own.path.published == 2 and own.rig.pump.staged == 0
        assert len(ch.started) == 2 and own.worker.left[0] == ch.started[0][1][0]
        assert c.finish_count >= 1 and own.worker.inflight.ctl[C_N_LIVE] == 2 - c.finish_count
    finally:
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(report_r)
        other.sock.close()
        other_there.close()


def test_the_lane_returns_after_an_own_publish_when_the_loop_has_work(own):
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=10)
    there = own.producer()
    own.lane.quiet = lambda: None
    there.sendall(C.pub("ours", b"mine"))
    t0 = time.monotonic()
    assert own.lane.poll(30.0) == []
    assert time.monotonic() - t0 < 20  # returned after the publish, not at the poll's timeout
    assert own.lane.again == 0 and own.path.published == 1
    assert c.message()[2] == b"mine" and recv_exactly(there, len(OK_FRAME)) == OK_FRAME


def test_after_an_own_publish_the_lanes_wait_ends_at_the_loops_next_timer(own):
    """The publish's Python share may add a timer (a held in-flight timer's post): the lane's next wait ends at
    the loop's next timer as ``quiet()`` gives it, not at the poll's timeout."""
    ch = Channel(own.topic, "ch", key=5)
    own.consumer(ch, conn_id=9, rdy=10)
    there = own.producer()
    own.lane.quiet = lambda: 0.05
    there.sendall(C.pub("ours", b"mine"))
    t0 = time.monotonic()
    assert own.lane.poll(60.0) == []
    assert time.monotonic() - t0 < 30  # the wait after the publish ended at 0.05 s, not at the poll's 60 s
    assert own.lane.again == 1 and own.path.published == 1
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME


def test_a_timer_due_now_ends_the_lane_after_an_own_publish(own):
    ch = Channel(own.topic, "ch", key=5)
    own.consumer(ch, conn_id=9, rdy=10)
    there = own.producer()
    own.lane.quiet = lambda: 0
    there.sendall(C.pub("ours", b"mine"))
    assert own.lane.poll(60.0) == [] and own.lane.again == 0 and own.path.published == 1


# ---- forwards to the armed topic, drained in the lane (ownpath.own_drain) -------------------------------------
def _forward(own, topic, bodies, ts, defer_ms=0, rtype=FORWARD):
    """Worker 1 forwards bodies to topic as its Forwarder does: one record committed to our input ring, then the
    wake-up (an eventfd write only while we sleep)."""
    src = np.frombuffer(b"".join(bodies), np.uint8)
    lengths = np.array([len(b) for b in bodies], np.int64)
    out = np.empty(forward_size(topic.encode(), lengths), np.uint8)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    assert own.rig.inbox.write(pack_forward(out, topic.encode(), src, offsets, lengths, ts, defer_ms), rtype)
    own.rig.wakeups.notify(0)


def _asleep(own):
    """The worker's loop found nothing to do and armed its wake-up flag before calling the lane."""
    assert own.rig.wakeups.prepare_sleep(0, lambda: False)


def _offered_again(own, n):
    """Nothing of the ring was taken: its n records are still there for Python, and the eventfd says so."""
    ring = own.rig.inbox
    assert ring.ctl[C_READ] == ring.ctl[C_HEAD] and len(records(ring)) == n
    assert os.eventfd_read(own.rig.eventfds[0]) >= 1


def test_a_forward_to_the_armed_topic_is_appended_and_delivered_in_the_lane(own):
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=10)
    _asleep(own)
    stamp = time.time_ns() - 5_000_000
    _forward(own, "ours", [b"one", b"two"], stamp)
    _forward(own, "ours", [b"three"], stamp + 1)
    assert own.lane.poll(30.0) == []
    assert own.path.drained == 3 and own.path.published == 0
    got = [_stamped(c) for _ in range(3)]
    assert [body for _, _, body in got] == [b"one", b"two", b"three"]
    assert [ts for ts, _, _ in got] == [stamp, stamp, stamp + 1]  # each keeps its record's time, as Topic.append
    ring = own.rig.inbox
    assert ring.ctl[C_HEAD] == ring.ctl[C_READ] == ring.ctl[P_TAIL]  # released
    assert (own.topic.message_count, own.topic.message_bytes) == (3, 11) and c.in_flight == 3
    assert own.topic.ids.next_id(time.time_ns()) > max(i for _, i, _ in got)
    assert not own.rig.wakeups.notify(0)  # awake for the loop: a forward now costs its sender no eventfd write
    assert len(serve.signatures) == 1


def test_the_lane_goes_on_after_a_drain_while_the_worker_is_quiet(own):
    ch = Channel(own.topic, "ch", key=5)
    c = own.consumer(ch, conn_id=9, rdy=10)
    # the loop's idle step has nothing to do until the producer's PUB was published (then it returns)
    own.lane.quiet = lambda: None if own.worker.pending or own.worker.frames or own.path.published else -1
    ring = own.rig.inbox
    own.worker.pub_pending = SimpleNamespace(any=lambda: ring.ctl[P_TAIL] != ring.ctl[C_READ])
    there = own.producer()
    _asleep(own)
    _forward(own, "ours", [b"forwarded"], time.time_ns())  # waiting in the ring as the lane is armed: drained first
    there.sendall(C.pub("ours", b"mine"))
    assert own.lane.poll(30.0) == []
    assert own.path.drained == 1 and own.path.published == 1 and own.lane.again == 1
    assert [c.message()[2] for _ in range(2)] == [b"forwarded", b"mine"]
    assert recv_exactly(there, len(OK_FRAME)) == OK_FRAME
    assert own.rig.wakeups.notify(0)  # the lane went on asleep: its flag was armed again


def test_after_a_drain_forwards_that_came_meanwhile_go_to_the_loop(own):
    """Forwards committed while Python did the drain's share found the worker awake (no eventfd write): the lane
    does not go on blind to them, the loop's drain takes them."""
    ch = Channel(own.topic, "ch", key=5)
    own.consumer(ch, conn_id=9, rdy=10)
    real_sleep, late = own.lane.sleep, []

    def sleep():
        if not late:  # Python does the first drain's share: another forward arrives while the worker is awake
            late.append(1)
            _forward(own, "ours", [b"late"], time.time_ns())
        return real_sleep()

    own.lane.sleep = sleep
    own.lane.quiet = lambda: -1
    _asleep(own)
    _forward(own, "ours", [b"first"], time.time_ns())
    assert own.lane.poll(30.0) == []
    assert own.path.drained == 1 and own.lane.again == 0
    assert len(records(own.rig.inbox)) == 1  # the late one, for the loop's drain


@pytest.mark.parametrize("why", ["another topic", "deferred", "a command", "too many", "scanner", "want room",
                                 "stalled", "not allowed", "not armed", "limited"])
def test_what_the_drain_must_leave_to_python_is_offered_again_untouched(own, why):
    ch = Channel(own.topic, "ch", key=5)
    own.consumer(ch, conn_id=9, rdy=100)
    ring = own.rig.inbox
    _asleep(own)
    if why == "scanner":
        assert own.rig.scanner.write(b"expired", 3)
    elif why == "want room":
        set_want_room(ring.ctl, 1)
    elif why == "stalled":
        ring.ctl[C_STALLED] = 1
    elif why == "not allowed":
        own.rig.drain_ok = False
    elif why == "not armed":
        own.path.hint(None)
    elif why == "limited":
        own.topic.limited = (1, 2)
    n = 1
    if why == "another topic":
        _forward(own, "ours", [b"mine"], time.time_ns())
        _forward(own, "theirs", [b"other"], time.time_ns())
        n = 2
    elif why == "deferred":
        _forward(own, "ours", [b"later"], time.time_ns(), defer_ms=1000)
    elif why == "a command":
        _forward(own, "ours", [b"cmd"], time.time_ns(), rtype=COMMAND)
    elif why == "too many":
        _forward(own, "ours", [b"m%d" % i for i in range(MAX_N + 1)], time.time_ns())
    else:
        _forward(own, "ours", [b"mine"], time.time_ns())
    events = own.lane.poll(30.0)
    assert (own.rig.eventfds[0], select.EPOLLIN) in events
    assert own.path.drained == 0 and own.log.depth(ch.ch) == 0 and ch.message_count == 0
    _offered_again(own, n)


def test_a_drain_the_log_cannot_take_without_a_new_segment_is_offered_again(own):
    ch = Channel(own.topic, "ch", key=5)
    own.consumer(ch, conn_id=9, rdy=10)
    log = own.log
    one, zero = np.ones(1, np.int64), np.zeros(1, np.int64)
    win = log.window
    for size in (60_000, 1_800):  # the segment is left with less room than one record of 1,800 bytes
        body = np.zeros(size, np.uint8)
        while MK.append_batch(log.ctrl, win.data, win.data64, body, zero, np.array([size], np.int64), zero, one,
                              zero, 0, 1, np.empty(0, np.int64)) >= 0:
            pass
    log.advance(ch.ch, log.head)
    _asleep(own)
    _forward(own, "ours", [b"x" * 1_900], time.time_ns())
    assert (own.rig.eventfds[0], select.EPOLLIN) in own.lane.poll(30.0)
    assert own.path.drained == 0 and log.depth(ch.ch) == 0
    _offered_again(own, 1)


def _stamped(c):
    """(timestamp ns, id, body) of the consumer's next MSG frame."""
    size, kind = struct.unpack(">ii", recv_exactly(c.peer, 8))
    assert kind == FRAME_MESSAGE
    rest = recv_exactly(c.peer, size - 4)
    return struct.unpack(">q", rest[:8])[0], int(rest[10:26], 16), rest[26:]
