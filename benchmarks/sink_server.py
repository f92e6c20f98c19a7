"""A V2 server that accepts IDENTIFY, PUB, MPUB and DPUB and answers OK as fast as it can, storing nothing.

It is bench_writer's ceiling: the most a writer on this machine can push when the broker costs nothing but
parsing. Every command still goes through the codec's server parser, so a malformed command gets nsqd's error.

    python -m benchmarks.sink_server --tcp-address=127.0.0.1:0 [--processes N] [--fast]

--fast serves with `fast_sink` instead: a compiled epoll loop (1 process unless --processes says otherwise)
that only counts and answers OK, the floor for bench_writer's epoll driver.

Logs NSQ's `TCP: listening on HOST:PORT` line on stderr when ready; on SIGTERM/SIGINT prints one JSON line of
counters (connections, msgs_in, bytes_in, errors, ...) on stdout.
"""

from __future__ import annotations

import argparse

from benchmarks.common import CORES, emit, host_port
from benchmarks.stub_server import Session, StubServer, serve_main


class SinkSession(Session):
    """The base session already does it all: count, reply OK, discard."""


def server(address=("127.0.0.1", 0), processes: int | None = None, fast: bool = False) -> StubServer:
    """The sink, not started yet: Python sessions on every core, or the fast sink on one process."""
    if fast:
        from benchmarks.fast_sink import FastSink  # compiles (or loads) its loop: only when asked for
        return FastSink(address, processes or 1)
    return StubServer(SinkSession, address, processes or CORES)


def start(address=("127.0.0.1", 0), processes: int | None = None, fast: bool = False) -> StubServer:
    return server(address, processes, fast).start()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tcp-address", type=host_port, default=("127.0.0.1", 0))
    p.add_argument("--processes", type=int, default=None,
                   help="serving processes sharing the listener (default: cores, or 1 with --fast)")
    p.add_argument("--fast", action="store_true", help="serve with the compiled no-op loop of fast_sink")
    p.add_argument("--out", default="")
    opts = p.parse_args(argv)
    counters = serve_main("sink_server", server(opts.tcp_address, opts.processes, opts.fast))
    emit({"tool": "sink_server", **counters}, opts.out)


if __name__ == "__main__":
    main()
