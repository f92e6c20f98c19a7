"""What max attempts, dead letters and message TTL cost (issue 49): the time to dead-letter N messages, and the
cost per message of a TTL on the read path, policy off and on in the same run.

    python -m benchmarks.dead_letter_bench [--messages=100000] [--read-messages=200000] [--size=200]
                                           [--workers=2] [--rounds=3] [--read-rdy=2500] [--phases=req,ttl,read]
                                           [--baseline-tree=DIR --baseline-commit=C] [--out=FILE]

Each phase starts nsqd (port 0, a fresh data path, ``--workers``), creates the channels, publishes with pipelined
MPUBs of 200 (each answered OK) and then:

* ``dead_letter_req``: ``--max-attempts=1``; a consumer (RDY 2500) answers every message with REQ 0 (one write of
  REQ lines per receive), so each is dead-lettered at its first REQ; a second connection consumes the dead-letter
  topic (``T.dead``, owned by the other worker: the dead letters go through the rings) with FIN. Time from the
  consumer's RDY to the N-th dead letter received (``s``, ``msgs_per_s``, ``us_per_msg``), next to the same N
  consumed with FIN on the same broker (``fin_same_broker``);
* ``dead_letter_ttl``: ``--message-ttl=50ms --max-attempts=1`` (a dead-letter topic in effect); N messages wait
  past the TTL, then a consumer's RDY: every one expires into the dead-letter topic (one publish per delivery
  round); time to the N-th dead letter received;
* ``ttl_read``: brokers without a policy and with ``--message-ttl=1h`` (a TTL that never expires: only the check's
  cost), interleaved over ``--rounds``: ``--read-messages`` preloaded, then read with RDY ``--read-rdy`` (2500)
  and FIN each (a small RDY makes rounds small: what a round costs beyond its messages shows); msgs/s and the
  brokers' CPU per message (user + system of their process tree, from /proc), median and best (most msgs/s, least
  CPU: on a loaded machine the least disturbed run) per mode, and the medians' difference (``ttl_cost_us_per_msg``).

``--baseline-tree=DIR`` adds ``ttl_read``'s two modes run by the broker of another checkout (DIR: a tree of the
sources, e.g. ``git archive <commit> | tar -x -C DIR``, with symlinks ``DIR/nsqpy/{workers,ipc,http_api}`` to
``DIR/{workers,ipc,http_api}`` as the installed layout maps them), interleaved with this tree's in the same run:
``off_baseline`` and ``ttl_1h_baseline``, and ``ttl_cost_us_per_msg_baseline``.

``--phases`` runs only the named phases (``req``: dead_letter_req, ``ttl``: dead_letter_ttl, ``read``: ttl_read).
Prints one JSON line (with the git commit, core count and command).
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import zlib

from benchmarks.common import emit, environment, log
from benchmarks.process import ListeningProcess
from benchmarks.pub_compare import cpu_seconds, process_tree
from benchmarks.wire import Connection, MessageStream, fin_lines, mpub_pipelined, req_lines, warm_up
from nsqpy.protocol import client as C

RDY = 2500


def broker(data_path, workers, *flags, tree=None):
    """nsqd from this checkout, or from the sources in ``tree`` (``--baseline-tree``: run from there, first on
    its path, so that it and its children import that tree's nsqpy)."""
    argv = [sys.executable, "-m", "nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=",
            f"--data-path={data_path}", f"--workers={workers}", *flags]
    if tree is None:
        return ListeningProcess(argv, stop_timeout=120.0).start()
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = tree
    try:
        return ListeningProcess(argv, cwd=tree, stop_timeout=120.0).start()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def topic_apart(workers, prefix):
    """A topic name whose dead-letter topic (name + .dead) another worker owns."""
    for i in range(1000):
        t = f"{prefix}{i}"
        if workers < 2 or zlib.crc32(t.encode()) % workers != zlib.crc32((t + ".dead").encode()) % workers:
            return t
    raise SystemExit("no topic name found")


def make_channel(address, topic, channel):
    conn = Connection(address)
    conn.send(C.sub(topic, channel))
    conn.expect_ok("SUB")
    conn.close()


def publish(address, topic, n, size):
    conn = Connection(address, timeout=120)
    mpub_pipelined(conn, topic, n, b"d" * size)
    conn.close()


def consume(address, topic, channel, n, answer=fin_lines, stop=None, timeout=600.0, rdy=RDY):
    """Receive n messages (or until ``stop`` is set), answering each batch with ``answer``'s lines; -> (count,
    seconds from RDY to the last one)."""
    conn = Connection(address, timeout=60)
    conn.subscribe(topic, channel, rdy)
    stream = MessageStream(conn)
    t0 = time.monotonic()
    got, last = 0, t0
    while got < n and not (stop is not None and stop.is_set()):
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"{topic}/{channel}: only {got} of {n} messages within {timeout:.0f}s")
        for batch in stream.read(0.2):
            got += len(batch)
            last = time.monotonic()
            conn.send(answer(stream.array, batch.body_offsets))
    conn.close()
    return got, last - t0


def _dead_letters_timed(address, topic, n, start_consumer):
    """Run the dead-letter topic's consumer in a thread, start the source's consumer (``start_consumer(stop)``),
    and time from then to the N-th dead letter received."""
    done = threading.Event()
    out = {}

    def dead():
        out["got"], _ = consume(address, topic + ".dead", "dlq", n)
        out["end"] = time.monotonic()
        done.set()

    make_channel(address, topic + ".dead", "dlq")
    t = threading.Thread(target=dead)
    t.start()
    t0 = time.monotonic()
    start_consumer(done)
    t.join()
    s = out["end"] - t0
    return {"messages": out["got"], "s": round(s, 3), "msgs_per_s": round(n / s), "us_per_msg": round(s * 1e6 / n, 2)}


def dead_letter_req(base, opts):
    n = opts.messages
    with tempfile.TemporaryDirectory(dir=base) as data:
        b = broker(data, opts.workers, "--max-attempts=1")
        try:
            topic = topic_apart(opts.workers, "dlreq")
            make_channel(b.address, topic, "c")
            make_channel(b.address, "plain", "c")
            publish(b.address, "plain", n, opts.size)
            got, fin_s = consume(b.address, "plain", "c", n)
            publish(b.address, topic, n, opts.size)
            result = _dead_letters_timed(b.address, topic, n, lambda stop: consume(
                b.address, topic, "c", 10 * n, answer=req_lines, stop=stop))
            # (--max-attempts applies to "plain" too: FINed at their first delivery, none is dead-lettered)
            result["fin_same_broker"] = {"s": round(fin_s, 3), "msgs_per_s": round(n / fin_s),
                                         "us_per_msg": round(fin_s * 1e6 / n, 2)}
        finally:
            b.stop()
    return result


def dead_letter_ttl(base, opts):
    n = opts.messages
    with tempfile.TemporaryDirectory(dir=base) as data:
        b = broker(data, opts.workers, "--message-ttl=50ms", "--max-attempts=1")
        try:
            topic = topic_apart(opts.workers, "dlttl")
            make_channel(b.address, topic, "c")
            publish(b.address, topic, n, opts.size)
            until = time.monotonic() + 0.06
            while time.monotonic() < until:  # past the TTL: what this phase measures, not a synchronisation
                time.sleep(until - time.monotonic())
            return _dead_letters_timed(b.address, topic, n, lambda stop: consume(
                b.address, topic, "c", 1, stop=stop))
        finally:
            b.stop()


def ttl_read(base, opts):
    m = opts.read_messages
    modes = {"off": ((), None), "ttl_1h": (("--message-ttl=1h",), None)}
    if opts.baseline_tree:
        ttl = ("--message-ttl=1h",)
        modes.update(off_baseline=((), opts.baseline_tree), ttl_1h_baseline=(ttl, opts.baseline_tree))
    runs = {k: [] for k in modes}
    for r in range(opts.rounds):
        for mode, (flags, tree) in modes.items():
            with tempfile.TemporaryDirectory(dir=base) as data:
                b = broker(data, opts.workers, *flags, tree=tree)
                try:
                    make_channel(b.address, "read", "c")
                    publish(b.address, "read", m, opts.size)
                    pids = process_tree(b.proc.pid)
                    before = cpu_seconds(pids)
                    got, s = consume(b.address, "read", "c", m, rdy=opts.read_rdy)
                    after = cpu_seconds(pids)
                finally:
                    b.stop()
            cpu = sum(after.get(p, 0.0) - before.get(p, 0.0) for p in pids)
            runs[mode].append({"msgs_per_s": round(m / s), "server_cpu_us_per_msg": round(cpu * 1e6 / m, 3)})
            log(f"ttl_read round {r + 1} {mode}: {m / s:,.0f} msgs/s, {cpu * 1e6 / m:.3f} us of server CPU per msg")
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("msgs_per_s", "server_cpu_us_per_msg")}
           for k, v in runs.items()}
    best = {k: {"msgs_per_s": max(x["msgs_per_s"] for x in v),
                "server_cpu_us_per_msg": min(x["server_cpu_us_per_msg"] for x in v)} for k, v in runs.items()}
    out = {"messages": m, "rdy": opts.read_rdy, "runs": runs, "median": med, "best": best}
    for suffix in ("", "_baseline") if opts.baseline_tree else ("",):
        cost = med["ttl_1h" + suffix]["server_cpu_us_per_msg"] - med["off" + suffix]["server_cpu_us_per_msg"]
        out["ttl_cost_us_per_msg" + suffix] = round(cost, 3)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=100_000, help="messages to dead-letter per phase")
    p.add_argument("--read-messages", type=int, default=200_000)
    p.add_argument("--read-rdy", type=int, default=RDY, help="ttl_read's consumer's RDY")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--phases", default="req,ttl,read", help="comma-separated: req, ttl, read")
    p.add_argument("--baseline-tree", default="", help="also run ttl_read's modes by the nsqd of this source tree")
    p.add_argument("--baseline-commit", default="", help="the commit --baseline-tree holds (recorded)")
    p.add_argument("--out", default="")
    opts = p.parse_args(argv)
    phases = set(opts.phases.split(","))
    if not phases <= {"req", "ttl", "read"}:
        p.error(f"--phases: unknown {', '.join(sorted(phases - {'req', 'ttl', 'read'}))}")
    warm_up()
    result = dict(environment(), tool="dead_letter_bench", messages=opts.messages, size=opts.size,
                  workers=opts.workers, phases=sorted(phases))
    if opts.baseline_tree:
        result["baseline_tree"] = opts.baseline_tree
        result["baseline_commit"] = opts.baseline_commit or "?"
    with tempfile.TemporaryDirectory(prefix="nsqpy-dead-letter-") as base:
        if "req" in phases:
            result["dead_letter_req"] = dead_letter_req(base, opts)
            log(f"dead-lettered {opts.messages} by REQ: {result['dead_letter_req']}")
        if "ttl" in phases:
            result["dead_letter_ttl"] = dead_letter_ttl(base, opts)
            log(f"dead-lettered {opts.messages} by TTL: {result['dead_letter_ttl']}")
        if "read" in phases:
            result["ttl_read"] = ttl_read(base, opts)
    emit(result, opts.out)


if __name__ == "__main__":
    main()
