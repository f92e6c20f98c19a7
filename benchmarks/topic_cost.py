"""What a topic costs nsqd: /dev/shm, file descriptors and time, for N topics with one small message each.

    python -m benchmarks.topic_cost --topics=20000 --workers=2 [--out=benchmarks/results/topic_cost_20000.json]

Starts ``nsqd`` (port 0, a fresh data path), publishes one 100-byte message to each of N new topics over one
pipelined connection, then prints one JSON line: the /dev/shm the instance's segments hold (st_blocks, so
reserved pages, not file sizes) per topic, the open fds of each worker before and after, and the seconds it
took. The line records the git commit, the core count and the command.
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

from benchmarks.common import emit, environment, settled as common_settled
from benchmarks.process import REPO, ListeningProcess, python_module
from nsqpy.ipc.shm import instance_prefix
from nsqpy.protocol import client as C

NODE_ID = 11
WORKER_LINE = re.compile(rb"worker \d+: started \(pid (\d+)\)")


def shm_bytes(prefix):
    bare = prefix.lstrip("/")
    return sum(os.stat(os.path.join("/dev/shm", e)).st_blocks * 512 for e in os.listdir("/dev/shm")
               if e.startswith(bare))


def settled(prefix, quiet=0.5):
    """/dev/shm bytes once they stopped changing: a PUB forwarded to another worker is answered OK before that
    owner creates the topic, so the last topics may still be on their way when the replies are in."""
    return common_settled(lambda: shm_bytes(prefix), quiet)


def fds(pids):
    return {str(p): len(os.listdir(f"/proc/{p}/fd")) for p in pids}


def publish_topics(address, names):
    """One PUB per topic, pipelined; every reply must be OK."""
    with socket.create_connection(address) as s:
        s.sendall(C.magic())
        decoder = C.FrameDecoder()
        for k in range(0, len(names), 1000):
            part = names[k:k + 1000]
            s.sendall(b"".join(C.pub(t, b"x" * 100) for t in part))
            got = []
            while len(got) < len(part):
                got.extend(decoder.feed(s.recv(1 << 16)))
            bad = [f for f in got if f[1] != b"OK"]
            if bad:
                raise SystemExit(f"a PUB failed: {bad[0]!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    data = tempfile.mkdtemp(prefix="topic_cost")
    prefix = instance_prefix(data, NODE_ID)
    argv = python_module("nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                         f"--data-path={data}",
                         f"--workers={args.workers}", f"--node-id={NODE_ID}")
    with ListeningProcess(argv) as nsqd:
        workers = [int(m.group(1)) for m in map(WORKER_LINE.search, nsqd.stderr_tail) if m]
        base, fds_before = shm_bytes(prefix), fds(workers)
        t0 = time.monotonic()
        publish_topics(nsqd.address, [f"cost-{i}" for i in range(args.topics)])
        seconds = time.monotonic() - t0
        grown, fds_after = settled(prefix) - base, fds(workers)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    emit({"tool": "topic_cost", "commit": commit, "command": " ".join(["python -m benchmarks.topic_cost"]
                                                                         + sys.argv[1:]),
          "topics": args.topics, "workers": args.workers, "seconds": round(seconds, 2),
          "topics_per_s": round(args.topics / seconds), "shm_bytes_per_topic": round(grown / args.topics),
          "shm_kib_per_topic": round(grown / args.topics / 1024, 1), "worker_fds_before": fds_before,
          "worker_fds_after": fds_after, **environment()}, args.out)


if __name__ == "__main__":
    main()
