"""PNG charts of a compare.py result: throughput bars per scenario and target, and the latency CDF.

Imported only when --plot is given, so matplotlib is an optional dependency (extra `bench`).
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.latency import CDF_QUANTILES  # noqa: E402


def throughput_bars(result: dict, path: str) -> None:
    scenarios = [s for s, figure in result["figures"].items() if figure == "ops_per_s"]
    targets = list(result["targets"])
    width = 0.8 / len(targets)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, target in enumerate(targets):
        values = [result["medians"][s][target] for s in scenarios]
        ax.bar([x + i * width for x in range(len(scenarios))], values, width, label=target)
    ax.set_xticks([x + width * (len(targets) - 1) / 2 for x in range(len(scenarios))], scenarios)
    ax.set_ylabel("messages/s (median of rounds)")
    ax.set_title(f"throughput, {result['cores']} cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_cdf(result: dict, path: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for target in result["targets"]:
        runs = [r["result"] for r in result["runs"] if r["scenario"] == "latency" and r["target"] == target]
        best = min((r for r in runs if "cdf_us" in r), key=lambda r: r["p99_us"], default=None)
        if best is not None:
            ax.plot(best["cdf_us"], CDF_QUANTILES * 100, label=f"{target} (round with the lowest p99)")
    ax.set_xscale("log")
    ax.set_xlabel("publish-to-handler latency (µs)")
    ax.set_ylabel("percentile")
    ax.set_title(f"latency CDF at {result['latency_rate']} msgs/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(result: dict, directory: str) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, "throughput.png"), os.path.join(directory, "latency_cdf.png")]
    throughput_bars(result, paths[0])
    latency_cdf(result, paths[1])
    return paths
