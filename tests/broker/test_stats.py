"""The stats plane against a real nsqd with two workers, read from a separate process.

What must hold: once clients stop (their last command answered, or ordered by a sync point), one fresh snapshot
shows exactly what they did: per topic message_count and message_bytes, per channel deliveries, requeues,
in-flight and depth, client_count, per client RDY, in-flight, message/finish/requeue counts, and every producer's
pub_counts (also for producers that never sent anything but lone PUBs, which the pump answers in compiled code,
and for publishes forwarded to the other worker); the JSON has NSQ's shape and filters; rows of closed clients and
deleted channels disappear; and all of this holds under load on both workers, with a reader polling throughout.

FIN and REQ get no reply: a consumer orders them with a sync point (``Conn.sync``: a PUB on the same connection,
answered in order), which the expected counts include (the consumer then is a producer of the sync topic, as in
nsqd). The reader runs in its own process (``StatsProcess``), as the HTTP API and statsd will.
"""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib

import pytest

from nsqpy.ipc.shm import instance_prefix
from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_MESSAGE
from wire import SYNC_TOPIC, Conn, unique, warm_up

DEADLINE = 60.0
READER = r"""
import json, sys
from nsqpy.broker.stats import StatsReader
reader = StatsReader.attach(sys.argv[1], int(sys.argv[2]))
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    args = json.loads(line)
    started = __import__("time").monotonic()
    out = reader.stats(**args)
    print(json.dumps({"stats": out, "fresh": reader.fresh,
                      "took": __import__("time").monotonic() - started}), flush=True)
"""


class StatsProcess:
    """A long-lived reader in another process: each ``stats(**filters)`` is one request line, one JSON answer."""

    def __init__(self, nsqd):
        self.proc = subprocess.Popen([sys.executable, "-c", READER, nsqd.data_path, str(nsqd.node_id)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}
        self.fresh = None

    def stats(self, **args):
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the stats reader died"
        answer = json.loads(line)
        self.fresh = answer["fresh"]
        return answer["stats"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture
def broker(nsqd_factory):
    nsqd = nsqd_factory(workers=2)
    warm_up(nsqd.address)
    reader = StatsProcess(nsqd)
    yield nsqd, reader
    reader.close()


def topics_on_both_workers(n, prefix="st"):
    """n >= 2 fresh topic names, the first owned by worker 0 and the second by worker 1 (crc32 % 2, as
    workers/connections/handover.py), the rest as they come."""
    first = {}
    rest = []
    while len(first) < 2 or len(first) + len(rest) < n:
        name = unique(prefix)
        owner = zlib.crc32(name.encode()) % 2
        if owner in first:
            rest.append(name)
        else:
            first[owner] = name
    return [first[0], first[1]] + rest[:n - 2]


def local(conn):
    host, port = conn.sock.getsockname()[:2]
    return f"{host}:{port}"


def by_topic(stats):
    return {t["topic_name"]: t for t in stats["topics"] or []}


def clients_by_address(stats):
    """Every client shown (consumers under their channel, producers), by remote address."""
    out = {}
    for t in stats["topics"] or []:
        for ch in t["channels"]:
            for c in ch["clients"] or []:
                out[c["remote_address"]] = c
    for c in stats["producers"] or []:
        out.setdefault(c["remote_address"], c)
    return out


def test_stats_agree_exactly_with_what_clients_did(broker):
    nsqd, reader = broker
    topics = topics_on_both_workers(4)
    rdy = 500
    consumers = {}
    for t in topics:
        for ch in ("b", "a"):
            c = Conn(nsqd.address)
            c.identify(client_id=f"{t}/{ch}", hostname="consumer-host", user_agent="stats-test/1.0")
            c.subscribe(t, ch, rdy=rdy)
            consumers[t, ch] = c
    # p1: pipelined PUBs (the pump's compiled path for lone PUBs, some forwarded to the other worker) and an MPUB
    # per topic; p2: MPUB and PUB through the parser; p3: no IDENTIFY, one PUB
    bodies = {t: [] for t in topics}
    p1, p2, p3 = Conn(nsqd.address), Conn(nsqd.address), Conn(nsqd.address)
    p1.identify(client_id="p1", hostname="producer-host", user_agent="stats-test/1.0")
    p2.identify(client_id="p2", hostname="producer-host", user_agent="stats-test/2.0")
    rng = random.Random(3)
    for t in topics:
        one = [os.urandom(rng.randint(1, 300)) for _ in range(20)]
        for body in one:
            p1.send(C.pub(t, body))
        for _ in one:
            p1.expect_response()
        many = [os.urandom(rng.randint(1, 300)) for _ in range(7)]
        p1.send(C.mpub(t, many))
        p1.expect_response()
        bodies[t] += one + many
    p2.send(C.mpub(topics[0], [b"x" * 10] * 5), C.pub(topics[1], b"y"), C.pub(topics[1], b"zz"))
    for _ in range(3):
        p2.expect_response()
    bodies[topics[0]] += [b"x" * 10] * 5
    bodies[topics[1]] += [b"y", b"zz"]
    p3.publish(topics[2], b"last")
    bodies[topics[2]].append(b"last")

    # every consumer: all its topic's messages; REQ 0 two of them (they come back), FIN all but three
    for (t, ch), c in consumers.items():
        n = len(bodies[t])
        msgs = c.read_messages(n)
        assert sorted(m.body for m in msgs) == sorted(bodies[t])
        c.send(C.req(msgs[0].id, 0), C.req(msgs[1].id, 0))
        again = c.read_messages(2)
        assert {m.id for m in again} == {msgs[0].id, msgs[1].id}
        for m in msgs[:-3]:
            c.send(C.fin(m.id))
        c.sync()  # the FINs were handled before this PUB's OK

    stats = reader.stats()
    assert reader.fresh == [True, True]
    assert stats["version"] == "1.3.0" and stats["health"] == "OK" and stats["start_time"] > 0
    assert set(stats["memory"]) == {"heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
                                    "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes",
                                    "gc_total_runs", "nsqpy_workers"}  # nsqd's keys, and nsqpy's capacities
    assert [set(w) for w in stats["memory"]["nsqpy_workers"]] == [
        {"in_flight", "in_flight_capacity", "channels_held_by_full_table", "deferred"}] * 2
    names = [t["topic_name"] for t in stats["topics"]]
    assert names == sorted(names) and set(topics) <= set(names)
    shown = by_topic(stats)
    clients = clients_by_address(stats)
    for t in topics:
        n = len(bodies[t])
        got = shown[t]
        assert list(got) == ["topic_name", "channels", "depth", "backend_depth", "message_count", "message_bytes",
                             "paused", "e2e_processing_latency"]
        assert (got["message_count"], got["message_bytes"]) == (n, sum(map(len, bodies[t])))
        assert (got["depth"], got["backend_depth"], got["paused"]) == (0, 0, False)
        assert got["e2e_processing_latency"] == {"count": 0, "percentiles": None}
        assert [ch["channel_name"] for ch in got["channels"]] == ["a", "b"]
        for ch in got["channels"]:
            assert list(ch) == ["channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count",
                                "message_count", "requeue_count", "timeout_count", "client_count", "clients",
                                "paused", "e2e_processing_latency"]
            assert {k: ch[k] for k in ("depth", "backend_depth", "in_flight_count", "deferred_count",
                                       "message_count", "requeue_count", "timeout_count", "client_count",
                                       "paused")} == {
                "depth": 0, "backend_depth": 0, "in_flight_count": 3, "deferred_count": 0, "message_count": n,
                "requeue_count": 2, "timeout_count": 0, "client_count": 1, "paused": False}
            [c] = ch["clients"]
            conn = consumers[t, ch["channel_name"]]
            assert c["remote_address"] == local(conn) and clients[local(conn)] is not None
            assert {k: c[k] for k in ("client_id", "hostname", "version", "state", "ready_count",
                                      "in_flight_count", "message_count", "finish_count", "requeue_count",
                                      "user_agent", "sample_rate", "deflate", "snappy", "tls")} == {
                "client_id": f"{t}/{ch['channel_name']}", "hostname": "consumer-host", "version": "V2", "state": 3,
                "ready_count": rdy, "in_flight_count": 3, "message_count": n + 2, "finish_count": n - 3,
                "requeue_count": 2, "user_agent": "stats-test/1.0", "sample_rate": 0, "deflate": False,
                "snappy": False, "tls": False}
            assert c["pub_counts"] == [{"topic": SYNC_TOPIC, "count": 1}]  # its sync point
            assert abs(c["connect_ts"] - time.time()) < 600
    producers = {c["remote_address"]: c for c in stats["producers"]}
    assert producers[local(p1)]["pub_counts"] == sorted(({"topic": t, "count": 27} for t in topics),
                                                        key=lambda e: e["topic"])
    assert producers[local(p1)]["client_id"] == "p1" and producers[local(p1)]["state"] == 0
    assert producers[local(p2)]["pub_counts"] == sorted([{"topic": topics[0], "count": 5},
                                                         {"topic": topics[1], "count": 2}], key=lambda e: e["topic"])
    host = local(p3).rsplit(":", 1)[0]
    assert producers[local(p3)]["pub_counts"] == [{"topic": topics[2], "count": 1}]
    assert (producers[local(p3)]["client_id"], producers[local(p3)]["hostname"]) == (host, host)  # no IDENTIFY
    assert list(producers[local(p1)]) == [
        "client_id", "hostname", "version", "remote_address", "state", "ready_count", "in_flight_count",
        "message_count", "finish_count", "requeue_count", "connect_ts", "sample_rate", "deflate", "snappy",
        "user_agent", "pub_counts", "tls", "tls_cipher_suite", "tls_version", "tls_negotiated_protocol",
        "tls_negotiated_protocol_is_mutual"]
    json.dumps(stats)  # what /stats?format=json serialises

    # closed clients leave the snapshot; the others' numbers stay
    gone = consumers.pop((topics[0], "a"))
    gone_address = local(gone)
    p2_address = local(p2)
    gone.close()
    p2.close()
    deadline = time.monotonic() + DEADLINE
    while True:  # a close is seen when the worker reads EOF: each round trip below is a fresh publication
        stats = reader.stats()
        ch = by_topic(stats)[topics[0]]["channels"][0]
        if ch["client_count"] == 0 and p2_address not in {c["remote_address"] for c in stats["producers"]}:
            break
        assert time.monotonic() < deadline, stats
    assert ch["in_flight_count"] == 0 and ch["depth"] == 3  # its three in-flight messages came back
    assert gone_address not in clients_by_address(stats)
    for c in list(consumers.values()) + [p1, p3]:
        c.close()


def test_filters_and_null_lists(broker):
    nsqd, reader = broker
    t1, t2 = unique("flt"), unique("flt")
    with Conn(nsqd.address) as p:
        p.publish(t1, b"a")
        p.publish(t2, b"b")
        with Conn(nsqd.address) as c1, Conn(nsqd.address) as c2:
            c1.subscribe(t1, "only1", rdy=0)
            c2.subscribe(t2, "both", rdy=0)
            with Conn(nsqd.address) as c3:
                c3.subscribe(t1, "both", rdy=0)
                c3.sync()
                stats = reader.stats(topic=t1)
                assert [t["topic_name"] for t in stats["topics"]] == [t1]
                assert [ch["channel_name"] for ch in stats["topics"][0]["channels"]] == ["both", "only1"]
                # producers are listed whatever the topic; their pub_counts only for it
                counts = {c["remote_address"]: c.get("pub_counts") for c in stats["producers"]}
                assert counts[local(p)] == [{"topic": t1, "count": 1}]
                assert counts[local(c3)] is None  # its sync went to another topic: omitted (omitempty)
                stats = reader.stats(channel="both")
                mine = [t for t in stats["topics"] if t["topic_name"] in (t1, t2)]
                assert [(t["topic_name"], [c["channel_name"] for c in t["channels"]]) for t in mine] == \
                    sorted([(t1, ["both"]), (t2, ["both"])])
                assert all(t["channels"] for t in stats["topics"])  # a topic without the channel is left out
                stats = reader.stats(topic=t1, channel="only1", include_clients=False, include_mem=False)
                assert list(stats) == ["version", "health", "start_time", "topics", "producers"]
                [ch] = stats["topics"][0]["channels"]
                assert ch["clients"] is None and ch["client_count"] == 1 and stats["producers"] is None
                stats = reader.stats(topic=unique("nope"))
                assert stats["topics"] is None and stats["producers"] is None  # nsqd returns before collecting
                stats = reader.stats(topic=t1, channel="missing")
                assert stats["topics"] == []


def test_a_killed_worker_is_skipped_then_its_replacement_publishes_everything(broker):
    """SIGKILL the worker that owns a topic: snapshots go on at once (the dead worker's last rows, not a wait for
    the whole timeout), and its replacement publishes the recovered topics with their counts; its predecessor's
    table is gone from /dev/shm."""
    nsqd, reader = broker
    other, mine = topics_on_both_workers(2, "kill")
    owner = 1  # of mine
    with Conn(nsqd.address) as p:
        p.send(C.mpub(mine, [b"m"] * 7), C.mpub(other, [b"o"] * 3))
        p.expect_response()
        p.expect_response()
    with Conn(nsqd.address) as c:
        c.subscribe(mine, "ch", rdy=0)
        c.sync()
    stats = reader.stats()
    assert by_topic(stats)[mine]["message_count"] == 7 and by_topic(stats)[mine]["channels"][0]["depth"] == 7
    pid = int(nsqd.wait_for_line(rf"worker {owner}: started \(pid (\d+)\)").group(1))
    seen = len(nsqd.lines)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    stats = reader.stats(timeout=DEADLINE)  # the dead worker cannot answer: found dead, not waited for
    assert time.monotonic() - t0 < DEADLINE / 2
    nsqd.wait_for_line(rf"worker {owner}: recovered \d+ topics after a restart", timeout=DEADLINE, start=seen)
    deadline = time.monotonic() + DEADLINE
    while True:
        stats = reader.stats()
        t = by_topic(stats).get(mine)
        if reader.fresh == [True, True] and t is not None and t["channels"]:
            break
        assert time.monotonic() < deadline, stats
    assert t["message_count"] == 7 and t["channels"][0]["depth"] == 7  # from the recovered log
    assert by_topic(stats)[other]["message_count"] == 3
    prefix = instance_prefix(nsqd.data_path, nsqd.node_id).lstrip("/")
    tables = [e for e in os.listdir("/dev/shm") if e.startswith(f"{prefix}stats{owner}-")]
    assert len(tables) == 1, tables  # the replacement's own; its predecessor's was removed


def test_deferred_messages_count_as_deferred_not_as_depth(broker):
    """A DPUB and a REQ with a delay wait in the deferred store: deferred_count, not depth (nsqd keeps them in the
    channel's deferred queue); a REQ 0 is depth again until delivered. The channel was given three messages."""
    nsqd, reader = broker
    t = unique("dfr")
    with Conn(nsqd.address) as c:
        c.subscribe(t, "ch", rdy=2)
        with Conn(nsqd.address) as p:
            p.send(C.dpub(t, 3_600_000, b"later"), C.pub(t, b"a"), C.pub(t, b"b"))
            for _ in range(3):
                p.expect_response()
        a, b = c.read_messages(2)
        c.send(C.req(a.id, 3_600_000), C.rdy(0), C.req(b.id, 0))
        c.sync()
        ch = by_topic(reader.stats(topic=t))[t]["channels"][0]
        assert (ch["deferred_count"], ch["depth"], ch["in_flight_count"], ch["requeue_count"],
                ch["message_count"]) == (2, 1, 0, 2, 3)
        assert ch["clients"][0]["in_flight_count"] == 0 and ch["clients"][0]["requeue_count"] == 2


def test_ephemeral_channel_rows_go_with_their_last_consumer(broker):
    nsqd, reader = broker
    t = unique("eph")
    with Conn(nsqd.address) as c:
        c.subscribe(t, "tmp#ephemeral", rdy=1)
        c.sync()
        assert [ch["channel_name"] for ch in by_topic(reader.stats())[t]["channels"]] == ["tmp#ephemeral"]
    deadline = time.monotonic() + DEADLINE
    while by_topic(reader.stats()).get(t, {"channels": []})["channels"]:
        assert time.monotonic() < deadline


def test_stats_stay_exact_under_load_on_two_workers(broker):
    """Four producer processes (lone PUBs and MPUBs, to topics of both workers) and two consumers per channel
    that FIN everything, while this process polls stats (fresh and not): counters only grow, and once everyone
    is done one snapshot equals what they did."""
    nsqd, reader = broker
    topics = topics_on_both_workers(4, "load")
    plan = {(i, t): 150 + 37 * i + 11 * k for i in range(4) for k, t in enumerate(topics)}  # messages each
    expected = {t: sum(n for (_, tt), n in plan.items() if tt == t) for t in topics}
    consumers = {t: [Conn(nsqd.address), Conn(nsqd.address)] for t in topics}
    for t, pair in consumers.items():
        for c in pair:
            c.subscribe(t, "c", rdy=50)
    # the producers first: forking once this process has threads could copy a lock some thread holds
    r, w = os.pipe()
    pids = []
    for i in range(4):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                code = _produce(nsqd.address, topics, {t: plan[i, t] for t in topics}, w, i)
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(w)
    try:
        _consume_and_check(reader, topics, plan, expected, consumers, r)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGTERM)  # the producers keep their connections open until the check is done
            os.waitpid(pid, 0)
        os.close(r)
        for c in [c for pair in consumers.values() for c in pair]:
            c.close()


def _consume_and_check(reader, topics, plan, expected, consumers, r):
    received = {t: 0 for t in topics}
    by_conn = {}
    lock = threading.Lock()
    errors = []

    def consume(t, c):
        try:
            mine = 0
            while True:
                with lock:
                    if received[t] >= expected[t]:
                        break  # the other consumer of this channel got the last ones
                try:
                    frame = c.next_frame(timeout=0.5)
                except AssertionError:
                    continue  # nothing within the window: look at the channel's total again
                assert frame is not None, "consumer closed"
                if frame[0] != FRAME_MESSAGE:
                    continue
                c.send(C.fin(C.decode_message(frame[1]).id))
                mine += 1
                with lock:
                    received[t] += 1
            by_conn[c] = mine
        except Exception as e:  # reported by the main thread
            errors.append(e)

    reports = []

    def read_reports():
        data = b""
        while chunk := os.read(r, 4096):
            data += chunk
        reports.extend(json.loads(line) for line in data.decode().splitlines())

    threads = [threading.Thread(target=consume, args=(t, c)) for t, pair in consumers.items() for c in pair]
    waiter = threading.Thread(target=read_reports)
    for th in threads + [waiter]:
        th.start()
    last, polls = {}, 0
    deadline = time.monotonic() + 4 * DEADLINE
    while any(th.is_alive() for th in threads + [waiter]):
        assert not errors, errors
        assert time.monotonic() < deadline, "the load did not finish"
        stats = reader.stats(fresh=polls % 2 == 0)
        polls += 1
        for t in topics:
            now = by_topic(stats).get(t)
            if now is not None:
                assert last.get(t, 0) <= now["message_count"] <= expected[t]
                last[t] = now["message_count"]
    assert not errors, errors
    for c in [c for pair in consumers.values() for c in pair]:
        c.sync()  # orders this consumer's last FINs before the snapshot
    assert len(reports) == 4 and polls > 2
    stats = reader.stats()
    assert reader.fresh == [True, True]
    shown = by_topic(stats)
    for t in topics:
        got = shown[t]
        assert got["message_count"] == expected[t]
        assert got["message_bytes"] == sum(rep["bytes"][t] for rep in reports)
        [ch] = got["channels"]
        assert (ch["message_count"], ch["in_flight_count"], ch["depth"], ch["requeue_count"], ch["timeout_count"],
                ch["client_count"]) == (expected[t], 0, 0, 0, 0, 2)
        assert sorted(c["remote_address"] for c in ch["clients"]) == sorted(local(c) for c in consumers[t])
        for c in ch["clients"]:
            conn = next(x for x in consumers[t] if local(x) == c["remote_address"])
            assert (c["message_count"], c["finish_count"], c["in_flight_count"], c["ready_count"]) == \
                (by_conn[conn], by_conn[conn], 0, 50)
    producers = {c["remote_address"]: c for c in stats["producers"]}
    for rep in reports:
        counts = {e["topic"]: e["count"] for e in producers[rep["address"]]["pub_counts"]}
        assert counts == {t: plan[rep["index"], t] for t in topics}


def _produce(address, topics, counts, wfd, index):
    """A producer process: publish counts[t] messages to each topic, in a random mix of pipelined lone PUBs and
    MPUBs, report (address, bytes per topic) once every OK arrived, then keep the connection until killed."""
    rng = random.Random(index)
    c = Conn(address)
    left = dict(counts)
    sent = {t: 0 for t in topics}
    while any(left.values()):
        t = rng.choice([t for t in topics if left[t]])
        lone = rng.random() < 0.5
        n = min(left[t], rng.randint(1, 20) if lone else rng.randint(2, 50))
        bodies = [os.urandom(rng.randint(1, 200)) for _ in range(n)]
        c.send(*[C.pub(t, b) for b in bodies]) if lone else c.send(C.mpub(t, bodies))
        for _ in range(n if lone else 1):
            c.expect_response()
        left[t] -= n
        sent[t] += sum(map(len, bodies))
    os.write(wfd, (json.dumps({"index": index, "address": local(c), "bytes": sent}) + "\n").encode())
    os.close(wfd)
    signal.pause()  # until the parent, done checking, sends SIGTERM
    return 0
