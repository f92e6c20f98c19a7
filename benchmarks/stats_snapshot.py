"""How long a /stats snapshot takes to build from the stats plane, for many topics and channels.

    python -m benchmarks.stats_snapshot --topics=1000 --channels=5 --workers=2 \
        [--out=benchmarks/results/stats_snapshot.json]

Starts ``nsqd`` (port 0, a fresh data path), creates N topics with one message each and C channels on each (a SUB
per channel, on connections closed right after: the channels stay), connects some consumers and producers so that
client rows exist, and then, from this process (a reader that holds no Plan, as a tool would be: it wakes the
workers with a signal), times ``StatsReader.stats()``, clients included:

    unchanged      fresh=False, nothing changed since the last call: the workers' parts are reused whole
    fresh_idle     fresh=True, nothing changed: the round trip to both workers (ticket, wake-up, answer)
    some_changed   fresh=True after one PUB to each of 20 topics: those topics' rows are new, the rest reused
    all_changed    fresh=True after one PUB to every topic: every topic and channel row is new (the workers
                   republish them all, the reader rebuilds them all)
    rebuild        fresh=False with the reader's reuse caches dropped: building every dict (no round trip)
    cold           a new reader's first snapshot (attach, decode every name, sort)
    topic          one topic (topic=..., fresh=False)
    json           json.dumps of the full dict (what /stats?format=json then sends)

Each runs ``--rounds`` times after a warm-up round (the PUBs between rounds are not timed); the line reports
median and 90th percentile in ms, the row counts, the workers' cost of their last publication (after
all_changed: every row), the git commit, the core count and the command.
"""
import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import emit, environment
from benchmarks.process import REPO, ListeningProcess, python_module
from nsqpy.ipc.statrows import B_ROWS, B_USER
from nsqpy.broker.stats import U_COST_NS, U_WRITTEN, StatsReader
from nsqpy.protocol import client as C

NODE_ID = 12


def replies(sock, n, decoder):
    got = []
    while len(got) < n:
        data = sock.recv(1 << 16)
        if not data:
            raise SystemExit("nsqd closed a connection")
        got.extend(f for f in decoder.feed(data) if f != (0, b"_heartbeat_"))
    bad = [f for f in got if f[1] != b"OK"]
    if bad:
        raise SystemExit(f"nsqd refused: {bad[0]!r}")


def create(address, topics, channels):
    with socket.create_connection(address) as s:
        s.sendall(C.magic())
        decoder = C.FrameDecoder()
        for k in range(0, len(topics), 500):
            part = topics[k:k + 500]
            s.sendall(b"".join(C.pub(t, b"x" * 100) for t in part))
            replies(s, len(part), decoder)
    subs = [(t, c) for t in topics for c in channels]
    for k in range(0, len(subs), 200):  # 200 connections at a time: SUB, OK, close (the channel stays)
        conns = []
        for t, c in subs[k:k + 200]:
            s = socket.create_connection(address)
            s.sendall(C.magic() + C.sub(t, c))
            conns.append(s)
        for s in conns:
            replies(s, 1, C.FrameDecoder())
            s.close()


def clients(address, topics, consumers, producers):
    """Connections that stay open while measuring: consumers (RDY 10, holding their topic's message in flight)
    and producers that published to a few topics each."""
    held = []
    for i in range(consumers):
        s = socket.create_connection(address)
        s.sendall(C.magic() + C.identify({"client_id": f"consumer{i}", "user_agent": "stats_snapshot"})
                  + C.sub(topics[i % len(topics)], "ch0") + C.rdy(10))
        held.append(s)
    for i in range(producers):
        s = socket.create_connection(address)
        s.sendall(C.magic() + b"".join(C.pub(topics[(i + k) % len(topics)], b"p") for k in range(5)))
        replies(s, 5, C.FrameDecoder())
        held.append(s)
    return held


def timed(fn, rounds, before=None):
    """fn timed ``rounds`` times after one warm-up call; ``before`` runs untimed before each call."""
    out = []
    for k in range(rounds + 1):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        if k:
            out.append((time.perf_counter() - t0) * 1000)
    out.sort()
    return {"median_ms": round(statistics.median(out), 2), "p90_ms": round(out[int(0.9 * (len(out) - 1))], 2)}


def publisher(address, topics):
    """before(): one PUB to each of ``topics`` (answered), so that their rows change."""
    s = socket.create_connection(address)
    s.sendall(C.magic())
    decoder = C.FrameDecoder()

    def publish():
        s.sendall(b"".join(C.pub(t, b"y") for t in topics))
        replies(s, len(topics), decoder)
    return s, publish


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--channels", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=50)
    ap.add_argument("--producers", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--out", default="")
    ap.add_argument("--nsqd-flag", action="append", default=[], help="a flag for nsqd (repeatable), e.g. "
                    "--nsqd-flag=--max-attempts=5: a policy on every channel, so each has a POLICY row too")
    args = ap.parse_args()
    data = tempfile.mkdtemp(prefix="stats_snapshot")
    argv = python_module("nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                         f"--data-path={data}",
                         f"--workers={args.workers}", f"--node-id={NODE_ID}", *args.nsqd_flag)
    topics = [f"snap-{i:05d}" for i in range(args.topics)]
    with ListeningProcess(argv) as nsqd:
        t0 = time.monotonic()
        create(nsqd.address, topics, [f"ch{k}" for k in range(args.channels)])
        held = clients(nsqd.address, topics, args.consumers, args.producers)
        setup_s = time.monotonic() - t0
        reader = StatsReader.attach(data, NODE_ID)
        deadline = time.monotonic() + 60
        while True:  # until every topic, channel and client is published (creation is asynchronous for forwards)
            stats = reader.stats()
            n_channels = sum(len(t["channels"]) for t in stats["topics"])
            n_clients = sum(t["channels"][0]["client_count"] for t in stats["topics"] if t["channels"])
            if len(stats["topics"]) == args.topics and n_channels == args.topics * args.channels \
                    and n_clients == args.consumers and len(stats["producers"] or []) == args.producers:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"stats never showed everything: {len(stats['topics'])} topics, {n_channels} "
                                 f"channels, {n_clients} consumers")
        some, touch_some = publisher(nsqd.address, topics[::max(1, len(topics) // 20)][:20])
        every, touch_all = publisher(nsqd.address, topics)

        def rebuild():
            reader._views = [None] * reader.workers
            reader._last = [None] * reader.workers
            reader._pubs = [None] * reader.workers
            reader._policies = [None] * reader.workers
            reader.stats(fresh=False)

        def cold():
            other = StatsReader.attach(data, NODE_ID)
            other.stats(fresh=False)
            other.close()

        results = {
            "unchanged": timed(lambda: reader.stats(fresh=False), args.rounds),
            "fresh_idle": timed(lambda: reader.stats(fresh=True), args.rounds),
            "some_changed": timed(lambda: reader.stats(fresh=True), args.rounds, touch_some),
            "all_changed": timed(lambda: reader.stats(fresh=True), args.rounds, touch_all),
        }
        cost = [{"ms": round(reader.board.word(w, B_USER + U_COST_NS) / 1e6, 2),
                 "row_writes": reader.board.word(w, B_USER + U_WRITTEN)} for w in range(reader.workers)]
        results["rebuild"] = timed(rebuild, args.rounds)
        results["cold"] = timed(cold, max(5, args.rounds // 5))
        results["topic"] = timed(lambda: reader.stats(topic=topics[len(topics) // 2], fresh=False), args.rounds)
        full = reader.stats(fresh=False)
        results["json"] = timed(lambda: json.dumps(full), args.rounds)
        some.close()
        every.close()
        rows = [reader.board.word(w, B_ROWS) for w in range(reader.workers)]
        json_bytes = len(json.dumps(full))
        reader.close()
        for s in held:
            s.close()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    emit({"tool": "stats_snapshot", "commit": commit,
          "command": " ".join(["python -m benchmarks.stats_snapshot"] + sys.argv[1:]),
          "topics": args.topics, "channels_per_topic": args.channels, "workers": args.workers,
          "consumers": args.consumers, "producers": args.producers, "rows_per_worker": rows,
          "all_changed_publication_per_worker": cost, "json_bytes": json_bytes, "setup_s": round(setup_s, 1),
          "rounds": args.rounds, **{k: v for k, v in results.items()}, **environment()}, args.out)


if __name__ == "__main__":
    main()
