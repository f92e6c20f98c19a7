"""Smoke runs of every benchmark tool against a live nsqpy (about a second each): valid JSON, non-zero rates,
no errors, and no message lost: the reader, told how many to expect, gets exactly what the writer published.

Speed is never asserted here; figures come from the tools run by hand (benchmarks/README.md).
"""
from __future__ import annotations

import pytest

from benchmarks.common import git_commit
from benchmarks.process import REPO, ListeningProcess, python_module, run_tool

RUN = ["--runfor", "1s", "--connections", "2", "--no-ceiling"]


@pytest.fixture(scope="module")
def nsqpy(tmp_path_factory):
    data = tmp_path_factory.mktemp("nsqpy-bench")
    argv = python_module("nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                         f"--data-path={data}", "--workers=2",
                         "--node-id=11")
    with ListeningProcess(argv, ready_timeout=120) as server:
        yield server


def ok(result):
    assert result["errors"] == 0, result.get("first_error")
    assert result["msgs"] > 0 and result["ops_per_s"] > 0


def test_writer_then_reader_lose_nothing(nsqpy):
    code, wrote = run_tool("benchmarks.bench_writer", "--nsqd-tcp-address", nsqpy.address_text, *RUN,
                           "--topic", "smoke_mpub", timeout=120)
    assert code == 0
    ok(wrote)
    code, read = run_tool("benchmarks.bench_reader", "--nsqd-tcp-address", nsqpy.address_text, "--topic",
                          "smoke_mpub", "--connections", "2", "--no-ceiling", "--runfor", "60s",
                          "--count", str(wrote["msgs"]), timeout=180)
    assert code == 0
    ok(read)
    assert read["msgs"] == wrote["msgs"]


def test_single_pub_writer(nsqpy):
    code, wrote = run_tool("benchmarks.bench_writer", "--nsqd-tcp-address", nsqpy.address_text, *RUN,
                           "--batch-size", "1", "--topic", "smoke_pub", timeout=120)
    assert code == 0
    ok(wrote)
    assert wrote["batch_size"] == 1


def test_latency(nsqpy):
    code, result = run_tool("benchmarks.latency", "--nsqd-tcp-address", nsqpy.address_text, "--runfor", "1s",
                            "--rates", "1000", "--no-ceiling", "--topic", "smoke_latency", timeout=120)
    assert code == 0
    assert result["errors"] == 0
    assert [(p["mode"], p["rate"]) for p in result["phases"]] == [("defaults", 1000), ("unbuffered", 1000)]
    for phase in result["phases"]:
        assert phase["lost"] == 0 and phase["received"] == phase["sent"] > 0
        assert 0 < phase["p50_us"] <= phase["p99_us"] <= phase["max_us"]


def test_roundtrip_with_its_ceiling(nsqpy):
    code, result = run_tool("benchmarks.roundtrip", "--nsqd-tcp-address", nsqpy.address_text, "--runfor", "1s",
                            "--ceiling-runfor", "0.5s", "--topic", "smoke_roundtrip", timeout=120)
    assert code == 0 and result["errors"] == 0
    for got in (result, result["ceiling"]):
        assert got["round_trips"] > 0 and got["us_per_round_trip"] > 0
        assert 0 < got["p50_us"] <= got["p99_us"] <= got["max_us"]


def test_compare_starts_nsqpy_itself(tmp_path):
    code, result = run_tool("benchmarks.compare", "--rounds", "1", "--runfor", "1s", "--latency-rate", "1000",
                            "--target-commit", "before=1013cfa", "--out", str(tmp_path / "c.json"), timeout=300)
    assert code == 0
    assert result["errors"] == 0
    assert result["target_commits"] == {"before": "1013cfa"}
    assert {r["scenario"] for r in result["runs"]} == {"writer", "reader", "pub", "latency", "roundtrip"}
    assert all(r["result"]["errors"] == 0 for r in result["runs"])
    assert all(v["nsqpy"] > 0 for v in result["medians"].values())


def test_pub_compare_runs_a_fresh_nsqpy_per_run_and_reports_its_cpu():
    code, result = run_tool("benchmarks.pub_compare", "--connections", "2", "--rounds", "1", "--runfor", "1s",
                            "--server", "nsqpy={python} -m nsqpy.workers.processes.nsqd --tcp-address=127.0.0.1:0 --http-address= "
                            "--data-path={data_path} --workers=2", "--server", "spread={python} -m nsqpy.workers.processes.nsqd "
                            "--tcp-address=127.0.0.1:0 --http-address= --data-path={data_path} --workers=2 "
                            "--producer-placement=spread", "--cwd", f"spread={REPO}", timeout=300)
    assert code == 0 and result["errors"] == 0
    assert result["cwd"] == {"spread": REPO} and result["cwd_commits"] == {"spread": git_commit(REPO)}
    assert set(result["medians"]["2"]) == {"nsqpy", "spread"} and result["medians"]["2"]["nsqpy"] > 0
    assert result["ratios"]["2"]["spread"] > 0
    assert all(run["server_cpu_us_per_msg"] > 0 for run in result["runs"])
    assert all(run["load_cpu_us_per_msg"] > 0 for run in result["runs"])  # the load tool's own CPU
    assert result["load_cpu_us_per_msg"]["2"]["nsqpy"] > 0
    assert result["commit"] and result["cores"] >= 1


def test_pub_compare_passes_its_batch_size_to_the_load():
    """--batch-size N: MPUBs of N (the write-throughput comparison) from the same load tool, recorded."""
    code, result = run_tool("benchmarks.pub_compare", "--connections", "2", "--rounds", "1", "--runfor", "1s",
                            "--batch-size", "50", timeout=300)
    assert code == 0 and result["errors"] == 0 and result["batch_size"] == 50
    assert result["runs"][0]["result"]["batch_size"] == 50 and result["medians"]["2"]["nsqpy"] > 0


def test_pub_compare_read_preloads_exactly_n_messages_then_reads_them():
    """--read N: each fresh server gets exactly N messages in channel ch before the reader's run (5,150 is not a
    multiple of the preload's MPUB of 200); reading all of them marks the run drained (a lower bound)."""
    code, result = run_tool("benchmarks.pub_compare", "--connections", "2", "--rounds", "1", "--runfor", "2s",
                            "--read", "5150", timeout=300)
    assert code == 0 and result["errors"] == 0, result
    assert result["load"] == "bench_reader" and result["read_preload"] == 5150 and result["rdy"] == 2500
    run = result["runs"][0]["result"]
    assert run["msgs"] == 5150 and run["drained"] is True and result["drained_runs"] == 1


def test_first_start_times_warm_up_steps_compiled_alone_and_deals_them_out():
    code, result = run_tool("benchmarks.first_start", "--steps", "7,12", timeout=600)
    assert code == 0
    assert [s["index"] for s in result["steps"]] == [7, 12] and all(s["s"] > 0 for s in result["steps"])
    assert [s["name"] for s in result["steps"]] == ["nsqpy.workers.publishing.records.warm_up", "nsqpy.ipc.statrows.warm_up"]
    one, many = result["predicted_kernels_s"]["1"], result["predicted_kernels_s"]["64"]
    seconds = [s["s"] for s in result["steps"]]
    assert one == round(sum(seconds), 2) and many == round(max(seconds), 2)  # one process; one each


def test_first_start_times_a_cold_and_a_warm_start_of_each_checkout():
    code, result = run_tool("benchmarks.first_start", "--rounds", "1", "--warm-starts", "2", "--moved",
                            "--baseline-checkout", str(REPO), timeout=600)
    assert code == 0
    assert [len(result["runs"][name][kind]) for name in ("current", "baseline")
            for kind in ("cold_s", "warm_s", "moved_s")] == [1, 2, 1, 1, 2, 1]
    for name in ("current", "baseline"):
        cold, warm = result["medians"][name]["cold_s"], result["medians"][name]["warm_s"]
        assert cold > 0 and warm > 0
        for kind, total in (("cold", cold), ("warm", warm)):  # the phases nsqd logs, each within the start
            phases = result["medians"][name]
            assert 0 < phases[f"{kind}_hello_s"] < total and 0 < phases[f"{kind}_kernels_s"] < total
            assert phases[f"{kind}_http_s"] >= total - 0.01  # HTTP's line, once every child is ready (TCP: 2 digits)
    assert result["http"] is True
    assert result["baseline_commit"] == git_commit(str(REPO)) == result["commit"]
    assert result["cold_ratio_current_to_baseline"] > 0 and result["warm_ratio_current_to_baseline"] > 0
    assert result["moved_ratio_current_to_baseline"] > 0
