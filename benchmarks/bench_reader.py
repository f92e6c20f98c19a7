"""NSQ's bench_reader: one raw connection per worker process, IDENTIFY, SUB, RDY --rdy, and a FIN for every
message (all the FINs of one receive buffer go out in one send), for --runfor.

    python -m benchmarks.bench_reader [--nsqd-tcp-address=127.0.0.1:4150] [--topic=sub_bench] [--channel=ch]
        [--size=200] [--rdy=2500] [--runfor=10s] [--connections=N] [--count=N] [--deadline=...]
        [--no-ceiling] [--out=FILE]

--count N stops once exactly N messages were FINed across all connections (the last buffer's surplus is
left unFINed, for the broker to time out) and fails if --runfor passes first: the smoke test that nothing was
lost. The duration is then the time to the last FIN. The ceiling run first measures the same workers against
an in-process source_server on port 0.
"""

from __future__ import annotations

import multiprocessing
import time

from benchmarks import source_server
from benchmarks.common import BenchError, base_parser, cli, emit, log, measure
from benchmarks.wire import Connection, MessageStream, fin_lines, warm_up

COUNT_POLL_S = 0.05   # with --count, how often an idle worker looks whether the others reached the count


class ReaderWorker:
    def __init__(self, index: int, opts):
        self.conn = Connection(opts.nsqd_tcp_address)
        self.conn.subscribe(opts.topic, opts.channel, opts.rdy)
        self.stream = MessageStream(self.conn)
        self.budget = opts.count_budget

    def run(self, stop_at: float) -> dict:
        msgs = body_bytes = errors = 0
        error_text = ""
        clock = time.monotonic
        start = last = clock()
        try:
            while True:
                now = clock()
                if now >= stop_at or (self.budget is not None and self.budget.value <= 0):
                    break
                wait = stop_at - now if self.budget is None else min(stop_at - now, COUNT_POLL_S)
                for batch in self.stream.read(wait):
                    offsets, lengths = batch.body_offsets, batch.body_lengths
                    if self.budget is not None:
                        k = _claim(self.budget, len(offsets))
                        offsets, lengths = offsets[:k], lengths[:k]
                    if len(offsets):
                        self.conn.send(fin_lines(self.stream.array, offsets))
                        msgs += len(offsets)
                        body_bytes += int(lengths.sum())
                        last = clock()
        except (BenchError, OSError) as err:
            errors, error_text = 1, str(err)
        end = last if self.budget is not None else clock()
        self.conn.close_after_server()
        return {"msgs": msgs, "bytes": body_bytes, "errors": errors + self.stream.nonfatal_errors,
                "elapsed_s": end - start, "error_text": error_text}


def _claim(budget, n: int) -> int:
    """Take up to n messages from the shared --count budget."""
    with budget.get_lock():
        k = min(n, budget.value)
        budget.value -= k
    return k


def parser():
    p = base_parser("NSQ's bench_reader: SUB, RDY and FIN every message for --runfor")
    p.add_argument("--channel", default="ch")
    p.add_argument("--rdy", type=int, default=2500, help="RDY count per connection")
    p.add_argument("--count", type=int, default=0, help="stop after exactly this many messages in all")
    return p


def main(argv=None) -> int:
    opts = parser().parse_args(argv)
    warm_up()
    opts.count_budget = multiprocessing.get_context("fork").Value("q", opts.count) if opts.count else None
    result = measure("bench_reader", ReaderWorker, opts,
                     lambda: source_server.start(processes=opts.connections, size=opts.size))
    result.update(channel=opts.channel, rdy=opts.rdy)
    failed = bool(result["errors"])
    if opts.count:
        result["count"] = opts.count
        if result["msgs"] != opts.count:
            log(f"bench_reader: received {result['msgs']} of --count {opts.count} before --runfor passed")
            failed = True
    emit(result, opts.out)
    return 1 if failed else 0


if __name__ == "__main__":
    cli(main)
