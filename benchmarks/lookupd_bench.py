"""nsqlookupd throughput: ``/lookup`` requests per second over HTTP, REGISTER/UNREGISTER per second over V1 TCP.

    python -m benchmarks.lookupd_bench [--runfor=5s] [--http-clients=4] [--tcp-clients=4] [--http-workers=2] \
        [--out=benchmarks/results/lookupd_bench.json]

Starts ``nsqlookupd`` (port 0, NSQ's default log level: an INFO line per request and per REGISTER, as nsqlookupd,
to a pipe this tool drains), registers ``--producers`` V1 producers of the topic with
``--channels`` channels each (what /lookup then returns: a realistic reply), and runs three phases, each with
forked client processes started together (benchmarks/common.py):

    lookup         GET /lookup?topic=... from --http-clients processes, one request per connection (gunicorn's
                   sync workers close after each reply, as pynsq's and go-nsq's pollers open one per poll)
    ping           the same with GET /ping, which the HTTP worker answers alone: the difference is the cost of
                   asking the registry (a unix-socket round trip) and building /lookup's JSON
    register_rtt   REGISTER t cN / UNREGISTER t cN alternately, one command per round trip, --tcp-clients
                   identified connections
    register_pipe  the same, --window commands in flight per connection: the registry's own rate

Prints one JSON line (rates, the commit, cores and command: ``common.environment()``). Clients run on the same
machine as the server, so on a 2-core host they take CPU from it: the figures are a floor.
"""
from __future__ import annotations

import argparse
import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.common import BenchError, cli, combine, duration_s, emit, environment, log, run_workers
from nsqpy.protocol import v1

LISTEN = re.compile(rb"(TCP|HTTP): listening on (\S+):(\d+)")


def start_lookupd(http_workers: int, log_level: str):
    proc = subprocess.Popen([sys.executable, "-m", "nsqpy.http_api.lookupd.main", "--tcp-address=127.0.0.1:0",
                             "--http-address=127.0.0.1:0", f"--http-workers={http_workers}",
                             f"--log-level={log_level}"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            cwd=tempfile.gettempdir())
    found = {}
    deadline = time.monotonic() + 60
    while len(found) < 2:
        line = proc.stderr.readline()
        if not line or time.monotonic() > deadline:
            proc.kill()
            raise BenchError("nsqlookupd did not start")
        m = LISTEN.search(line)
        if m:
            found[m.group(1).decode()] = (m.group(2).decode(), int(m.group(3)))
    # keep draining stderr so a chatty server never blocks on a full pipe
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, found["TCP"], found["HTTP"]


class V1Client:
    def __init__(self, address, tcp_port):
        self.sock = socket.create_connection(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = v1.ReplyDecoder()
        self.pending = []
        self.sock.sendall(v1.magic() + v1.identify({"broadcast_address": "127.0.0.1", "tcp_port": tcp_port,
                                                    "http_port": tcp_port + 1, "version": "1.3.0"}))
        self.replies(1)

    def replies(self, n):
        while len(self.pending) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise BenchError("nsqlookupd closed the connection")
            self.pending.extend(self.decoder.feed(chunk))
        out, self.pending = self.pending[:n], self.pending[n:]
        if any(v1.is_error(r) for r in out):
            raise BenchError(f"error reply: {out}")
        return out


class LookupClient:
    def __init__(self, index, opts):
        self.opts = opts

    def run(self, stop_at):
        host, port = self.opts.http
        n = errors = 0
        path = self.opts.path
        start = time.monotonic()
        while time.monotonic() < stop_at:
            conn = http.client.HTTPConnection(host, port, timeout=10)
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    n += 1
                else:
                    errors += 1
            except OSError:
                errors += 1
            finally:
                conn.close()
        return {"msgs": n, "bytes": 0, "errors": errors, "elapsed_s": time.monotonic() - start}


class RegisterClient:
    def __init__(self, index, opts):
        self.opts = opts
        self.client = V1Client(opts.tcp, 20000 + index)
        self.index = index

    def run(self, stop_at):
        window = self.opts.window
        t = self.opts.topic
        cmds = [v1.register(t, f"c{self.index}"), v1.unregister(t, f"c{self.index}")]
        burst = b"".join(cmds[i % 2] for i in range(window))
        n = 0
        start = time.monotonic()
        while time.monotonic() < stop_at:
            self.client.sock.sendall(burst)
            self.client.replies(window)
            n += window
        return {"msgs": n, "bytes": 0, "errors": 0, "elapsed_s": time.monotonic() - start}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runfor", type=duration_s, default=5.0)
    p.add_argument("--http-clients", type=int, default=4)
    p.add_argument("--tcp-clients", type=int, default=4)
    p.add_argument("--http-workers", type=int, default=2)
    p.add_argument("--producers", type=int, default=10)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--topic", default="lookupd_bench")
    p.add_argument("--log-level", default="info", help="the server's (the listening lines it must print are INFO)")
    p.add_argument("--out", default="")
    opts = p.parse_args()
    proc, opts.tcp, opts.http = start_lookupd(opts.http_workers, opts.log_level)
    result = {"tool": "lookupd_bench", "runfor_s": opts.runfor, "http_clients": opts.http_clients,
              "tcp_clients": opts.tcp_clients, "http_workers": opts.http_workers, "producers": opts.producers,
              "channels": opts.channels, "window": opts.window, "log_level": opts.log_level,
              "loadavg_1m_before": round(os.getloadavg()[0], 2), **environment()}  # a shared host: how busy
    try:
        producers = [V1Client(opts.tcp, 10000 + i) for i in range(opts.producers)]
        for i, c in enumerate(producers):
            c.sock.sendall(b"".join(v1.register(opts.topic, f"ch{j}") for j in range(opts.channels)))
            c.replies(opts.channels)
        conn = http.client.HTTPConnection(*opts.http)
        conn.request("GET", f"/lookup?topic={opts.topic}")
        result["lookup_reply_bytes"] = len(conn.getresponse().read())
        conn.close()
        phases = [("lookup", LookupClient, opts.http_clients, {"path": f"/lookup?topic={opts.topic}"}),
                  ("ping", LookupClient, opts.http_clients, {"path": "/ping"}),
                  ("register_rtt", RegisterClient, opts.tcp_clients, {"window": 1}),
                  ("register_pipe", RegisterClient, opts.tcp_clients, {"window": opts.window})]
        for name, cls, count, overrides in phases:
            phase = argparse.Namespace(**{**vars(opts), **overrides})
            r = combine(run_workers(cls, count, phase, opts.runfor))
            log(f"{name}: {r['ops_per_s']:.0f}/s ({r['msgs']} in {r['duration_s']:.2f}s, {r['errors']} errors)")
            result[f"{name}_per_s"] = round(r["ops_per_s"], 1)
            result[f"{name}_errors"] = r["errors"]
    finally:
        proc.terminate()
        proc.wait(30)
    emit(result, opts.out)
    return 0


if __name__ == "__main__":
    cli(main)
