"""Write and read msgs/s over TLS, snappy and deflate next to plain, on one broker in one run (issue 13).

    python -m benchmarks.tls_bench [--connections=4] [--runfor=5s] [--size=200] [--window=100] \
        [--modes=plain,tls,snappy,deflate,tls+snappy,tls+deflate] [--out=benchmarks/results/tls_bench.json]

One nsqd (port 0, --workers=2, a trustme certificate) serves every mode. Per mode, on a topic of its own:
    write   --connections processes, each one connection that negotiated the mode, sending PUBs of --size bytes
            pipelined --window deep (one OK read per PUB), for --runfor; msgs/s = OKs received / time
    mpub    the same with one MPUB of --window messages at a time (one OK each): less client work per message
    read    the same number of consumers of that topic (RDY 1000, a FIN per message, pipelined), reading what
            the write phase stored until it is drained or --runfor passes; msgs/s = messages received / time
Consumers are accepted by either worker and handed to the topic's owner; with TLS or compression their relay
stays on the accepting worker (ARCHITECTURE.md, "TLS, compression and AUTH"), so about half of them cross the
socketpair. The client does its TLS/compression in the same process as its protocol work, as pynsq does.
The JSON line holds msgs/s per mode and phase, ratios to plain, the broker's CPU time per message in each phase
(user + system of nsqd's processes from /proc, the cost model's figure: on a shared 2-core machine the client's
own TLS and compression share the cores, so msgs/s alone understate what the broker could do), and the
environment (commit, cores, command).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import ssl
import tempfile
import time
import zlib

import snappy
import trustme

from benchmarks.common import duration_s, emit, environment, log
from benchmarks.process import ListeningProcess, python_module
from nsqpy.protocol import client as C

IDLE_S = 3.0  # a consumer that received nothing for this long has drained its topic
MODES = ["plain", "tls", "snappy", "deflate", "tls+snappy", "tls+deflate"]


class Client:
    """A blocking V2 connection that negotiated ``mode`` (the upgrade sequence of spec 1.8)."""

    def __init__(self, address, mode, ca_file):
        self.sock = socket.create_connection(address, timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.compress = self.decompress = None
        self.decoder = C.FrameDecoder()
        self.sock.sendall(C.magic() + C.identify({"feature_negotiation": True, "tls_v1": "tls" in mode,
                                                   "snappy": "snappy" in mode, "deflate": "deflate" in mode}))
        reply = json.loads(self._frame_exactly())
        if reply["tls_v1"]:
            ctx = ssl.create_default_context(cafile=ca_file)
            self.sock = ctx.wrap_socket(self.sock, server_hostname="localhost")
            assert self._frame_exactly() == b"OK"
        if reply["snappy"]:
            enc, dec = snappy.StreamCompressor(), snappy.StreamDecompressor()
            self.compress, self.decompress = enc.compress, dec.decompress
        elif reply["deflate"]:
            enc, dec = zlib.compressobj(6, zlib.DEFLATED, -15), zlib.decompressobj(-15)
            self.compress = lambda d: enc.compress(d) + enc.flush(zlib.Z_SYNC_FLUSH)
            self.decompress = dec.decompress
        self.pending = []
        if self.compress is not None:
            assert self.frames(1)[0] == (0, b"OK")

    def _frame_exactly(self):
        def exactly(n):
            out = b""
            while len(out) < n:
                chunk = self.sock.recv(n - len(out))
                assert chunk, "closed during the upgrade"
                out += chunk
            return out
        size = int.from_bytes(exactly(4), "big")
        return exactly(size)[4:]

    def send(self, data):
        self.sock.sendall(self.compress(data) if self.compress is not None else data)

    def frames(self, n):
        """At least n frames (heartbeats included), as (type, data)."""
        while len(self.pending) < n:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            if self.decompress is not None:
                data = self.decompress(data)
            self.pending.extend(self.decoder.feed(data))
        out, self.pending = self.pending, []
        return out


def _writer(address, mode, ca, topic, size, window, mpub, stop_at, out):
    c = Client(address, mode, ca)
    body = os.urandom(size // 2).hex().encode()[:size]
    batch, replies = (C.mpub(topic, [body] * window), 1) if mpub else (C.pub(topic, body) * window, window)
    n = 0
    while time.monotonic() < stop_at:
        c.send(batch)
        got = 0
        while got < replies:
            got += sum(1 for f in c.frames(1) if f == (0, b"OK"))
        n += window
    out.put(n)


def _reader(address, mode, ca, topic, stop_at, idle_s, out):
    c = Client(address, mode, ca)
    c.send(C.sub(topic, "bench"))
    c.frames(1)
    c.send(C.rdy(1000))
    n = 0
    last = time.monotonic()
    c.sock.settimeout(idle_s)
    try:
        while time.monotonic() < stop_at:
            fins = [C.fin(C.decode_message(data).id) for kind, data in c.frames(1) if kind == 2]
            if fins:
                n += len(fins)
                last = time.monotonic()
                c.send(b"".join(fins))
    except (socket.timeout, TimeoutError):
        pass  # drained
    out.put((n, last))


def broker_cpu_s(pid):
    """CPU seconds (user + system) used so far by nsqd's supervisor and every child of it."""
    ticks = os.sysconf("SC_CLK_TCK")
    pids = [pid] + [int(x) for x in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    total = 0
    for p in pids:
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def _run(target, count, args):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, q)) for _ in range(count)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return results, t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--runfor", type=duration_s, default=5.0)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tls_bench")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(f"{tmp}/server.pem")
    ca.cert_pem.write_to_path(f"{tmp}/ca.pem")
    os.mkdir(f"{tmp}/data")
    argv = python_module("nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={tmp}/data",
                         "--workers=2", f"--tls-cert={tmp}/server.pem", f"--tls-key={tmp}/server.pem",
                         "--mem-queue-size=10000000")
    results = {}
    with ListeningProcess(argv) as nsqd:
        warm = time.monotonic() + 2.0  # compiles the broker's kernels (a cold numba cache) outside the figures
        _run(_writer, 1, (nsqd.address, "plain", f"{tmp}/ca.pem", "warmup", args.size, args.window, False, warm))
        _run(_reader, 1, (nsqd.address, "plain", f"{tmp}/ca.pem", "warmup", time.monotonic() + 5, IDLE_S))
        for mode in args.modes.split(","):
            topic = f"bench_{mode.replace('+', '_')}"
            rate = {}
            pid = nsqd.proc.pid
            for mpub in (False, True):
                stop_at = time.monotonic() + args.runfor + 1.0  # set-up (handshakes) inside the first second
                cpu0 = broker_cpu_s(pid)
                counts, t0 = _run(_writer, args.connections, (nsqd.address, mode, f"{tmp}/ca.pem", topic,
                                                              args.size, args.window, mpub, stop_at))
                rate[mpub] = (sum(counts) / (time.monotonic() - t0), sum(counts),
                              (broker_cpu_s(pid) - cpu0) * 1e6 / max(1, sum(counts)))
            write, written = rate[False][:2]
            cpu0 = broker_cpu_s(pid)
            stop_at = time.monotonic() + args.runfor + 1.0
            got, t0 = _run(_reader, args.connections, (nsqd.address, mode, f"{tmp}/ca.pem", topic, stop_at, IDLE_S))
            read_n = sum(n for n, _ in got)
            read_t = max(t for _, t in got) - t0  # until the last message arrived
            read_cpu = (broker_cpu_s(pid) - cpu0) * 1e6 / max(1, read_n)
            results[mode] = {"write_msgs_per_s": round(write), "write_mpub_msgs_per_s": round(rate[True][0]),
                             "read_msgs_per_s": round(read_n / read_t), "written": written + rate[True][1],
                             "read": read_n, "broker_cpu_us_per_msg": {"write": round(rate[False][2], 2),
                                                                       "write_mpub": round(rate[True][2], 2),
                                                                       "read": round(read_cpu, 2)}}
            log(f"{mode}: write {write:,.0f}/s (MPUB {rate[True][0]:,.0f}/s), read {read_n / read_t:,.0f}/s")
    plain = results.get("plain")
    if plain:
        for mode, r in results.items():
            r["write_vs_plain"] = round(r["write_msgs_per_s"] / plain["write_msgs_per_s"], 3)
            r["write_mpub_vs_plain"] = round(r["write_mpub_msgs_per_s"] / plain["write_mpub_msgs_per_s"], 3)
            r["read_vs_plain"] = round(r["read_msgs_per_s"] / plain["read_msgs_per_s"], 3)
    emit({"tool": "tls_bench", "connections": args.connections, "size": args.size, "window": args.window,
          "runfor_s": args.runfor, "modes": results, **environment()}, args.out)


if __name__ == "__main__":
    main()
