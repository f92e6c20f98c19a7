"""Each benchmark tool that starts its own brokers (nsqd, nsqlookupd, gunicorn, Spark) runs and reports: a short
run as a subprocess, as `python -m benchmarks.<tool>`, whose one JSON line carries its figures and what every
results file records (commit, command, cores). Figures are not checked against any bound: benchmarks are not
timed tests."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys

from benchmarks.process import REPO, run_tool

from test_micro_benchmarks import assert_recorded


def _run(tool: str, *args: str) -> dict:
    code, result = run_tool(f"benchmarks.{tool}", *args)
    assert code == 0
    assert_recorded(result, tool)
    return result


def test_client_bench():
    r = _run("client_bench", "--runfor", "0.3s")
    assert r["producer_mpub_msgs_per_s"] > 0 and r["producer_mpub_pipelined_msgs_per_s"] > 0
    assert r["consumer_msgs"] > 0 and r["consumer_msgs_per_s"] > 0


def test_lookupd_bench():
    r = _run("lookupd_bench", "--runfor", "0.5s")
    assert r["lookup_per_s"] > 0 and r["ping_per_s"] > 0 and r["register_rtt_per_s"] > 0
    assert r["lookup_errors"] == r["ping_errors"] == r["register_rtt_errors"] == r["register_pipe_errors"] == 0


def test_tls_bench():
    r = _run("tls_bench", "--runfor", "0.5s", "--connections", "2", "--modes", "plain,tls")
    assert sorted(r["modes"]) == ["plain", "tls"]
    for mode in r["modes"].values():
        assert mode["write_msgs_per_s"] > 0 and mode["write_mpub_msgs_per_s"] > 0 and mode["read_msgs_per_s"] > 0


def test_http_bench():
    r = _run("http_bench", "--classes", "sync", "--runfor", "0.5s", "--topics", "10", "--channels", "2",
             "--rounds", "1", "--connections", "4", "--load-processes", "1")
    assert r["tcp"]["tcp_pub"]["msgs_per_s"] > 0 and r["tcp"]["tcp_pub"]["errors"] == 0


def test_idle_footprint():
    r = _run("idle_footprint", "--workers", "2")
    [run] = r["runs"]
    assert run["workers"] == 2 and run["shm_bytes"] > 0 and run["pss_mib"] > 0


def test_topic_cost():
    r = _run("topic_cost", "--topics", "20", "--workers", "2")
    assert r["topics"] == 20 and r["topics_per_s"] > 0


def test_stats_snapshot_with_fewer_than_twenty_topics():
    r = _run("stats_snapshot", "--topics", "10", "--channels", "2", "--workers", "2", "--consumers", "2",
             "--producers", "2", "--rounds", "1")
    assert r["topics"] == 10 and r["some_changed"]["median_ms"] > 0


def test_persistence_bench():
    r = _run("persistence_bench", "--messages", "10000", "--rounds", "1", "--skip-write")
    assert r["messages"] == 10000 and r["shutdown_s"] > 0 and r["start_with_queue_s"] > 0 and r["recovery_s"] > 0


def test_msglog_bench():
    r = _run("msglog_bench")
    assert r["appends_per_s_batched"] > 0 and r["appends_per_s_single"] > 0
    assert r["frames_per_s_read_frame_advance"] > 0


def test_spark_bench():
    r = _run("spark_bench", "--rows", "20000", "--stream-rows", "5000", "--max-rows-per-batch", "2500")
    assert r["complete"] is True
    assert r["foreach_partition_rows_per_s"] > 0 and r["batch_writer_rows_per_s"] > 0
    assert r["python_producer_rows_per_s"] > 0 and r["stream_rows_per_s"] > 0


def test_a_tool_stopped_by_sigterm_stops_the_broker_it_started():
    """SIGTERM to a tool (a CI run stopped by hand, a timeout) stops the nsqd it started, in a session of its
    own, instead of leaving it running with no parent."""
    tool = subprocess.Popen([sys.executable, "-m", "benchmarks.compare", "--scenarios", "roundtrip", "--rounds", "1",
                             "--runfor", "600s"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port = None
        for line in tool.stderr:  # the round's line names the broker it started, once it listens
            found = re.search(rb"round 1/1 on nsqpy \(127\.0\.0\.1:(\d+)\)", line)
            if found:
                port = int(found.group(1))
                break
        assert port is not None
        socket.create_connection(("127.0.0.1", port), timeout=10).close()  # it listens
        tool.send_signal(signal.SIGTERM)
        assert tool.wait(timeout=120) == 128 + signal.SIGTERM
        try:
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
            stopped = False
        except ConnectionRefusedError:
            stopped = True
        assert stopped  # the tool waited for the broker's stop before it exited
    finally:
        if tool.poll() is None:
            tool.kill()
            tool.wait()
        tool.stderr.close()
