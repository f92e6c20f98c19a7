"""Ring throughput and wake-up latency between two processes, with multiprocessing.Queue and os.pipe baselines.

Prints ONE JSON line (and writes it to --out FILE when given):
  records_per_s.<transport>.<size>.<single|batched>: records/s from producer start to the consumer having all
      (consumer in a forked process; ring consumers read (offset, length, type) batches and release them, the
      baselines deliver bytes objects: each transport's natural consumer);
  wakeup_us.p50/p99/max: commit-to-running latency of a reader sleeping on its eventfd (nsqpy.ipc.wake);
  compile_s.cold/cached: a fresh interpreter importing nsqpy.ipc.ring and running every ring kernel once, with an
      empty numba cache directory and then with the cache it filled.

Usage: python -m benchmarks.ring_bench [--out FILE] [--quick]
"""
from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import select
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nsqpy.ipc.ring import Ring
from nsqpy.ipc.wake import Wakeups, make_eventfd

from benchmarks.common import emit, environment

CAPACITY = 1 << 22
BATCH = 256
SIZES = {"100B": 100, "1KiB": 1024}


def _fork(fn, *args) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            fn(*args)
        finally:
            os._exit(0)
    return pid


def _report_done(fd):
    os.write(fd, b"!")


def _timed(produce, consume, *args) -> float:
    """Seconds from the start of ``produce`` to the consumer (a forked child) reporting it has everything."""
    r, w = os.pipe()
    pid = _fork(lambda: (consume(*args), _report_done(w)))
    start = time.perf_counter()
    produce(*args)
    select.select([r], [], [])
    elapsed = time.perf_counter() - start
    os.waitpid(pid, 0)
    os.close(r)
    os.close(w)
    return elapsed


# ring ---------------------------------------------------------------------------------------------------------
def _ring_consume(buf, n, size, batched):
    ring = Ring.attach(buf, 0, CAPACITY, role=Ring.CONSUMER, max_batch=BATCH)
    got = 0
    while got < n:
        offs, _, _ = ring.read_batch()
        if len(offs):
            got += len(offs)
            ring.release()
        else:
            os.sched_yield()  # on a shared 2-core machine, let the producer run


def _ring_produce(buf, n, size, batched):
    ring = Ring.attach(buf, 0, CAPACITY, role=Ring.PRODUCER)
    payload = np.frombuffer(os.urandom(size), np.uint8)
    sent = 0
    if not batched:
        while sent < n:
            if ring.write(payload):
                sent += 1
            else:
                os.sched_yield()
        return
    src = np.tile(payload, BATCH)
    lengths = np.full(BATCH, size, np.int64)
    offsets = np.arange(BATCH, dtype=np.int64) * size
    types = np.zeros(BATCH, np.int64)
    while sent < n:
        wrote = ring.write_batch(src, offsets, lengths, types, 0, min(BATCH, n - sent))
        sent += wrote
        if not wrote:
            os.sched_yield()


def bench_ring(n, size, batched):
    buf = mmap.mmap(-1, Ring.size_for(CAPACITY))
    Ring.create(buf, 0, CAPACITY)
    return n / _timed(_ring_produce, _ring_consume, buf, n, size, batched)


# baselines ----------------------------------------------------------------------------------------------------
def _queue_produce(q, n, size, batched):
    payload = os.urandom(size)
    if batched:
        batch = [os.urandom(size) for _ in range(BATCH)]  # distinct objects: pickle would share one payload
        for k in range(0, n, BATCH):
            q.put(batch[:min(BATCH, n - k)])
    else:
        for _ in range(n):
            q.put(payload)


def _queue_consume(q, n, size, batched):
    got = 0
    while got < n:
        item = q.get()
        got += len(item) if batched else 1


def bench_queue(n, size, batched):
    q = multiprocessing.get_context("fork").Queue()
    return n / _timed(_queue_produce, _queue_consume, q, n, size, batched)


def _pipe_produce(fds, n, size, batched):
    record = struct.pack("<I", size) + os.urandom(size)
    w = fds[1]
    if batched:
        for k in range(0, n, BATCH):
            data = memoryview(record * min(BATCH, n - k))
            while data:
                data = data[os.write(w, data):]
    else:
        for _ in range(n):
            os.write(w, record)


def _pipe_consume(fds, n, size, batched):
    r, got, pending = fds[0], 0, b""
    while got < n:
        pending += os.read(r, 1 << 20)
        at = 0
        while len(pending) - at >= 4:
            (length,) = struct.unpack_from("<I", pending, at)
            if len(pending) - at - 4 < length:
                break
            _ = pending[at + 4:at + 4 + length]
            at += 4 + length
            got += 1
        pending = pending[at:]


def bench_pipe(n, size, batched):
    fds = os.pipe()
    try:
        return n / _timed(_pipe_produce, _pipe_consume, fds, n, size, batched)
    finally:
        os.close(fds[0])
        os.close(fds[1])


# wake-up latency ----------------------------------------------------------------------------------------------
def _sleeper(buf, fds, rounds, out_w):
    wake = Wakeups.attach(buf, 0, fds)
    ring = Ring.attach(buf, Wakeups.size_for(1), 4096, role=Ring.CONSUMER)
    lat = np.zeros(rounds, np.int64)
    for k in range(rounds):
        while True:
            got = ring.read(1)
            if got:
                lat[k] = time.perf_counter_ns() - int.from_bytes(got[0][1], "little")
                ring.release()
                break
            wake.sleep(0, lambda: ring.readable() > 0)
    os.write(out_w, lat.tobytes())


def bench_wakeup(rounds):
    fds = [make_eventfd()]
    buf = mmap.mmap(-1, Wakeups.size_for(1) + Ring.size_for(4096))
    wake = Wakeups.create(buf, 0, fds)
    ring = Ring.create(buf, Wakeups.size_for(1), 4096)
    r, w = os.pipe()
    pid = _fork(_sleeper, buf, fds, rounds, w)
    for _ in range(rounds):
        while wake.flags[16] != 1:  # the reader's SLEEPING word: wait until it has armed
            os.sched_yield()
        select.select([], [], [], 0.0002)  # let it reach poll(): measure a wake-up, not a cancelled sleep
        ring.write(time.perf_counter_ns().to_bytes(8, "little"))
        wake.notify(0)
    raw = b""
    while len(raw) < rounds * 8:
        raw += os.read(r, rounds * 8)
    os.waitpid(pid, 0)
    for fd in (r, w, fds[0]):
        os.close(fd)
    lat = np.frombuffer(raw, np.int64) / 1000.0
    return {"p50": round(float(np.percentile(lat, 50)), 1), "p99": round(float(np.percentile(lat, 99)), 1),
            "max": round(float(lat.max()), 1), "rounds": rounds}


# compile times ------------------------------------------------------------------------------------------------
_COMPILE_PROBE = """
import time; t = time.perf_counter()
import mmap, numpy as np
from nsqpy.ipc.ring import Ring
buf = mmap.mmap(-1, Ring.size_for(4096)); ring = Ring.create(buf, 0, 4096)
ring.write(b"x"); ring.write_batch(np.zeros(8, np.uint8), np.zeros(1, np.int64), np.ones(1, np.int64),
                                   np.zeros(1, np.int64))
ring.claim(1); ring.commit(); ring.read_batch(); ring.release(); ring.free(); ring.readable(); ring.committed_count
Ring.attach(buf, 0, role="producer"); Ring.attach(buf, 0, role="consumer")
print(time.perf_counter() - t)
"""


def bench_compile():
    root = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=root)
        runs = [float(subprocess.run([sys.executable, "-c", _COMPILE_PROBE], env=env, cwd=root, check=True,
                                     capture_output=True, text=True).stdout) for _ in range(2)]
    return {"cold": round(runs[0], 2), "cached": round(runs[1], 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON line to this file")
    parser.add_argument("--quick", action="store_true", help="10x fewer records (smoke run)")
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    counts = {"ring": (1_000_000, 5_000_000), "queue": (200_000, 1_000_000), "pipe": (300_000, 2_000_000)}
    benches = {"ring": bench_ring, "queue": bench_queue, "pipe": bench_pipe}
    bench_ring(BATCH * 4, 100, True)  # compile before measuring
    bench_ring(4, 100, False)
    result = {"tool": "ring_bench", **environment(), "records_per_s": {}}
    for name, fn in benches.items():
        result["records_per_s"][name] = {
            label: {mode: round(fn(counts[name][batched] // scale, size, batched))
                    for mode, batched in (("single", False), ("batched", True))}
            for label, size in SIZES.items()}
    result["batch"] = BATCH
    result["wakeup_us"] = bench_wakeup(2000 // scale)
    result["compile_s"] = bench_compile()
    emit(result, args.out)


if __name__ == "__main__":
    main()
