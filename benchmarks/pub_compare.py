"""One PUB per round trip, NSQ's way: servers side by side, a fresh server for every run, ratios in one JSON line.

    python -m benchmarks.pub_compare [--server NAME=COMMAND ...] [--cwd NAME=DIR ...]
        [--connections 2,32,64] [--rounds 3] [--runfor 5s] [--batch-size 1] [--go-bench-writer PATH]
        [--read N [--go-bench-reader PATH] [--rdy 2500]] [--out FILE]

--batch-size N sends MPUBs of N messages instead (NSQ's bench_writer defaults to 200): the same comparison for
the write throughput figure, with the same load tool and fresh servers.

--read N compares reading instead (NSQ's bench.sh: "SUB"). Every run first creates channel ``ch`` (a SUB with
RDY 0), preloads exactly N messages into it (pipelined MPUBs of 200 from this process, untimed), then reads for
--runfor with NSQ's Go ``bench_reader --rdy=2500`` (--go-bench-reader; GOMAXPROCS = the connection count, one
connection each) or this repository's ``bench_reader``. The figure is messages FINed per second. N must exceed
what the fastest server delivers in --runfor: a run that read all N waited for messages that never came, so it
is marked ``drained`` (a lower bound) and counted in ``drained_runs``. Go nsqd keeps only --mem-queue-size
messages in memory (10000 by default; bench.sh starts it with 1000000): give it the flag in its command.

Every run starts its server from COMMAND (``{python}``, ``{data_path}``: a fresh directory; the server must listen
on port 0 or a fixed port and log NSQ's ``TCP: listening on HOST:PORT`` line), runs the load against it for
--runfor and stops it, so no run inherits another's topic, backlog or warm caches. The default server is nsqpy
(``{python} -m nsqpy.workers.processes.nsqd --tcp-address=127.0.0.1:0 --http-address= --data-path={data_path}``); add Go nsqd
(``--server 'go=/path/nsqd --tcp-address=127.0.0.1:0 --http-address=127.0.0.1:0 --data-path={data_path}'``) or
an older nsqpy from a git worktree (``--server before=... --cwd before=/path/to/worktree``; ``cwd_commits``
records each such checkout's commit).

The load is NSQ's own: with --go-bench-writer, Go's ``bench_writer --batch-size=1 --size=200`` with GOMAXPROCS set
to the connection count (it opens one blocking connection per GOMAXPROCS); without, this repository's
``bench_writer --batch-size=1 --driver=epoll`` (compiled, one process per connection up to the cores); both
with --batch-size's value. Rounds interleave servers for each connection count, so a drift in the machine's load
hits all alike.

Result: ``runs`` (every run), ``medians[connections][server]`` (msgs/s), ``ratios[connections][server]`` =
first server / that server, ``server_cpu_us_per_msg[connections][server]`` (median CPU time of the server's
process tree per message, from /proc: the cost the placement policy's model uses),
``load_cpu_us_per_msg[connections][server]`` (the same for the load tool: its CPU time as a waited-for child,
``RUSAGE_CHILDREN``; on a host the load shares, the server's rate is bound where both together fill the cores),
plus the commit, cores and command (benchmarks.common.environment).
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile

from benchmarks.common import BenchError, CORES, cli, duration_s, emit, environment, git_commit, log, positive_ints
from benchmarks.process import REPO, ListeningProcess, run_tool
from benchmarks.wire import Connection
from nsqpy.protocol import client

TOPIC, CHANNEL = "pub_compare", "ch"
PRELOAD_BATCH, PRELOAD_WINDOW = 200, 16  # --read's preload: messages per MPUB, MPUBs in flight
DRAINED = 0.99  # a read run that got this share of the preload may have waited for more: a lower bound
STOP_TIMEOUT = 300.0  # seconds a server may take to stop cleanly
NSQPY = "{python} -m nsqpy.workers.processes.nsqd --tcp-address=127.0.0.1:0 --http-address= --data-path={data_path}"
GO_SUMMARY = re.compile(r"duration: ([\d.]+)s - ([\d.]+)mi?b/s - ([\d.]+)ops/s - ([\d.]+)us/op", re.I)


def pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pub_compare", description=__doc__.split("\n")[0])
    p.add_argument("--server", type=pair, action="append", default=[],
                   help="NAME=COMMAND ({python}, {data_path}); default: nsqpy=" + NSQPY)
    p.add_argument("--cwd", type=pair, action="append", default=[], help="NAME=DIR: run that server's command there")
    p.add_argument("--connections", type=positive_ints("connection counts"), default=[CORES, 32, 64])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runfor", type=duration_s, default=5.0)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=1, help="messages per command: 1 is a PUB, more an MPUB")
    p.add_argument("--go-bench-writer", default="", help="path of NSQ's Go bench_writer (the load); default: ours")
    p.add_argument("--read", type=int, default=0, metavar="N",
                   help="compare reading: preload N messages per run, then read for --runfor")
    p.add_argument("--go-bench-reader", default="", help="with --read: path of NSQ's Go bench_reader; default: ours")
    p.add_argument("--rdy", type=int, default=2500, help="with --read: RDY per reading connection")
    p.add_argument("--ready-timeout", type=duration_s, default=120.0)
    p.add_argument("--out", default="")
    return p


def go_load(address: str, connections: int, opts) -> dict:
    argv = [opts.go_bench_writer, f"--nsqd-tcp-address={address}", f"--batch-size={opts.batch_size}",
            f"--size={opts.size}", f"--runfor={opts.runfor}s", f"--topic={TOPIC}"]
    return go_summary(argv, "go bench_writer", connections, opts)


def go_summary(argv: list[str], tool: str, connections: int, opts) -> dict:
    """Run one of NSQ's Go bench tools (one connection per GOMAXPROCS) and read its closing summary line."""
    env = {**os.environ, "GOMAXPROCS": str(connections)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=opts.runfor + 120)
    match = GO_SUMMARY.search(done.stdout + done.stderr)
    if done.returncode != 0 or match is None:
        raise BenchError(f"{' '.join(argv)}: exit {done.returncode}\n{(done.stdout + done.stderr)[-2000:]}")
    return {"tool": tool, "connections": connections, "duration_s": float(match.group(1)),
            "ops_per_s": float(match.group(3)), "us_per_op": float(match.group(4)), "errors": 0}


def go_read(address: str, connections: int, opts) -> dict:
    argv = [opts.go_bench_reader, f"--nsqd-tcp-address={address}", f"--size={opts.size}", f"--rdy={opts.rdy}",
            f"--runfor={opts.runfor}s", f"--topic={TOPIC}", f"--channel={CHANNEL}"]
    return go_summary(argv, "go bench_reader", connections, opts)


def own_read(address: str, connections: int, opts) -> dict:
    code, result = run_tool("benchmarks.bench_reader", "--nsqd-tcp-address", address, "--size", str(opts.size),
                            "--rdy", str(opts.rdy), "--runfor", f"{opts.runfor}s", "--topic", TOPIC,
                            "--channel", CHANNEL, "--connections", str(connections), "--no-ceiling",
                            timeout=opts.runfor + 120)
    if code != 0 or not result:
        raise BenchError(f"bench_reader against {address} failed with {code}: {result}")
    return result


def preload(address: tuple[str, int], count: int, size: int) -> Connection:
    """Channel CHANNEL of TOPIC made (by a SUB with RDY 0, returned open) and exactly `count` messages of `size`
    bytes published to it: MPUBs of PRELOAD_BATCH, PRELOAD_WINDOW of them in flight."""
    holder = Connection(address)
    holder.subscribe(TOPIC, CHANNEL, 0)
    producer = Connection(address)
    full = client.mpub(TOPIC, [b"x" * size] * PRELOAD_BATCH)
    left = count
    while left:
        n = min(PRELOAD_WINDOW, left // PRELOAD_BATCH)
        producer.send(full * n if n else client.mpub(TOPIC, [b"x" * size] * left))  # n 0: the remainder
        for _ in range(max(n, 1)):
            producer.expect_ok("MPUB")
        left -= n * PRELOAD_BATCH if n else left
    producer.close()
    return holder


def own_load(address: str, connections: int, opts) -> dict:
    code, result = run_tool("benchmarks.bench_writer", "--nsqd-tcp-address", address,
                            "--batch-size", str(opts.batch_size),
                            "--size", str(opts.size), "--runfor", f"{opts.runfor}s", "--topic", TOPIC,
                            "--connections", str(connections), "--driver", "epoll",
                            "--driver-processes", str(min(connections, CORES)), "--no-ceiling",
                            timeout=opts.runfor + 120)
    if code != 0 or not result:
        raise BenchError(f"bench_writer against {address} failed with {code}: {result}")
    return result


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (from /proc/<pid>/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue  # gone meanwhile
    return found


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU time of each of these processes so far."""
    used = {}
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            used[p] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        except OSError:
            continue
    return used


def one_run(name: str, command: str, cwd: str, connections: int, opts) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"pub-compare-{name}-") as data_path:
        argv = shlex.split(command.format(python=sys.executable, data_path=data_path))
        # a broker stopping after an MPUB run saves its backlog (gigabytes): SIGKILL would leave its shared memory
        with ListeningProcess(argv, ready_timeout=opts.ready_timeout, cwd=cwd, stop_timeout=STOP_TIMEOUT) as server:
            holder = preload(server.address, opts.read, opts.size) if opts.read else None
            pids = process_tree(server.proc.pid)
            before, load_before = cpu_seconds(pids), children_cpu_s()
            result = load_of(opts)[1](server.address_text, connections, opts)
            after, load_cpu_s = cpu_seconds(pids), children_cpu_s() - load_before
            if holder is not None:
                holder.close()
    msgs = result["ops_per_s"] * result.get("duration_s", opts.runfor)
    if opts.read:
        result["drained"] = msgs >= opts.read * DRAINED
    per_process = sorted((after[p] - before.get(p, 0.0) for p in after), reverse=True)
    result["server_cpu_s"] = sum(per_process)
    result["server_cpu_us_per_msg"] = sum(per_process) * 1e6 / msgs if msgs else None
    result["load_cpu_s"] = load_cpu_s
    result["load_cpu_us_per_msg"] = load_cpu_s * 1e6 / msgs if msgs else None
    # the busiest processes' share (with nsqpy: the topic's owner first, then the workers that forward to it)
    result["server_cpu_us_per_msg_by_process"] = [round(x * 1e6 / msgs, 2) for x in per_process[:8] if x] \
        if msgs else []
    return result


def children_cpu_s() -> float:
    """User + system CPU time of this process's children that ended and were waited for (the load tools)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def medians_of(runs: list[dict], names: list[str], connections: list[int], key: str) -> dict:
    return {str(c): {n: statistics.median(r[key] or 0 for r in runs if r["server"] == n and r["connections"] == c)
                     for n in names} for c in connections}


def summarize(runs: list[dict], names: list[str], connections: list[int]) -> tuple[dict, dict]:
    medians = medians_of(runs, names, connections, "ops_per_s")
    first = names[0]
    ratios = {c: {n: (row[first] / row[n] if row[n] else None) for n in names[1:]} for c, row in medians.items()}
    return medians, ratios


def load_of(opts):
    """-> (the load's name, the function that runs it against an address)."""
    if opts.read:
        return ("go bench_reader", go_read) if opts.go_bench_reader else ("bench_reader", own_read)
    return ("go bench_writer", go_load) if opts.go_bench_writer else ("bench_writer --driver=epoll", own_load)


def main(argv=None) -> int:
    opts = parser().parse_args(argv)
    servers = dict(opts.server) or {"nsqpy": NSQPY}
    cwds = dict(opts.cwd)
    unknown = set(cwds) - set(servers)
    if unknown:
        raise BenchError(f"--cwd for servers not given with --server: {sorted(unknown)}")
    runs = []
    for round_no in range(opts.rounds):
        for connections in opts.connections:
            for name, command in servers.items():
                log(f"pub_compare: round {round_no + 1}/{opts.rounds}, {connections} connections, {name}")
                result = one_run(name, command, cwds.get(name, REPO), connections, opts)
                log(f"pub_compare:   {result['ops_per_s']:.0f} msgs/s, server CPU "
                    f"{result['server_cpu_us_per_msg'] or 0:.1f} us/msg"
                    + (" (drained: read all of --read, a lower bound)" if result.get("drained") else ""))
                runs.append({"round": round_no, "server": name, "connections": connections,
                             "ops_per_s": result["ops_per_s"],
                             "server_cpu_us_per_msg": result["server_cpu_us_per_msg"],
                             "load_cpu_us_per_msg": result["load_cpu_us_per_msg"], "result": result})
    medians, ratios = summarize(runs, list(servers), opts.connections)
    for c, row in ratios.items():
        log(f"pub_compare: {c} connections: " + ", ".join(
            f"{list(servers)[0]}/{n} = {r:.3f}" for n, r in row.items() if r))
    result = {"tool": "pub_compare", "servers": servers, "cwd": cwds,
              "cwd_commits": {name: git_commit(path) for name, path in cwds.items()}, "rounds": opts.rounds,
              "runfor_s": opts.runfor, "size": opts.size, "batch_size": opts.batch_size,
              "connections": opts.connections,
              "load": load_of(opts)[0], "read_preload": opts.read, "rdy": opts.rdy if opts.read else None,
              "drained_runs": sum(bool(r["result"].get("drained")) for r in runs),
              "medians": medians, "ratios": ratios, "runs": runs,
              "server_cpu_us_per_msg": medians_of(runs, list(servers), opts.connections, "server_cpu_us_per_msg"),
              "load_cpu_us_per_msg": medians_of(runs, list(servers), opts.connections, "load_cpu_us_per_msg"),
              "errors": sum(int(r["result"].get("errors", 0)) for r in runs), **environment()}
    emit(result, opts.out)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    cli(main)
