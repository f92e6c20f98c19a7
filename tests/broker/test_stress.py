"""Multi-process stress and crash tests of the whole broker (spec 1.10: every channel gets every message, FIN /
REQ / in-flight timeout, redelivery after a disconnect).

Theory of operation. One broker with two workers. ``PRODUCERS`` processes publish disjoint ranges of sequence
numbers to one topic, mixing MPUB batches and single PUBs, with a few commands pipelined per connection. The
three channels exist (SUB) before the first publish, so every channel must see every message. Each channel has
one consumer process holding ``CONNECTIONS_PER_CHANNEL`` connections (the acceptor spreads them over the
workers; SUB moves them to the topic's owner). Per delivery a consumer randomly FINs, REQs (delay 0 or a few
ms) or ignores the message (it times out after the 1 s msg_timeout the consumers IDENTIFY with); a message
already delivered ``PLAY_ATTEMPTS`` times is always FINned, so the run converges. Now and then a consumer drops
a connection abruptly (RST, whatever it holds unanswered) and reconnects.

Every process reports to the test process through its pipe: producers the seq ranges answered ``OK``,
consumers one record per delivery (seq, message id, attempts, what it did). The run ends when every
acknowledged seq was FINned on every channel, or at the deadline, and the failure then names what is missing.

Bodies are ``<u8 seq><u4 crc32(seq bytes + payload)><4..64 random bytes>``: a body that is cut, spliced or
delivered under another message's header fails the checksum.

The crash variant SIGKILLs a worker ``WORKER_KILLS`` times, the scanner once and the acceptor once. Kills are
spread by the run's progress, not by time (kill i once i/(kills+1) of all the work is done, counting
acknowledgements and each channel's finished messages alike, so the first kills fall while producers publish
and the later ones while consumers drain), each after the previous victim's replacement logged its start; pids come from the broker's log. Producers whose connection
dies resend every command not yet answered (so a message may then appear twice, never zero times); consumers
reconnect. Around the scanner kill a probe consumer holds a message in flight and must see it time out and be
redelivered after the scanner's restart, and again for a message delivered after it.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
import random
import re
import selectors
import signal
import socket
import struct
import threading
import time
import zlib
from multiprocessing.connection import wait as wait_for_pipes

import numpy as np
import pytest

from benchmarks.common import BenchError
from benchmarks.wire import MessageStream, fin_lines, warm_up
from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, OK

# ---- sizes: the defaults fit the default suite's budget (under 2 minutes each on 2 shared cores) ------------
STRESS_MESSAGES = 500_000
CRASH_MESSAGES = 500_000
SOAK_MESSAGES = 5_000_000
PRODUCERS = 3
CONNECTIONS_PER_CHANNEL = 3
WORKER_KILLS = 10

TOPIC = "stress"
CHANNELS = ("a", "b", "c")
MSG_TIMEOUT_MS = 1000
RDY = 200
PIPELINE = 4               # commands a producer keeps unanswered on one connection
SINGLE_PUB_SHARE = 0.4     # share of producer commands that are a PUB (the rest: MPUB of 2..MPUB_MAX)
MPUB_MAX = 100
P_REQ, P_IGNORE = 0.08, 0.01
REQ_DELAYS_MS = (0, 0, 0, 5, 20)
PLAY_ATTEMPTS = 3          # from this many attempts on, a consumer always FINs
DROP_EVERY = (3_000, 25_000)   # deliveries between two abrupt disconnects of one connection (random in range)
IO_TIMEOUT = 60.0          # no reply or frame for this long is a failure (the broker is stuck)
RUN_DEADLINE = 240.0       # the whole run must complete within this (x messages / STRESS_MESSAGES)
PROBE_DEADLINE = 60.0
RESTART_DEADLINE = 60.0    # a killed child's replacement must log its start within this
MIN_AGE = 1.5              # a child is killed only this long after its start: the supervisor gives up on a child
                           # that dies within 1 s of its start five times in a row (a restart storm)
STALL = 30.0               # no delivery and no acknowledgement for this long, while incomplete: the run is stuck
REPORT_EVERY = 0.25        # seconds between a process's reports

FIN, REQ, IGNORE, DROPPED, BAD = range(5)
RECORD = np.dtype([("seq", "<u8"), ("id", "<u8"), ("attempts", "<u2"), ("action", "u1"), ("conn", "u1")])
_SEQ_CRC = struct.Struct("<QI")
_HEAD_SPAN = np.arange(12, dtype=np.int64)

fork = multiprocessing.get_context("fork")


def body(seq, rng):
    payload = rng.randbytes(rng.randint(4, 64))
    head = seq.to_bytes(8, "little")
    return _SEQ_CRC.pack(seq, zlib.crc32(payload, zlib.crc32(head))) + payload


# ---- a blocking handshake on the codec ------------------------------------------------------------------
class Link:
    """One connection during set-up and for producers: send, read replies (heartbeats answered)."""

    def __init__(self, address, identify):
        self.sock = socket.create_connection(address, timeout=IO_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = C.FrameDecoder()
        self.pending = collections.deque()
        self.send(C.magic() + C.identify(identify))
        self.expect_ok("IDENTIFY")

    def send(self, data):
        self.sock.sendall(data)

    def reply(self):
        while True:
            while self.pending:
                kind, data = self.pending.popleft()
                if kind == FRAME_RESPONSE and data == HEARTBEAT:
                    self.send(C.nop())
                elif kind == FRAME_RESPONSE:
                    return data
                else:
                    raise BenchError(f"frame type {kind} while waiting for a reply: {data[:100]!r}")
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise BenchError("connection closed by the broker")
            self.pending.extend(self.decoder.feed(chunk))

    def expect_ok(self, what):
        data = self.reply()
        if data != OK:
            raise BenchError(f"{what}: expected OK, got {data[:100]!r}")

    def next_message(self, timeout):
        """The next message frame, decoded (for the probes); BenchError at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            while self.pending:
                kind, data = self.pending.popleft()
                if kind == FRAME_MESSAGE:
                    return C.decode_message(data)
                if kind == FRAME_RESPONSE and data == HEARTBEAT:
                    self.send(C.nop())
                    continue
                raise BenchError(f"frame type {kind} while waiting for a message: {data[:100]!r}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"no message within {timeout}s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            if not chunk:
                raise BenchError("connection closed by the broker")
            self.pending.extend(self.decoder.feed(chunk))

    def abort(self):
        """Close with RST: the broker sees the connection die with whatever it had in flight."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.sock.close()


def identify_fields(name):
    return {"client_id": name, "hostname": "stress", "user_agent": "nsqpy-stress/1", "feature_negotiation": False,
            "msg_timeout": MSG_TIMEOUT_MS}


# ---- producers ----------------------------------------------------------------------------------------------
def commands(first, count, rng):
    """(lo, hi, bytes) per command: a PUB of seq lo, or an MPUB of seqs lo..hi-1."""
    seq, end = first, first + count
    while seq < end:
        n = 1 if rng.random() < SINGLE_PUB_SHARE else min(rng.randint(2, MPUB_MAX), end - seq)
        bodies = [body(s, rng) for s in range(seq, seq + n)]
        yield seq, seq + n, C.pub(TOPIC, bodies[0]) if n == 1 else C.mpub(TOPIC, bodies)
        seq += n


def producer_main(address, index, first, count, seed, stop, out):
    rng = random.Random(seed)
    todo = commands(first, count, rng)
    retry = collections.deque()
    failures = []
    acked = []
    last_report = time.monotonic()
    done = False
    while not done and not stop.is_set():
        outstanding = collections.deque()
        link = None
        try:
            link = Link(address, identify_fields(f"producer{index}"))
            while True:
                while len(outstanding) < PIPELINE:
                    cmd = retry.popleft() if retry else next(todo, None)
                    if cmd is None:
                        break
                    outstanding.append(cmd)
                    link.send(cmd[2])
                if not outstanding:
                    done = True
                    break
                link.expect_ok("PUB" if outstanding[0][1] - outstanding[0][0] == 1 else "MPUB")
                lo, hi, _ = outstanding.popleft()
                acked.append((lo, hi))
                if time.monotonic() - last_report > REPORT_EVERY:
                    out.send(("acked", index, np.array(acked, np.int64)))
                    acked.clear()
                    last_report = time.monotonic()
        except (OSError, BenchError) as e:
            failures.append(f"{type(e).__name__}: {e}")
            retry.extendleft(reversed(outstanding))   # resend what was not answered, in order, first
        finally:
            if link is not None:
                link.sock.close()
    out.send(("acked", index, np.array(acked, np.int64).reshape(-1, 2)))
    out.send(("producer done", index, {"done": done, "failures": failures}))


# ---- consumers ----------------------------------------------------------------------------------------------
class Consumer:
    """One subscribed connection of a consumer process."""

    def __init__(self, address, channel, number, rng):
        self.number = number
        self.rng = rng
        self.link = Link(address, identify_fields(f"{channel}{number}"))
        self.link.send(C.sub(TOPIC, channel))
        self.link.expect_ok("SUB")
        self.stream = MessageStream(self.link, buffer_size=1 << 20)
        self.link.send(C.rdy(RDY))
        self.next_drop = int(rng.integers(*DROP_EVERY))

    def handle(self, batches, records):
        """Answer a read's messages; False when this connection is to be dropped now, unanswered."""
        drop = False
        for b in batches:
            n = len(b)
            self.next_drop -= n
            drop = drop or self.next_drop <= 0
            arr = self.stream.array
            offsets = b.body_offsets
            short = b.body_lengths < 16
            head = arr[np.where(short, 0, offsets)[:, None] + _HEAD_SPAN]
            seqs = np.ascontiguousarray(head[:, :8]).view("<u8").ravel()
            crcs = np.ascontiguousarray(head[:, 8:]).view("<u4").ravel()
            view = self.stream.view
            intact = np.array([zlib.crc32(view[o + 12:o + n_], zlib.crc32(view[o:o + 8])) == c
                               for o, n_, c in zip(offsets.tolist(), b.body_lengths.tolist(), crcs.tolist())],
                              bool) & ~short
            r = self.rng.random(n)
            play = b.attempts < PLAY_ATTEMPTS
            action = np.full(n, FIN, np.uint8)
            action[play & (r < P_REQ)] = REQ
            action[play & (r >= P_REQ) & (r < P_REQ + P_IGNORE)] = IGNORE
            action[~intact] = BAD
            if drop:
                action[:] = np.where(intact, DROPPED, BAD)
            rec = np.empty(n, RECORD)
            rec["seq"], rec["id"], rec["attempts"] = seqs, b.id_values, b.attempts
            rec["action"], rec["conn"] = action, self.number
            records.append(rec)
            if drop:
                continue
            answer = [fin_lines(arr, offsets[(action == FIN) | (action == BAD)])]
            for i in np.flatnonzero(action == REQ).tolist():
                answer.append(C.req(b.raw_id(i), int(self.rng.choice(REQ_DELAYS_MS))))
            self.link.send(b"".join(answer))
        return not drop


def consumer_main(address, channel, seed, stop, deadline, out):
    rng = np.random.default_rng(seed)
    sel = selectors.DefaultSelector()
    stats = collections.Counter()
    events = []
    records = []

    def connect(number):
        while time.monotonic() < deadline and not stop.is_set():
            try:
                c = Consumer(address, channel, number, rng)
            except (OSError, BenchError) as e:
                stats["failed connects"] += 1
                events.append(f"connect {number}: {type(e).__name__}: {e}")
                continue
            sel.register(c.link.sock, selectors.EVENT_READ, c)
            return c
        return None

    def flush():
        if records:
            out.send(("deliveries", channel, np.concatenate(records).tobytes()))
            records.clear()

    for number in range(CONNECTIONS_PER_CHANNEL):
        connect(number)
    out.send(("consumer ready", channel, len(sel.get_map())))
    last_report = time.monotonic()
    while not stop.is_set() and time.monotonic() < deadline:
        for key, _ in sel.select(REPORT_EVERY):
            c = key.data
            try:
                keep = c.handle(c.stream.read(IO_TIMEOUT), records)
                if not keep:
                    stats["dropped"] += 1
            except (OSError, BenchError) as e:
                keep = False
                stats["lost"] += 1
                events.append(f"conn {c.number}: {type(e).__name__}: {e}")
            if not keep:
                sel.unregister(c.link.sock)
                c.link.abort()
                connect(c.number)
        if time.monotonic() - last_report > REPORT_EVERY:
            flush()
            last_report = time.monotonic()
    for key in list(sel.get_map().values()):
        stats["nonfatal errors"] += key.data.stream.nonfatal_errors
        key.data.link.sock.close()
    flush()
    out.send(("consumer done", channel, {"stats": dict(stats), "events": events[-50:]}))


# ---- the test process's side --------------------------------------------------------------------------------
class Ledger:
    """What the children reported: acknowledged seqs, deliveries per channel, and their final words."""

    def __init__(self, messages):
        self.messages = messages
        self.acked = np.zeros(messages, np.int32)
        self.acked_total = 0
        self.finished_total = 0   # over all channels
        self.finished = {ch: np.zeros(messages, bool) for ch in CHANNELS}
        self.deliveries = {ch: [] for ch in CHANNELS}
        self.ready = {}
        self.producers = {}
        self.consumers = {}
        self.progress = threading.Condition()
        self.last_progress = time.monotonic()

    def take(self, msg):
        kind, who, data = msg
        if kind in ("acked", "deliveries") and len(data):
            self.last_progress = time.monotonic()
        if kind == "acked":
            for lo, hi in data.tolist():
                self.acked[lo:hi] += 1
            with self.progress:
                self.acked_total += int((data[:, 1] - data[:, 0]).sum()) if len(data) else 0
                self.progress.notify_all()
        elif kind == "deliveries":
            rec = np.frombuffer(data, RECORD)
            self.deliveries[who].append(rec)
            fin = np.unique(rec["seq"][(rec["action"] == FIN) & (rec["seq"] < self.messages)].astype(np.int64))
            with self.progress:
                self.finished_total += int((~self.finished[who][fin]).sum())
                self.finished[who][fin] = True
                self.progress.notify_all()
        elif kind == "consumer ready":
            self.ready[who] = data
        elif kind == "producer done":
            self.producers[who] = data
        elif kind == "consumer done":
            self.consumers[who] = data

    def complete(self):
        return (len(self.producers) == PRODUCERS and
                all(self.finished[ch].all() for ch in CHANNELS))

    def all_deliveries(self, ch):
        return np.concatenate(self.deliveries[ch]) if self.deliveries[ch] else np.empty(0, RECORD)

    def done_share(self):
        """How far the run is, 0..1: publishing and each channel's finishing weigh the same."""
        return (self.acked_total + self.finished_total) / (self.messages * (1 + len(CHANNELS)))

    def missing(self, ch):
        return np.flatnonzero((self.acked > 0) & ~self.finished[ch])

    def history(self, ch, seqs):
        """Each seq's deliveries on a channel, in arrival order: [(id, attempts, action, conn), ...]."""
        rec = self.all_deliveries(ch)
        names = ("FIN", "REQ", "IGNORE", "DROPPED", "BAD")
        out = {}
        for seq in seqs:
            out[int(seq)] = [(f"{int(r['id']):016x}", int(r["attempts"]), names[r["action"]], int(r["conn"]))
                             for r in rec[rec["seq"] == seq]]
        return out

    def diagnosis(self):
        """What the missing messages went through before they disappeared."""
        lines = []
        for ch in CHANNELS:
            missing = self.missing(ch)
            if not len(missing):
                continue
            hist = self.history(ch, missing)
            last = collections.Counter(h[-1][2] if h else "never delivered" for h in hist.values())
            lines.append(f"channel {ch}: {len(missing)} missing; last thing done to them: {dict(last)}")
            lines += [f"  seq {seq}: {h}" for seq, h in list(hist.items())[:10]]
        return "\n".join(lines)

    def summary(self):
        lines = [f"acked {int((self.acked > 0).sum())}/{self.messages} (answered OK twice: "
                 f"{int((self.acked > 1).sum())})"]
        for ch in CHANNELS:
            rec = self.all_deliveries(ch)
            counts = {name: int((rec["action"] == a).sum())
                      for a, name in enumerate(("fin", "req", "ignore", "dropped", "bad"))}
            lines.append(f"channel {ch}: finished {int(self.finished[ch].sum())}, deliveries {len(rec)} {counts}")
        lines += [f"producer {k}: {v}" for k, v in sorted(self.producers.items())]
        lines += [f"consumer {k}: {v}" for k, v in sorted(self.consumers.items())]
        return "\n".join(lines)


class Incomplete(AssertionError):
    pass


class Run:
    """The children of one run: consumers subscribed first, then producers; results through pipes."""

    def __init__(self, address, messages, seed):
        self.address = address
        self.messages = messages
        self.ledger = Ledger(messages)
        self.stop = fork.Event()
        self.deadline = time.monotonic() + RUN_DEADLINE * max(1.0, messages / STRESS_MESSAGES)
        self.pipes = []
        self.procs = []
        self.seed = seed

    def _start(self, target, *args):
        r, w = fork.Pipe(duplex=False)
        p = fork.Process(target=target, args=(*args, w), daemon=True)
        p.start()
        w.close()
        self.pipes.append(r)
        self.procs.append(p)

    def _pump(self, until, what, stall=True):
        while not until():
            left = self.deadline - time.monotonic()
            if left <= 0 or not self.pipes:
                raise Incomplete(f"{what}: not done by the deadline")
            if stall and time.monotonic() - self.ledger.last_progress > STALL:
                raise Incomplete(f"{what}: no progress for {STALL:.0f}s")
            for r in wait_for_pipes(self.pipes, min(left, 1.0)):
                try:
                    self.ledger.take(r.recv())
                except EOFError:
                    self.pipes.remove(r)

    def start(self):
        warm_up()
        for i, ch in enumerate(CHANNELS):
            self._start(consumer_main, self.address, ch, self.seed * 100 + i, self.stop, self.deadline)
        self._pump(lambda: len(self.ledger.ready) == len(CHANNELS), "consumers subscribing")
        assert all(n == CONNECTIONS_PER_CHANNEL for n in self.ledger.ready.values()), self.ledger.ready
        share = -(-self.messages // PRODUCERS)
        for i in range(PRODUCERS):
            first = i * share
            self._start(producer_main, self.address, i, first, min(share, self.messages - first),
                        self.seed * 100 + 50 + i, self.stop)

    def wait(self, nsqd, also=lambda: True):
        """Until every message was finished on every channel (and ``also``); then stop and collect. A run that
        does not complete fails with what the missing messages went through and the broker's own state dump."""
        failure = None
        try:
            self._pump(lambda: self.ledger.complete() and also(), "the run")
        except Incomplete as e:
            failure = f"{e}\n{self.ledger.summary()}\n{self.ledger.diagnosis()}\n{dump_broker_state(nsqd)}"
        finally:
            self.stop.set()
            self.deadline = max(self.deadline, time.monotonic() + 30)
            self._pump(lambda: not self.pipes, "children reporting after stop", stall=False)
            for p in self.procs:
                p.join(30)
        if failure:
            pytest.fail(failure, pytrace=False)
        return self.ledger


STARTED_RE = re.compile(r"(worker \d+|scanner|acceptor): started \(pid (\d+)\)")


def current_pids(nsqd):
    """{child name: (pid, index of its latest 'started' line)} from the broker's log."""
    pids = {}
    for i, line in enumerate(nsqd.output().splitlines()):
        m = STARTED_RE.search(line)
        if m:
            pids[m.group(1)] = (int(m.group(2)), i)
    return pids


def dump_broker_state(nsqd):
    """SIGUSR1 to every worker: each logs one line per channel it owns (depth, requeued, consumers' in-flight)."""
    start = len(nsqd.output().splitlines())
    for name, (pid, _) in current_pids(nsqd).items():
        if name.startswith("worker") and pid in nsqd.child_pids():
            os.kill(pid, signal.SIGUSR1)
    try:
        nsqd.wait_for_line(rf"worker \d+: {TOPIC}/", 10, start=start)
        nsqd.wait_for_line(rf"worker \d+: {TOPIC}/{CHANNELS[-1]} ", 10, start=start)
    except AssertionError:
        pass
    lines = nsqd.output().splitlines()
    return "broker log, last lines:\n" + "\n".join(lines[max(0, start - 30):])


# ---- checks -------------------------------------------------------------------------------------------------
def check_bodies_and_coverage(ledger):
    for ch in CHANNELS:
        rec = ledger.all_deliveries(ch)
        bad = rec[rec["action"] == BAD]
        assert len(bad) == 0, f"channel {ch}: {len(bad)} bodies failed their checksum, e.g. {bad[:5]}"
        assert (rec["seq"] < ledger.messages).all(), f"channel {ch}: a seq out of range"
        missing = np.flatnonzero((ledger.acked > 0) & ~ledger.finished[ch])
        assert len(missing) == 0, (f"channel {ch}: {len(missing)} acknowledged messages never finished, e.g. "
                                   f"{missing[:20].tolist()}\n{ledger.summary()}")
    assert (ledger.acked > 0).all(), f"not every message was acknowledged\n{ledger.summary()}"


def check_redeliveries_only(ledger):
    """Without crashes each seq was published once, so it has one message id (the same on every channel), and a
    message seen twice on a channel was redelivered: its attempts differ each time."""
    ids = {}
    for ch in CHANNELS:
        rec = ledger.all_deliveries(ch)
        order = np.lexsort((rec["attempts"], rec["id"]))
        rec = rec[order]
        same = (rec["id"][1:] == rec["id"][:-1]) & (rec["attempts"][1:] == rec["attempts"][:-1])
        assert not same.any(), (f"channel {ch}: {int(same.sum())} deliveries repeat an earlier one's attempts "
                                f"(not a redelivery), e.g. {rec[1:][same][:5]}")
        first = np.unique(rec[["seq", "id"]])
        assert len(np.unique(first["seq"])) == len(first), f"channel {ch}: a seq arrived with two message ids"
        ids[ch] = first
    for ch in CHANNELS[1:]:
        assert np.array_equal(ids[ch], ids[CHANNELS[0]]), f"channel {ch} saw other message ids than {CHANNELS[0]}"


def check_no_connection_failures(ledger):
    for i, p in sorted(ledger.producers.items()):
        assert p["done"] and not p["failures"], f"producer {i}: {p}"
    for ch, c in sorted(ledger.consumers.items()):
        assert not c["stats"].get("lost") and not c["stats"].get("failed connects"), f"consumer {ch}: {c}"


# ---- the crash variant --------------------------------------------------------------------------------------
class TimeoutProbe:
    """A consumer on a topic of its own holding a message in flight across a scanner kill: after the restart the
    held message must time out and come back, and so must one delivered after the restart."""

    def __init__(self, address, number):
        self.address = address
        self.topic = f"probe{number}"
        self.consumer = Link(address, identify_fields(f"probe{number}"))
        self.consumer.send(C.sub(self.topic, "ch"))
        self.consumer.expect_ok("SUB")
        self.consumer.send(C.rdy(1))
        self.held = self._publish_and_take(b"held across the kill")

    def _publish_and_take(self, data):
        producer = Link(self.address, identify_fields("probe-producer"))
        producer.send(C.pub(self.topic, data))
        producer.expect_ok("PUB")
        producer.sock.close()
        m = self.consumer.next_message(PROBE_DEADLINE)
        assert (m.body, m.attempts) == (data, 1), m
        return m

    def _times_out(self, m):
        again = self.consumer.next_message(PROBE_DEADLINE)
        assert (again.id, again.body, again.attempts) == (m.id, m.body, 2), (m, again)
        self.consumer.send(C.fin(again.id))

    def check(self):
        try:
            self._times_out(self.held)
            self._times_out(self._publish_and_take(b"delivered after the restart"))
        finally:
            self.consumer.sock.close()


class Killer(threading.Thread):
    """SIGKILLs the broker's children one at a time, spread by the run's progress (see the module docstring)."""

    def __init__(self, nsqd, ledger, seed):
        super().__init__(daemon=True)
        self.nsqd = nsqd
        self.ledger = ledger
        self.rng = random.Random(seed)
        self.victims = ["worker"] * WORKER_KILLS + ["scanner", "acceptor"]
        self.rng.shuffle(self.victims)
        self.kills = []
        self.error = None
        self.finished = threading.Event()
        self.abort = threading.Event()

    def run(self):
        try:
            self._run()
        except BaseException as e:  # reported by the test thread
            self.error = e
        finally:
            self.finished.set()

    def _wait_for_progress(self, share):
        with self.ledger.progress:
            self.ledger.progress.wait_for(lambda: self.ledger.done_share() >= share or self.abort.is_set(),
                                          RUN_DEADLINE)

    def _run(self):
        pids = {name: (pid, line, time.monotonic() - MIN_AGE) for name, (pid, line) in current_pids(self.nsqd).items()}
        workers = sorted(n for n in pids if n.startswith("worker"))
        for i, victim in enumerate(self.victims):
            self._wait_for_progress((i + 1) / (len(self.victims) + 1))
            if self.abort.is_set():
                return
            name = self.rng.choice(workers) if victim == "worker" else victim
            pid, line, started = pids[name]
            age = time.monotonic() - started
            if age < MIN_AGE:
                time.sleep(MIN_AGE - age)  # spacing kills, not synchronisation: see MIN_AGE
            assert pid in self.nsqd.child_pids(), f"{name} (pid {pid}) is not a child of the broker any more"
            probe = TimeoutProbe(self.nsqd.address, i) if name == "scanner" else None
            at = f"{self.ledger.done_share():.0%}"
            os.kill(pid, signal.SIGKILL)
            m = self.nsqd.wait_for_line(re.compile(rf"{name}: started \(pid (\d+)\)"), RESTART_DEADLINE, line + 1)
            lines = self.nsqd.output().splitlines()
            new_line = next(j for j in range(line + 1, len(lines)) if m.group(0) in lines[j])
            pids[name] = (int(m.group(1)), new_line, time.monotonic())
            self.kills.append((name, pid, at))
            if probe is not None:
                probe.check()
            if name == "acceptor":  # a new connection is accepted and served again
                Link(self.nsqd.address, identify_fields("after-acceptor")).sock.close()


def run_crash(nsqd, messages):
    t0 = time.monotonic()
    run = Run(nsqd.address, messages, seed=2)
    killer = Killer(nsqd, run.ledger, seed=2)
    run.start()
    killer.start()

    def killer_done():
        if killer.error is not None:
            raise Incomplete(f"killing the broker's children: {type(killer.error).__name__}: {killer.error}")
        return killer.finished.is_set()

    try:
        ledger = run.wait(nsqd, also=killer_done)
    finally:
        killer.abort.set()
        with run.ledger.progress:
            run.ledger.progress.notify_all()
        killer.join(RESTART_DEADLINE + PROBE_DEADLINE)
    out = nsqd.output()
    assert killer.error is None, killer.error
    assert [k[0].split()[0] for k in killer.kills].count("worker") == WORKER_KILLS, killer.kills
    assert len(re.findall(r"\(pid \d+\) died \(signal 9\); restarting", out)) == len(killer.kills), out[-20000:]
    assert not re.search(r"keeps dying|Traceback", out), out[-20000:]
    check_bodies_and_coverage(ledger)
    for i, p in sorted(ledger.producers.items()):
        assert p["done"], f"producer {i}: {p}"
    print(f"crash: {messages} messages in {time.monotonic() - t0:.1f}s, kills (name, pid, progress at the kill): "
          f"{killer.kills}\n{ledger.summary()}")


def run_stress(nsqd, messages):
    t0 = time.monotonic()
    run = Run(nsqd.address, messages, seed=1)
    run.start()
    ledger = run.wait(nsqd)
    out = nsqd.output()
    check_bodies_and_coverage(ledger)
    check_redeliveries_only(ledger)
    check_no_connection_failures(ledger)
    assert not re.search(r"died|Traceback", out), out[-20000:]
    print(f"stress: {messages} messages in {time.monotonic() - t0:.1f}s\n{ledger.summary()}")


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("scenario, messages", [
    pytest.param(run_stress, STRESS_MESSAGES, id="stress"),
    pytest.param(run_crash, CRASH_MESSAGES, id="crash"),
    pytest.param(run_stress, SOAK_MESSAGES, id="stress-soak", marks=pytest.mark.soak),
    pytest.param(run_crash, SOAK_MESSAGES, id="crash-soak", marks=pytest.mark.soak),
])
def test_broker_under_load(nsqd_factory, scenario, messages):
    scenario(nsqd_factory(workers=2), messages)
