"""The micro-benchmarks run and report: each for a fraction of a second as a subprocess, its one JSON line
carrying its figures and, as every results file must, the commit, the command and the core count."""

from __future__ import annotations

from benchmarks.process import run_tool


def assert_recorded(result: dict, tool: str) -> None:
    assert result["tool"] == tool
    assert result["command"].startswith(f"python -m benchmarks.{tool}")
    assert result["commit"] and result["cores"] >= 1


def test_codec_bench_reports_each_codec_rate():
    code, result = run_tool("benchmarks.codec_bench", "--seconds", "0.05")
    assert code == 0
    assert_recorded(result, "codec_bench")
    assert all(result[k] > 0 for k in ("mpub_msgs_per_s", "fin_lines_per_s", "frames_per_s"))


def test_ring_bench_reports_every_transport_and_the_wakeup():
    code, result = run_tool("benchmarks.ring_bench", "--quick")
    assert code == 0
    assert_recorded(result, "ring_bench")
    assert sorted(result["records_per_s"]) == ["pipe", "queue", "ring"]
    assert all(rate > 0 for sizes in result["records_per_s"].values() for modes in sizes.values()
               for rate in modes.values())
    assert 0 < result["wakeup_us"]["p50"] <= result["wakeup_us"]["max"]
    assert result["compile_s"]["cold"] > 0 and result["compile_s"]["cached"] > 0


def test_loop_bench_reports_each_installed_loop_against_asyncio():
    code, result = run_tool("benchmarks.loop_bench", "--runfor", "0.3", "--rounds", "1")
    assert code == 0
    assert_recorded(result, "loop_bench")
    assert {"epoll", "asyncio"} <= set(result["round_trips_per_s"])
    assert set(result["round_trips_per_s"]) | set(result["missing"]) == {"epoll", "asyncio", "uvloop"}
    assert result["ratio_to_asyncio"]["asyncio"] == 1.0 and result["round_trips_per_s"]["epoll"] > 0
