"""What every benchmark tool shares: flags, the summary line, the JSON result, and the fork-join of workers.

Theory of operation
-------------------
A tool forks `--connections` worker processes (processes, not threads: one Python process cannot saturate a
broker). Each worker connects and finishes its set-up (IDENTIFY, SUB, ...) and then reports ready over its
pipe; only when all are ready does the parent send every worker the same stop time on the shared monotonic
clock, so all run for the same window. Each worker answers with a dict of counters; the parent sums them,
takes the longest elapsed time as the duration (as NSQ's bench.py does) and derives the rates.

Error handling: a worker that fails during set-up sends {"error": text}; the run is then aborted and the
tool exits non-zero. Failures during the run are counted in "errors" and end that worker's run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import time

from nsqpy.config.duration import SECOND, parse_duration

MIB = 1024 * 1024
CORES = os.cpu_count() or 1
SETUP_TIMEOUT_S = 30.0   # how long a worker may take to connect and IDENTIFY/SUB before the run is aborted


class BenchError(Exception):
    """The target misbehaved or could not be reached; the message says how."""


def duration_s(text: str) -> float:
    """Go duration text ("10s", "250ms") -> seconds, for argparse."""
    try:
        return parse_duration(text) / SECOND
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive_ints(what: str):
    """An argparse type: comma-separated positive integers ("2,32,64") -> list; ``what`` names them in errors."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
        return values
    return parse


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected <host>:<port>, got {text!r}")
    return host or "127.0.0.1", int(port)


def base_parser(description: str) -> argparse.ArgumentParser:
    """The flags NSQ's bench_writer and bench_reader share, plus --out and --ceiling."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--nsqd-tcp-address", type=host_port, default=("127.0.0.1", 4150),
                   help="<addr>:<port> of nsqd (or anything speaking V2)")
    p.add_argument("--topic", default="sub_bench")
    p.add_argument("--size", type=int, default=200, help="message body size in bytes")
    p.add_argument("--runfor", type=duration_s, default=10.0, help="how long to run (Go duration)")
    p.add_argument("--connections", type=int, default=CORES, help="worker processes, one connection each")
    p.add_argument("--deadline", default="",
                   help='wall-clock start time "YYYY-MM-DD HH:MM:SS" (UTC) to line up several hosts')
    p.add_argument("--ceiling", action=argparse.BooleanOptionalAction, default=True,
                   help="first measure this tool against its stand-in server on port 0")
    p.add_argument("--ceiling-runfor", type=duration_s, default=2.0)
    p.add_argument("--out", default="", help="also write the JSON line to this file")
    return p


def wait_for_deadline(deadline: str) -> None:
    """NSQ's --deadline: hold the start until a wall-clock time, so workers on several hosts start together."""
    if not deadline:
        return
    start = datetime.datetime.strptime(deadline, "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    delay = start.timestamp() - time.time()
    log(f"waiting until {deadline} UTC ({max(delay, 0):.1f}s)")
    if delay > 0:
        time.sleep(delay)  # a scheduled start, not synchronisation with anything we could wait on


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def rates(msgs: int, body_bytes: int, duration: float) -> dict:
    """NSQ's figures: MiB/s of bodies, ops/s and µs/op (duration over every message)."""
    if duration <= 0 or msgs <= 0:
        return {"mib_per_s": 0.0, "ops_per_s": 0.0, "us_per_op": 0.0}
    return {"mib_per_s": body_bytes / duration / MIB, "ops_per_s": msgs / duration,
            "us_per_op": duration * 1e6 / msgs}


def summary_line(tool: str, result: dict) -> str:
    """The line NSQ's tools log: `duration - MiB/s - ops/s - us/op`."""
    return (f"{tool}: duration: {result['duration_s']:.3f}s - {result['mib_per_s']:.3f}MiB/s - "
            f"{result['ops_per_s']:.3f}ops/s - {result['us_per_op']:.3f}us/op")


def git_commit(root: str = "") -> str:
    """The commit of this checkout (or of the one at `root`), with "+dirty" when the tree has uncommitted
    changes ("" outside a git checkout)."""
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+dirty" if dirty else "")


def environment() -> dict:
    """What every results file records: the commit, the command, the machine and when."""
    return {"cores": CORES, "python": platform.python_version(), "machine": platform.machine(),
            "commit": git_commit(), "command": " ".join(["python -m " + _module_name()] + sys.argv[1:]),
            "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else os.path.basename(sys.argv[0])


def emit(result: dict, out: str = "") -> None:
    """The one JSON line on stdout, and the same line in --out if asked."""
    line = json.dumps(result, sort_keys=True)
    print(line, flush=True)
    if out:
        with open(out, "w") as f:
            f.write(line + "\n")


def run_workers(worker_class, count: int, opts, runfor: float) -> list[dict]:
    """Fork `count` workers, start them together once all are set up, and collect their counter dicts.

    `worker_class(index, opts)` does the set-up in the child; `.run(stop_at)` returns a dict of counters.
    """
    ctx = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for index in range(count):
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(worker_class, index, opts, theirs), daemon=True)
        proc.start()
        theirs.close()
        pipes.append(ours)
        procs.append(proc)
    try:
        setup_deadline = time.monotonic() + SETUP_TIMEOUT_S
        for conn in pipes:
            ready = conn.recv() if conn.poll(max(setup_deadline - time.monotonic(), 0)) else None
            if ready is None:
                raise BenchError("a worker did not finish its set-up in time")
            if "error" in ready:
                raise BenchError(ready["error"])
        stop_at = time.monotonic() + runfor
        for conn in pipes:
            conn.send(stop_at)
        results = []
        for conn in pipes:
            try:
                results.append(conn.recv())
            except EOFError:
                raise BenchError("a worker died during the run") from None
        return results
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _worker_main(worker_class, index, opts, conn) -> None:
    try:
        worker = worker_class(index, opts)
    except (OSError, BenchError) as err:
        conn.send({"error": f"worker {index}: {err}"})
        return
    conn.send({"ready": index})
    stop_at = conn.recv()
    conn.send(worker.run(stop_at))


def combine(parts: list[dict]) -> dict:
    """Sum the workers' counters; the duration is the longest worker's."""
    msgs = sum(p["msgs"] for p in parts)
    body_bytes = sum(p["bytes"] for p in parts)
    duration = max((p["elapsed_s"] for p in parts), default=0.0)
    out = {"msgs": msgs, "bytes": body_bytes, "errors": sum(p["errors"] for p in parts), "duration_s": duration}
    out.update(rates(msgs, body_bytes, duration))
    first_error = next((p["error_text"] for p in parts if p.get("error_text")), "")
    if first_error:
        out["first_error"] = first_error
    return out


def measure(tool: str, worker_class, opts, start_standin) -> dict:
    """The whole run of a throughput tool: the ceiling against `start_standin()` (unless --no-ceiling), then
    --deadline, then the run against --nsqd-tcp-address. Returns the result dict, ceiling fields included."""
    result = {"tool": tool, "target": "%s:%d" % opts.nsqd_tcp_address, "topic": opts.topic, "size": opts.size,
              "connections": opts.connections, "runfor_s": opts.runfor, **environment()}
    if opts.ceiling:
        server = start_standin()
        try:
            standin = argparse.Namespace(**vars(opts))
            standin.nsqd_tcp_address = server.address
            standin.count_budget = None
            ceiling = combine(run_workers(worker_class, opts.connections, standin, opts.ceiling_runfor))
        finally:
            server.stop()
        log(summary_line(f"{tool} ceiling", ceiling))
        result.update(ceiling_ops_per_s=ceiling["ops_per_s"], ceiling_mib_per_s=ceiling["mib_per_s"],
                      ceiling_errors=ceiling["errors"])
    wait_for_deadline(opts.deadline)
    main = combine(run_workers(worker_class, opts.connections, opts, opts.runfor))
    log(summary_line(tool, main))
    result.update(main)
    if opts.ceiling and result["ceiling_ops_per_s"]:
        result["fraction_of_ceiling"] = result["ops_per_s"] / result["ceiling_ops_per_s"]
    return result


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def cli(main) -> None:
    """Script entry: a target that cannot be reached or misbehaves is one line on stderr and exit code 2. SIGTERM
    ends the tool as an exception would, so the servers it started stop with it (their ``with`` blocks run)
    instead of outliving it in sessions of their own."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        code = main()
    except BenchError as err:
        log(f"error: {err}")
        code = 2
    sys.exit(code)


def settled(measure, quiet: float):
    """measure() once it returns the same value twice, `quiet` seconds apart (e.g. /dev/shm bytes while forwarded
    topics are still being created by their owners after the publishes were answered)."""
    last = measure()
    while True:
        time.sleep(quiet)
        now = measure()
        if now == last:
            return now
        last = now
