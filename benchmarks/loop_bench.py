"""Which event loop should a worker run? nsqpy.workers.processes.event_loop (our epoll loop) vs asyncio vs uvloop, side by side.

Each candidate serves the same tiny request/response protocol as a V2 PUB round trip (a command line plus a
200-byte body in, an 10-byte OK frame out) in its own process on port 0; client processes keep one request in
flight per connection, like NSQ's bench_writer with --batch-size=1. Rounds are interleaved (A, B, C, A, B, C,
...) because this machine is noisy, and the JSON line carries the medians and the ratios to asyncio. uvloop is not
a dependency of nsqpy: without it installed its candidate is left out (``missing``).

    python -m benchmarks.loop_bench [--runfor 2] [--rounds 3] [--connections 2] [--out FILE]
"""
import argparse
import importlib.util
import multiprocessing as mp
import socket
import statistics
import struct
import sys
import time

from benchmarks.common import emit, environment

OK = struct.pack(">ii", 6, 0) + b"OK"
BODY = b"x" * 200
REQUEST = b"PUB t\n" + struct.pack(">i", len(BODY)) + BODY


def _count_requests(buf):
    """How many whole requests buf holds, and the bytes they take (requests have a fixed size here)."""
    n = len(buf) // len(REQUEST)
    return n, n * len(REQUEST)


def serve_epoll(sock, ready):
    from nsqpy.workers.processes.event_loop import Loop
    loop = Loop()
    bufs = {}

    def on_conn():
        conn, _ = sock.accept()
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        fd = conn.fileno()
        bufs[fd] = (conn, bytearray())

        def on_read():
            c, buf = bufs[fd]
            data = c.recv(65536)
            if not data:
                loop.forget(fd)
                c.close()
                return
            buf += data
            n, used = _count_requests(buf)
            if n:
                del buf[:used]
                c.send(OK * n)
        loop.add_reader(fd, on_read)
    sock.setblocking(False)
    loop.add_reader(sock.fileno(), on_conn)
    ready.set()
    loop.run()


def serve_asyncio(sock, ready, use_uvloop=False):
    import asyncio

    class Echo(asyncio.Protocol):
        def connection_made(self, transport):
            self.t = transport
            self.buf = bytearray()
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def data_received(self, data):
            self.buf += data
            n, used = _count_requests(self.buf)
            if n:
                del self.buf[:used]
                self.t.write(OK * n)

    if use_uvloop:
        import uvloop
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()

    async def main():
        server = await loop.create_server(Echo, sock=sock)
        ready.set()
        await server.serve_forever()
    loop.run_until_complete(main())


def serve_uvloop(sock, ready):
    serve_asyncio(sock, ready, use_uvloop=True)


SERVERS = {"epoll": serve_epoll, "asyncio": serve_asyncio, "uvloop": serve_uvloop}
NEEDS = {"uvloop": "uvloop"}  # candidate: the module it needs beyond nsqpy's own dependencies


def client(addr, runfor, out):
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n = 0
    end = time.monotonic() + runfor
    while time.monotonic() < end:
        s.sendall(REQUEST)
        got = b""
        while len(got) < len(OK):
            got += s.recv(64)
        n += 1
    s.close()
    out.put(n)


def run_one(name, runfor, connections):
    ctx = mp.get_context("fork")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    ready = ctx.Event()
    server = ctx.Process(target=SERVERS[name], args=(sock, ready), daemon=True)
    server.start()
    if not ready.wait(30):
        raise RuntimeError(f"{name} server did not start")
    out = ctx.Queue()
    clients = [ctx.Process(target=client, args=(sock.getsockname(), runfor, out)) for _ in range(connections)]
    t0 = time.monotonic()
    for c in clients:
        c.start()
    total = sum(out.get(timeout=runfor + 30) for _ in clients)
    elapsed = time.monotonic() - t0
    for c in clients:
        c.join()
    server.kill()
    server.join()
    sock.close()
    return total / elapsed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runfor", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", type=int, default=2)
    p.add_argument("--out")
    a = p.parse_args(argv)
    missing = [name for name, module in NEEDS.items() if importlib.util.find_spec(module) is None]
    rates = {name: [] for name in SERVERS if name not in missing}
    for _ in range(a.rounds):
        for name in rates:
            rates[name].append(run_one(name, a.runfor, a.connections))
    med = {k: statistics.median(v) for k, v in rates.items()}
    result = {"tool": "loop_bench", "round_trips_per_s": med, "runs": rates, "missing": missing,
              "ratio_to_asyncio": {k: v / med["asyncio"] for k, v in med.items()},
              "connections": a.connections, "runfor_s": a.runfor, "rounds": a.rounds, **environment()}
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
