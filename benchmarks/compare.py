"""nsqpy against other NSQ-compatible brokers, scenario by scenario, with the ratios in one JSON line.

    python -m benchmarks.compare [--target nsqd=127.0.0.1:4150 ...] [--target-commit nsqd=v1.3.0 ...] [--rounds 3]
        [--runfor 5s] [--connections N] [--scenarios writer,reader,pub,latency,roundtrip]
        [--latency-rate 10000[,...]]
        [--latency-modes defaults,unbuffered] [--nsqpy-command CMD] [--plot DIR] [--out FILE]

nsqpy is started here (fresh --data-path, port 0; ready once it logs its `TCP: listening on` line, waited on
with a deadline) and stopped at the end; every --target is an address of something already running. Each
round runs every scenario against every target in turn (A/B interleaved, so a drift in the machine's load
hits all alike; the order rotates by one each round, ``round_order``, so no target always runs first, on the
freshest or the quietest machine), each in a topic of its own so no run reads another's backlog:

| scenario   | tool and flags                                                           | figure (ratio)     |
|------------|--------------------------------------------------------------------------|--------------------|
| writer     | bench_writer, MPUB of 200 x 200 B                                        | ops/s (higher)     |
| reader     | bench_reader, RDY 2500, --count = what `writer` just wrote               | ops/s (higher)     |
| pub        | bench_writer --batch-size 1 (one PUB per round trip)                     | ops/s (higher)     |
| latency    | latency at --latency-rate msgs/s, once per --latency-modes consumer mode | p99 µs (lower)     |
| roundtrip  | roundtrip: PUB, receive (RDY 1, unbuffered), FIN, OK; one at a time      | µs each (lower)    |

Latency runs once per round and target with every mode of --latency-modes (default defaults,unbuffered: the
consumer's IDENTIFY with NSQ's client defaults, output buffer 16 KiB / 250 ms, and with output_buffer_size -1;
see benchmarks/latency.py). Each mode is its own entry in `runs` (scenario `latency`, plus `mode`) and its own
key in `medians`, `ratios` and `figures`: `latency_defaults`, `latency_unbuffered`. With several rates
(--latency-rate 1000,10000,100000) each rate and mode is its own key: `latency_<mode>_<rate>`.
--scenarios runs a subset (reader needs writer: it reads what writer wrote).

The JSON holds every run, the median per scenario (latency: per mode) and target, and `ratios` = nsqpy /
target of those medians. --plot DIR writes throughput.png and latency_cdf.png (matplotlib is imported only
then).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile

from benchmarks.common import CORES, cli, duration_s, emit, environment, log, positive_ints
from benchmarks.latency import MODES
from benchmarks.process import ListeningProcess, run_tool

NSQPY_COMMAND = ("{python} -m nsqpy.workers.processes.nsqd --tcp-address=127.0.0.1:0 --http-address=127.0.0.1:0 "
                 "--data-path={data_path}")
# scenario -> (figure key in its result, True when higher is better); latency adds one key per mode
FIGURES = {"writer": ("ops_per_s", True), "reader": ("ops_per_s", True), "pub": ("ops_per_s", True),
           "roundtrip": ("us_per_round_trip", False)}
LATENCY = ("p99_us", False)


SCENARIOS = ("writer", "reader", "pub", "latency", "roundtrip")


def latency_key(mode: str, rate: int, rates: list[int]) -> str:
    return f"latency_{mode}" if len(rates) <= 1 else f"latency_{mode}_{rate}"


def figures(latency_modes: list[str], latency_rates: list[int] = (), scenarios=SCENARIOS) -> dict:
    table = {s: f for s, f in FIGURES.items() if s in scenarios}
    if "latency" in scenarios:
        table.update({latency_key(m, r, latency_rates): LATENCY for r in latency_rates or [0] for m in latency_modes})
    return table


def run_key(run: dict) -> str:
    """Where a run counts in medians and ratios: its scenario, for latency its mode (and rate) too."""
    if run.get("key"):
        return run["key"]
    return f"{run['scenario']}_{run['mode']}" if run.get("mode") else run["scenario"]


def run_scenarios(address: str, topic: str, opts) -> list[tuple[str, str, dict]]:
    """One round of the chosen scenarios against one address: (scenario, run key, result) each."""
    common = ["--nsqd-tcp-address", address, "--no-ceiling", "--connections", str(opts.connections)]
    runfor = ["--runfor", f"{opts.runfor}s"]
    results = {}
    if "writer" in opts.scenarios:
        _, results["writer"] = run_tool("benchmarks.bench_writer", *common, *runfor, "--topic", topic + "_mpub",
                                        "--batch-size", "200", "--size", "200")
    if "reader" in opts.scenarios:
        _, results["reader"] = run_tool("benchmarks.bench_reader", *common, "--topic", topic + "_mpub",
                                        "--rdy", "2500", "--count", str(results["writer"]["msgs"]),
                                        "--runfor", f"{max(opts.runfor * 10, 60)}s")
    if "pub" in opts.scenarios:
        _, results["pub"] = run_tool("benchmarks.bench_writer", *common, *runfor, "--topic", topic + "_pub",
                                     "--batch-size", "1", "--size", "200")
    if "roundtrip" in opts.scenarios:
        _, results["roundtrip"] = run_tool("benchmarks.roundtrip", "--nsqd-tcp-address", address, "--no-ceiling",
                                           *runfor, "--topic", topic + "_rt", "--size", "200")
    out = [(scenario, scenario, result) for scenario, result in results.items()]
    if "latency" not in opts.scenarios:
        return out
    rates = opts.latency_rate
    _, latency = run_tool("benchmarks.latency", "--nsqd-tcp-address", address, "--no-ceiling", *runfor,
                          "--topic", topic + "_lat", "--rates", ",".join(map(str, rates)),
                          "--modes", ",".join(opts.latency_modes))
    phases = {(p["mode"], p["rate"]): p for p in latency["phases"]}
    first = True
    for rate in rates:
        for mode in opts.latency_modes:
            # the tool's errors count once, with the first phase; a phase missing (it failed) counts one more
            errors = (latency["errors"] if first else 0) + ((mode, rate) not in phases)
            first = False
            result = {**phases.get((mode, rate), {"mode": mode, "rate": rate}), "errors": errors}
            out.append(("latency", latency_key(mode, rate, rates), result))
    return out


def figure(key: str, result: dict, table: dict) -> float:
    return float(result.get(table[key][0], 0.0))


def summarize(runs: list[dict], names: list[str], table: dict = FIGURES) -> tuple[dict, dict]:
    """Medians per scenario (latency: per mode) and target, and nsqpy / other for each other target."""
    medians = {s: {n: statistics.median([figure(s, r["result"], table) for r in runs
                                         if run_key(r) == s and r["target"] == n] or [0.0])
                   for n in names} for s in table}
    ratios = {s: {n: (medians[s]["nsqpy"] / medians[s][n] if medians[s][n] else None)
                  for n in names if n != "nsqpy"} for s in table}
    return medians, ratios


def scenarios_list(text: str) -> list[str]:
    chosen = [x for x in text.split(",") if x]
    if not chosen or any(x not in SCENARIOS for x in chosen) or ("reader" in chosen and "writer" not in chosen):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(SCENARIOS)} (reader with writer), got {text!r}")
    return chosen


def modes_list(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(MODES)}, got {text!r}")
    return modes


def parse_target(text: str) -> tuple[str, str]:
    name, sep, address = text.partition("=")
    if not sep or not name or name == "nsqpy":
        raise argparse.ArgumentTypeError(f"expected name=host:port (name not 'nsqpy'), got {text!r}")
    return name, address


def round_order(names, round_no):
    """The targets' order in round ``round_no``: rotated by one each round (round 0 in the given order)."""
    k = round_no % len(names) if names else 0
    return names[k:] + names[:k]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="nsqpy vs other NSQ-compatible brokers, as ratios")
    p.add_argument("--target", type=parse_target, action="append", default=[], help="name=host:port")
    p.add_argument("--target-commit", type=parse_target, action="append", default=[],
                   help="name=what that target runs (a commit, a version), recorded as target_commits")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runfor", type=duration_s, default=5.0, help="per throughput run and latency phase")
    p.add_argument("--connections", type=int, default=CORES)
    p.add_argument("--scenarios", type=scenarios_list, default=list(SCENARIOS),
                   help="comma-separated subset of writer,reader,pub,latency,roundtrip (default all)")
    p.add_argument("--latency-rate", type=positive_ints("messages per second"), default=[10000],
                   help="msgs/s of the latency scenario; several (comma-separated) are reported apart")
    p.add_argument("--latency-modes", type=modes_list, default=["defaults", "unbuffered"],
                   help="latency consumer modes (benchmarks.latency --modes), each reported on its own as "
                        "latency_<mode> (default defaults,unbuffered)")
    p.add_argument("--nsqpy-command", default=NSQPY_COMMAND,
                   help="how to start nsqpy; {python} and {data_path} are filled in")
    p.add_argument("--ready-timeout", type=duration_s, default=60.0, help="wait this long for its listening line")
    p.add_argument("--plot", default="", help="write PNG charts into this directory")
    p.add_argument("--out", default="")
    return p


def main(argv=None) -> int:
    opts = parser().parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="nsqpy-compare-") as data_path:
        command = shlex.split(opts.nsqpy_command.format(python=sys.executable, data_path=data_path))
        with ListeningProcess(command, ready_timeout=opts.ready_timeout) as nsqpy:
            targets = {"nsqpy": nsqpy.address_text, **dict(opts.target)}
            log(f"compare: {targets}")
            for round_no in range(opts.rounds):
                for name in round_order(list(targets), round_no):
                    address = targets[name]
                    log(f"compare: round {round_no + 1}/{opts.rounds} on {name} ({address})")
                    topic = f"cmp{round_no}"
                    for scenario, key, result in run_scenarios(address, topic, opts):
                        extra = {}
                        if scenario == "latency":
                            extra = {"mode": result["mode"], "rate": result["rate"], "key": key}
                        runs.append({"round": round_no, "target": name, "scenario": scenario, **extra,
                                     "result": result})
        if nsqpy.proc.returncode not in (0, -15):
            log(f"compare: nsqpy exited with {nsqpy.proc.returncode}")
    table = figures(opts.latency_modes, opts.latency_rate, opts.scenarios)
    medians, ratios = summarize(runs, list(targets), table)
    for scenario, row in ratios.items():
        log(f"compare: {scenario}: " + ", ".join(f"nsqpy/{n} = {r:.3f}" if r else f"nsqpy/{n} = n/a"
                                                 for n, r in row.items()))
    result = {"tool": "compare", "targets": targets, "target_commits": dict(opts.target_commit),
              "rounds": opts.rounds, "runfor_s": opts.runfor,
              "scenarios": opts.scenarios, "latency_rate": opts.latency_rate[0],
              "latency_rates": opts.latency_rate, "latency_modes": opts.latency_modes,
              "figures": {s: f for s, (f, _) in table.items()},
              "medians": medians, "ratios": ratios, "runs": runs,
              "errors": sum(int(r["result"].get("errors", 0)) for r in runs), **environment()}
    if opts.plot:
        from benchmarks import plots  # matplotlib only when charts are asked for
        result["plots"] = plots.write_all(result, opts.plot)
    emit(result, opts.out)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    cli(main)
