"""Nothing is lost at capacity (issue 9, sections 1 and 3), against a real broker.

* 150,000 DPUBs (3 s delay) on one worker, every one answered OK, are all delivered: deferred messages wait in
  the deferred store, not in the 131,072-slot in-flight table (before, 18,928 were never delivered).
* 60 consumers at RDY 2500 that never FIN (more than the in-flight table holds), 200,000 published, all closed:
  one consumer then drains exactly 200,000 distinct messages (a full table is back-pressure, never loss).
* One message REQ'd for an hour while four times the topic's whole budget (memory + disk) is published and
  FIN'd: no publish fails (the held message is moved forward in the log instead of pinning it), and the held
  message is still there.
"""
from __future__ import annotations

import selectors
import socket
import time

from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT
from wire import Conn, consumer, unique

WAIT = 120.0
MIB = 1 << 20


class Bulk:
    """A fast reader of many frames on one connection (the Conn helpers keep one frame at a time)."""

    def __init__(self, conn):
        self.conn = conn
        self.pending = []

    def read(self, timeout):
        """One recv's worth of whole frames (heartbeats dropped; [] on a timeout or a partial frame); None when
        the connection closed."""
        self.conn.sock.settimeout(timeout)
        try:
            data = self.conn.sock.recv(4 << 20)
        except socket.timeout:
            return []
        if not data:
            return None
        return [f for f in self.conn.decoder.feed(data) if f != (FRAME_RESPONSE, HEARTBEAT)]


def pipelined(address, commands, batch=5000):
    """Send commands in batches, each batch's replies read before the next; every reply must be OK."""
    with Conn(address) as p:
        bulk = Bulk(p)
        for k in range(0, len(commands), batch):
            part = commands[k:k + batch]
            p.sock.sendall(b"".join(part))
            got = 0
            deadline = time.monotonic() + WAIT
            while got < len(part):
                frames = bulk.read(max(0.1, deadline - time.monotonic()))
                assert frames is not None and time.monotonic() < deadline, "the broker stopped answering"
                for f in frames:
                    assert f == (FRAME_RESPONSE, b"OK"), f"publish refused: {f!r:.200}"
                got += len(frames)


def drain_distinct(address, topic, channel, want, rdy=2500):
    """One consumer FINs everything until `want` distinct bodies arrived; -> (bodies seen, deliveries)."""
    c = consumer(address, topic, channel, rdy=rdy)
    bulk = Bulk(c)
    seen, deliveries = set(), 0
    deadline = time.monotonic() + WAIT
    while len(seen) < want:
        assert time.monotonic() < deadline, f"only {len(seen)} of {want} messages arrived"
        frames = bulk.read(5.0)
        assert frames is not None, "the broker closed the consumer"
        fins = []
        for kind, data in frames:
            assert kind == FRAME_MESSAGE, (kind, data[:200])
            m = C.decode_message(data)
            seen.add(m.body)
            deliveries += 1
            fins.append(C.fin(m.id))
        if fins:
            c.sock.sendall(b"".join(fins))
    c.send(C.pub(topic + "-sync", b"x"))  # a sync point: nothing else may come before its OK
    for kind, data in iter(lambda: c.next_frame(WAIT), None):
        if kind == FRAME_MESSAGE:
            seen.add(C.decode_message(data).body)
            deliveries += 1
            continue
        assert (kind, data) == (FRAME_RESPONSE, b"OK"), (kind, data)
        break
    c.close()
    return seen, deliveries


def test_150k_deferred_messages_on_one_worker_all_delivered(nsqd_factory):
    n = nsqd_factory(workers=1)
    topic = unique()
    consumer(n.address, topic, "ch").close()  # the channel exists before the messages arrive
    count = 150_000
    pipelined(n.address, [C.dpub(topic, 3000, b"%d" % i) for i in range(count)])
    seen, _ = drain_distinct(n.address, topic, "ch", count)
    assert seen == {b"%d" % i for i in range(count)}


def test_more_held_than_the_table_holds_then_all_closed_loses_nothing(nsqd_factory):
    n = nsqd_factory(workers=1)
    topic = unique()
    count = 200_000
    consumers = [consumer(n.address, topic, "ch", rdy=2500) for _ in range(60)]
    pipelined(n.address, [C.mpub(topic, [b"%d" % i for i in range(k, min(k + 1000, count))])
                          for k in range(0, count, 1000)], batch=20)
    # read (never FIN) until well over a hundred thousand are held: the 150,000 the consumers ask for are more
    # than the in-flight table's 131,072 slots, so the table fills and the channel waits on it
    held = 0
    sel = selectors.DefaultSelector()
    bulks = {}
    for c in consumers:
        sel.register(c.sock, selectors.EVENT_READ, c)
        bulks[c] = Bulk(c)
    deadline = time.monotonic() + WAIT
    while held < 120_000:
        assert time.monotonic() < deadline, f"only {held} messages were delivered"
        for key, _ in sel.select(1.0):
            frames = bulks[key.data].read(1.0)
            assert frames is not None
            held += sum(1 for f in frames if f[0] == FRAME_MESSAGE)
    sel.close()
    for c in consumers:
        c.close()
    seen, _ = drain_distinct(n.address, topic, "ch", count)
    assert seen == {b"%d" % i for i in range(count)}


def test_held_messages_do_not_pin_the_log(nsqd_factory):
    # budgets: --mem-queue-size 1 gives the smallest memory tier (two 8 MiB segments, a new one used only while
    # fewer than one message waits), and the disk budget is at least two segments: 32 MiB in all; four times
    # that flows through (and is FIN'd) while one message is REQ'd for an hour and another is held in flight by
    # a consumer with a long message timeout
    n = nsqd_factory("--mem-queue-size=1", f"--max-disk-bytes-per-topic={16 * MIB}", workers=2)
    topic = unique()
    deferred = consumer(n.address, topic, "ch", rdy=1)
    holder = Conn(n.address)
    holder.identify(msg_timeout=600_000)
    holder.subscribe(topic, "ch")
    with Conn(n.address) as p:
        p.publish(topic, b"deferred for an hour")
        m = deferred.read_message()
        deferred.send(C.req(m.id, 3600_000))
        deferred.send(C.rdy(0))
        deferred.publish(topic + "-sync", b"s")  # a sync point: the REQ and RDY 0 are done before what follows
        held_body = b"held in flight " + bytes(range(256)) * 400
        p.publish(topic, held_body)
        holder.send(C.rdy(1))
        held = holder.read_message()
        assert (held.body, held.attempts) == (held_body, 1)
        flow = consumer(n.address, topic, "ch", rdy=200)
        body = b"x" * (100 << 10)
        total, sent = 4 * 32 * MIB, 0
        bulk = Bulk(flow)
        while sent < total:
            p.send(C.mpub(topic, [body] * 20))
            p.expect_response(b"OK", timeout=WAIT)  # E_MPUB_FAILED here: a held message pinned the log
            sent += 20 * len(body)
            got, deadline = 0, time.monotonic() + WAIT
            while got < 20:
                assert time.monotonic() < deadline, "the flow consumer stopped getting messages"
                frames = bulk.read(1.0)
                assert frames is not None
                for kind, data in frames:
                    assert kind == FRAME_MESSAGE
                    msg = C.decode_message(data)
                    assert msg.body == body  # neither held message is part of this flow
                    flow.send(C.fin(msg.id))
                    got += 1
        flow.send(C.rdy(0))
        flow.publish(topic + "-sync", b"s")  # a sync point: the flow consumer takes nothing more
        flow.close()
    # the message held in flight was moved forward in the log several times: it comes back intact
    holder.send(C.req(held.id, 0))
    again = holder.read_message()
    assert (again.id, again.body, again.attempts) == (held.id, held_body, 2)
    holder.send(C.fin(again.id))
    holder.close()
    deferred.close()


def test_deferred_messages_survive_their_worker_killed(nsqd_factory):
    """DPUBs parked in the deferred store and REQs with a delay are all delivered after every worker is
    SIGKILLed (the store is shared memory; its replacement rebuilds the due-time heap), each exactly once."""
    from namespaces import kill_workers, log_on_failure
    n = nsqd_factory(workers=2)
    topic = unique()
    with log_on_failure(n):
        c = consumer(n.address, topic, "ch", rdy=100)
        pipelined(n.address, [C.dpub(topic, 4000, b"dpub%d" % i) for i in range(2000)])
        with Conn(n.address) as p:
            p.publish(topic, *[b"req%d" % i for i in range(50)])
        for m in c.read_messages(50):
            c.send(C.req(m.id, 4000))
        c.send(C.rdy(0))
        c.publish(topic + "-sync", b"s")  # the REQs are done: 2,050 deferred messages wait
        c.close()
        kill_workers(n)
        seen, deliveries = drain_distinct(n.address, topic, "ch", 2050)
        assert seen == {b"dpub%d" % i for i in range(2000)} | {b"req%d" % i for i in range(50)}
        assert deliveries == 2050


def test_stats_show_a_full_in_flight_table(nsqd_factory):
    """--max-in-flight-per-worker sets the table's size; /stats' memory section says when it is full and which
    channels it holds back."""
    from nsqpy.broker.stats import StatsReader
    n = nsqd_factory("--max-in-flight-per-worker=1000", workers=1)
    topic = unique()
    c = consumer(n.address, topic, "ch", rdy=2500)
    pipelined(n.address, [C.mpub(topic, [b"%d" % i for i in range(k, k + 100)]) for k in range(0, 1500, 100)])
    bulk, got = Bulk(c), 0
    deadline = time.monotonic() + WAIT
    while got < 1000:
        assert time.monotonic() < deadline, f"only {got} delivered"
        got += sum(1 for f in bulk.read(1.0) or [] if f[0] == FRAME_MESSAGE)
    reader = StatsReader.attach(n.data_path, n.node_id)
    try:
        deadline = time.monotonic() + WAIT
        while True:  # the capacity words are republished once a second: wait for them with fresh snapshots
            reader.refresh()
            w = reader.stats(include_mem=True)["memory"]["nsqpy_workers"][0]
            if w["channels_held_by_full_table"]:
                break
            assert time.monotonic() < deadline, w
        assert w == {"in_flight": 1000, "in_flight_capacity": 1000, "channels_held_by_full_table": 1,
                     "deferred": 0}
        ch = reader.stats(topic=topic)["topics"][0]["channels"][0]
        assert (ch["in_flight_count"], ch["depth"], ch["deferred_count"]) == (1000, 500, 0)
    finally:
        reader.close()
        c.close()
