"""One message at a time through the broker: the broker's own cost per message, with no queue to hide it.

    python -m benchmarks.roundtrip [--nsqd-tcp-address=127.0.0.1:4150] [--runfor=5s] [--size=200]
        [--topic=roundtrip_bench] [--channel=rt] [--no-ceiling] [--out=FILE]

Theory of operation
-------------------
One process holds two connections: a producer, and a consumer that subscribes with RDY 1 and the unbuffered
IDENTIFY of benchmarks/latency.py (output_buffer_size -1). A round trip is: PUB one message, read it at the
consumer, FIN it, read the PUB's OK. The next PUB goes only after that, so exactly one message is in the broker
at any time and every step waits for the one before it: the time of a round trip is the broker's work for one
message (read the PUB, store it, deliver it, read the FIN, answer OK) plus this process's and the loopback's.

That is the cost an unbuffered consumer at a low rate sees in its latency (benchmarks/latency.py's
`unbuffered` at 1k msgs/s), measured without the fixed-rate schedule, the second process and the sleeps between
messages that make those figures noisy. It is a figure for comparing brokers (and commits) side by side, not a
rate any real producer sees: NSQ's clients pipeline.

--ceiling (on by default) first runs the same loop for --ceiling-runfor against an in-process
`source_server --relay` on port 0: what a round trip costs when the broker costs almost nothing. It is reported
(`ceiling`), never subtracted.

JSON: `round_trips`, `round_trips_per_s`, `us_per_round_trip` (mean) and p50/p99/p99.9 of single round trips.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from nsqpy.protocol import client
from nsqpy.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, HEARTBEAT

from benchmarks import source_server
from benchmarks.common import BenchError, base_parser, cli, emit, environment, log
from benchmarks.latency import MODES
from benchmarks.wire import Connection

WARMUP_S = 0.5   # unreported round trips first: numba's first calls, TCP warm-up


class Pair:
    """The producer and the RDY 1 unbuffered consumer, subscribed (SUB creates the topic and the channel)."""

    def __init__(self, address, topic: str, channel: str, size: int):
        self.producer = Connection(address)
        self.consumer = Connection(address, identify_extra=MODES["unbuffered"])
        self.consumer.subscribe(topic, channel, 1)
        self.pub = client.pub(topic, b"r" * size)

    def round_trip(self) -> None:
        self.producer.send(self.pub)
        data = self._next_message()
        self.consumer.send(client.fin(data[10:26]))
        self.producer.expect_ok("PUB")

    def _next_message(self) -> bytes:
        c = self.consumer
        while True:
            while c.pending:
                frame_type, data = c.pending.pop(0)
                if frame_type == FRAME_MESSAGE:
                    return data
                if frame_type == FRAME_ERROR:
                    raise BenchError(f"consumer: {data.decode('ascii', 'replace')}")
                if data == HEARTBEAT:
                    c.send(client.nop())
            chunk = c.sock.recv(1 << 16)
            if not chunk:
                raise BenchError("consumer: connection closed by the server")
            c.pending.extend(c.decoder.feed(chunk))

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()


def run(address, opts, runfor: float) -> dict:
    pair = Pair(address, opts.topic, opts.channel, opts.size)
    try:
        end = time.monotonic() + WARMUP_S
        while time.monotonic() < end:
            pair.round_trip()
        times = []
        clock = time.perf_counter_ns
        start = clock()
        stop = start + int(runfor * 1e9)
        last = start
        while last < stop:
            pair.round_trip()
            now = clock()
            times.append(now - last)
            last = now
    finally:
        pair.close()
    us = np.array(times, np.float64) / 1e3
    p50, p99, p999 = np.percentile(us, [50, 99, 99.9])
    elapsed = (last - start) / 1e9
    return {"round_trips": len(us), "round_trips_per_s": len(us) / elapsed, "us_per_round_trip": float(us.mean()),
            "p50_us": float(p50), "p99_us": float(p99), "p999_us": float(p999), "max_us": float(us.max())}


def parser() -> argparse.ArgumentParser:
    p = base_parser("one message at a time: PUB, receive, FIN, OK")
    p.set_defaults(topic="roundtrip_bench", runfor=5.0, ceiling_runfor=1.0)
    p.add_argument("--channel", default="rt")
    return p


def main(argv=None) -> int:
    opts = parser().parse_args(argv)
    result = {"tool": "roundtrip", "target": "%s:%d" % opts.nsqd_tcp_address, "topic": opts.topic,
              "size": opts.size, "runfor_s": opts.runfor, **environment()}
    if opts.ceiling:
        with source_server.start(relay=True) as relay:
            result["ceiling"] = run(relay.address, opts, opts.ceiling_runfor)
        log(f"roundtrip ceiling (in-process relay; the tool's own cost, not subtracted): "
            f"{result['ceiling']['us_per_round_trip']:.1f}us per round trip")
    result.update(run(opts.nsqd_tcp_address, opts, opts.runfor))
    result["errors"] = 0
    log(f"roundtrip: {result['round_trips']} round trips - {result['round_trips_per_s']:.0f}/s - "
        f"{result['us_per_round_trip']:.1f}us each - p50 {result['p50_us']:.0f}us p99 {result['p99_us']:.0f}us")
    emit(result, opts.out)
    return 0


if __name__ == "__main__":
    cli(main)
