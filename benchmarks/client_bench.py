"""nsqpy's client against nsqpy's nsqd, in one run: the blocking Producer's MPUB rate, then the blocking
Consumer draining what was published (its handler does nothing; each message is FINed by the consumer).

    .venv/bin/python -m benchmarks.client_bench [--runfor=10s] [--size=200] [--batch-size=200]

Starts nsqd on port 0 (unless --nsqd-tcp-address is given), prints one JSON line and, given --out, writes it there
(a new results file: a run never replaces a committed one). Figures:
  producer_mpub_msgs_per_s            one MPUB at a time, each waiting for its OK (NSQ's bench_writer method)
  producer_mpub_pipelined_msgs_per_s  up to --window MPUBs awaiting their OK at once (mpub_async)
  consumer_msgs_per_s                 the Consumer (max_in_flight --rdy) receiving + FINing every message
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import threading
import time

from benchmarks.common import duration_s, emit, environment, host_port, log
from benchmarks.process import ListeningProcess, python_module
from nsqpy.client import Consumer, Producer


def produce(address: str, topic: str, body: bytes, batch: int, runfor: float, window: int) -> tuple[int, float]:
    bodies = [body] * batch
    sent = 0
    with Producer([address]) as p:
        p.mpub(topic, bodies)            # connect and create the topic outside the timed window
        sent += batch
        started = time.perf_counter()
        stop = started + runfor
        if window <= 1:
            while time.perf_counter() < stop:
                p.mpub(topic, bodies)
                sent += batch
        else:
            pending = collections.deque()
            while time.perf_counter() < stop:
                pending.append(p.mpub_async(topic, bodies))
                if len(pending) >= window:
                    pending.popleft().result()
                    sent += batch
            while pending:
                pending.popleft().result()
                sent += batch
        elapsed = time.perf_counter() - started
    return sent, elapsed


def consume(address: str, topic: str, expected: int, rdy: int, timeout: float) -> tuple[int, float]:
    done = threading.Event()
    count = 0
    lock = threading.Lock()

    def handle(message):
        nonlocal count
        with lock:
            count += 1
            if count >= expected:
                done.set()
    c = Consumer(topic, "bench", handle, nsqd_tcp_addresses=[address], max_in_flight=rdy)
    started = time.perf_counter()
    c.start()
    finished = done.wait(timeout)
    elapsed = time.perf_counter() - started
    c.stop()
    if not finished:
        log(f"consumer: only {count} of {expected} messages within {timeout}s")
    return count, elapsed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nsqd-tcp-address", type=host_port, default=None, help="use this broker instead of "
                   "starting nsqpy's nsqd on port 0")
    p.add_argument("--workers", type=int, default=2, help="nsqd --workers when the benchmark starts it")
    p.add_argument("--runfor", type=duration_s, default=10.0, help="producer run time (Go duration)")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=200)
    p.add_argument("--window", type=int, default=16, help="MPUBs in flight for the pipelined figure")
    p.add_argument("--rdy", type=int, default=2500, help="consumer max_in_flight")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    server = None
    data = None
    if args.nsqd_tcp_address is None:
        data = tempfile.mkdtemp(prefix="client_bench_")
        server = ListeningProcess(python_module("nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=",
                                                f"--data-path={data}", f"--workers={args.workers}"),
                                  ready_timeout=300).start()
        address = server.address_text
    else:
        address = "%s:%d" % args.nsqd_tcp_address
    body = b"x" * args.size
    topic = f"client_bench_{os.getpid()}"
    try:
        # The channel exists before anything is published, so the consumer later drains both runs.
        Consumer(topic, "bench", lambda m: None, nsqd_tcp_addresses=[address], max_in_flight=0).start().stop()
        n1, t1 = produce(address, topic, body, args.batch_size, args.runfor, window=1)
        log(f"producer (blocking MPUB {args.batch_size}): {n1} msgs in {t1:.2f}s = {n1 / t1:,.0f} msgs/s")
        n2, t2 = produce(address, topic, body, args.batch_size, args.runfor / 2, window=args.window)
        log(f"producer (pipelined MPUB x{args.window}): {n2} msgs in {t2:.2f}s = {n2 / t2:,.0f} msgs/s")
        n3, t3 = consume(address, topic, n1 + n2, args.rdy, timeout=max(120.0, 10 * args.runfor))
        log(f"consumer (FIN each, max_in_flight {args.rdy}): {n3} msgs in {t3:.2f}s = {n3 / t3:,.0f} msgs/s")
    finally:
        if server is not None:
            server.stop()
        if data is not None:
            shutil.rmtree(data, ignore_errors=True)
    result = {
        "tool": "client_bench", "size": args.size, "batch_size": args.batch_size, "runfor_s": args.runfor,
        "nsqd_workers": args.workers if server is not None else None,
        "producer_mpub_msgs": n1, "producer_mpub_s": round(t1, 3), "producer_mpub_msgs_per_s": round(n1 / t1),
        "producer_mpub_pipelined_window": args.window, "producer_mpub_pipelined_msgs_per_s": round(n2 / t2),
        "consumer_msgs": n3, "consumer_s": round(t3, 3), "consumer_msgs_per_s": round(n3 / t3),
        "consumer_max_in_flight": args.rdy, **environment()}
    emit(result, args.out)
    return 0 if n3 == n1 + n2 else 1


if __name__ == "__main__":
    sys.exit(main())
