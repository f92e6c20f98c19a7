"""nsqd's HTTP API under load, per gunicorn worker class, next to TCP PUB/MPUB on the same broker and run.

    python -m benchmarks.http_bench [--classes=sync,gthread,asgi] [--connections=50] [--runfor=10s] \
        [--out=benchmarks/results/http_bench.json]

For each worker class: start nsqd (port 0, fresh data path, --workers=2, --http-workers=2, that class), then

    http_pub     POST /pub, one 200-byte message per request, --connections keep-alive connections
    http_mpub    POST /mpub, 200 newline-separated 200-byte messages per request, the same connections
    tcp_pub      bench_writer --batch-size=1 --driver=epoll, the same number of connections (first class only)
    tcp_mpub     bench_writer MPUB 200 x 200 B, the same number of connections (first class only)
    stats        GET /stats?format=json and GET /stats (text) with --topics x --channels (1000 x 5), median and
                 p90 ms over --rounds requests, one at a time

HTTP load comes from --load-processes forked processes, each driving its share of the connections with a
selector (HTTP/1.1, a request waits for its response; a connection the server closes, as gunicorn's sync worker
does after each response, is reopened and counted in ``reconnects``). The line holds msgs/s per case and class,
the fastest class, and the environment (commit, cores, command).
"""
from __future__ import annotations

import argparse
import multiprocessing
import re
import selectors
import socket
import statistics
import tempfile
import time

from benchmarks.common import duration_s, emit, environment, log
from benchmarks.process import ListeningProcess, python_module, run_tool
from benchmarks.stats_snapshot import create

HTTP_LINE = re.compile(rb"HTTP: listening on (\S+):(\d+)")
BODY = b"m" * 200
NODE_ID = 13


class _Conn:
    __slots__ = ("sock", "buf", "need")

    def __init__(self, address):
        self.sock = socket.create_connection(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.need = None  # bytes of the whole response, once its head is complete


def _response_done(c):
    """(complete, status, close) for the bytes buffered so far."""
    if c.need is None:
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            return False, 0, False
        head = c.buf[:end].lower()
        m = re.search(rb"content-length: *(\d+)", head)
        c.need = end + 4 + (int(m.group(1)) if m else 0)
    if len(c.buf) < c.need:
        return False, 0, False
    head = c.buf[:c.buf.find(b"\r\n\r\n")].lower()
    status = int(c.buf[9:12])
    close = b"connection: close" in head
    c.buf = c.buf[c.need:]
    c.need = None
    return True, status, close


def _load(address, request, n_conns, start_at, stop_at, out):
    """One load process: ``n_conns`` connections, each sending ``request`` again as soon as its response came."""
    sel = selectors.DefaultSelector()
    conns = [_Conn(address) for _ in range(n_conns)]
    ok = errors = reconnects = 0
    while time.monotonic() < start_at:
        time.sleep(0.001)  # a start line shared by all load processes
    for c in conns:
        c.sock.sendall(request)
        sel.register(c.sock, selectors.EVENT_READ, c)
    while time.monotonic() < stop_at:
        for key, _ in sel.select(0.1):
            c = key.data
            data = c.sock.recv(1 << 16)
            if not data:
                done, status, close = True, 0, True
            else:
                c.buf += data
                done, status, close = _response_done(c)
            if not done:
                continue
            if status == 200:
                ok += 1
            elif data:
                errors += 1
            if close:
                sel.unregister(c.sock)
                c.sock.close()
                c.__init__(address)
                sel.register(c.sock, selectors.EVENT_READ, c)
                reconnects += 1
            c.sock.sendall(request)
    out.send({"ok": ok, "errors": errors, "reconnects": reconnects})


def http_load(address, request, connections, processes, runfor):
    ctx = multiprocessing.get_context("fork")
    start_at = time.monotonic() + 2.0  # time to connect everything
    stop_at = start_at + runfor
    shares = [connections // processes + (i < connections % processes) for i in range(processes)]
    pipes, procs = [], []
    for share in shares:
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=_load, args=(address, request, share, start_at, stop_at, theirs), daemon=True)
        p.start()
        pipes.append(ours)
        procs.append(p)
    parts = [p.recv() for p in pipes]
    for p in procs:
        p.join()
    return {k: sum(part[k] for part in parts) for k in parts[0]}, runfor


def _request(method, path, body):
    return (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def _http_address(server, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(server.stderr_tail):
            m = HTTP_LINE.search(line)
            if m:
                return m.group(1).decode(), int(m.group(2))
        time.sleep(0.05)  # the line follows TCP's within milliseconds
    raise SystemExit("no HTTP listening line")


def _get(address, path):
    with socket.create_connection(address) as s:
        s.sendall(_request("GET", path, b""))
        c = _Conn.__new__(_Conn)
        c.sock, c.buf, c.need = s, b"", None
        while True:
            c.buf += s.recv(1 << 20)
            done, status, _ = _response_done(c)
            if done:
                assert status == 200, status
                return


def stats_latency(address, rounds):
    out = {}
    for name, path in (("json", "/stats?format=json"), ("text", "/stats")):
        times = []
        for k in range(rounds + 1):
            t0 = time.perf_counter()
            _get(address, path)
            if k:
                times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        out[name] = {"median_ms": round(statistics.median(times), 1),
                     "p90_ms": round(times[int(0.9 * (len(times) - 1))], 1)}
    return out


def run_class(cls, args, with_tcp):
    data = tempfile.mkdtemp(prefix=f"http_bench_{cls}")
    argv = python_module("nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                         f"--data-path={data}", "--workers=2", f"--node-id={NODE_ID}", "--http-workers=2",
                         f"--http-worker-class={cls}")
    result = {}
    # a clean stop saves and frees every topic: with --topics x --channels that takes longer than the default wait
    with ListeningProcess(argv, ready_timeout=120, stop_timeout=60 + args.topics * args.channels / 50) as server:
        api = _http_address(server)
        for case, req, per in (("http_pub", _request("POST", "/pub?topic=hpub", BODY), 1),
                               ("http_mpub", _request("POST", "/mpub?topic=hmpub", b"\n".join([BODY] * 200)), 200)):
            counts, secs = http_load(api, req, args.connections, args.load_processes, args.runfor)
            result[case] = dict(counts, msgs_per_s=round(counts["ok"] * per / secs), requests_per_s=round(
                counts["ok"] / secs))
            log(f"{cls} {case}: {result[case]}")
        if with_tcp:
            common = ["--nsqd-tcp-address", server.address_text, "--no-ceiling", "--runfor", f"{args.runfor}s",
                      "--connections", str(args.connections)]
            _, pub = run_tool("benchmarks.bench_writer", *common, "--topic", "tpub", "--batch-size=1",
                              "--driver=epoll")
            _, mpub = run_tool("benchmarks.bench_writer", *common, "--topic", "tmpub", "--driver=epoll")
            result["tcp_pub"] = {"msgs_per_s": round(pub["ops_per_s"]), "errors": pub.get("errors", 0)}
            result["tcp_mpub"] = {"msgs_per_s": round(mpub["ops_per_s"]), "errors": mpub.get("errors", 0)}
            log(f"tcp: {result['tcp_pub']} {result['tcp_mpub']}")
        if args.topics:
            topics = [f"st-{i:05d}" for i in range(args.topics)]
            create(server.address, topics, [f"c{k}" for k in range(args.channels)])
            result["stats"] = stats_latency(api, args.rounds)
            log(f"{cls} stats: {result['stats']}")
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", default="sync,gthread,asgi")
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--load-processes", type=int, default=2)
    ap.add_argument("--runfor", type=duration_s, default=10.0)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--channels", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    classes = args.classes.split(",")
    results = {cls: run_class(cls, args, with_tcp=i == 0) for i, cls in enumerate(classes)}
    tcp = {k: results[classes[0]].pop(k) for k in ("tcp_pub", "tcp_mpub") if k in results[classes[0]]}
    fastest = max(classes, key=lambda c: results[c]["http_pub"]["msgs_per_s"] + results[c]["http_mpub"]["msgs_per_s"]
                  / 200)
    emit({"tool": "http_bench", "classes": results, "tcp": tcp, "fastest_class": fastest,
          "connections": args.connections, "runfor_s": args.runfor, "topics": args.topics,
          "channels": args.channels, **environment()}, args.out)


if __name__ == "__main__":
    main()
