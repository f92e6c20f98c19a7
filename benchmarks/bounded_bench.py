"""What issue 49's policies cost on the write path: MPUB write cost per message with no policy, with a bound that
is never reached (``--max-channel-depth`` far above what is published: only the checks), with
``--channel-overflow=drop_oldest`` at its limit (every MPUB drops as many messages as it adds), and with
``--max-attempts`` and ``--message-ttl`` on (nothing of theirs runs at publish: the control), in the same run.

    python -m benchmarks.bounded_bench [--messages=500000] [--size=200] [--workers=2] [--rounds=3]
                                       [--drop-depth=100000] [--out=FILE]

Each round starts one broker per mode (port 0, a fresh data path, ``--workers``), creates channel ``c`` of topic
``w`` (no consumer: everything published stays in the channel, or is dropped), and publishes ``--messages`` with
pipelined MPUBs of 200 (32 waiting for their OK) from one connection; the modes alternate within a round. Per mode:
msgs/s and the broker's CPU per message (user + system of its process tree, from /proc), median over the rounds,
and each mode's difference from ``off`` (``cost_us_per_msg``). Prints one JSON line (with the git commit, core
count and command).
"""
import argparse
import statistics
import tempfile
import time

from benchmarks.common import emit, environment, log
from benchmarks.dead_letter_bench import broker, make_channel, publish
from benchmarks.pub_compare import cpu_seconds, process_tree
from benchmarks.wire import warm_up


def modes(opts):
    return {"off": (),
            "bound_not_reached": (f"--max-channel-depth={10 * opts.messages}", "--channel-overflow=reject"),
            "drop_oldest_at_limit": (f"--max-channel-depth={opts.drop_depth}", "--channel-overflow=drop_oldest"),
            "max_attempts": ("--max-attempts=5",),
            "ttl": ("--message-ttl=1h",)}


def write_round(base, opts, flags):
    with tempfile.TemporaryDirectory(dir=base) as data:
        b = broker(data, opts.workers, *flags)
        try:
            make_channel(b.address, "w", "c")
            pids = process_tree(b.proc.pid)
            before = cpu_seconds(pids)
            t0 = time.monotonic()
            publish(b.address, "w", opts.messages, opts.size)
            s = time.monotonic() - t0
            after = cpu_seconds(pids)
        finally:
            b.stop()
    cpu = sum(after.get(p, 0.0) - before.get(p, 0.0) for p in pids)
    return {"msgs_per_s": round(opts.messages / s), "server_cpu_us_per_msg": round(cpu * 1e6 / opts.messages, 3)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=500_000)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--drop-depth", type=int, default=100_000, help="max depth of the drop_oldest mode")
    p.add_argument("--out", default="")
    opts = p.parse_args(argv)
    warm_up()
    runs = {k: [] for k in modes(opts)}
    with tempfile.TemporaryDirectory(prefix="nsqpy-bounded-") as base:
        for r in range(opts.rounds):
            for mode, flags in modes(opts).items():
                x = write_round(base, opts, flags)
                runs[mode].append(x)
                log(f"round {r + 1} {mode}: {x['msgs_per_s']:,} msgs/s, {x['server_cpu_us_per_msg']} us of server "
                    f"CPU per msg")
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("msgs_per_s", "server_cpu_us_per_msg")}
           for k, v in runs.items()}
    off = med["off"]["server_cpu_us_per_msg"]
    emit(dict(environment(), tool="bounded_bench", messages=opts.messages, size=opts.size, workers=opts.workers,
              rounds=opts.rounds, drop_depth=opts.drop_depth, modes={k: list(v) for k, v in modes(opts).items()},
              runs=runs, median=med,
              cost_us_per_msg={k: round(v["server_cpu_us_per_msg"] - off, 3) for k, v in med.items() if k != "off"}),
         opts.out)


if __name__ == "__main__":
    main()
