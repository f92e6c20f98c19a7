"""Bounded channels (issue 49: ``--max-channel-depth`` / ``--max-channel-bytes`` with ``--channel-overflow``) on a
real nsqd, with raw V2 connections (tests/broker/wire.py), the real pynsq Writer and HTTP.

Every test has a channel without consumers (made with /channel/create), so that nothing drains until the test
says so, and producers on every worker (``connections_on_every_worker``): the owner's own publishes and the
forwards of the other workers (2 and 3 workers) both meet the bound. Where a count must be exact after publishes
from other workers, a fresh /stats is the sync point: the owner appends what is in its rings first (and marks
the topic once a channel is at its limit) before it answers.
"""
from __future__ import annotations

import json
import select
import time
import urllib.error
import urllib.request
import zlib

import pytest

from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_RESPONSE
from namespaces import connections_on_every_worker, kill_workers, log_on_failure
from test_pynsq import PynsqLoop
from wire import Conn, consumer, unique

LIMIT = 5


def http(nsqd, method, path, body=None, timeout=30):
    host, port = nsqd.http_address
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def channel_stats(nsqd, topic, channel="c"):
    status, body = http(nsqd, "GET", f"/stats?format=json&topic={topic}")
    assert status == 200, body
    [t] = [t for t in json.loads(body)["topics"] if t["topic_name"] == topic]
    [ch] = [c for c in t["channels"] if c["channel_name"] == channel]
    return ch


def topic_depth(nsqd, topic, channel="c"):
    """The channel's depth, or None while /stats does not show it (e.g. just after a worker restart)."""
    status, body = http(nsqd, "GET", f"/stats?format=json&topic={topic}")
    for t in (json.loads(body).get("topics") or []) if status == 200 else []:
        for c in t["channels"] if t["topic_name"] == topic else []:
            if c["channel_name"] == channel:
                return c["depth"]
    return None


def make_channel(nsqd, topic, channel="c"):
    assert http(nsqd, "POST", f"/topic/create?topic={topic}") == (200, b"")
    assert http(nsqd, "POST", f"/channel/create?topic={topic}&channel={channel}") == (200, b"")


def producers(nsqd):
    """{"worker N": connection} with one producer connection on every worker."""
    def connect():
        c = Conn(nsqd.address)
        c.sync()
        return c
    return connections_on_every_worker(nsqd, connect)


def oks_so_far(conn):
    """The OKs already arrived on conn (read without waiting for more)."""
    n = 0
    while select.select([conn.sock], [], [], 0)[0]:
        data = conn.sock.recv(1 << 16)
        if not data:
            break
        conn.frames.extend(conn.decoder.feed(data))
    while conn.frames:
        assert conn.frames.pop(0) == (FRAME_RESPONSE, b"OK")
        n += 1
    return n


def bounded(nsqd_factory, overflow, workers=2, prefix="t"):
    """A broker whose channels have max_depth LIMIT and this overflow, and a fresh topic with channel c."""
    nsqd = nsqd_factory(f"--max-channel-depth={LIMIT}", f"--channel-overflow={overflow}", workers=workers)
    topic = unique(prefix)
    make_channel(nsqd, topic)
    return nsqd, topic


def bodies(n, tag="m"):
    return [b"%s%03d" % (tag.encode(), i) for i in range(n)]


@pytest.mark.parametrize("workers", [2, 3])
def test_reject_refuses_every_publish_over_the_limit_naming_the_channel(nsqd_factory, workers):
    nsqd, topic = bounded(nsqd_factory, "reject", workers, "rj")
    with log_on_failure(nsqd):
        conns = producers(nsqd)
        first = next(iter(conns.values()))
        first.publish(topic, *bodies(LIMIT))
        assert channel_stats(nsqd, topic)["depth"] == LIMIT  # exactly at the limit: all taken
        why = f"channel {topic}:c is full (max_depth {LIMIT})"
        for name, c in conns.items():  # the owner's own sessions and the senders alike, PUB and MPUB
            c.send(C.pub(topic, b"over"))
            c.expect_fatal("E_PUB_FAILED", f"E_PUB_FAILED PUB failed {why}")
        for c in producers(nsqd).values():
            c.send(C.mpub(topic, [b"x", b"y"]))
            c.expect_fatal("E_MPUB_FAILED", f"E_MPUB_FAILED MPUB failed {why}")
        for c in producers(nsqd).values():
            c.send(C.dpub(topic, 10, b"later"))
            c.expect_fatal("E_DPUB_FAILED", f"E_DPUB_FAILED DPUB failed {why}")
        assert http(nsqd, "POST", f"/pub?topic={topic}", b"h") == (503, b'{"message":"CHANNEL_FULL"}')
        assert http(nsqd, "POST", f"/mpub?topic={topic}", b"h1\nh2") == (503, b'{"message":"CHANNEL_FULL"}')
        assert channel_stats(nsqd, topic)["depth"] == LIMIT
        # a consumer takes them: the owner clears the mark, and publishes from every worker are taken again
        c = consumer(nsqd.address, topic, "c", rdy=100)
        got = c.read_messages(LIMIT)
        assert [m.body for m in got] == bodies(LIMIT)
        for m in got:
            c.send(C.fin(m.id))
        assert channel_stats(nsqd, topic)["depth"] == 0  # (sync point: the owner went through its idle step)
        for name, p in producers(nsqd).items():
            p.publish(topic, name.encode())
        assert sorted(m.body for m in c.read_messages(workers)) == sorted(n.encode() for n in conns)
        c.sync()
        c.close()


@pytest.mark.parametrize("workers", [2, 3])
def test_drop_oldest_keeps_the_newest_and_counts_the_drops(nsqd_factory, workers):
    nsqd, topic = bounded(nsqd_factory, "drop_oldest", workers, "do")
    with log_on_failure(nsqd):
        conns = list(producers(nsqd).values())
        sent = []
        for i, p in enumerate(conns):  # in turn, each answered before the next: one order for the topic
            batch = bodies(4, f"p{i}-")
            p.publish(topic, *batch[:2])
            p.send(C.mpub(topic, batch[2:]))
            p.expect_response(b"OK")
            sent += batch
        st = channel_stats(nsqd, topic)
        assert st["depth"] == LIMIT and st["message_count"] == len(sent)
        assert st["dropped_count"] == len(sent) - LIMIT
        c = consumer(nsqd.address, topic, "c", rdy=100)
        assert [m.body for m in c.read_messages(LIMIT)] == sent[-LIMIT:]
        assert c.read_until_settled() == []  # the dropped ones never come
        c.close()


@pytest.mark.parametrize("workers", [2, 3])
def test_block_stalls_producers_until_a_consumer_drains_and_loses_nothing(nsqd_factory, workers):
    nsqd, topic = bounded(nsqd_factory, "block", workers, "bl")
    n = 4 * LIMIT
    with log_on_failure(nsqd):
        conns = producers(nsqd)
        sent = {name: bodies(2 * n, name.replace(" ", "")) for name in conns}
        for name, p in conns.items():  # every producer sends n PUBs at once, reading no reply yet
            p.send(*(C.pub(topic, b) for b in sent[name][:n]))
        total = 2 * n * len(conns)
        # the channel reaches its limit: more by what other workers forwarded before the owner marked the topic
        deadline = time.monotonic() + 60
        while (depth := channel_stats(nsqd, topic)["depth"]) < LIMIT:
            assert time.monotonic() < deadline, f"depth {depth}"
        for name, p in conns.items():  # now the mark is up: n more each, none of which may be taken
            p.send(*(C.pub(topic, b) for b in sent[name][n:]))
        with Conn(nsqd.address) as other:  # a sync point: another topic's publish is answered meanwhile
            other.publish(unique("free"), b"x")
        held_depth = channel_stats(nsqd, topic)["depth"]
        oks = {name: oks_so_far(p) for name, p in conns.items()}
        assert sum(oks.values()) == held_depth  # every OK is a message in the channel: nothing refused
        assert all(k <= n for k in oks.values()), oks  # none of the second round: every producer stalls
        assert channel_stats(nsqd, topic)["depth"] == held_depth  # nothing more went in
        print(f"block: held at depth {held_depth} with max_depth {LIMIT}, {workers} workers, OKs {oks}")
        # a consumer drains: every producer completes, each message once, in order per producer
        c = consumer(nsqd.address, topic, "c", rdy=2 * LIMIT)
        got = []
        while len(got) < total:
            m = c.read_message(timeout=60)
            got.append(m.body)
            c.send(C.fin(m.id))
        for name, p in conns.items():
            for _ in range(2 * n - oks[name]):
                p.expect_response(b"OK", timeout=60)
            p.sync()
            mine = set(sent[name])
            assert [b for b in got if b in mine] == sent[name]
        assert len(set(got)) == total
        assert c.read_until_settled() == []
        c.close()


def test_block_over_http_waits_then_503(nsqd_factory):
    nsqd = nsqd_factory(f"--max-channel-depth={LIMIT}")
    topic = unique("bh")
    with log_on_failure(nsqd):
        make_channel(nsqd, topic)
        for b in bodies(LIMIT):
            assert http(nsqd, "POST", f"/pub?topic={topic}", b) == (200, b"OK")
        assert channel_stats(nsqd, topic)["depth"] == LIMIT
        started = time.monotonic()
        assert http(nsqd, "POST", f"/pub?topic={topic}", b"late") == (503, b'{"message":"CHANNEL_FULL"}')
        assert time.monotonic() - started >= 4.5  # it waited (5 s) for the channel to drain
        assert channel_stats(nsqd, topic)["depth"] == LIMIT


def test_block_with_pynsq_writer_completes_once_drained(nsqd_factory):
    nsqd = nsqd_factory(f"--max-channel-depth={LIMIT}")
    topic = unique("bp")
    loop = PynsqLoop(nsqd.address)
    with log_on_failure(nsqd):
        make_channel(nsqd, topic)
        w = loop.writer()
        msgs = bodies(3 * LIMIT)
        for b in msgs[:LIMIT]:
            loop.publish(w, "pub", topic, b)
        loop.published(LIMIT)  # exactly at the limit: taken
        assert channel_stats(nsqd, topic)["depth"] == LIMIT  # (the owner appended them, and marked the topic)
        for b in msgs[LIMIT:]:
            loop.publish(w, "pub", topic, b)
        checks = []

        def synced():  # the second check, after the loop ran a while: a sync point on another connection
            checks.append(1)
            if len(checks) < 2:
                return False
            with Conn(nsqd.address) as other:
                other.publish(unique("free"), b"x")
            return True

        loop.run_until(synced, what="the sync point")
        assert loop.replies == [b"OK"] * LIMIT  # the writer's later publishes wait
        assert channel_stats(nsqd, topic)["depth"] == LIMIT
        got = []

        def handle(message):
            got.append(message.body)
            return True

        r = loop.reader(topic, "c", handle, max_in_flight=LIMIT)
        loop.subscribed(r)
        loop.published(len(msgs))  # every publish answered OK, none failed
        loop.run_until(lambda: len(got) == len(msgs), timeout=60, what="every message")
        assert got == msgs
        loop.close()


@pytest.mark.parametrize("overflow", ["block", "reject", "drop_oldest"])
def test_a_worker_sigkill_and_a_clean_restart_lose_nothing_acknowledged(nsqd_factory, overflow):
    flags = (f"--max-channel-depth={LIMIT}", f"--channel-overflow={overflow}")
    nsqd = nsqd_factory(*flags)
    topic = unique("rs")
    with log_on_failure(nsqd):
        make_channel(nsqd, topic)
        acked = []
        conns = producers(nsqd)
        each = LIMIT if overflow == "drop_oldest" else LIMIT // len(conns)  # (within the limit: none blocked)
        for i, p in enumerate(conns.values()):
            batch = bodies(each, f"p{i}-")
            p.publish(topic, *batch)
            acked += batch
            p.close()
        kept = acked[-LIMIT:] if overflow == "drop_oldest" else acked
        assert channel_stats(nsqd, topic)["depth"] == len(kept)
        kill_workers(nsqd)
        deadline = time.monotonic() + 60
        while (depth := topic_depth(nsqd, topic)) != len(kept):  # the replacements publish their stats rows anew
            assert time.monotonic() < deadline, f"depth {depth} after the restart, {len(kept)} acknowledged"
    code = nsqd.stop()
    assert code == 0, nsqd.output()[-3000:]
    again = nsqd_factory(*flags, data=nsqd.data_path)
    with log_on_failure(again):
        c = consumer(again.address, topic, "c", rdy=100)
        got = [m.body for m in c.read_messages(len(kept))]
        assert sorted(got) == sorted(kept)
        assert c.read_until_settled() == []
        c.close()


def test_max_bytes_counts_record_bytes_and_rejects_naming_the_limit(nsqd_factory):
    per = 48 + 104  # a 100-byte body's log record: 48-byte header, rounded up to 8 (workers/domain/bounds.py)
    nsqd = nsqd_factory(f"--max-channel-bytes={3 * per}", "--channel-overflow=reject")
    topic = unique("mb")
    body = b"b" * 100
    why = f"channel {topic}:c is full (max_bytes {3 * per})"
    with log_on_failure(nsqd):
        make_channel(nsqd, topic)
        conns = producers(nsqd)
        mine = conns.pop(f"worker {zlib.crc32(topic.encode()) % 2}")  # the owner's own: exact at the edge
        mine.publish(topic, body, body)
        mine.send(C.mpub(topic, [body] * 2))  # 2 + 2 records: over, refused whole
        mine.expect_fatal("E_MPUB_FAILED", f"E_MPUB_FAILED MPUB failed {why}")
        with Conn(nsqd.address) as c:
            c.publish(topic, body)  # exactly at the limit (the owner marks the topic)
        assert channel_stats(nsqd, topic)["depth"] == 3
        for c in conns.values():  # another worker's producer: refused at once
            c.send(C.pub(topic, b"x"))
            c.expect_fatal("E_PUB_FAILED", f"E_PUB_FAILED PUB failed {why}")
        assert channel_stats(nsqd, topic)["depth"] == 3
