"""NSQ's bench_writer: raw connections that IDENTIFY, then MPUB after MPUB of --batch-size messages of --size
bytes, each waiting for its OK, for --runfor.

    python -m benchmarks.bench_writer [--nsqd-tcp-address=127.0.0.1:4150] [--topic=sub_bench] [--size=200]
        [--batch-size=200] [--runfor=10s] [--connections=N] [--deadline="YYYY-MM-DD HH:MM:SS"]
        [--driver={process,epoll}] [--driver-processes=K] [--no-ceiling] [--out=FILE]

--batch-size=1 sends one PUB per round trip instead. Two drivers:

* `process` (the default, NSQ's way): one forked worker process per connection, blocking send and recv.
* `epoll`: --driver-processes K forked workers (default 1), each driving its share of the --connections
  from one compiled epoll loop (`fast_writer`), still one command outstanding per connection.

Either driver's ceiling runs against the compiled fast sink (`fast_sink`): the floor a broker can be measured
against here. (The process driver's used to be the Python sink_server, which answers single PUBs slower than
nsqd does: nsqpy once measured 1.8x that "ceiling".)

The ceiling run first measures the same workers against the stand-in on port 0. Prints `duration - MiB/s -
ops/s - us/op` on stderr and one JSON line on stdout (with `driver` and `driver_processes`).
"""

from __future__ import annotations

import argparse
import time

from nsqpy.protocol import client

from benchmarks import sink_server
from benchmarks.common import BenchError, base_parser, cli, emit, measure
from benchmarks.wire import Connection


def publish_command(opts) -> tuple[bytes, str]:
    """The PUB (batch 1) or MPUB every round trip sends, and its verb for error messages."""
    body = b"a" * opts.size
    if opts.batch_size == 1:
        return client.pub(opts.topic, body), "PUB"
    return client.mpub(opts.topic, [body] * opts.batch_size), "MPUB"


def counters(msgs: int, size: int, errors: int, elapsed: float, error_text: str) -> dict:
    return {"msgs": msgs, "bytes": msgs * size, "errors": errors, "elapsed_s": elapsed, "error_text": error_text}


class WriterWorker:
    """--driver=process: one connection, blocking round trips."""

    def __init__(self, index: int, opts):
        self.batch = opts.batch_size
        self.conn = Connection(opts.nsqd_tcp_address)
        self.command, self.verb = publish_command(opts)
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
        return counters(msgs, self.size, errors, elapsed, error_text)


class EpollWriterWorker:
    """--driver=epoll: this worker's share of the connections (`opts.epoll_connections` split over
    `opts.connections` workers, see `main`), set up here and then driven by `fast_writer.publish`."""

    def __init__(self, index: int, opts):
        share, extra = divmod(opts.epoll_connections, opts.connections)
        self.batch, self.size = opts.batch_size, opts.size
        self.command, _ = publish_command(opts)
        self.conns = [Connection(opts.nsqd_tcp_address) for _ in range(share + (index < extra))]
        if any(conn.pending or conn.decoder.buffered for conn in self.conns):
            raise BenchError("the server sent more than the IDENTIFY reply before the first PUB")

    def run(self, stop_at: float) -> dict:
        from benchmarks import fast_writer  # compiled (or loaded) by main before the fork
        start = time.monotonic()
        out = fast_writer.publish([conn.sock for conn in self.conns], self.command, self.batch, stop_at)
        elapsed = time.monotonic() - start
        for conn in self.conns:
            conn.close()
        return counters(out["msgs"], self.size, out["errors"], elapsed, out["error_text"])


def parser():
    p = base_parser("NSQ's bench_writer: MPUB (or PUB) round trips for --runfor")
    p.add_argument("--batch-size", type=int, default=200, help="messages per MPUB; 1 = one PUB per round trip")
    p.add_argument("--driver", choices=("process", "epoll"), default="process",
                   help="process: one blocking process per connection (NSQ's); epoll: compiled epoll loops")
    p.add_argument("--driver-processes", type=int, default=1,
                   help="epoll driver: worker processes sharing the connections")
    return p


def main(argv=None) -> int:
    p = parser()
    opts = p.parse_args(argv)
    opts.count_budget = None
    if opts.driver == "process":
        result = measure("bench_writer", WriterWorker, opts, lambda: sink_server.start(fast=True))
        processes = opts.connections
    else:
        if not 1 <= opts.driver_processes <= opts.connections:
            p.error("--driver-processes must be between 1 and --connections")
        import benchmarks.fast_writer  # noqa: F401  (compile or load the loop once, before the workers fork)
        # common.measure forks one worker per opts.connections: here a worker is a driver process, and the
        # connections are split between them.
        run = argparse.Namespace(**vars(opts), epoll_connections=opts.connections)
        run.connections = processes = opts.driver_processes
        result = measure("bench_writer", EpollWriterWorker, run, lambda: sink_server.start(fast=True))
        result["connections"] = opts.connections
    result.update(batch_size=opts.batch_size, driver=opts.driver, driver_processes=processes)
    emit(result, opts.out)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    cli(main)
