"""Max attempts with a dead-letter topic, and message TTL (issue 49), on a real nsqd with real clients: the pynsq
Reader (0.9.1) and the suite's raw V2 client (tests/broker/wire.py).

The policies come from nsqd's flags (``--max-attempts``, ``--message-ttl``; the dead-letter topic is the topic's
name + ``.dead``). Topics are chosen so that the dead-letter topic is owned by another worker than its topic (the
dead letters then go through the rings, ``Forwarder.commit``'s forward). Every "nothing more arrives" ends with a
sync point: a fresh message published to the same topic, whose delivery to the same consumer orders the stream
(a requeued message waits behind nothing published after it came back, so it would have come first).
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import threading
import time
import urllib.request
import zlib

import pytest

from nsqpy.protocol import client as C
from nsqpy.protocol.dead_letter import decode
from nsqpy.protocol.frames import FRAME_MESSAGE
import namespaces
from namespaces import kill_workers, log_on_failure
from test_pynsq import PynsqLoop
from wire import Conn, consumer, producer, unique

WAIT = 60.0


def owner(name, workers):
    return zlib.crc32(name.encode()) % workers


def topic_apart(workers, prefix="dl"):
    """A fresh topic name whose dead-letter topic (name + .dead) another worker owns."""
    while True:
        t = unique(prefix)
        if owner(t, workers) != owner(t + ".dead", workers):
            return t


def stats(nsqd, topic):
    host, port = nsqd.http_address
    with urllib.request.urlopen(f"http://{host}:{port}/stats?format=json&topic={topic}", timeout=30) as r:
        doc = json.loads(r.read())
    return {t["topic_name"]: t for t in doc.get("topics") or []}


def channel_stats(nsqd, topic, channel):
    [ch] = [c for c in stats(nsqd, topic)[topic]["channels"] if c["channel_name"] == channel]
    return ch


@pytest.mark.parametrize("workers", [2, 3])
def test_a_message_reqd_three_times_arrives_on_the_dead_letter_topic_once(nsqd_factory, workers):
    nsqd = nsqd_factory("--max-attempts=3", workers=workers)
    topic = topic_apart(workers)
    loop = PynsqLoop(nsqd.address)
    seen, dead = [], []

    def handle(message):
        seen.append((message.body, message.attempts, message.id, message.timestamp))
        if message.body == b"poison":
            message.requeue(backoff=False, delay=0)
        return True

    def handle_dead(message):
        dead.append(message.body)
        return True

    try:
        with log_on_failure(nsqd):
            r = loop.reader(topic, "c", handle, max_tries=0, max_in_flight=5)
            rd = loop.reader(topic + ".dead", "dlq", handle_dead, max_in_flight=5)
            loop.subscribed(r, rd)
            w = loop.writer()
            loop.publish(w, "pub", topic, b"poison")
            loop.published(1)
            loop.run_until(lambda: dead, timeout=WAIT, what="the dead letter")
            loop.publish(w, "pub", topic, b"sync")  # the sync point: its delivery orders the stream
            loop.run_until(lambda: any(b == b"sync" for b, *_ in seen), timeout=WAIT, what="the sync message")
            poison = [(a, i, ts) for b, a, i, ts in seen if b == b"poison"]
            assert [a for a, _, _ in poison] == [1, 2, 3]  # delivered 3 times, never a 4th
            [(msg_id, ts)] = {(i, t) for _, i, t in poison}
            [letter] = dead
            header, body = decode(letter)
            assert body == b"poison"
            assert header == {"topic": topic, "channel": "c", "attempts": 3, "timestamp": ts, "reason": "max_attempts",
                              "id": msg_id.decode() if isinstance(msg_id, bytes) else msg_id}
            assert loop.barrier(rd) == [] and dead == [letter]  # nothing else reached the dead-letter topic
            assert loop.barrier(r) == []  # the REQs were answered as NSQ answers them: with nothing
    finally:
        loop.close()


def _serve(handlers, until, deadline):
    """Read the connections' messages, each handed to its handler (msg -> the command to answer with), until
    ``until()`` holds (-> True) or a connection closes (-> False). Waits on the sockets, never sleeps."""
    while not until():
        assert time.monotonic() < deadline, "did not settle"
        ready = {c.sock for c in handlers if c.frames} or set(select.select([c.sock for c in handlers], [], [], 0.5)[0])
        for c, handle in handlers.items():
            if c.sock not in ready:
                continue
            try:
                frame = c.next_frame(timeout=1.0)
            except AssertionError:
                continue  # a heartbeat, or a frame not whole yet
            if frame is None:
                return False
            if frame[0] == FRAME_MESSAGE:
                reply = handle(C.decode_message(frame[1]))
                if reply is not None:
                    c.send(reply)
    return True


def test_a_worker_sigkill_mid_way_loses_no_message(nsqd_factory):
    """Odd messages are REQ'd at every delivery (dead at their 2nd), even ones REQ'd once then FINed; all workers
    are SIGKILLed mid-way: every message acknowledged to the producer ends FINed or on the dead-letter topic, and
    none that reached the dead-letter topic is delivered to its channel again."""
    nsqd = nsqd_factory("--max-attempts=2", workers=2)
    topic = topic_apart(2)
    n = 120
    bodies = [b"m%03d" % i for i in range(n)]
    fined, dead, again, answered = set(), set(), [], [0]

    def on_message(msg):
        answered[0] += 1
        if msg.body in dead:
            again.append(msg.body)
        if msg.body == b"sync":
            fined.add(msg.body)
            return C.fin(msg.id)
        if int(msg.body[1:]) % 2 == 1 or msg.attempts < 2:
            return C.req(msg.id, 0)
        fined.add(msg.body)
        return C.fin(msg.id)

    def on_dead(msg):
        header, body = decode(msg.body)
        assert header["topic"] == topic and header["attempts"] >= 2 and header["reason"] == "max_attempts"
        dead.add(body)
        return C.fin(msg.id)

    def connect():
        return {consumer(nsqd.address, topic, "c", rdy=10): on_message,
                consumer(nsqd.address, topic + ".dead", "dlq", rdy=50): on_dead}

    def close(conns):
        for c in conns:
            c.close()

    deadline = time.monotonic() + 2 * WAIT
    with log_on_failure(nsqd):
        conns = connect()
        producer(nsqd.address, topic, *bodies)  # each answered OK: acknowledged
        _serve(conns, lambda: answered[0] >= n + n // 3 and dead, deadline)  # some dead-lettered, most not yet
        kill_workers(nsqd)
        close(conns)
        done = False
        while not done:  # until every message is FINed or dead-lettered (reconnecting after the kill)
            conns = connect()
            done = _serve(conns, lambda: fined | dead >= set(bodies), deadline)
            if not done:
                close(conns)
        producer(nsqd.address, topic, b"sync")  # the sync point: what the channel still held comes before it
        assert _serve(conns, lambda: b"sync" in fined, deadline)
        close(conns)
        assert dead <= {b for i, b in enumerate(bodies) if i % 2 == 1}  # FINed ones are never dead-lettered
        assert again == []  # dead-lettered ones never come back to the channel


def _wait_past(ns):
    """Until the clock passed ``ns`` (time.time_ns()): the condition TTL tests wait for."""
    while time.time_ns() <= ns:
        threading.Event().wait((ns - time.time_ns()) / 1e9 + 0.001)


def test_messages_past_their_ttl_go_to_the_dead_letter_topic_and_are_never_delivered(nsqd_factory):
    nsqd = nsqd_factory("--message-ttl=300ms", "--max-attempts=5", workers=2)
    topic = topic_apart(2)
    with log_on_failure(nsqd):
        c = consumer(nsqd.address, topic, "c", rdy=0)  # the channel exists; nothing is delivered yet
        dlq = consumer(nsqd.address, topic + ".dead", "dlq", rdy=50)
        start = time.time_ns()
        bodies = [b"old%02d" % i for i in range(20)]
        producer(nsqd.address, topic, *bodies)
        _wait_past(time.time_ns() + 300 * 10**6)
        c.send(C.rdy(50))
        letters = [decode(m.body) for m in dlq.read_messages(20, WAIT)]
        assert sorted(b for _, b in letters) == bodies
        assert all(h["reason"] == "ttl" and h["attempts"] == 0 and h["channel"] == "c" and
                   start <= h["timestamp"] <= time.time_ns() for h, _ in letters)
        producer(nsqd.address, topic, b"fresh")  # the sync point: delivered, and nothing before it
        msg = c.read_message(WAIT)
        assert msg.body == b"fresh" and msg.attempts == 1
        ch = channel_stats(nsqd, topic, "c")
        assert ch.get("expired_count") == 20 and ch.get("dead_lettered_count") == 20, ch
        assert ch["depth"] == 0 and ch["in_flight_count"] == 1
        c.close()
        dlq.close()


def test_deferred_messages_past_their_ttl_when_due_go_to_the_dead_letter_topic(nsqd_factory):
    """A DPUB due after the TTL, and a message REQ'd with a delay past it: neither is delivered again."""
    nsqd = nsqd_factory("--message-ttl=400ms", "--max-attempts=5", workers=2)
    topic = topic_apart(2)
    with log_on_failure(nsqd):
        dlq = consumer(nsqd.address, topic + ".dead", "dlq", rdy=10)
        c = consumer(nsqd.address, topic, "c", rdy=10)
        with Conn(nsqd.address) as p:
            p.send(C.dpub(topic, 800, b"deferred"))
            p.expect_response(b"OK")
        producer(nsqd.address, topic, b"reqd")
        msg = c.read_message(WAIT)
        assert msg.body == b"reqd"
        c.send(C.req(msg.id, 800))
        letters = {body: header for header, body in (decode(m.body) for m in dlq.read_messages(2, WAIT))}
        assert letters[b"deferred"]["attempts"] == 0 and letters[b"reqd"]["attempts"] == 1
        assert {h["reason"] for h in letters.values()} == {"ttl"}
        producer(nsqd.address, topic, b"fresh")  # the sync point: delivered, and nothing before it
        assert c.read_message(WAIT).body == b"fresh"
        c.close()
        dlq.close()


def test_messages_past_their_ttl_without_a_dead_letter_topic_are_dropped_and_counted(nsqd_factory):
    nsqd = nsqd_factory("--message-ttl=300ms", workers=2)
    topic = unique("ttl")
    with log_on_failure(nsqd):
        c = consumer(nsqd.address, topic, "c", rdy=0)
        producer(nsqd.address, topic, *[b"old%02d" % i for i in range(20)])
        _wait_past(time.time_ns() + 300 * 10**6)
        c.send(C.rdy(50))
        producer(nsqd.address, topic, b"fresh")
        assert c.read_message(WAIT).body == b"fresh"  # the sync point: nothing came before it
        ch = channel_stats(nsqd, topic, "c")
        assert ch.get("expired_count") == 20 and ch.get("dead_lettered_count", 0) == 0, ch
        assert ch["depth"] == 0
        assert topic + ".dead" not in stats(nsqd, topic + ".dead")
        c.close()


def test_without_policies_a_message_is_requeued_for_ever_as_in_nsq(nsqd_factory):
    nsqd = nsqd_factory(workers=2)
    topic = unique("plain")
    with log_on_failure(nsqd):
        c = consumer(nsqd.address, topic, "c", rdy=1)
        producer(nsqd.address, topic, b"m")
        for attempt in range(1, 7):
            msg = c.read_message(WAIT)
            assert (msg.body, msg.attempts) == (b"m", attempt)
            c.send(C.req(msg.id, 0))
        msg = c.read_message(WAIT)
        c.send(C.fin(msg.id))
        c.sync()
        assert topic + ".dead" not in stats(nsqd, topic + ".dead")
        ch = channel_stats(nsqd, topic, "c")
        assert ch["requeue_count"] == 6 and not ch.get("dead_lettered_count") and not ch.get("expired_count")
        c.close()


def test_dead_letters_parked_when_their_worker_dies_are_sent_again_by_its_replacement(nsqd_factory):
    """The dead-letter topic's owner is stopped (SIGSTOP), so the ring to it fills and the source worker's dead
    letters wait as parked publishes, their messages held and marked in the in-flight table; then the source
    worker is SIGKILLed (the parked publishes die with it) and the owner continued: the replacement's recovery
    sends every marked message to the dead-letter topic again, and none of them to the channel."""
    nsqd = nsqd_factory("--max-attempts=1", "--ring-budget=1048576", "--log-level=debug", workers=2)
    topic = topic_apart(2)
    source, dead_owner = f"worker {owner(topic, 2)}", f"worker {owner(topic + '.dead', 2)}"
    n = 60
    bodies = [b"%03d" % i + b"x" * (16 << 10) for i in range(n)]  # 16 KiB: forwarded in the ring, not by file
    with log_on_failure(nsqd):
        consumer(nsqd.address, topic + ".dead", "dlq", rdy=0).close()  # the channel keeps what arrives
        producer(nsqd.address, topic, *bodies)
        c = consumer(nsqd.address, topic, "c", rdy=n)
        msgs = c.read_messages(n, WAIT)
        stopped = namespaces.worker_pids(nsqd)[dead_owner][0]
        os.kill(stopped, signal.SIGSTOP)
        try:
            mark = len(nsqd.lines)
            for m in msgs:  # one REQ per loop iteration of the source worker: one dead-letter publish each
                c.send(C.req(m.id, 0) + C.fin(b"0" * 16))
                c.expect_error("E_FIN_FAILED")  # answered after the REQ's dead-letter pass
            nsqd.wait_for_line(re.compile(rf"{source}: {dead_owner} is behind: publishes to it wait"), WAIT, mark)
            c.close()
            kill_workers(nsqd, [source])
        finally:
            os.kill(stopped, signal.SIGCONT)
        got = set()
        with consumer(nsqd.address, topic + ".dead", "dlq", rdy=n) as dlq:
            while len(got) < n:
                msg = dlq.read_message(WAIT)
                header, body = decode(msg.body)
                assert header["attempts"] == 1 and header["reason"] == "max_attempts"
                got.add(body)
                dlq.send(C.fin(msg.id))
        assert got == set(bodies)
        with consumer(nsqd.address, topic, "c", rdy=n) as c:
            producer(nsqd.address, topic, b"fresh")  # the sync point: nothing of the channel comes before it
            assert c.read_message(WAIT).body == b"fresh"
