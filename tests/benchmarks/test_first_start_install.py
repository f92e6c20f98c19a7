"""benchmarks.first_start's install step and Go columns (issue 48): --compile-only times `nsqd --compile-only` on a
fresh cache, counts its progress lines (one per warm-up step) and times the start after it; a cold start's
`cold_full_speed_s` waits for the workers' forward lane; --go-nsqd starts Go nsqd in the same round, or says why
it did not. One round: two compiles of some 20 s of CPU each. Speed is never asserted (benchmarks/README.md)."""
import os

from benchmarks.process import run_tool
from nsqpy.workers.lane import warmup

GO_NSQD = "/tmp/gobin/nsqd"  # NSQ's binary where benchmarks/go_tools.sh put it on this machine, if it did


def test_first_start_times_the_install_step_the_start_after_it_and_go_nsqd(tmp_path):
    go = GO_NSQD if os.access(GO_NSQD, os.X_OK) else str(tmp_path / "no-such-nsqd")
    code, result = run_tool("benchmarks.first_start", "--compile-only", f"--go-nsqd={go}", timeout=900)
    assert code == 0 and result["rounds"] == 1
    current = result["medians"]["current"]
    assert current["compile_only_progress"] == len(warmup.declared())  # a line for every step
    assert 0 < current["compile_only_first_line_s"] < current["compile_only_s"] and current["compile_only_cpu_s"] > 0
    assert 0 < current["after_compile_only_s"] and 0 < current["after_compile_only_kernels_s"]
    assert current["cold_full_speed_s"] >= current["cold_s"] > 0  # the lane comes after listening
    assert "warm_full_speed_s" not in current and "after_compile_only_full_speed_s" not in current  # lane at once
    if go == GO_NSQD:
        assert result["medians"]["go"]["start_s"] > 0 and "go_skipped" not in result
    else:
        assert "go" not in result["medians"] and result["go_skipped"] == f"{go} is not an executable file"
