"""NSQ's bench_writer: one raw connection per worker process, IDENTIFY, then MPUB after MPUB of --batch-size
messages of --size bytes, each waiting for its OK, for --runfor.

    python -m benchmarks.bench_writer [--nsqd-tcp-address=127.0.0.1:4150] [--topic=sub_bench] [--size=200]
        [--batch-size=200] [--runfor=10s] [--connections=N] [--deadline="YYYY-MM-DD HH:MM:SS"]
        [--no-ceiling] [--out=FILE]

--batch-size=1 sends one PUB per round trip instead. The ceiling run first measures the same workers against
an in-process sink_server on port 0. Prints `duration - MiB/s - ops/s - us/op` on stderr and one JSON line on
stdout.
"""

from __future__ import annotations

import time

from nsqpy.protocol import client

from benchmarks import sink_server
from benchmarks.common import BenchError, base_parser, cli, emit, measure
from benchmarks.wire import Connection


class WriterWorker:
    def __init__(self, index: int, opts):
        self.batch = opts.batch_size
        self.conn = Connection(opts.nsqd_tcp_address)
        body = b"a" * opts.size
        if self.batch == 1:
            self.command, self.verb = client.pub(opts.topic, body), "PUB"
        else:
            self.command, self.verb = client.mpub(opts.topic, [body] * self.batch), "MPUB"
        self.size = opts.size

    def run(self, stop_at: float) -> dict:
        msgs = errors = 0
        error_text = ""
        send, expect_ok, command, verb = self.conn.send, self.conn.expect_ok, self.command, self.verb
        clock = time.monotonic
        start = clock()
        try:
            while clock() < stop_at:
                send(command)
                expect_ok(verb)
                msgs += self.batch
        except (BenchError, OSError) as err:
            errors, error_text = 1, str(err)
        elapsed = clock() - start
        self.conn.close()
        return {"msgs": msgs, "bytes": msgs * self.size, "errors": errors,
                "elapsed_s": elapsed, "error_text": error_text}


def parser():
    p = base_parser("NSQ's bench_writer: MPUB (or PUB) round trips for --runfor")
    p.add_argument("--batch-size", type=int, default=200, help="messages per MPUB; 1 = one PUB per round trip")
    return p


def main(argv=None) -> int:
    opts = parser().parse_args(argv)
    opts.count_budget = None
    result = measure("bench_writer", WriterWorker, opts, lambda: sink_server.start(processes=opts.connections))
    result["batch_size"] = opts.batch_size
    emit(result, opts.out)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    cli(main)
