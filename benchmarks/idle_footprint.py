"""What an idle nsqd costs as the worker count grows: /dev/shm and memory of its processes.

    python -m benchmarks.idle_footprint --workers=2,8,64 [--out=benchmarks/results/idle_footprint.json]

For each worker count: starts ``nsqd`` (port 0, a fresh data path), waits for its listening line and for its
/dev/shm to settle (a worker that started before the scanner sends it one timer event at once), then records the
bytes its segments hold (st_blocks, so reserved pages, not file sizes) in all and per kind, next to
``nsqpy.workers.processes.plan.idle_shm_bytes`` (the model in ARCHITECTURE.md, "Shared memory per broker") and to what the same
segments took when everything was reserved up front (``reserved_up_front``: every pair's 32 MiB ring, the scanner
rings, 131,072-slot in-flight tables and heaps), plus the resident (RSS) and proportional (PSS: shared pages
split between the processes that map them) memory of the supervisor and all its children, and the seconds to
start. Prints one JSON line with the git commit, the core count and the command.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import emit, environment, settled as common_settled
from benchmarks.process import REPO, ListeningProcess, python_module
from nsqpy.ipc.shm import instance_prefix
from nsqpy.workers.processes.plan import idle_shm_bytes

NODE_ID = 12
MIB = 1 << 20


def shm_by_kind(prefix):
    bare = prefix.lstrip("/")
    out = {}
    for e in os.scandir("/dev/shm"):
        if e.name.startswith(bare):
            kind = e.name[len(bare):].rsplit("-", 1)[0]
            out[kind] = out.get(kind, 0) + e.stat().st_blocks * 512
    return out


def settled(prefix, quiet=1.0):
    return common_settled(lambda: shm_by_kind(prefix), quiet)


def processes(root):
    """The pids of root and all its descendants."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            pass
    return pids


def memory(pids):
    """(RSS, PSS) in bytes, summed over pids."""
    rss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key == "Rss":
                        rss += int(value.split()[0]) * 1024
                    elif key == "Pss":
                        pss += int(value.split()[0]) * 1024
        except FileNotFoundError:
            pass
    return rss, pss


def reserved_up_front(workers):
    """Bytes the same segments took when every page was reserved at creation (before the ring budget and lazy
    pages): links with a 32 MiB ring per ordered pair of workers and two 8 MiB scanner rings per worker, a
    131,072-slot in-flight table and its timer heap per worker, and the control block."""
    ring = 3 * 128  # control lines
    links = 128 + 128 * (workers + 2) + workers * (workers - 1) * (ring + (32 << 20)) + 2 * workers * (ring + (8 << 20))
    inflight = 2 * 128 + 8 * (16 * (1 << 17) + (1 << 18))
    heap = 2 * 128 + 8 * 3 * (1 << 17)
    control = 128 * (2 + workers) + 8 * 256 * workers
    return links + workers * (inflight + heap) + control


def measure(workers):
    data = tempfile.mkdtemp(prefix="idle_footprint")
    prefix = instance_prefix(data, NODE_ID)
    argv = python_module("nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                         f"--data-path={data}",
                         f"--workers={workers}", f"--node-id={NODE_ID}")
    t0 = time.monotonic()
    with ListeningProcess(argv, ready_timeout=600.0) as nsqd:
        start_s = time.monotonic() - t0
        kinds = settled(prefix)
        pids = processes(nsqd.proc.pid)
        rss, pss = memory(pids)
    predicted = idle_shm_bytes(workers)
    total = sum(kinds.values())
    return {"workers": workers, "start_s": round(start_s, 1), "shm_bytes": total,
            "shm_mib": round(total / MIB, 2), "shm_by_kind": kinds, "predicted_bytes": sum(predicted.values()),
            "predicted_by_kind": predicted, "reserved_up_front_mib": round(reserved_up_front(workers) / MIB),
            "processes": len(pids), "rss_mib": round(rss / MIB, 1), "pss_mib": round(pss / MIB, 1),
            "pss_mib_per_worker": round(pss / MIB / workers, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,8,64", help="comma-separated worker counts")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    runs = [measure(int(w)) for w in args.workers.split(",")]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    emit({"tool": "idle_footprint", "commit": commit,
          "command": " ".join(["python -m benchmarks.idle_footprint"] + sys.argv[1:]), "runs": runs,
          **environment()}, args.out)


if __name__ == "__main__":
    main()
