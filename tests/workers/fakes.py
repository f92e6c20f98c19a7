"""Small fakes for unit tests of the domain objects (Channel, Topic, Session) without a broker: a real message log
and a real in-flight table and deferred store (all in this process's memory), and fake hosts that provide exactly
the services the Protocols of workers/domain/hosts.py name (tests/workers/test_hosts.py holds them to it):
``FakeWorker`` a channel's (``ChannelHost``; it records the frames it is asked to write), ``FakeTopicHost`` a
topic's (``TopicHost``), ``FakeSessionHost`` a session's (``SessionHost``: a fake pump and loop, publishes
recorded and answered, SUB to real channels whose frames go to the session's socket)."""
import itertools
import mmap
import socket
import time
from types import SimpleNamespace

import numpy as np
import pytest

from nsqpy.config import NsqdOptions
from nsqpy.ipc.inflight import InFlightTable, inflight_nbytes
from nsqpy.ipc.msglog import NO_LOW_WATER, MessageLog, ShmSegmentProvider, log_ctrl_nbytes
from nsqpy.ipc.msglog_layout import FRAME_OVERHEAD
from nsqpy.protocol.client import FrameDecoder
from nsqpy.protocol.errors import DpubFailed, MpubFailed, PubFailed
from nsqpy.protocol.frames import OK_FRAME
from nsqpy.workers.domain.channel import Channel
from nsqpy.workers.domain.deferred import DeferredStore, LocalChunks
from nsqpy.workers.domain.policy import Policy
from nsqpy.workers.domain.session import MIGRATED, Session
from nsqpy.workers.publishing.forwarding import Parked
from nsqpy.workers.publishing.records import FORWARD

S = 8 << 20


class FakeSuspect:
    def __init__(self):
        self.w = np.zeros(16, np.int64)  # a compiled round writes its suspect words here
        self.base = 0

    def careful_rounds(self, key):
        return 0

    def careful_done(self):
        pass

    def begin(self, *args):
        pass

    def end(self):
        pass


class FakeDirectory:
    def __init__(self):
        self.changes = []

    def __getattr__(self, name):
        return lambda *args: self.changes.append((name, *args))


class FakeWorker:
    """The parts of nsqpy.workers.processes.worker.Worker a channel uses; frames are recorded as (session, positions)."""

    def __init__(self, capacity, compiled=True):
        self.round_buffer = np.empty(8 << 20, np.uint8) if compiled else None  # as the worker's FRAME_SCRATCH
        self.stopping = False
        self.inflight = InFlightTable.create(np.zeros(inflight_nbytes(capacity), np.uint8), 0, capacity)
        self.deferred = DeferredStore(LocalChunks())
        self.directory = FakeDirectory()
        self.pending = set()
        self.table_blocked = set()
        self.touched = set()
        self.retries = []
        self.suspect = FakeSuspect()
        self.rounds = []
        self.opts = SimpleNamespace(max_msg_timeout=900 * 10**9)
        self._keys = 0
        self.log = FakeLog()
        self.dead_letters = []          # (topic, [bodies]) committed by dead_letter
        self.dead_letter_answer = True  # what dead_letter answers: True, False or "park"
        self.dead_parked = []           # (Parked, topic, [bodies]) while the answer is "park"

    def dead_letter(self, topic, src, offsets, lengths):
        """Worker.dead_letter (Forwarder.commit) for a channel's dead letters: committed (recorded), refused or
        parked."""
        bodies = [bytes(src[o:o + n]) for o, n in zip(offsets.tolist(), lengths.tolist())]
        answer = self.dead_letter_answer
        if answer == "park":
            p = Parked(FORWARD, src.copy(), topic, 0)
            self.dead_parked.append((p, topic, bodies))
            return p
        if answer:
            self.dead_letters.append((topic, bodies))
        return answer

    def answer_dead_parked(self, committed=True):
        """The ring had room (committed) or the owner refused (not): what Forwarder.retry_parked answers."""
        parked, self.dead_parked = self.dead_parked, []
        for p, topic, bodies in parked:
            for s, n, error, verb in p.waiters:
                if committed:
                    s.count_pub(topic, n)
                    s.release()
                else:
                    s.fail_held(error(f"{verb} failed topic {topic} is full"))
            if committed:
                self.dead_letters.append((topic, bodies))

    def next_channel_key(self):
        self._keys += 1
        return self._keys

    def write_frames(self, s, log, positions, attempts):
        lengths = log.records_at(positions).lengths[:len(positions)]
        self.rounds.append(int(lengths.sum()) + FRAME_OVERHEAD * len(positions))
        s.received.extend(log.body(int(p)) for p in positions)
        s.attempts.extend(int(a) for a in attempts)

    @staticmethod
    def direct_fd(s):
        return -1  # no socket: every round's frames come to send_frames

    def send_frames(self, s, out, end, sent=0):
        """A compiled round's frames, read back as the client would."""
        self.rounds.append(end)
        data, at = bytes(out[:end]), 0
        while at < end:
            size = int.from_bytes(data[at:at + 4], "big")
            s.attempts.append(int.from_bytes(data[at + 16:at + 18], "big"))
            s.received.append(data[at + FRAME_OVERHEAD:at + 4 + size])
            at += 4 + size

    def timer_start(self, slots, key):
        pass

    def timer_start_each(self, slots, keys):
        pass

    def timer_leave(self, slots):
        pass

    def timer_leave_one(self, slot):
        pass

    def channel_changed(self, ch):
        self.touched.add(ch.topic)

    def slots_of_channel(self, key):
        table = self.inflight
        return [s for s in range(table.capacity) if table.slot(s).state and table.slot(s).channel == key]

    def deferred_changed(self):
        pass

    def retry_later(self, ch):
        self.retries.append(ch)

    def storage_failed(self, what, exc):
        pass

    def _record(self, change, *args):
        change(*args)

    def come_due(self, now=None):
        """What Worker._on_deferred_due does: due entries join their channel's due queue."""
        idx = self.deferred.due(time.time_ns() if now is None else now)
        _, channels, _, _, _, _ = self.deferred.fields(idx)
        for i, key in zip(idx.tolist(), channels.tolist()):
            self.channels[key].came_due(i)
        return len(idx)


class FakeTopic:
    """A channel's topic (``hosts.ChannelParent``)."""

    def __init__(self, worker, log, name="t"):
        self.worker, self.log, self.index, self.paused, self.name = worker, log, 1, False, name
        self.deleted_channels = []

    def delete_channel(self, name):
        self.deleted_channels.append(name)


class FakeSession:
    def __init__(self, conn_id, rdy):
        self.conn_id = conn_id
        self.rdy = rdy
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.received = []
        self.attempts = []
        self.closed = False
        self.channel = None
        self.settings = SimpleNamespace(msg_timeout_ms=60_000, sample_rate=0)

    def ready_for_more(self):
        return self.in_flight < self.rdy

    def close(self):
        self.closed = True


@pytest.fixture(params=[True, False], ids=["compiled-rounds", "general-rounds"])
def setup(shm_prefix, request):
    """make(capacity) -> (worker, log, channel); each test runs with the worker's compiled delivery rounds
    (kernels.deliver_round) and without (the general path alone)."""
    made = []

    def make(capacity, mem_segments=4):
        worker = FakeWorker(capacity, compiled=request.param)
        ctrl = mmap.mmap(-1, log_ctrl_nbytes(S, mem_segments * S))
        log = MessageLog.create(ctrl, 0, segment_size=S, mem_bytes=mem_segments * S,
                                memory=ShmSegmentProvider(f"{shm_prefix}-{len(made)}"))
        made.append(log)
        topic = FakeTopic(worker, log)
        ch = Channel(topic, "c", log.open_channel(), worker.next_channel_key())
        worker.channels = {ch.key: ch}
        return worker, log, ch

    yield make
    for log in made:
        log.destroy()


_ids = itertools.count(1000)


def publish(log, bodies, not_before=0):
    ts = time.time_ns()
    for b in bodies:
        log.append(b, ts, next(_ids), not_before)


def drain(ch, passes=1000):
    """Delivery passes until the channel says nothing more can go out now (bounded: a stuck channel fails)."""
    for _ in range(passes):
        if not ch.deliver():
            return
    raise AssertionError("delivery never settles")


def finish_all(ch, s):
    table = ch.worker.inflight
    for slot in table.iter_conn(s.conn_id).tolist():
        table.release(slot)
    s.in_flight = 0


# ---- a topic's host (hosts.TopicHost) ---------------------------------------------------------------------------
class FakeControl:
    """The control block's full marks (``hosts.TopicFullMarks``)."""

    def __init__(self):
        self.full = {}

    def topic_full(self, w, crc):
        return self.full.get((w, crc), False)

    def set_topic_full(self, w, crc, full):
        self.full[(w, crc)] = full


class FakeTopicHost(FakeWorker):
    """``hosts.TopicHost``: a channel's services plus what a Topic adds. Its logs' shared memory is named from
    ``shm_prefix`` (the suite's leak check finds what a test leaves); ``data_path`` is a test's tmp_path."""

    def __init__(self, data_path, shm_prefix, capacity=64, **opts):
        super().__init__(capacity)
        self.opts = NsqdOptions(**opts)
        self.index = 0
        self.data_path = str(data_path)
        self.shm_prefix = shm_prefix
        self.control = FakeControl()
        self.stats = SimpleNamespace(changed=set(), structure_changed=lambda name: None)
        self.channels_by_key = {}
        self.storage_failing = False
        self.failures = []      # (what, exception) the topic reported
        self.low_water = []     # refresh_low_water calls (lists of topics)
        self.deleted = []       # delete_topic names
        self.synced = []        # appended(topic, n) calls of durable topics
        self.watched = set()    # topics whose channel mark is watched (watch_limits)
        self.policies = {}      # (topic, channel) -> the Policy channel_policy gives a new channel

    def storage_failed(self, what, exc):
        self.storage_failing = True
        self.failures.append((what, exc))

    def storage_works(self):
        self.storage_failing = False

    def refresh_low_water(self, topics):
        """What the worker's reclaim pass does when nothing is held (in flight, requeued, deferred): each log may
        reclaim behind its cursors, and a full topic with room again is no longer marked."""
        self.low_water.append(list(topics))
        for t in topics:
            for ch in t.channels.values():
                t.log.set_low_water(ch.ch, NO_LOW_WATER)
            t.log.reclaim()
            if t.full and t.log.has_room():
                t.set_full(False)

    def channel_policy(self, topic, channel):
        return self.policies.get((topic, channel), Policy.OFF)

    def delete_topic(self, name):
        self.deleted.append(name)

    def appended(self, topic, n):
        self.synced.append((topic.name, n))

    def watch_limits(self, topic):
        self.watched.add(topic)


# ---- a session's host (hosts.SessionHost) -----------------------------------------------------------------------
class FakeTimer:
    def __init__(self, delay, callback):
        self.delay, self.callback, self.cancelled = delay, callback, False

    def cancel(self):
        self.cancelled = True


class FakeLoop:
    """``hosts.SessionLoop``: timers are recorded, never run by themselves (a test fires them: ``fire``)."""

    def __init__(self):
        self.timers = []
        self.writers = {}
        self.forgotten = []

    def call_later(self, delay, callback):
        t = FakeTimer(delay, callback)
        self.timers.append(t)
        return t

    def live(self):
        return [t for t in self.timers if not t.cancelled]

    def fire(self, callback):
        """Run the live timers whose callback is ``callback`` (a bound method compares equal to another binding)."""
        due = [t for t in self.live() if t.callback == callback]
        for t in due:
            t.cancelled = True
            t.callback()
        return len(due)

    def add_writer(self, fd, callback):
        self.writers[fd] = callback

    def remove_writer(self, fd):
        self.writers.pop(fd)

    def forget(self, fd):
        self.forgotten.append(fd)
        self.writers.pop(fd, None)


class FakePump:
    """``hosts.SessionPump``: the per-fd arrays the real pump keeps, and which fds it reads."""

    def __init__(self, fds=1 << 16):
        self.busy = np.zeros(fds, np.uint8)
        self.clean = np.zeros(fds, np.uint8)
        self.last_read = np.zeros(fds, np.float64)
        self.reading = set()
        self.paused = set()

    def add(self, session, now):
        self.reading.add(session.fd)
        self.busy[session.fd] = 1 if session.wbuf else 0
        self.clean[session.fd] = 0
        self.last_read[session.fd] = now

    def remove(self, session):
        self.reading.discard(session.fd)
        self.paused.discard(session.fd)

    def pause(self, fd):
        self.paused.add(fd)

    def resume(self, fd):
        self.paused.discard(fd)


class FakeLog:
    def __init__(self):
        self.lines = []

    def debug(self, msg):
        self.lines.append(("debug", msg))

    def info(self, msg):
        self.lines.append(("info", msg))

    def warn(self, msg):
        self.lines.append(("warn", msg))


class FakeSessionHost(FakeWorker):
    """``hosts.SessionHost`` (and, for the channels its SUBs join, ``hosts.ChannelHost``): publishes are recorded
    and answered OK, refused (``full``: the topic names whose publishes fail as a full topic's) or parked
    (``park``: the session is held, as for a ring without room; ``answer_parked`` commits them); SUB joins a real
    channel on a real log (``channel(name)``), or hands the connection over (``foreign``: topics another worker
    owns); message frames go to the session's output as the worker's do."""

    def __init__(self, log, capacity=64, **opts):
        super().__init__(capacity, compiled=False)
        self.opts = NsqdOptions(**opts)
        self.server_settings = self.opts.server_settings()
        self.limits = self.server_settings.limits
        self.log = FakeLog()
        self.loop = FakeLoop()
        self.pump = FakePump()
        self.dirty = []
        self.topic = FakeTopic(self, log)
        self.published = []     # (topic, bodies, defer_ms, verb)
        self.full = set()
        self.park = False
        self.parked = []        # (session, topic, n)
        self.foreign = set()
        self.migrated = []      # (session, sub, rest)
        self.forgotten = []
        self.channels = {}      # key -> channel (what come_due looks up)
        self.topic_channels = {}  # name -> channel

    def channel(self, name):
        ch = self.topic_channels.get(name)
        if ch is None:
            ch = Channel(self.topic, name, self.topic.log.open_channel(), self.next_channel_key())
            self.topic_channels[name] = ch
            self.channels[ch.key] = ch
        return ch

    # publishing
    def _publish(self, s, topic, bodies, defer_ms, verb, error):
        if topic in self.full:
            raise error(f"{verb} failed topic {topic} is full")
        self.published.append((topic, [bytes(b) for b in bodies], defer_ms, verb))
        if self.park:
            self.parked.append((s, topic, len(bodies)))
            s.hold()
        else:
            s.count_pub(topic, len(bodies))

    def publish(self, s, topic, bodies, defer_ms, verb):
        self._publish(s, topic, bodies, defer_ms, verb, DpubFailed if verb == "DPUB" else PubFailed)

    def publish_mpub(self, s, cmd):
        bodies = [bytes(cmd.buffer[o:o + n]) for o, n in zip(np.asarray(cmd.offsets).tolist(),
                                                              np.asarray(cmd.lengths).tolist())]
        self._publish(s, cmd.topic, bodies, 0, "MPUB", MpubFailed)

    def answer_parked(self):
        """The ring had room: each parked publish is OK'd and its session released (the worker's commit)."""
        parked, self.parked = self.parked, []
        for s, topic, n in parked:
            s.count_pub(topic, n)
            s.release()

    # subscribing and hand-over
    def subscribe(self, s, topic, channel):
        if topic in self.foreign:
            return MIGRATED
        self.channel(channel).add_consumer(s)
        s.write(OK_FRAME)
        return None

    def migrate(self, s, sub, rest):
        self.migrated.append((s, sub, rest))
        s.detach()

    def forget_session(self, s):
        self.forgotten.append(s)

    # delivery: frames into the session's output, as Worker.write_frames/send_frames
    def write_frames(self, s, log, positions, attempts):
        out = np.empty(8 << 20, np.uint8)
        end = log.write_frames(out, 0, positions, attempts)
        s.write(bytes(out[:end]))

    def send_frames(self, s, out, end, sent=0):
        if sent < end:
            s.write(bytes(out[sent:end]))

    def deliver_and_flush(self, passes=100):
        """The worker's step: delivery passes for pending channels, then every dirty session's flush."""
        for _ in range(passes):
            if not self.pending:
                break
            pending, self.pending = self.pending, set()
            for ch in pending:
                if ch.deliver():
                    self.pending.add(ch)
        dirty, self.dirty = self.dirty, []
        for s in dirty:
            s.flush()


class Client:
    """The client's end of a session's socketpair: what it sends goes to ``Session.on_data`` (as the pump would
    hand it over), what the session sends is read back as frames."""

    def __init__(self, host, sock_buffer=None, **session_kwargs):
        self.host = host
        ours, self.peer = socket.socketpair()
        if sock_buffer:
            for sk in (ours, self.peer):
                sk.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sock_buffer)
                sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sock_buffer)
        ours.setblocking(False)
        self.peer.setblocking(False)
        self.session = Session(host, ours, next(_conn_ids), ("127.0.0.1", 4150), **session_kwargs)
        self.session.start()
        self.decoder = FrameDecoder()
        self.eof = False

    def send(self, *parts):
        """Bytes from the client, one read of the session's each, then the worker's deliver-and-flush step."""
        s = self.session
        for data in parts:
            if not s.closed and s.fd in self.host.pump.reading and s.fd not in self.host.pump.paused:
                s.on_data(bytes(data))
        self.host.deliver_and_flush()
        return self

    def frames(self):
        """Every whole frame the session has sent so far: [(frame type, data)]."""
        out = []
        while True:
            try:
                chunk = self.peer.recv(1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            out += self.decoder.feed(chunk)
        return out

    def close(self):
        self.peer.close()
        self.session.close()


_conn_ids = itertools.count(1)


@pytest.fixture
def session_host(shm_prefix):
    """make(**nsqd options) -> a FakeSessionHost over a real log (its channels' messages: ``publish(host.topic.log,
    ...)``); the logs are destroyed at the end."""
    made = []

    def make(capacity=64, **opts):
        ctrl = mmap.mmap(-1, log_ctrl_nbytes(S, 2 * S))
        log = MessageLog.create(ctrl, 0, segment_size=S, mem_bytes=2 * S,
                                memory=ShmSegmentProvider(f"{shm_prefix}-s{len(made)}"))
        host = FakeSessionHost(log, capacity, **opts)
        made.append(host)
        return host

    yield make
    for host in made:
        host.topic.log.destroy()
