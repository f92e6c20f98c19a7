"""Publish-to-handler latency at fixed publish rates.

    python -m benchmarks.latency [--nsqd-tcp-address=127.0.0.1:4150] [--rates=1000,10000,100000]
        [--modes=defaults,unbuffered] [--runfor=5s] [--size=200] [--topic=latency_bench] [--channel=lat]
        [--no-ceiling] [--out=FILE]

Theory of operation
-------------------
A consumer process subscribes first (RDY --rdy) and says so; only then does the publisher start. For each
rate in turn the publisher runs for --runfor on a schedule: message i of a phase is due at start + i/rate, and
its body carries that *scheduled* time (time.time_ns, so it also works across hosts with synced clocks). The
publisher sends whatever is due as one PUB or MPUB, waits for the OK, and sleeps until the next message is due.
Stamping the schedule rather than the moment of sending charges a publisher that falls behind (because the
broker was slow to answer OK) to the latency figures instead of hiding it: no coordinated omission.

The consumer stamps each receive buffer with time.time_ns once, right after recv (the "handler" time), reads
each body's stamp, FINs everything and keeps one latency array per phase. Bodies also carry a run id, so
messages left in the channel by an earlier run are FINed but not counted. After the last phase the publisher
tells the consumer how many it sent per phase (a first, unreported warm-up phase included); the consumer stops when all arrived, or DRAIN_S later.

Body layout: [int64 scheduled ns][uint32 run id][uint16 phase][padding to --size], big-endian.

Consumer modes (--modes, each runs every rate with a consumer of its own; the publisher is the same):

  defaults    the consumer's IDENTIFY carries NSQ's client defaults, as go-nsq and pynsq send them:
              output_buffer_size 16384, output_buffer_timeout 250 (ms). nsqd buffers what it writes to the
              consumer and flushes when 16 KiB fill, when the consumer's in-flight count reaches its RDY, or on a
              250 ms ticker: a message can wait there up to 16 KiB's worth of traffic or 250 ms.
  unbuffered  the same IDENTIFY with output_buffer_size -1 (what go-nsq sends for OutputBufferSize = -1):
              nsqd then writes every message straight to the socket (buffer size 1, no flush timer).

--ceiling (on by default) first runs the same modes and phases for --ceiling-runfor each against an
in-process `source_server --relay` on port 0: the latency this tool measures when the broker costs almost
nothing, i.e. the tool's own overhead. It is reported next to the result (`ceiling`), never subtracted.

The JSON line has one `phases` list (and one `ceiling` list): an entry per mode and rate, in that order,
each carrying `mode` and `rate`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import numpy as np

from nsqpy.protocol import client

from benchmarks import source_server
from benchmarks.common import (
    BenchError, base_parser, cli, emit, environment, log, wait_for_deadline)
from benchmarks.wire import Connection, MessageStream, fin_lines, warm_up

HEADER = 14                 # stamp 8 + run id 4 + phase 2
MAX_BATCH = 2000            # messages per MPUB at most, whatever fell due
DRAIN_S = 10.0              # how long the consumer waits for stragglers after the publisher finished
WARMUP_S = 0.5              # an unreported first phase at the first rate: numba's first calls and TCP warm-up
POLL_S = 0.05               # consumer's receive timeout, so it notices the publisher's final counts
CDF_QUANTILES = np.concatenate([np.linspace(0, 0.99, 100), [0.995, 0.999, 0.9995, 0.9999, 1.0]])
_STAMP_SPAN = np.arange(HEADER, dtype=np.int64)
# consumer mode -> what its IDENTIFY adds (go-nsq's defaults: OutputBufferSize 16384, OutputBufferTimeout 250ms)
MODES = {"defaults": {"output_buffer_size": 16384, "output_buffer_timeout": 250},
         "unbuffered": {"output_buffer_size": -1, "output_buffer_timeout": 250}}


class ConsumerConnection(Connection):
    """A `Connection` whose IDENTIFY also carries the mode's output buffer fields (no feature negotiation, so
    the reply is OK; nsqd applies the fields all the same, and rejects invalid ones with E_BAD_BODY)."""

    def __init__(self, address: tuple[str, int], identify_extra: dict, timeout: float = 10.0):
        super().__init__(address, timeout, identify_extra)


def bodies(scheduled_ns: np.ndarray, run_id: int, phase: int, size: int) -> list[bytes]:
    out = np.zeros((len(scheduled_ns), size), dtype=np.uint8)
    out[:, :8] = scheduled_ns.astype(">i8").view(np.uint8).reshape(-1, 8)
    out[:, 8:12] = np.frombuffer(run_id.to_bytes(4, "big"), dtype=np.uint8)
    out[:, 12:14] = np.frombuffer(phase.to_bytes(2, "big"), dtype=np.uint8)
    return [row.tobytes() for row in out]


def read_stamps(array: np.ndarray, body_offsets: np.ndarray):
    """(scheduled ns, run id, phase) of each message of a batch, from the first HEADER bytes of its body."""
    head = np.ascontiguousarray(array[body_offsets[:, None] + _STAMP_SPAN])
    return (head[:, :8].copy().view(">i8").ravel().astype(np.int64),
            head[:, 8:12].copy().view(">u4").ravel(), head[:, 12:14].copy().view(">u2").ravel())


def publish_phase(conn: Connection, opts, run_id: int, phase: int, rate: int, runfor: float) -> dict:
    total = max(int(rate * runfor), 1)
    interval = 1e9 / rate
    start = time.time_ns()
    sent = 0
    max_lag = 0
    while sent < total:
        now = time.time_ns()
        due = min(total, int((now - start) / interval) + 1, sent + MAX_BATCH)
        if due <= sent:
            time.sleep(max(0.0, (start + sent * interval - now) / 1e9))  # pacing: the next one is not due yet
            continue
        scheduled = start + (np.arange(sent, due, dtype=np.float64) * interval).astype(np.int64)
        batch = bodies(scheduled, run_id, phase, opts.size)
        conn.send(client.pub(opts.topic, batch[0]) if len(batch) == 1 else client.mpub(opts.topic, batch))
        conn.expect_ok("PUB")
        max_lag = max(max_lag, now - int(scheduled[0]))
        sent = due
    elapsed = (time.time_ns() - start) / 1e9
    return {"rate": rate, "sent": sent, "achieved_rate": sent / elapsed, "max_publish_lag_ms": max_lag / 1e6}


def consume(opts, mode: str, phases: int, run_id: int, pipe) -> None:
    """The consumer process: IDENTIFY as `mode` says, subscribe, report ready, collect latencies until told the
    totals and all came."""
    try:
        conn = ConsumerConnection(opts.nsqd_tcp_address, MODES[mode])
        conn.subscribe(opts.topic, opts.channel, opts.rdy)
        stream = MessageStream(conn)
    except (OSError, BenchError) as err:
        pipe.send({"error": str(err)})
        return
    pipe.send({"ready": True})
    chunks: list[list[np.ndarray]] = [[] for _ in range(phases)]
    counts = np.zeros(phases, dtype=np.int64)
    expected = drain_until = None
    error = ""
    try:
        while expected is None or (counts < expected).any():
            if expected is None and pipe.poll():
                expected = np.array(pipe.recv(), dtype=np.int64)
                drain_until = time.monotonic() + DRAIN_S
            if drain_until is not None and time.monotonic() > drain_until:
                break
            batches = stream.read(POLL_S)
            handled_ns = time.time_ns()
            for batch in batches:
                scheduled, runs, phase = read_stamps(stream.array, batch.body_offsets)
                conn.send(fin_lines(stream.array, batch.body_offsets))
                ours = (runs == run_id) & (phase < phases)
                for p in np.unique(phase[ours]):
                    mine = ours & (phase == p)
                    chunks[p].append(handled_ns - scheduled[mine])
                    counts[p] += int(mine.sum())
    except (OSError, BenchError) as err:
        error = str(err)
    pipe.send({"phases": [summarize(np.concatenate(c) if c else np.zeros(0, np.int64)) for c in chunks],
               "error": error, "nonfatal_errors": stream.nonfatal_errors})


def summarize(latencies_ns: np.ndarray) -> dict:
    if not len(latencies_ns):
        return {"received": 0}
    us = latencies_ns / 1e3
    p50, p90, p99, p999 = np.percentile(us, [50, 90, 99, 99.9])
    return {"received": int(len(us)), "p50_us": p50, "p90_us": p90, "p99_us": p99, "p999_us": p999,
            "max_us": float(us.max()), "mean_us": float(us.mean()),
            "cdf_us": np.quantile(us, CDF_QUANTILES).round(1).tolist()}


def run_phases(opts, mode: str, rates: list[int], runfor: float) -> dict:
    """One consumer process in `mode` and this process publishing: every rate in turn, then the per-rate
    figures (each phase tagged with the mode)."""
    run_id = int.from_bytes(os.urandom(4), "big")
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    consumer = ctx.Process(target=consume, args=(opts, mode, len(rates) + 1, run_id, theirs), daemon=True)
    consumer.start()
    theirs.close()
    try:
        ready = ours.recv() if ours.poll(30) else {"error": "consumer did not subscribe within 30s"}
        if "error" in ready:
            raise BenchError(f"consumer: {ready['error']}")
        conn = Connection(opts.nsqd_tcp_address)
        schedule = [(rates[0], WARMUP_S)] + [(rate, runfor) for rate in rates]
        published = [publish_phase(conn, opts, run_id, phase, rate, seconds)
                     for phase, (rate, seconds) in enumerate(schedule)]
        conn.close()
        ours.send([p["sent"] for p in published])
        if not ours.poll(DRAIN_S + 30):
            raise BenchError("consumer did not report")
        consumed = ours.recv()
    finally:
        consumer.join(timeout=5)
        if consumer.is_alive():
            consumer.kill()
    phases = [{"mode": mode, **pub, **con, "lost": pub["sent"] - con["received"]}
              for pub, con in zip(published, consumed["phases"])][1:]  # [0] is the warm-up
    errors = sum(p["lost"] != 0 for p in phases) + bool(consumed["error"]) + consumed["nonfatal_errors"]
    for p in phases:
        log(f"latency {mode} @ {p['rate']}/s: sent {p['sent']} received {p['received']} - "
            f"p50 {p.get('p50_us', 0):.0f}us - p99 {p.get('p99_us', 0):.0f}us - "
            f"p99.9 {p.get('p999_us', 0):.0f}us - max {p.get('max_us', 0):.0f}us")
    return {"phases": phases, "errors": errors, "first_error": consumed["error"]}


def parser() -> argparse.ArgumentParser:
    p = base_parser("publish-to-handler latency at fixed publish rates")
    p.set_defaults(topic="latency_bench", runfor=5.0, ceiling_runfor=1.0)
    p.add_argument("--channel", default="lat")
    p.add_argument("--rates", default="1000,10000,100000", help="comma-separated messages per second")
    p.add_argument("--modes", default="defaults,unbuffered",
                   help="comma-separated consumer modes, each runs every rate: defaults (IDENTIFY "
                        "output_buffer_size 16384, output_buffer_timeout 250 ms, as NSQ's clients) and "
                        "unbuffered (output_buffer_size -1)")
    p.add_argument("--rdy", type=int, default=2500)
    return p


def run_modes(opts, modes: list[str], rates: list[int], runfor: float) -> dict:
    """`run_phases` for each mode in turn: one list of phases (mode-major), errors summed, the first error."""
    phases, errors, first_error = [], 0, ""
    for mode in modes:
        got = run_phases(opts, mode, rates, runfor)
        phases += got["phases"]
        errors += got["errors"]
        first_error = first_error or got["first_error"]
    return {"phases": phases, "errors": errors, "first_error": first_error}


def main(argv=None) -> int:
    opts = parser().parse_args(argv)
    warm_up()
    rates = [int(r) for r in opts.rates.split(",") if r]
    modes = [m for m in opts.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise BenchError(f"--modes: unknown {unknown or modes}; choose from {', '.join(MODES)}")
    if opts.size < HEADER:
        raise BenchError(f"--size must be at least {HEADER} (the stamp)")
    result = {"tool": "latency", "target": "%s:%d" % opts.nsqd_tcp_address, "topic": opts.topic,
              "size": opts.size, "rates": rates, "modes": modes,
              "identify": {m: MODES[m] for m in modes}, "runfor_s": opts.runfor, **environment()}
    if opts.ceiling:
        with source_server.start(relay=True) as relay:
            standin = argparse.Namespace(**vars(opts))
            standin.nsqd_tcp_address = relay.address
            log("latency ceiling (in-process relay; the tool's own overhead, not subtracted):")
            ceiling = run_modes(standin, modes, rates, opts.ceiling_runfor)
        result["ceiling"] = ceiling["phases"]
        result["ceiling_errors"] = ceiling["errors"]
    wait_for_deadline(opts.deadline)
    result.update(run_modes(opts, modes, rates, opts.runfor))
    ceilings = {(c["mode"], c["rate"]): c for c in result.get("ceiling", [])}
    for p in result["phases"]:
        c = ceilings.get((p["mode"], p["rate"]), {})
        log(f"latency {p['mode']} @ {p['rate']}/s: p50 {p.get('p50_us', 0):.0f}us p99 {p.get('p99_us', 0):.0f}us"
            + (f" (tool's own, against the stand-in: p50 {c.get('p50_us', 0):.0f}us p99 {c.get('p99_us', 0):.0f}us)"
               if c else ""))
    emit(result, opts.out)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    cli(main)
