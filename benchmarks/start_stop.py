"""How long a warm nsqd takes from exec to listening, and from SIGTERM to its exit, idle and with messages queued,
optionally next to Go nsqd:

    python -m benchmarks.start_stop [--rounds=5] [--queued=100000] [--go-nsqd=PATH] [--out=FILE]

Each round, per server, on a fresh data path: a start (exec to the `TCP: listening on` line, `start_s`), a stop
at once (SIGTERM to exit: `idle_stop_s`); then a start, --queued messages of 200 B published by MPUBs of 1,000 to
a topic with one channel, a stop (`queued_stop_s`: saving them), a start on that data path (`queued_start_s`:
loading them; nsqpy says it is listening once they are loaded, Go nsqd once its disk queues are open) and its
stop. nsqpy runs with its HTTP API on (port 0) and --workers=2, as `deploy/` does, from this checkout's numba
cache (run one nsqd first after a change: the first start compiles). PYTHONDONTWRITEBYTECODE is removed from the
started nsqd's environment, as benchmarks/first_start.py does (an installed nsqd has its bytecode). Medians per
server; prints one JSON line.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import emit, environment
from nsqpy.protocol import client as C

BODY = b"x" * 200
BATCH = 1000


def _start(argv, env):
    """-> (process, seconds from exec to its TCP listening line, (host, port)). Returns once HTTP listens too, so
    that the stop that follows is a stop of a started server (Go nsqd's signal handler is set up after its TCP
    listener: a SIGTERM right after that line can kill it)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    took = address = None
    http = False
    for line in proc.stdout:
        if "TCP: listening on" in line:
            took = time.monotonic() - t0
            host, _, port = line.strip().rpartition(" ")[2].rpartition(":")
            address = (host.strip("[]"), int(port))
        http = http or "HTTP: listening on" in line
        if took is not None and http:
            return proc, took, address
    raise RuntimeError(f"{argv[0]} exited with {proc.wait()} before listening")


def _stop(proc):
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.stdout.read()  # drains its output until it closes (its children too)
    code = proc.wait()
    if code != 0:
        raise RuntimeError(f"exit code {code} at stop")
    return time.monotonic() - t0


def _publish(address, n, topic="start_stop"):
    with socket.create_connection(address) as sock:
        sock.sendall(C.MAGIC_V2)
        sock.sendall(C.sub(topic, "ch") + C.cls())  # the channel exists: the messages wait in it
        left, pending = n, 0
        while left:
            k = min(BATCH, left)
            sock.sendall(C.mpub(topic, [BODY] * k))
            left -= k
            pending += 1
        want = pending + 2  # SUB's OK, CLS's CLOSE_WAIT, each MPUB's OK
        buf = b""
        while want:
            buf += sock.recv(65536)
            while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                size = int.from_bytes(buf[:4], "big")
                buf = buf[4 + size:]
                want -= 1


def _rounds(name, argv_for, env, rounds, queued):
    runs = {"start_s": [], "idle_stop_s": [], "queued_stop_s": [], "queued_start_s": []}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix=f"start_stop_{name}_") as data:
            proc, took, _ = _start(argv_for(data), env)
            runs["start_s"].append(took)
            runs["idle_stop_s"].append(_stop(proc))
        with tempfile.TemporaryDirectory(prefix=f"start_stop_{name}_") as data:
            proc, _, address = _start(argv_for(data), env)
            _publish(address, queued)
            runs["queued_stop_s"].append(_stop(proc))
            proc, took, _ = _start(argv_for(data), env)
            runs["queued_start_s"].append(took)
            _stop(proc)
    return {"runs": runs, **{k: round(statistics.median(v), 3) for k, v in runs.items()}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--queued", type=int, default=100_000)
    p.add_argument("--go-nsqd", default="", help="path of a Go nsqd binary to measure alongside")
    p.add_argument("--out", default="", help="also write the JSON line to this file")
    opts = p.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    flags = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
    servers = {"nsqpy": lambda d: [sys.executable, "-m", "nsqpy.workers.processes.nsqd", *flags, "--workers=2", f"--data-path={d}"]}
    if opts.go_nsqd:
        servers["go"] = lambda d: [opts.go_nsqd, *flags, f"--data-path={d}"]
    result = {"tool": "start_stop", **environment(), "rounds": opts.rounds, "queued": opts.queued}
    for name, argv_for in servers.items():
        result[name] = _rounds(name, argv_for, env, opts.rounds, opts.queued)
    emit(result, opts.out)


if __name__ == "__main__":
    main()
