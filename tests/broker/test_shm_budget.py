"""A full /dev/shm and a full data path: publishes fail cleanly, the broker lives, and nothing acknowledged is lost.

nsqd runs in a private mount namespace (``namespaces.namespaced_factory``: needs root, skips otherwise) with a
192 MiB tmpfs on /dev/shm (a two-worker broker's fixed segments take ~140 MiB of it) and a 64 MiB tmpfs on its
data path. Producers on several connections (the acceptor spreads them over both workers, so publishes are both
appended by owners and forwarded) publish PUBs and MPUBs of 64 KiB messages round-robin over ``TOPICS`` topics
until storage runs out: until rounds covering every topic get no OK at all.

What must hold:
* every publish is answered within ``WAIT``: OK, or E_PUB_FAILED / E_MPUB_FAILED (fatal in NSQ, so the broker
  then closes that connection and the producer opens a new one); a connection never closes without an error
  frame, and no other error is acceptable;
* a consumer subscribed from the start on a probe topic gets every probe message that was answered OK, while
  the others fill up;
* the broker never exits and none of its processes dies; it never logs "giving up";
* afterwards every message answered OK is delivered, byte for byte (bodies carry unique sequence numbers and a
  pattern derived from them), and once everything is consumed a new topic can be published to and read again.
"""
from __future__ import annotations

import select
import time

import pytest

from namespaces import log_on_failure, namespaced_factory, worker_pids, worker_serving
from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT
from wire import Conn, unique

KIB, MIB = 1 << 10, 1 << 20
TOPICS = 12            # today the 7th new topic kills the broker at this /dev/shm size
PRODUCERS = 6
MSG = 64 * KIB
MPUB_N = 8
ATTEMPT_CAP = 1 << 30  # stop publishing after this many bytes even if storage never ran out
WAIT = 45.0           # for a reply or a message; under the broker's 60 s read timeout, so that a missing reply
                      # fails as such rather than as a connection the broker closed for being idle
FAIL_CODES = {"PUB": b"E_PUB_FAILED", "MPUB": b"E_MPUB_FAILED"}


@pytest.fixture
def ns_factory(nsqd_factory, tmp_path):
    started = []
    yield namespaced_factory(nsqd_factory, tmp_path, started, shm_size="192m", data_size="64m")
    nsqd_factory.__globals__["_stop_all"](started)


def make_body(seq, size=MSG):
    head = b"seq=%010d;" % seq
    return (head * (size // len(head) + 1))[:size]


def seq_of(body):
    assert body.startswith(b"seq="), body[:20]
    return int(body[4:14])


class Producer:
    """One connection with at most one command unanswered (so that a fatal error frame is never lost to a reset
    caused by unread commands behind it)."""

    def __init__(self, address):
        self.address = address
        self.conn = None
        self.pending = None
        self.reconnects = 0

    def connect(self):
        if self.conn is None:
            self.conn = Conn(self.address)
            self.conn.identify(client_id="filler")
            self.reconnects += 1
        return self.conn

    def send(self, topic, kind, seqs, size=MSG):
        self.connect()
        bodies = [make_body(s, size) for s in seqs]
        self.conn.sock.settimeout(WAIT)
        self.conn.send(C.pub(topic, bodies[0]) if kind == "PUB" else C.mpub(topic, bodies))
        self.pending = (topic, kind, seqs)

    def reply(self):
        """-> (topic, seqs, True if answered OK, False if refused with the command's *_FAILED error)."""
        topic, kind, seqs = self.pending
        self.pending = None
        try:
            frame = self.conn.next_frame(timeout=WAIT)
        except AssertionError:
            raise AssertionError(f"{kind} {topic}: no reply within {WAIT:.0f}s (the broker hangs)") from None
        assert frame is not None, f"{kind} {topic}: the broker closed the connection without an error frame"
        if frame == (FRAME_RESPONSE, b"OK"):
            return topic, seqs, True
        assert frame[0] == FRAME_ERROR and frame[1].split(b" ", 1)[0] == FAIL_CODES[kind], (
            f"{kind} {topic}: expected OK or {FAIL_CODES[kind].decode()}, got {frame!r:.300}")
        self.conn.expect_closed(WAIT)  # a fatal error: the broker closes the connection after it
        self.conn.close()
        self.conn = None
        return topic, seqs, False

    def close(self):
        if self.conn is not None:
            self.conn.close()


def read_probe(probe, want, seen, wait=WAIT, must=True):
    """Read the probe consumer's messages (answering heartbeats: it may wait long between commands) until every
    seq in ``want`` arrived, FINning them; with ``must=False`` whatever arrives within ``wait``."""
    deadline = time.monotonic() + wait
    while not want <= seen:
        left = deadline - time.monotonic()
        if left <= 0 and not must:
            return
        assert left > 0, (f"probe messages answered OK were not delivered within {wait:.0f}s after the other "
                          f"topics were consumed: seqs {sorted(want - seen)}")
        try:
            frame = probe.next_frame(timeout=left, heartbeats=True)
        except AssertionError:
            continue
        assert frame is not None, "the broker closed the probe consumer's connection"
        if frame == (FRAME_RESPONSE, HEARTBEAT):
            probe.send(C.nop())
            continue
        assert frame[0] == FRAME_MESSAGE, f"probe consumer: expected a message, got {frame!r:.300}"
        m = C.decode_message(frame[1])
        seen.add(seq_of(m.body))
        probe.send(C.fin(m.id))


def drain_all(address, wants, rdy=200):
    """Consume every topic at once, as an operator's consumers would, until every seq in ``wants[topic]`` arrived
    (FINning all); bodies must be intact. All at once because a publish forwarded by the other worker may wait in
    the ring behind another full topic's records until that topic's consumer frees room."""
    conns = {}
    seen = {t: set() for t in wants}
    try:
        for t in wants:
            conns[t] = Conn(address)
            conns[t].subscribe(t, "ch", rdy=rdy)
        by_sock = {c.sock: t for t, c in conns.items()}
        deadline = time.monotonic() + 3 * WAIT
        while any(not wants[t] <= seen[t] for t in wants):
            left = deadline - time.monotonic()
            missing = {t: len(wants[t] - seen[t]) for t in wants if not wants[t] <= seen[t]}
            assert left > 0, f"messages answered OK never arrived: {missing} (topic: how many)"
            ready, _, _ = select.select(list(by_sock), [], [], min(left, 1.0))
            for sock in ready:
                t = by_sock[sock]
                c = conns[t]
                c._fill(time.monotonic() + WAIT)  # readable: one recv, then every whole frame it completed
                assert not c.eof, f"{t}: the broker closed the consumer's connection"
                while c.frames:
                    frame = c.frames.pop(0)
                    if frame == (FRAME_RESPONSE, HEARTBEAT):
                        c.send(C.nop())
                        continue
                    assert frame[0] == FRAME_MESSAGE, f"{t}: expected a message, got {frame!r:.300}"
                    m = C.decode_message(frame[1])
                    q = seq_of(m.body)
                    assert m.body == make_body(q, len(m.body)), f"{t}: the body of seq {q} arrived altered"
                    seen[t].add(q)
                    c.send(C.fin(m.id))
        for t, c in conns.items():  # a sync point per consumer: its FINs were taken (a TOUCH of no message is
            c.send(C.touch(b"0" * 16))  # answered in order, and needs no storage, which may still be full)
            while (frame := c.expect_frame(WAIT))[0] == FRAME_MESSAGE:  # redeliveries (at least once): FIN them
                c.send(C.fin(C.decode_message(frame[1]).id))
            assert frame[0] == FRAME_ERROR and frame[1].startswith(b"E_TOUCH_FAILED"), frame
    finally:
        for c in conns.values():
            c.close()


def test_full_shm_and_data_path(ns_factory):
    nsqd = ns_factory()
    addr = nsqd.address
    prefix = unique("full")
    topics = [f"{prefix}-{i}" for i in range(TOPICS)]
    probe_topic = prefix + "-probe"
    acked = {t: set() for t in topics}
    refused = attempted = 0
    probe_acked, probe_seen = set(), set()
    seq = 0
    producers = [Producer(addr) for _ in range(PRODUCERS)]
    probe_producer = Producer(addr)
    with log_on_failure(nsqd), Conn(addr) as probe:
        probe.subscribe(probe_topic, "ch", rdy=100)
        serving = {worker_serving(nsqd, p.connect()) for p in producers}
        assert serving == set(worker_pids(nsqd)), f"the producers' connections are all on {serving}"
        try:
            rounds = quiet_rounds = 0
            need_quiet = -(-TOPICS // PRODUCERS) + 1   # rounds without an OK that cover every topic, and one more
            while quiet_rounds < need_quiet and attempted < ATTEMPT_CAP:
                for i, p in enumerate(producers):
                    kind = "PUB" if (rounds + i) % 2 else "MPUB"
                    n = 1 if kind == "PUB" else MPUB_N
                    p.send(topics[(rounds * PRODUCERS + i) % TOPICS], kind, list(range(seq, seq + n)))
                    seq += n
                    attempted += n * MSG
                probe_producer.send(probe_topic, "PUB", [seq], size=100)  # small: consuming it frees ~nothing
                seq += 1
                oks = 0
                for p in producers:
                    topic, seqs, ok = p.reply()
                    if ok:
                        acked[topic].update(seqs)
                        oks += 1
                    else:
                        refused += 1
                _, [s], ok = probe_producer.reply()
                if ok:
                    probe_acked.add(s)
                # the probe topic is served all along, but a probe forwarded from the other worker may wait in the
                # ring behind a full topic's records (acknowledged, so kept) until space comes back: collected
                # here, required once the full topics were consumed
                read_probe(probe, probe_acked, probe_seen, wait=0.2, must=False)
                quiet_rounds = 0 if oks else quiet_rounds + 1
                rounds += 1
        finally:
            for p in producers + [probe_producer]:
                p.close()
        usage = nsqd.usage()
        report = (f"{rounds} rounds, {attempted / MIB:.0f} MiB attempted, "
                  f"{sum(map(len, acked.values())) * MSG / MIB:.0f} MiB answered OK, {refused} refused; "
                  f"probe {len(probe_acked)} OK; /dev/shm {usage['shm'][0] / MIB:.0f}/{usage['shm'][1] / MIB:.0f} "
                  f"MiB, data path {usage['data'][0] / MIB:.0f}/{usage['data'][1] / MIB:.0f} MiB used")
        print(report)
        assert nsqd.proc.poll() is None, f"nsqd exited with {nsqd.proc.returncode}; {report}"
        assert refused, f"storage never ran out: {report}"
        with Conn(addr) as c:  # new connections are served
            assert c.identify(feature_negotiation=True)["max_rdy_count"] > 0

        drain_all(addr, {t: acked[t] for t in topics})  # every message answered OK is delivered
        read_probe(probe, probe_acked, probe_seen)

        # storage is free again once everything was consumed: a new topic takes messages and delivers them
        fresh = prefix + "-after"
        deadline = time.monotonic() + WAIT
        while True:
            with Conn(addr) as p:
                p.send(C.pub(fresh, make_body(seq, 100)))
                frame = p.expect_frame(WAIT)
            if frame == (FRAME_RESPONSE, b"OK"):
                break
            assert frame[0] == FRAME_ERROR and frame[1].startswith(b"E_PUB_FAILED"), frame
            assert time.monotonic() < deadline, f"publishing still fails {WAIT:.0f}s after everything was consumed"
            time.sleep(0.25)  # paced retry while consumed segments are reclaimed
        drain_all(addr, {fresh: {seq}})
        out = nsqd.output()
        assert nsqd.proc.poll() is None and "giving up" not in out
        assert " died (" not in out, "a process of the broker died"
