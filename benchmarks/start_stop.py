"""How long a warm nsqd takes from exec to listening and to its first replies, and from SIGTERM to its exit, idle and
with messages queued, optionally next to Go nsqd:

    python -m benchmarks.start_stop [--rounds=5] [--queued=100000] [--go-nsqd=PATH] [--out=FILE]

Each round, per server, on a fresh data path: a start (exec to the `TCP: listening on` line, `start_s`; to the
`HTTP: listening on` line too, `ready_s`), a stop (SIGTERM to exit: `idle_stop_s`); then a start that also times
the first replies (`first_pub_s`: exec to the OK of a PUB sent over a connection opened at the TCP line;
`first_ping_s`: exec to a 200 from /ping asked at the HTTP line), --queued messages of 200 B published by MPUBs of
1,000 to a topic with one channel, a stop (`queued_stop_s`: saving them), a start on that data path
(`queued_start_s`: loading them; nsqpy says it is listening once they are loaded, Go nsqd once its disk queues are
open; `queued_ready_s`: both lines) and its stop. A stop is sent once both listening lines are out and /ping
answered once (Go nsqd's signal handler is set up after its listeners, by another goroutine than the one that
prints their lines: a SIGTERM right after both lines killed it in 6 of 20 starts on a loaded machine, still 2
of 20 after the /ping; such a round is run again, counted in `died_of_sigterm`). nsqpy
runs with its HTTP API on (port 0) and --workers=2, as `deploy/` does, from this checkout's numba cache (run
`nsqd --compile-only` first after a change: the first start compiles). PYTHONDONTWRITEBYTECODE is removed from
the started nsqd's environment, as benchmarks/first_start.py does (an installed nsqd has its bytecode). Medians
per server; prints one JSON line.
"""
from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.common import emit, environment
from nsqpy.protocol import client as C

BODY = b"x" * 200
BATCH = 1000
REPLY_TIMEOUT_S = 120.0


def _address(line):
    host, _, port = line.strip().rpartition(" ")[2].rpartition(":")
    return host.strip("[]"), int(port)


def _first_pub(address, t0, out):
    """exec -> the OK of one PUB on a connection opened now (at the TCP line), into out["first_pub_s"]."""
    with socket.create_connection(address, timeout=REPLY_TIMEOUT_S) as sock:
        sock.sendall(C.MAGIC_V2 + C.pub("start_stop_first", b"x"))
        reply = b""
        while len(reply) < 4 or len(reply) < 4 + int.from_bytes(reply[:4], "big"):
            chunk = sock.recv(256)
            if not chunk:
                raise RuntimeError("the connection closed before PUB's reply")
            reply += chunk
        if reply[8:10] != b"OK":
            raise RuntimeError(f"PUB answered {reply!r}")
        out["first_pub_s"] = time.monotonic() - t0


def _first_ping(address, t0, out):
    """exec -> a 200 from /ping asked now (at the HTTP line), into out["first_ping_s"]."""
    web = http.client.HTTPConnection(*address, timeout=REPLY_TIMEOUT_S)
    try:
        web.request("GET", "/ping")
        status = web.getresponse().status
    finally:
        web.close()
    if status != 200:
        raise RuntimeError(f"/ping answered {status}")
    out["first_ping_s"] = time.monotonic() - t0


def _start(argv, env, replies=False):
    """-> (process, {"start_s": exec to its TCP listening line, "ready_s": to both listening lines, and with
    ``replies`` "first_pub_s" and "first_ping_s"}, (host, port)). Returns once both lines are out."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    times, address, threads, http_address = {}, None, [], None
    for line in proc.stdout:
        now = time.monotonic() - t0
        if "TCP: listening on" in line and address is None:
            times["start_s"] = now
            address = _address(line)
            if replies:
                threads.append(threading.Thread(target=_first_pub, args=(address, t0, times)))
                threads[-1].start()
        if "HTTP: listening on" in line and http_address is None:
            http_address = _address(line)
            if replies:
                threads.append(threading.Thread(target=_first_ping, args=(http_address, t0, times)))
                threads[-1].start()
        if address is not None and http_address is not None:
            times["ready_s"] = now
            for t in threads:
                t.join(REPLY_TIMEOUT_S)
            if replies and not ("first_pub_s" in times and "first_ping_s" in times):
                raise RuntimeError(f"{argv[0]}: no first replies ({times})")
            _first_ping(http_address, t0, {})  # one answer before any stop (see the module's docstring)
            return proc, times, address
    raise RuntimeError(f"{argv[0]} exited with {proc.wait()} before it was up")


def _stop(proc):
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.stdout.read()  # drains its output until it closes (its children too)
    code = proc.wait()
    if code == -signal.SIGTERM:
        raise DiedOfTheSignal()
    if code != 0:
        raise RuntimeError(f"exit code {code} at stop")
    return time.monotonic() - t0


class DiedOfTheSignal(Exception):
    """The server died of the SIGTERM itself: its handler was not set up yet (Go nsqd, see the module's docstring);
    the round is run again and counted in ``died_of_sigterm``."""


def _again(step, died, attempts=5):
    """step() until it stops its servers cleanly (``died``: [count] of the rounds run again)."""
    for _ in range(attempts - 1):
        try:
            return step()
        except DiedOfTheSignal:
            died[0] += 1
    return step()


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
    keys = ("start_s", "ready_s", "first_pub_s", "first_ping_s", "idle_stop_s", "queued_stop_s", "queued_start_s",
            "queued_ready_s")
    runs = {k: [] for k in keys}
    died = [0]

    def idle():
        with tempfile.TemporaryDirectory(prefix=f"start_stop_{name}_") as data:
            proc, times, _ = _start(argv_for(data), env)
            stop = _stop(proc)
        return {"start_s": times["start_s"], "ready_s": times["ready_s"], "idle_stop_s": stop}

    def with_queue():
        with tempfile.TemporaryDirectory(prefix=f"start_stop_{name}_") as data:
            proc, times, address = _start(argv_for(data), env, replies=True)
            got = {"first_pub_s": times["first_pub_s"], "first_ping_s": times["first_ping_s"]}
            _publish(address, queued)
            got["queued_stop_s"] = _stop(proc)
            proc, times, _ = _start(argv_for(data), env)
            got.update(queued_start_s=times["start_s"], queued_ready_s=times["ready_s"])
            _stop(proc)
        return got

    for _ in range(rounds):
        for step in (idle, with_queue):
            for k, v in _again(step, died).items():
                runs[k].append(v)
    return {"runs": runs, "died_of_sigterm": died[0], **{k: round(statistics.median(v), 3) for k, v in runs.items()}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--queued", type=int, default=100_000)
    p.add_argument("--go-nsqd", default="", help="path of a Go nsqd binary to measure alongside")
    p.add_argument("--out", default="", help="also write the JSON line to this file")
    opts = p.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    flags = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
    servers = {"nsqpy": lambda d: [sys.executable, "-m", "nsqpy.workers.processes.nsqd", *flags, "--workers=2",
                                   f"--data-path={d}"]}
    if opts.go_nsqd:
        servers["go"] = lambda d: [opts.go_nsqd, *flags, f"--data-path={d}"]
    result = {"tool": "start_stop", **environment(), "rounds": opts.rounds, "queued": opts.queued}
    for name, argv_for in servers.items():
        result[name] = _rounds(name, argv_for, env, opts.rounds, opts.queued)
    emit(result, opts.out)


if __name__ == "__main__":
    main()
