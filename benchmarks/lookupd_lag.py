"""Registration lag: from the reply of the command that creates a topic on nsqd to the first ``/lookup`` on
nsqlookupd that lists nsqd for it.

    python -m benchmarks.lookupd_lag [--topics=50] [--workers=2] [--out=benchmarks/results/lookupd_lag.json]

Starts ``nsqlookupd`` and nsqpy's ``nsqd`` registering with it (both on port 0, NSQ's default log level), then
creates ``--topics`` topics one after another over nsqd's HTTP API (``POST /topic/create``) and as many with a TCP
PUB to a new topic; after each reply it polls ``GET /lookup?topic=`` (one request per connection, as consumers
poll) until nsqd is listed, with a 10 s deadline. Prints one JSON line: per way of creating, the median, p99 and
max of the lags in ms and how many topics were found at the first /lookup after the reply. The poll's own round
trip (~1 ms here) is part of every figure: it is a ceiling on the lag as a consumer sees it.
"""
from __future__ import annotations

import argparse
import http.client
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.common import BenchError, cli, emit, environment, log
from benchmarks.process import REPO

LISTEN = re.compile(rb"(TCP|HTTP): listening on (\S+):(\d+)")
DEADLINE = 10.0


def start(argv, names=("TCP", "HTTP")):
    """A daemon that logs NSQ's listening lines: (process, {"TCP": (host, port), "HTTP": ...})."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=REPO,
                            start_new_session=True)
    found = {}
    deadline = time.monotonic() + 120
    while len(found) < len(names):
        line = proc.stderr.readline()
        if not line or time.monotonic() > deadline:
            proc.kill()
            raise BenchError(f"{argv[2]} did not start")
        m = LISTEN.search(line)
        if m:
            found[m.group(1).decode()] = (m.group(2).decode(), int(m.group(3)))
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # never a full pipe
    return proc, found


def stop(proc):
    proc.terminate()
    try:
        return proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def request(address, method, path):
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def listed(lookupd, topic) -> bool:
    status, body = request(lookupd, "GET", f"/lookup?topic={topic}")
    return status == 200 and b'"tcp_port"' in body


def lag(lookupd, topic):
    """(seconds from now until /lookup lists the topic, polls it took)."""
    start_at = time.monotonic()
    polls = 0
    while True:
        polls += 1
        if listed(lookupd, topic):
            return time.monotonic() - start_at, polls
        if time.monotonic() - start_at > DEADLINE:
            raise BenchError(f"{topic} not in /lookup within {DEADLINE:.0f}s")


def pub(sock, topic):
    body = b"m"
    sock.sendall(b"PUB %s\n" % topic.encode() + struct.pack(">I", len(body)) + body)
    reply = b""
    while len(reply) < 4 or len(reply) < 4 + struct.unpack(">I", reply[:4])[0]:
        chunk = sock.recv(4096)
        if not chunk:
            raise BenchError("nsqd closed the connection")
        reply += chunk
    if reply[8:] != b"OK":
        raise BenchError(f"PUB answered {reply!r}")


def figures(lags):
    ms = sorted(x * 1e3 for x, _ in lags)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {"median_ms": round(statistics.median(ms), 2), "p99_ms": round(p99, 2), "max_ms": round(ms[-1], 2),
            "found_at_first_lookup": sum(1 for _, polls in lags if polls == 1), "topics": len(ms)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topics", type=int, default=50)
    p.add_argument("--workers", type=int, default=2, help="nsqd's --workers")
    p.add_argument("--out", default="")
    args = p.parse_args()
    lk, lk_addr = start([sys.executable, "-m", "nsqpy.http_api.lookupd.main", "--tcp-address=127.0.0.1:0",
                         "--http-address=127.0.0.1:0"])
    data = tempfile.mkdtemp(prefix="lookupd_lag")
    try:
        tcp = "%s:%d" % lk_addr["TCP"]
        nsqd, nsqd_addr = start([sys.executable, "-m", "nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0",
                                 "--http-address=127.0.0.1:0", f"--data-path={data}", f"--workers={args.workers}",
                                 "--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={tcp}"])
        try:
            deadline = time.monotonic() + 30
            while b'"tcp_port"' not in request(lk_addr["HTTP"], "GET", "/nodes")[1]:  # IDENTIFY done
                if time.monotonic() > deadline:
                    raise BenchError("nsqd did not connect to nsqlookupd")
                time.sleep(0.01)  # polling a condition with a deadline
            run = f"{os.getpid()}x{int(time.time())}"
            by_http = []
            for i in range(args.topics):
                topic = f"lagh{run}-{i}"
                status, body = request(nsqd_addr["HTTP"], "POST", f"/topic/create?topic={topic}")
                if status != 200:
                    raise BenchError(f"/topic/create answered {status} {body!r}")
                by_http.append(lag(lk_addr["HTTP"], topic))
            by_pub = []
            with socket.create_connection(nsqd_addr["TCP"], timeout=30) as sock:
                sock.sendall(b"  V2")
                for i in range(args.topics):
                    topic = f"lagt{run}-{i}"
                    pub(sock, topic)
                    by_pub.append(lag(lk_addr["HTTP"], topic))
        finally:
            code = stop(nsqd)
            if code != 0:
                log(f"nsqd exited with {code}")
    finally:
        stop(lk)
    result = {"tool": "lookupd_lag", "http_topic_create": figures(by_http), "tcp_pub": figures(by_pub),
              "nsqd_workers": args.workers, **environment()}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    cli(main)
